/*
 * snapgym sandbox daemon: one process per LocalBackend that owns many sandboxes.
 *
 * Why C: a sandbox must cost little memory when idle (hundreds per machine) and
 * an exec must cost about a millisecond. A resident init process written in C
 * inside each sandbox's namespaces gives both; Python stays on the host side.
 *
 * Process tree
 *
 *   python (LocalBackend)
 *     `- sandboxd              private mount ns; holds each sandbox's writable tmpfs
 *          `- init (per sbx)   PID 1 of new pid/mount/net/ipc/uts/user namespaces
 *               `- reaper      one per exec: child subreaper, enforces the timeout
 *                    `- /bin/sh -c CMD
 *
 * Restore = SIGKILL the sandbox's init (the kernel kills its whole PID namespace),
 * unmount its writable tmpfs, mount a fresh one and start a new init over the
 * same read-only layers. Nothing of the snapshot is copied.
 *
 * Usage: sandboxd root|user STAGE_DIR CONTROL_FD
 *
 * Wire format (SOCK_SEQPACKET, one message per packet, host byte order):
 *   u32 op, u32 sandbox id, u32 field count, then per field u32 length + bytes.
 * Fields are "key=value". File descriptors travel as SCM_RIGHTS.
 * Operations that carry a status fd get a 16-byte status record on it
 * (i32 code, i32 timed_out, i32 errno, i32 reserved); the others get a reply
 * packet on the control socket (OK with "pid=N", or ERR with a message).
 */
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
#define MAX_SANDBOXES 4096

typedef struct {
    uint32_t op, sbx, nfields;
    char *key[MAX_FIELDS];
    char *val[MAX_FIELDS];
    int fds[MAX_FDS];
    int nfds;
} msg_t;

typedef struct {
    int used;
    uint32_t id;
    pid_t init_pid;
    int sock; /* daemon side of the init's control socket */
    char stage[4096];
} sandbox_t;

static sandbox_t sandboxes[MAX_SANDBOXES];
static char *msgbuf;
static char stage_root[4096];
static int user_mode; /* 1 when the daemon runs without host root */
static int control_fd = 3;
static char *title_start;
static size_t title_len;

/* A sandbox's PID 1 is a fork of the daemon; give it a neutral command line
 * so /proc/1/cmdline in the sandbox shows no host paths. */
static void set_title(const char *title) {
    if (!title_start) return;
    memset(title_start, 0, title_len);
    snprintf(title_start, title_len, "%s", title);
}

/* ------------------------------------------------------------------ wire */

static int recv_msg(int fd, msg_t *m) {
    struct iovec iov = {msgbuf, MAX_MSG};
    char cbuf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t n;
    do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    if (n <= 0) return -1;
    m->nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (int i = 0; i < k && m->nfds < MAX_FDS; i++)
                m->fds[m->nfds++] = ((int *)CMSG_DATA(c))[i];
        }
    }
    if (n < 12) return -1;
    uint32_t *h = (uint32_t *)msgbuf;
    m->op = h[0];
    m->sbx = h[1];
    m->nfields = h[2];
    if (m->nfields > MAX_FIELDS) return -1;
    size_t off = 12;
    for (uint32_t i = 0; i < m->nfields; i++) {
        if (off + 4 > (size_t)n) return -1;
        uint32_t len;
        memcpy(&len, msgbuf + off, 4);
        /* Each field is NUL-terminated in place by shifting it left over its
         * length prefix; the prefix is no longer needed once read. */
        if (off + 4 + len > (size_t)n) return -1;
        memmove(msgbuf + off, msgbuf + off + 4, len);
        msgbuf[off + len] = 0;
        char *f = msgbuf + off;
        char *eq = strchr(f, '=');
        if (eq) { *eq = 0; m->key[i] = f; m->val[i] = eq + 1; }
        else { m->key[i] = f; m->val[i] = f + strlen(f); }
        off += 4 + len;
    }
    return 0;
}

