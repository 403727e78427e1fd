/*
 * snapgym sandbox daemon: shared declarations.
 *
 * Why C: a sandbox must cost little memory when idle (hundreds per machine) and
 * an exec must cost about a millisecond. A resident init process written in C
 * inside each sandbox's namespaces gives both; Python stays on the host side.
 *
 * Process tree (one daemon per LocalBackend):
 *
 *   python (LocalBackend)
 *     `- sandboxd (daemon.c)     private mount ns; routes requests by sandbox id
 *          |- netmaker (netstock.c)  makes network namespaces ahead, for new keepers
 *          `- keeper (keeper/)   one per sandbox, in a mount ns of its own (its stages);
 *               |                starts, restores and seals the sandbox
 *               |- init          PID 1 of new pid/mount/net/ipc/uts/user namespaces (instance/),
 *               |    |           in cgroups of its own and a Landlock domain
 *               |    `- reaper   one per exec: child subreaper, owns the timeout
 *               |         `- /bin/sh -c CMD
 *               |- spare init    the next episode's namespaces, set up ahead of time
 *               `- janitor       unmounts and removes what dead instances leave
 *
 * Restore = SIGKILL the init (the kernel kills its whole PID namespace), hand
 * over to the spare, which already runs over the same read-only layers in
 * namespaces and cgroups of its own, and answer; the old instance finishes dying
 * off the request path (the next restore or close waits for it if need be).
 * Nothing of the snapshot is copied, and creating namespaces (the slow part)
 * happens off the critical path. Sealing (OP_SEAL, keeper/keeper.c) hands the
 * sandbox to the verifier.
 *
 * Files, by the process that runs them:
 *   daemon.c      the daemon, netstock.c (its stock of network namespaces made ahead) and
 *                 hostmounts.c (its copy of the host's mounts, cut down at start)
 *   wire.c, children.c, mountapi.c: plumbing every level uses
 *   keeper/       keeper.c, instance.c (one instance, from clone to discard), and the
 *                 proofs that let it reuse a dead instance's cgroups (cgpool.c) and
 *                 network namespace (netproof.c)
 *   instance/     the cloned child that becomes init (sandbox.c, seccomp.c, warm.c),
 *                 init.c (PID 1 and each exec's reaper), session.c (a persistent shell)
 *   verifier/     what a seal builds for the verifier: graft.c (strict), shared.c,
 *                 knowngood.c and freeze.c (shared), lookup.c (overlayfs lookups both use)
 *
 * Usage: sandboxd root|user STAGE_DIR CONTROL_FD [NETNS_STOCK [KEEP_PATH...]]
 *   NETNS_STOCK: how many new network namespaces the daemon may keep made ahead (netstock.c; 0, the
 *   default: none). KEEP_PATH: host paths sandboxes reach (the store, the host base's bind
 *   sources); the daemon's copy of the host's mounts keeps only theirs (hostmounts.c)
 *
 * Wire format (SOCK_SEQPACKET, one message per packet, host byte order):
 *   u32 op, u32 sandbox id, u32 sequence, u32 field count,
 *   then per field u32 length + bytes ("key=value"). File descriptors travel as
 *   SCM_RIGHTS. Operations that carry a status fd get a 16-byte status record on
 *   it (i32 code, i32 timed_out, i32 errno, i32 reserved; code -2: snapgym could
 *   not start the command, errno says why); CREATE, RESTORE, SEAL, CLOSE and
 *   PING get a reply packet with the request's sequence (OK with "pid=N" and
 *   "stage=PATH" and "keeper=PID", then any report lines, or ERR with a message). A reply with
 *   sequence 0 is an event: the sandbox's keeper died.
 */
#ifndef SNAPGYM_SANDBOXD_H
#define SNAPGYM_SANDBOXD_H
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>

#include "linkaudit.h" /* ../../csrc: shared with the Docker helper */
#include "proctree.h"

