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
 *          `- keeper (keeper.c)  one per sandbox; holds its cgroups, restores it
 *               |- init          PID 1 of new pid/mount/net/ipc/uts/user namespaces
 *               |    `- reaper   one per exec: child subreaper, owns the timeout
 *               |         `- /bin/sh -c CMD
 *               `- spare init    the next episode's namespaces, set up ahead of time
 *
 * Restore = SIGKILL the init (the kernel kills its whole PID namespace), drop its
 * writable tmpfs, and hand over to the spare, which already runs over the same
 * read-only layers. Nothing of the snapshot is copied, and creating namespaces
 * (the slow part) happens off the critical path.
 *
 * Usage: sandboxd root|user STAGE_DIR CONTROL_FD
 *
 * Wire format (SOCK_SEQPACKET, one message per packet, host byte order):
 *   u32 op, u32 sandbox id, u32 sequence, u32 field count,
 *   then per field u32 length + bytes ("key=value"). File descriptors travel as
 *   SCM_RIGHTS. Operations that carry a status fd get a 16-byte status record on
 *   it (i32 code, i32 timed_out, i32 errno, i32 reserved); CREATE, RESTORE,
 *   CLOSE and PING get a reply packet with the request's sequence (OK with
 *   "pid=N" and "stage=PATH", or ERR with a message). A reply with sequence 0 is
 *   an event: the sandbox's keeper died.
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

enum {
    OP_CREATE = 1, OP_RESTORE = 2, OP_EXEC = 3, OP_CLOSE = 4, OP_READ = 5,
    OP_WRITE = 6, OP_FREEZE = 7, OP_THAW = 8, OP_PING = 9,
    REPLY_OK = 100, REPLY_ERR = 101,
};

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
int write_file_str(const char *path, const char *text);
int read_full(int fd, void *buf, size_t len);
long long now_ms(void);
int mkdir_p(const char *path, mode_t mode);
void set_title_area(char *start, size_t len);
void set_title(const char *title);

/* sandbox.c: runs in the cloned child, becomes the sandbox's init. */
void sandbox_child(msg_t *cfg, const char *stage, int sock, int syncfd) __attribute__((noreturn));

/* seccomp.c: deny system calls that reach past the namespaces. */
int install_seccomp(void);

/* init.c */
void init_loop(int sock) __attribute__((noreturn));

/* keeper.c */
void keeper_main(msg_t *create, const char *stage_root, int daemon_sock) __attribute__((noreturn));

#endif