static int send_raw(int fd, const char *buf, size_t len, const int *fds, int nfds) {
    struct iovec iov = {(void *)buf, len};
    char cbuf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (nfds > 0) {
        memset(cbuf, 0, sizeof cbuf);
        mh.msg_control = cbuf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t n;
    do n = sendmsg(fd, &mh, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    return n < 0 ? -1 : 0;
}

static void reply(uint32_t op, uint32_t sbx, const char *fmt, ...) {
    char text[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    uint32_t len = strlen(text);
    char buf[8192 + 16];
    uint32_t h[3] = {op, sbx, 1};
    memcpy(buf, h, 12);
    memcpy(buf + 12, &len, 4);
    memcpy(buf + 16, text, len);
    send_raw(control_fd, buf, 16 + len, NULL, 0);
}

static void close_fds(msg_t *m) {
    for (int i = 0; i < m->nfds; i++) close(m->fds[i]);
    m->nfds = 0;
}

static void write_status(int fd, int code, int timed_out, int err) {
    int32_t rec[4] = {code, timed_out, err, 0};
    ssize_t n;
    do n = write(fd, rec, sizeof rec); while (n < 0 && errno == EINTR);
}

static const char *field(msg_t *m, const char *key) {
    for (uint32_t i = 0; i < m->nfields; i++)
        if (strcmp(m->key[i], key) == 0) return m->val[i];
    return NULL;
}

/* ------------------------------------------------------------ utilities */

static int write_file_str(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static int read_full(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += n;
    }
    return 0;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static int mkdir_p(const char *path, mode_t mode) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, mode) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST) return -1;
    return 0;
}

/* ------------------------------------------------------- sandbox child */

/* Errors during setup travel back to the daemon as "e<message>" on the sync
 * socket, so the caller sees which step failed and why. */
static int sync_fd = -1;
static void child_fail(const char *fmt, ...) {
    char text[4096] = "e";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + 1, sizeof text - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(text);
    snprintf(text + len, sizeof text - len, ": %s", strerror(errno));
    if (write(sync_fd, text, strlen(text)) < 0) {}
    _exit(1);
}

static void bind_into(const char *root, const char *src, const char *dst, int ro) {
    char target[4096];
    snprintf(target, sizeof target, "%s%s", root, dst);
    if (mount(src, target, NULL, MS_BIND, NULL) < 0)
        child_fail("bind-mount %s onto %s", src, dst);
    if (ro && mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
        child_fail("make %s read-only", dst);
}

static void setup_dev(const char *root, const char *root_uid) {
    char p[4096], q[4096], opts[128];
    snprintf(p, sizeof p, "%s/dev", root);
    snprintf(opts, sizeof opts, "mode=755,size=1m,uid=%s,gid=%s", root_uid, root_uid);
    if (mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NOEXEC, opts) < 0)
        child_fail("mount tmpfs on /dev");
    static const char *nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++) {
        snprintf(p, sizeof p, "%s/dev/%s", root, nodes[i]);
        int fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        if (fd < 0) child_fail("create /dev/%s", nodes[i]);
        close(fd);
        snprintf(q, sizeof q, "/dev/%s", nodes[i]);
        if (mount(q, p, NULL, MS_BIND, NULL) < 0) child_fail("bind /dev/%s", nodes[i]);
    }
    static const char *links[][2] = {{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
                                     {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
                                     {"pts/ptmx", "ptmx"}};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        snprintf(p, sizeof p, "%s/dev/%s", root, links[i][1]);
        if (symlink(links[i][0], p) < 0) child_fail("symlink /dev/%s", links[i][1]);
    }
    snprintf(p, sizeof p, "%s/dev/shm", root);
    mkdir(p, 01777);
    snprintf(opts, sizeof opts, "mode=1777,size=64m,uid=%s,gid=%s", root_uid, root_uid);
    if (mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        child_fail("mount /dev/shm");
    snprintf(p, sizeof p, "%s/dev/pts", root);
    mkdir(p, 0755);
    if (mount("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620") < 0)
        child_fail("mount /dev/pts");
    snprintf(p, sizeof p, "%s/dev/mqueue", root);
    mkdir(p, 0755);
    if (mount("mqueue", p, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        child_fail("mount /dev/mqueue");
}

static void loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) child_fail("socket for loopback");
    struct ifreq ifr = {0};
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) child_fail("read loopback flags");
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) child_fail("bring loopback up");
    close(s);
}