enum {
    OP_CREATE = 1, OP_RESTORE = 2, OP_EXEC = 3, OP_CLOSE = 4, OP_READ = 5,
    OP_WRITE = 6, OP_FREEZE = 7, OP_THAW = 8, OP_PING = 9, OP_SEAL = 10,
    REPLY_OK = 100, REPLY_ERR = 101,
};

/* Constants of the new mount API (named with a trailing _ so they never clash
 * with the C library's own definitions). */
#define FSOPEN_CLOEXEC_ 0x1
#define FSCONFIG_SET_FLAG_ 0
#define FSCONFIG_SET_STRING_ 1
#define FSCONFIG_CMD_CREATE_ 6
#define FSMOUNT_CLOEXEC_ 0x1
#define MOUNT_ATTR_RDONLY_ 0x1
#define MOUNT_ATTR_NOSUID_ 0x2
#define MOUNT_ATTR_NODEV_ 0x4
#define OPEN_TREE_CLONE_ 1
#define OPEN_TREE_CLOEXEC_ O_CLOEXEC
#define AT_RECURSIVE_ 0x8000
#define MOVE_MOUNT_F_EMPTY_PATH_ 0x4

#define MAX_MSG (1 << 20)
#define MAX_FIELDS 4096
#define MAX_FDS 8
#define HDR_SIZE 16

typedef struct {
    uint32_t op, sbx, seq, nfields;
    char *key[MAX_FIELDS];
    char *val[MAX_FIELDS];
    int fds[MAX_FDS];
    int nfds;
    char *raw;     /* the packet as received, for forwarding */
    size_t rawlen;
    char *buf;     /* a parsed copy: key/val point into it */
} msg_t;

/* wire.c */
extern int user_mode;  /* 1 when the daemon runs without host root */
extern int control_fd; /* the socket to Python; replies go here */
msg_t *msg_new(void);
int recv_msg(int fd, msg_t *m);
int parse_msg(msg_t *m, const char *raw, size_t len);
int send_raw(int fd, const char *buf, size_t len, const int *fds, int nfds);
int forward_msg(int fd, msg_t *m);
void reply(uint32_t op, uint32_t sbx, uint32_t seq, const char *fmt, ...);
void close_fds(msg_t *m);
void write_status(int fd, int code, int timed_out, int err);
const char *field(msg_t *m, const char *key);
/* Write `text` to fd (-1: fails, errno kept) and close it: 0 when all of it went. */
int write_str_closing(int fd, const char *text);
int errno_fail(char *err, size_t errlen, const char *what); /* "what: strerror(errno)" into err; -1 */
int write_file_str(const char *path, const char *text);
int read_full(int fd, void *buf, size_t len);
ssize_t read_all(int fd, void *buf, size_t len);
long long now_ms(void);
int mkdir_p(const char *path, mode_t mode);
void set_title_area(char *start, size_t len);
void set_title(const char *title);

/* instance/sandbox.c: runs in the cloned child, becomes the sandbox's init. */
void sandbox_child(msg_t *cfg, const char *stage, int sock, int syncfd) __attribute__((noreturn));
void child_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
extern int fail_status_fd; /* set: child_fail answers an exec's status fd (code -2) instead */
void drop_privileges(msg_t *cfg); /* rlimits, capabilities, no_new_privs, seccomp */
int mount_overlay(const char *target, char *const *lowers, int nlowers, const char *upper, const char *work);

/* What a keeper hands the instance it is about to start (read by the cloned child). */
typedef struct {
    char cgroups[4][512]; /* the instance's own cgroup directories, one per hierarchy */
    int ncgroups;
    char agent_upper[4096]; /* strict verifier: the agent's writable layer, kept after its death */
    int net_fd;             /* >= 0: join this network namespace (the dead agent's) instead of a new one */
} launch_t;
extern launch_t launch;

/* verifier/graft.c, in a helper of the keeper: a strict verifier's filesystem (the outputs of the
 * agent's end state, /tests, private dirs) onto the ready instance whose init is `init`. */
