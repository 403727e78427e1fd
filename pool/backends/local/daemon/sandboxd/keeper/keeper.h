/*
 * Within the keeper: its instances (instance.c), shared by keeper.c.
 */
#ifndef SANDBOXD_KEEPER_H
#define SANDBOXD_KEEPER_H

#include "sandboxd.h"

enum { NONE = 0, STARTING, MAPPED, READY };

typedef struct {
    int state;
    pid_t pid;
    int sock; /* to the init */
    int sync; /* setup handshake, until READY */
    char stage[4096];
    char cgroups[4][512];
    int ncgroups;
    int died_of_oom; /* its init died while its memory cgroup was killing for memory: the agent's doing */
    int net_fd;      /* a network namespace handed to it, closed once it has joined (the 'u' step) */
    long oom_base;   /* OOM kills its cgroups had counted before it (a reused set's), see cgpool.c */
    int reused_cgroup, reused_netns; /* what it got from a dead instance, proven clean; in its replies */
} instance_t;

void instance_reset(instance_t *in); /* empty: no process, no stage, no fds */
int instance_begin(instance_t *in, msg_t *cfg, const char *stage, const char *suffix, const int *inherited,
                   int ninherited, char *err, size_t errlen); /* 0: cloned, setup under way */
int instance_advance(instance_t *in, msg_t *cfg, char *err, size_t errlen); /* 1 ready, 0 not yet, -1 failed */
int instance_wait_ready(instance_t *in, msg_t *cfg, char *err, size_t errlen); /* 1 ready, -1 failed */
/* Kill it, wait for its processes, hand its remains to the janitor; held: see instance.c. */
void instance_discard_held(instance_t *in, int keep_stage, int held);
void instance_discard(instance_t *in);
int instance_hold_mount_ns(pid_t pid); /* an fd on its mount namespace: its teardown waits for the fd */
void instance_wait_gone(pid_t pid);    /* a killed init reaped: its PID namespace is empty */
int is_host_net(msg_t *cfg);           /* the sandbox shares the host's network namespace */

/* The instances' cgroups (1 from cgroups_create: a dead instance's set, proven clean). */
int cgroups_create(msg_t *cfg, const char *suffix, char dirs[][512], int *n);
int cgroups_oom_killed(char dirs[][512], int n, long base);
void cgroups_remove(char dirs[][512], int *n);
void drop_cgroup(const char *dir);

#endif