static int syscall_pivot_root(const char *new_root, const char *put_old) {
    return (int)syscall(SYS_pivot_root, new_root, put_old);
}

/* Docker's default capability set: enough to be root inside the sandbox
 * (own files, change users), nothing that touches the kernel or devices. */
static void drop_capabilities(void) {
    static const int keep[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL,
                               CAP_SETGID, CAP_SETUID, CAP_SETPCAP, CAP_NET_BIND_SERVICE,
                               CAP_SYS_CHROOT, CAP_AUDIT_WRITE, CAP_SETFCAP};
    uint64_t mask = 0;
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) mask |= 1ULL << keep[i];
    for (int cap = 0; cap <= 63; cap++) {
        if (mask & (1ULL << cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break;
    }
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t)mask;
    data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t)(mask >> 32);
    if (syscall(SYS_capset, &hdr, data) < 0) child_fail("drop capabilities");
}

static void apply_rlimits(msg_t *cfg) {
    for (uint32_t i = 0; i < cfg->nfields; i++) {
        if (strcmp(cfg->key[i], "rlimit") != 0) continue;
        int res;
        unsigned long long soft, hard;
        if (sscanf(cfg->val[i], "%d:%llu:%llu", &res, &soft, &hard) != 3) continue;
        struct rlimit rl = {soft, hard};
        if (setrlimit(res, &rl) < 0) child_fail("set rlimit %d", res);
    }
}

static void init_loop(int sock);