void graft_verifier(msg_t *cfg, pid_t init, const char *stage, int fail_fd) __attribute__((noreturn));
void set_failure_fd(int fd); /* where child_fail sends its "e<message>" */
/* Find the links one of the agent's layers (an open directory at rel) has that lead a process in
 * the view at rootfd into /tests, a private directory, /proc or /sys; remove_links() removes them
 * through the view. audit_links writes "removed=" lines to the report set with set_report(). */
void audit_links(msg_t *cfg, int rootfd, int agent_dir, const char *rel);
void remove_links(void);
void set_report(FILE *to);

/* verifier/shared.c: a shared verifier's mount namespace beside the agent's live processes. */
int shared_view_build(msg_t *cfg, pid_t init_pid, const char *stage, char *err, size_t errlen);
void shared_exec(msg_t *m, msg_t *cfg, const int ns_fds[6], char cgroups[][512], int ncg) __attribute__((noreturn));

/* verifier/knowngood.c: what a shared verifier takes from the known-good snapshot (hooks, top-level
 * links), and detached writable overlays with their uppers in the verifier's scratch tmpfs. */
enum { MAX_LAYERS = 512 }; /* known-good and agent layers a shared verifier reads, each */
void known_good_init(msg_t *cfg, uid_t copies_owner, int scratch_fs);
int known_good_layers(char ***layers);                        /* how many; top first */
int known_good_load(msg_t *cfg, char *err, size_t errlen);    /* look the hooks and links up now */
int writable_overlay(char *const *lowers, int n, mode_t mode, uid_t uid, gid_t gid); /* a mount fd */
int is_hook(const char *path);
int is_top_link(const char *name);
int place_hooks(int troot, char *err, size_t errlen);
int place_top_links(int troot, char *err, size_t errlen);

/* verifier/freeze.c: a frozen copy of name (an entry of src_dir, never followed) as dst_dir/name. */
enum { FREEZE_MAX_LIVE = 256 };
typedef struct {
    int skipped;                  /* entries that could not be copied (left out) */
    char *live[FREEZE_MAX_LIVE];  /* sockets and FIFOs, relative to src_dir: bound live over the copies */
    int nlive;
} freeze_t;
int freeze_tree(int src_dir, const char *name, int dst_dir, freeze_t *out); /* -1: the copy could not begin */

/* verifier/lookup.c: a path in a stack of overlayfs layers (top first), as overlayfs sees it. */
enum { LAYER_ABSENT = 0, LAYER_HAS = 1 };
/* The entry at rel (no leading "/") and the index of the layer that has it; 0: none. */
int stack_lookup(char *const *layers, int n, const char *rel, struct stat *st, int *index);
/* Indexes of the layers whose directory at rel overlayfs would merge, top first;
 * *agent_touched: one of the first n_agent layers has or hides something there. */
int stack_dirs(char *const *layers, int n, int n_agent, const char *rel, int *out, int max, int *agent_touched);
int fields_of(msg_t *cfg, const char *key, char **out, int max);

/* hostmounts.c: detach the daemon's mounts that are neither on the way to nor under one of paths
 * (nor /proc, /sys, /dev); how many were detached. */
enum { MAX_KEEP_PATHS = 64 }; /* the daemon's KEEP_PATH arguments */
int prune_host_mounts(char *const *paths, int npaths); /* at most MAX_KEEP_PATHS + 1 paths */

/* mountapi.c */
int sys_fsopen(const char *fs);
int sys_fsconfig_str(int fd, const char *key, const char *value);
int sys_fsmount(int fd, unsigned attrs);
int sys_open_tree(int dfd, const char *path, unsigned flags);
int attach_mount(int mount_fd, int to_dfd, const char *to_path);
int overlay_fsmount(const char *lowerdir, const char *upper, const char *work);
int open_beneath(int dirfd, const char *path, int flags);
int landlock_confine(void);

/* instance/warm.c: look up the first command's shell, loader and libraries in a new instance's overlay. */
void warm_first_command(void);