static void sandbox_child(msg_t *cfg, const char *stage, int sock, int syncfd) {
    sync_fd = syncfd;
    char go;
    if (read_full(sync_fd, &go, 1) < 0) _exit(1); /* daemon attached cgroups */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) child_fail("make mounts private");

    char root[4096], opts[65536];
    snprintf(root, sizeof root, "%s/root", stage);
    size_t off = snprintf(opts, sizeof opts, "lowerdir=");
    int first = 1;
    for (uint32_t i = 0; i < cfg->nfields; i++) {
        if (strcmp(cfg->key[i], "lower") != 0) continue;
        off += snprintf(opts + off, sizeof opts - off, "%s%s", first ? "" : ":", cfg->val[i]);
        first = 0;
    }
    /* Redirects, index and metacopy would make the writable layer depend on
     * the layers under it; without them it can be frozen into a layer as is.
     * In a user namespace the kernel refuses those options but keeps them off. */
    off += snprintf(opts + off, sizeof opts - off, ",upperdir=%s/upper,workdir=%s/work,%s", stage, stage,
                    user_mode ? "userxattr" : "redirect_dir=off,index=off,metacopy=off");
    if (off >= sizeof opts) { errno = E2BIG; child_fail("overlay options (too many layers)"); }
    if (mount("overlay", root, "overlay", 0, opts) < 0) child_fail("mount overlay root filesystem");

    for (uint32_t i = 0; i < cfg->nfields; i++) {
        if (strcmp(cfg->key[i], "bind") != 0) continue;
        char spec[8192];
        snprintf(spec, sizeof spec, "%s", cfg->val[i]);
        char *src = spec, *dst = strchr(spec, '\t');
        if (!dst) continue;
        *dst++ = 0;
        char *mode = strchr(dst, '\t');
        int ro = 1;
        if (mode) { *mode++ = 0; ro = strcmp(mode, "rw") != 0; }
        bind_into(root, src, dst, ro);
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/proc", root);
    if (mount("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) child_fail("mount /proc");
    const char *root_uid = field(cfg, "root_uid");
    setup_dev(root, root_uid ? root_uid : "0");

    const char *hostname = field(cfg, "hostname");
    if (hostname && sethostname(hostname, strlen(hostname)) < 0) child_fail("set hostname");
    const char *net = field(cfg, "net");
    if (!net || strcmp(net, "host") != 0) loopback_up();

    if (chdir(root) < 0) child_fail("enter root filesystem");
    if (syscall_pivot_root(".", ".") < 0) child_fail("pivot_root");
    if (umount2(".", MNT_DETACH) < 0) child_fail("detach host filesystem");
    if (chdir("/") < 0) child_fail("chdir /");

    /* The user namespace comes last, so the mount, pid and net namespaces stay
     * owned by the daemon's user namespace: root in the sandbox can neither
     * mount nor reconfigure the network. */
    if (unshare(CLONE_NEWUSER) < 0) child_fail("create user namespace");
    if (write(sync_fd, "u", 1) != 1) _exit(1);
    if (read_full(sync_fd, &go, 1) < 0 || go != 'm') _exit(1);
    if (setresgid(0, 0, 0) < 0) child_fail("become gid 0 in the sandbox");
    setgroups(0, NULL); /* denied where setgroups is disabled; harmless */
    if (setresuid(0, 0, 0) < 0) child_fail("become uid 0 in the sandbox");

    apply_rlimits(cfg);
    drop_capabilities();
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail("set no_new_privs");
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) child_fail("set parent-death signal");
    /* getppid() is 0 across the PID namespace; a dead daemon shows as a failed write below. */
    umask(022);
    set_title("snapgym-init");
    if (write(sync_fd, "r", 1) != 1) _exit(1);
    close(sync_fd);
    init_loop(sock);
}

/* ------------------------------------------------------------- reaper */

/* State and parent pid of a process, from /proc/PID/stat. */
static int read_proc_stat(const char *pid, char *state, int *ppid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return -1;
    buf[k] = 0;
    char *rp = strrchr(buf, ')'); /* the command name may hold spaces and parens */
    if (!rp || sscanf(rp + 2, "%c %d", state, ppid) != 2) return -1;
    return 0;
}

/* Every process an exec started, found through the parent links in /proc:
 * the reaper is a child subreaper, so orphans (setsid, double fork) come back
 * to it and stay in the tree. */
static int collect_descendants(pid_t self, pid_t *out, int max) {
    static pid_t pids[65536], ppids[65536];
    int n = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 65536) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char state;
        int ppid;
        if (read_proc_stat(e->d_name, &state, &ppid) < 0) continue;
        pids[n] = atoi(e->d_name);
        ppids[n] = ppid;
        n++;
    }
    closedir(d);
    int count = 0;
    out[count++] = self;
    for (int head = 0; head < count; head++)
        for (int i = 0; i < n && count < max; i++)
            if (ppids[i] == out[head]) out[count++] = pids[i];
    for (int i = 1; i < count; i++) out[i - 1] = out[i];
    return count - 1;
}

static void kill_tree(pid_t self) {
    static pid_t found[65536];
    for (int round = 0; round < 1000; round++) {
        int n = collect_descendants(self, found, 65536);
        for (int i = 0; i < n; i++) kill(found[i], SIGKILL);
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        if (n == 0) {
            if (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD) return;
            usleep(1000);
        }
    }
}

static int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

static void run_reaper(msg_t *m) {
    int in = m->fds[0], out = m->fds[1], err = m->fds[2], st = m->fds[3];
    const char *cmd = field(m, "cmd");
    const char *cwd = field(m, "cwd");
    const char *tmo = field(m, "timeout_ms");
    long long timeout_ms = tmo ? atoll(tmo) : 0;
    static char *envp[MAX_FIELDS + 1];
    int ne = 0;
    for (uint32_t i = 0; i < m->nfields; i++)
        if (strcmp(m->key[i], "env") == 0) envp[ne++] = m->val[i];
    envp[ne] = NULL;

    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    pid_t child = fork();
    if (child < 0) { write_status(st, -1, 0, errno); _exit(1); }
    if (child == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setsid();
        dup2(in, 0); dup2(out, 1); dup2(err, 2);
        syscall(SYS_close_range, 3, ~0U, 0);
        if (cwd && *cwd && chdir(cwd) < 0) {
            dprintf(2, "snapgym: cannot enter working directory %s: %s\n", cwd, strerror(errno));
            _exit(126);
        }
        char *argv[] = {"sh", "-c", (char *)(cmd ? cmd : ""), NULL};
        execve("/bin/sh", argv, envp);
        dprintf(2, "snapgym: cannot run /bin/sh in the sandbox: %s\n", strerror(errno));
        _exit(127);
    }
    close(in); close(out); close(err);

    long long deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
    int status = 0, done = 0, timed_out = 0;
    while (!done) {
        pid_t r;
        while ((r = waitpid(-1, &status, WNOHANG)) > 0)
            if (r == child) { done = 1; break; }
        if (done) break;
        struct timespec ts = {1, 0};
        if (deadline) {
            long long left = deadline - now_ms();
            if (left <= 0) { timed_out = 1; break; }
            ts.tv_sec = left / 1000;
            ts.tv_nsec = (left % 1000) * 1000000;
        }
        sigtimedwait(&chld, NULL, &ts);
    }
    if (timed_out) {
        kill_tree(getpid());
        write_status(st, 128 + SIGKILL, 1, 0);
        _exit(0);
    }
    write_status(st, exit_code_of(status), 0, 0);
    close(st);
    /* Background processes the command left running live on; keep reaping
     * them so they never become zombies, and leave when the last one ends. */
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {}
    _exit(0);
}

/* --------------------------------------------------------- file worker */

static int copy_fd(int from, int to, long long max, int *too_big) {
    static char buf[1 << 16];
    long long total = 0;
    for (;;) {
        ssize_t n = read(from, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) return 0;
        total += n;
        if (max > 0 && total > max) { *too_big = 1; return 0; }
        for (ssize_t w = 0; w < n;) {
            ssize_t k = write(to, buf + w, n - w);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) return -1;
            w += k;
        }
    }
}

static void make_parents(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash || slash == tmp) return;
    *slash = 0;
    mkdir_p(tmp, 0755);
}

static void run_file_op(msg_t *m) {
    int data = m->fds[0], st = m->fds[1];
    const char *path = field(m, "path");
    int too_big = 0;
    if (!path) { write_status(st, -1, 0, EINVAL); _exit(0); }
    if (m->op == OP_READ) {
        const char *mx = field(m, "max");
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0) { write_status(st, -1, 0, errno); _exit(0); }
        struct stat sb;
        if (fstat(fd, &sb) < 0 || S_ISDIR(sb.st_mode) || !S_ISREG(sb.st_mode)) {
            write_status(st, -1, 0, S_ISDIR(sb.st_mode) ? EISDIR : EINVAL);
            _exit(0);
        }
        int rc = copy_fd(fd, data, mx ? atoll(mx) : 0, &too_big);
        write_status(st, 0, 0, too_big ? EFBIG : rc < 0 ? errno : 0);
    } else {
        const char *mode_s = field(m, "mode");
        mode_t mode = mode_s ? (mode_t)strtol(mode_s, NULL, 8) : 0644;
        make_parents(path);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, mode);
        if (fd < 0) { write_status(st, -1, 0, errno); _exit(0); }
        lseek(data, 0, SEEK_SET);
        int rc = copy_fd(data, fd, 0, &too_big);
        int saved = errno;
        if (rc == 0 && mode_s && fchmod(fd, mode) < 0) { rc = -1; saved = errno; }
        if (close(fd) < 0 && rc == 0) { rc = -1; saved = errno; }
        write_status(st, 0, 0, rc < 0 ? saved : 0);
    }
    _exit(0);
}

/* Stop (or continue) every process of the sandbox but init, and wait until
 * the kernel reports them stopped, so a snapshot sees a quiet filesystem. */
static void signal_all(int sig, int st) {
    kill(-1, sig);
    if (sig == SIGSTOP) {
        for (int round = 0; round < 200; round++) {
            int running = 0;
            DIR *d = opendir("/proc");
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] < '0' || e->d_name[0] > '9' || strcmp(e->d_name, "1") == 0) continue;
                char state;
                int ppid;
                if (read_proc_stat(e->d_name, &state, &ppid) < 0) continue;
                if (state != 'T' && state != 't' && state != 'Z' && state != 'X') running++;
            }
            if (d) closedir(d);
            if (!running) break;
            kill(-1, SIGSTOP);
            usleep(500);
        }
    }
    write_status(st, 0, 0, 0);
}