/* instance/seccomp.c: deny system calls that reach past the namespaces. */
int install_seccomp(void);

/* instance/init.c */
void init_loop(int sock) __attribute__((noreturn));
void run_reaper(msg_t *m) __attribute__((noreturn));
void run_file_op(msg_t *m) __attribute__((noreturn));
int exit_code_of(int status);                                /* 128 + signal for a killed process */
void become_killable(void);                                  /* give up init's OOM immunity */

/* instance/session.c: a persistent shell whose steps arrive on the exec's stdin (the "session" field). */
void run_session(msg_t *m) __attribute__((noreturn));
enum { STATUS_FINAL = 0, STATUS_STEP = 1 }; /* the status record's 4th field in a session */

/* children.c: SIGCHLD blocked and read from a signalfd, and the start of a forked command. */
sigset_t block_sigchld(void);   /* block SIGCHLD; returns the set holding it (for sigtimedwait) */
int sigchld_fd(void);           /* block SIGCHLD and open a non-blocking signalfd that reports it */
void drain_signalfd(int sfd);   /* read away the signals a signalfd holds */
/* Wait until sock has something (a request, or its end), calling reap whenever sfd reports SIGCHLD. */
void await_request(int sock, int sfd, void (*reap)(void));
void unblock_signals(void);     /* a forked child's start: no signal blocked */
void enter_cwd(const char *cwd); /* in a command's child: chdir to cwd if set, else exit 126 saying why */

/* keeper/cgpool.c: emptied cgroups of dead instances, reused only when proven clean (see there). */
int cgpool_prove(msg_t *cfg, char dirs[][512], int n, char *why, size_t whylen); /* 0: clean, limits set */
int cgpool_give(char dirs[][512], int n);                                          /* 1: kept for reuse */
int cgpool_take(msg_t *cfg, char dirs[][512], int *n, void (*drop)(const char *dir)); /* 1: reused */
void cgpool_drain(void (*drop)(const char *dir));
long cgpool_oom_kills(char dirs[][512], int n); /* OOM kills the cgroups have counted */
/* keeper/netproof.c: is a dead instance's network namespace empty, as a fresh one? */
int net_is_empty(int net);
/* keeper/nets.c: the network namespaces a keeper keeps for its next instances (see there). */
void nets_keep_new(const int *nets, int n); /* new ones from the daemon's stock */
void nets_recycle(int net);                 /* a dead instance's: kept if proven empty, else dropped */
int nets_take(int *reused);                 /* one for a new instance, or -1; *reused: a dead one's */
void nets_drop(int net);                    /* no longer wanted: its teardown goes to the janitor */
void nets_forget(void);                     /* in a forked child: close them */
/* keeper/janitor.c: the keeper's child that clears dead instances' remains off the request path. */
void janitor_send(char op, const char *path, int fd); /* U unmount+remove, R remove, N only close fd */
void janitor_drain(void);        /* let it finish and wait for it */
void janitor_reaped(pid_t pid);  /* pid was reaped: if the janitor's, clean up inline from now on */
void janitor_forget(void);       /* in a forked child: close the channel */

/* netstock.c: new network namespaces made ahead by a helper of the daemon, for new keepers. */
int net_set_up(void);         /* set up the current network namespace as an instance's: 0, or -1 */
void netstock_start(int max); /* start the helper; at most max namespaces stocked (0: none) */
int netstock_fd(void);        /* the helper's channel to poll, -1 when there is none */
void netstock_receive(void);  /* take in what the helper sent (its channel is readable) */
int netstock_refill(void);    /* ask the helper for what the stock lacks: -1, or ms to wait first */
int netstock_take(int *nets, int want); /* up to want stocked namespaces into nets: how many */
void netstock_forget(void);   /* in a forked child: close the stock and the channel */

/* keeper/keeper.c; nets: new network namespaces (fds) for its first instances */
void keeper_main(msg_t *create, const char *stage_root, int daemon_sock, const int *nets, int nnets)
    __attribute__((noreturn));

#endif