/* ---------------------------------------------------------------- init */

static void init_loop(int sock) {
    static msg_t m;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    for (;;) {
        struct pollfd p[2] = {{sock, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) continue;
        if (p[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {}
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
        }
        if (!(p[0].revents)) continue;
        if (recv_msg(sock, &m) < 0) _exit(0); /* the daemon is gone */
        int need = m.op == OP_EXEC ? 4 : (m.op == OP_READ || m.op == OP_WRITE) ? 2 : 1;
        if (m.nfds < need) { close_fds(&m); continue; }
        if (m.op == OP_FREEZE || m.op == OP_THAW) {
            signal_all(m.op == OP_FREEZE ? SIGSTOP : SIGCONT, m.fds[0]);
            close_fds(&m);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(sock);
            close(sfd);
            sigprocmask(SIG_UNBLOCK, &chld, NULL);
            set_title(m.op == OP_EXEC ? "snapgym-exec" : "snapgym-file");
            if (m.op == OP_EXEC) run_reaper(&m);
            else run_file_op(&m);
            _exit(0);
        }
        if (pid < 0) write_status(m.fds[m.nfds - 1], -1, 0, errno);
        close_fds(&m);
    }
}

/* -------------------------------------------------------------- daemon */

static sandbox_t *find_sandbox(uint32_t id) {
    for (int i = 0; i < MAX_SANDBOXES; i++)
        if (sandboxes[i].used && sandboxes[i].id == id) return &sandboxes[i];
    return NULL;
}

static void stop_init(sandbox_t *s) {
    if (s->init_pid > 0) {
        kill(s->init_pid, SIGKILL);
        while (waitpid(s->init_pid, NULL, 0) < 0 && errno == EINTR) {}
        s->init_pid = 0;
    }
    if (s->sock >= 0) { close(s->sock); s->sock = -1; }
}

static int prepare_stage(sandbox_t *s, msg_t *cfg, char *err, size_t errlen) {
    const char *size = field(cfg, "tmpfs_bytes");
    char opts[256], p[4200];
    snprintf(opts, sizeof opts, "mode=0755,size=%s", size ? size : "1073741824");
    umount2(s->stage, MNT_DETACH);
    if (mkdir_p(s->stage, 0700) < 0 || mount("tmpfs", s->stage, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
        snprintf(err, errlen, "mount the writable layer at %s: %s", s->stage, strerror(errno));
        return -1;
    }
    const char *uid_s = field(cfg, "root_uid");
    uid_t root_uid = uid_s ? (uid_t)atol(uid_s) : 0;
    static const char *dirs[] = {"upper", "work", "root"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", s->stage, dirs[i]);
        if (mkdir(p, 0755) < 0 && errno != EEXIST) {
            snprintf(err, errlen, "create %s: %s", p, strerror(errno));
            return -1;
        }
    }
    snprintf(p, sizeof p, "%s/upper", s->stage);
    if (chown(p, root_uid, root_uid) < 0) {
        snprintf(err, errlen, "hand the writable layer to the sandbox's root: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static int write_id_maps(pid_t pid, msg_t *cfg) {
    char path[64];
    const char *uid_map = field(cfg, "uid_map"), *gid_map = field(cfg, "gid_map");
    if (!uid_map || !gid_map) { errno = EINVAL; return -1; }
    snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
    if (write_file_str(path, uid_map) < 0) return -1;
    snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
    return write_file_str(path, gid_map);
}

static int attach_cgroups(pid_t pid, msg_t *cfg, char *err, size_t errlen) {
    char text[32];
    snprintf(text, sizeof text, "%d\n", pid);
    for (uint32_t i = 0; i < cfg->nfields; i++) {
        if (strcmp(cfg->key[i], "cgroup") != 0) continue;
        if (write_file_str(cfg->val[i], text) < 0) {
            snprintf(err, errlen, "join cgroup %s: %s", cfg->val[i], strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Start a fresh init for the sandbox: new namespaces over the layers in cfg. */
static int start_init(sandbox_t *s, msg_t *cfg, char *err, size_t errlen) {
    if (prepare_stage(s, cfg, err, errlen) < 0) return -1;
    int sv[2], sy[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sy) < 0) {
        snprintf(err, errlen, "socketpair: %s", strerror(errno));
        return -1;
    }
    const char *net = field(cfg, "net");
    int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
    if (!net || strcmp(net, "host") != 0) flags |= CLONE_NEWNET;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid < 0) {
        snprintf(err, errlen, "clone new namespaces: %s", strerror(errno));
        close(sv[0]); close(sv[1]); close(sy[0]); close(sy[1]);
        return -1;
    }
    if (pid == 0) {
        close(sv[0]);
        close(sy[0]);
        close(control_fd);
        for (int i = 0; i < MAX_SANDBOXES; i++)
            if (sandboxes[i].used && sandboxes[i].sock >= 0) close(sandboxes[i].sock);
        sandbox_child(cfg, s->stage, sv[1], sy[1]);
        _exit(1);
    }
    close(sv[1]);
    close(sy[1]);
    s->init_pid = pid;
    s->sock = sv[0];
    char buf[4096];
    int rc = attach_cgroups(pid, cfg, err, errlen);
    if (rc == 0 && write(sy[0], "g", 1) != 1) rc = -1;
    ssize_t n = rc == 0 ? read(sy[0], buf, sizeof buf - 1) : -1;
    if (rc == 0 && n == 1 && buf[0] == 'u') {
        if (write_id_maps(pid, cfg) < 0) {
            snprintf(err, errlen, "write the sandbox's uid/gid map: %s", strerror(errno));
            rc = -1;
        } else if (write(sy[0], "m", 1) != 1) {
            rc = -1;
        } else {
            n = read(sy[0], buf, sizeof buf - 1);
        }
    }
    if (rc == 0 && !(n == 1 && buf[0] == 'r')) {
        if (n > 1 && buf[0] == 'e') { buf[n] = 0; snprintf(err, errlen, "%s", buf + 1); }
        else if (!*err) snprintf(err, errlen, "sandbox init exited during setup");
        rc = -1;
    }
    close(sy[0]);
    if (rc < 0) {
        stop_init(s);
        return -1;
    }
    return 0;
}

static void handle_control(msg_t *m) {
    char err[4096] = "";
    sandbox_t *s = find_sandbox(m->sbx);
    switch (m->op) {
    case OP_PING:
        reply(REPLY_OK, m->sbx, "pid=%d", s ? (int)s->init_pid : 0);
        break;
    case OP_CREATE:
        if (s) { reply(REPLY_ERR, m->sbx, "sandbox %u already exists", m->sbx); break; }
        for (int i = 0; i < MAX_SANDBOXES && !s; i++)
            if (!sandboxes[i].used) s = &sandboxes[i];
        if (!s) { reply(REPLY_ERR, m->sbx, "too many sandboxes in one daemon (%d)", MAX_SANDBOXES); break; }
        memset(s, 0, sizeof *s);
        s->used = 1;
        s->id = m->sbx;
        s->sock = -1;
        snprintf(s->stage, sizeof s->stage, "%s/%u", stage_root, m->sbx);
        /* fall through */
    case OP_RESTORE:
        if (!s) { reply(REPLY_ERR, m->sbx, "no sandbox %u", m->sbx); break; }
        stop_init(s);
        if (start_init(s, m, err, sizeof err) < 0) {
            umount2(s->stage, MNT_DETACH);
            rmdir(s->stage);
            s->used = 0;
            reply(REPLY_ERR, m->sbx, "%s", err);
        } else {
            reply(REPLY_OK, m->sbx, "pid=%d", (int)s->init_pid);
        }
        break;
    case OP_CLOSE:
        if (s) {
            stop_init(s);
            umount2(s->stage, MNT_DETACH);
            rmdir(s->stage);
            s->used = 0;
        }
        reply(REPLY_OK, m->sbx, "pid=0");
        break;
    default:
        reply(REPLY_ERR, m->sbx, "unknown operation %u", m->op);
        break;
    }
}

/* Forward a request packet unchanged to the sandbox's init, with its fds. */
static void forward(uint32_t sbx, const char *raw, size_t len, msg_t *m) {
    sandbox_t *s = find_sandbox(sbx);
    if (s && s->init_pid > 0 && s->sock >= 0) send_raw(s->sock, raw, len, m->fds, m->nfds);
    close_fds(m);
}

static void reap_children(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_SANDBOXES; i++) {
            if (sandboxes[i].used && sandboxes[i].init_pid == pid) {
                sandboxes[i].init_pid = 0;
                if (sandboxes[i].sock >= 0) { close(sandboxes[i].sock); sandboxes[i].sock = -1; }
            }
        }
    }
}

static void shutdown_all(void) {
    for (int i = 0; i < MAX_SANDBOXES; i++) {
        if (!sandboxes[i].used) continue;
        stop_init(&sandboxes[i]);
        umount2(sandboxes[i].stage, MNT_DETACH);
        rmdir(sandboxes[i].stage);
    }
}

static int enter_own_user_namespace(void) {
    uid_t uid = geteuid();
    gid_t gid = getegid();
    char map[64];
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0) return -1;
    if (write_file_str("/proc/self/setgroups", "deny") < 0) return -1;
    snprintf(map, sizeof map, "0 %u 1", uid);
    if (write_file_str("/proc/self/uid_map", map) < 0) return -1;
    snprintf(map, sizeof map, "0 %u 1", gid);
    return write_file_str("/proc/self/gid_map", map);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s root|user STAGE_DIR CONTROL_FD\n", argv[0]);
        return 2;
    }
    control_fd = atoi(argv[3]);
    title_start = argv[0];
    title_len = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) - argv[0]);
    user_mode = strcmp(argv[1], "user") == 0;
    snprintf(stage_root, sizeof stage_root, "%s", argv[2]);
    msgbuf = malloc(MAX_MSG + 16);
    if (!msgbuf) return 1;
    signal(SIGPIPE, SIG_IGN);

    int rc = user_mode ? enter_own_user_namespace() : unshare(CLONE_NEWNS);
    if (rc < 0) {
        fprintf(stderr, "snapgym-sandboxd: cannot create %s: %s\n",
                user_mode ? "a user namespace" : "a mount namespace", strerror(errno));
        return 3;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        fprintf(stderr, "snapgym-sandboxd: make mounts private: %s\n", strerror(errno));
        return 3;
    }
    if (mount("tmpfs", stage_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4k") < 0) {
        fprintf(stderr, "snapgym-sandboxd: mount %s: %s\n", stage_root, strerror(errno));
        return 3;
    }
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    static msg_t m;
    for (;;) {
        struct pollfd p[2] = {{control_fd, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) continue;
        if (p[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {}
            reap_children();
        }
        if (!p[0].revents) continue;
        if (recv_msg(control_fd, &m) < 0) break; /* the host process is gone */
        switch (m.op) {
        case OP_EXEC: case OP_READ: case OP_WRITE: case OP_FREEZE: case OP_THAW: {
            /* recv_msg rewrote the packet in place; rebuild it for the init. */
            static char raw[MAX_MSG + 16];
            uint32_t h[3] = {m.op, m.sbx, m.nfields};
            size_t off = 12;
            memcpy(raw, h, 12);
            for (uint32_t i = 0; i < m.nfields; i++) {
                size_t klen = strlen(m.key[i]), vlen = strlen(m.val[i]);
                uint32_t len = klen + 1 + vlen;
                if (off + 4 + len > sizeof raw) break;
                memcpy(raw + off, &len, 4);
                memcpy(raw + off + 4, m.key[i], klen);
                raw[off + 4 + klen] = '=';
                memcpy(raw + off + 5 + klen, m.val[i], vlen);
                off += 4 + len;
            }
            forward(m.sbx, raw, off, &m);
            break;
        }
        default:
            close_fds(&m);
            handle_control(&m);
        }
    }
    shutdown_all();
    return 0;
}
