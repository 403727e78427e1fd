/*
 * The keeper of one sandbox: it joins the sandbox's cgroups once, starts its
 * init, forwards requests to it, and restores it.
 *
 * A restore hands over to a spare init that was set up ahead of time over the
 * same layers (new namespaces, fresh writable tmpfs, same cgroups), so the
 * slow part of a restore, creating namespaces and mounts, runs while the agent
 * is still busy with the previous episode. Children inherit the keeper's
 * cgroups, so no restore writes to cgroup.procs (slow on cgroup v1).
 */
#include "sandboxd.h"

enum { NONE = 0, STARTING, MAPPED, READY };

typedef struct {
    int state;
    pid_t pid;
    int sock; /* to the init */
    int sync; /* setup handshake, until READY */
    char stage[4096];
} instance_t;

static instance_t current, spare;
static msg_t *config; /* the layers and settings the sandbox runs with */
static uint32_t sandbox_id, generation;
static const char *stages;
static int daemon_sock = -1, signal_fd = -1;

static int prepare_stage(const char *stage, char *err, size_t errlen) {
    const char *size = field(config, "tmpfs_bytes");
    const char *uid_s = field(config, "root_uid");
    uid_t root_uid = uid_s ? (uid_t)atol(uid_s) : 0;
    char opts[256], p[4200];
    snprintf(opts, sizeof opts, "mode=0755,size=%s", size ? size : "1073741824");
    if (mkdir_p(stage, 0700) < 0 || mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
        snprintf(err, errlen, "mount the writable layer at %s: %s", stage, strerror(errno));
        return -1;
    }
    static const char *dirs[] = {"upper", "work", "root"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", stage, dirs[i]);
        if (mkdir(p, 0755) < 0 && errno != EEXIST) {
            snprintf(err, errlen, "create %s: %s", p, strerror(errno));
            return -1;
        }
    }
    snprintf(p, sizeof p, "%s/upper", stage);
    if (chown(p, root_uid, root_uid) < 0) {
        snprintf(err, errlen, "hand the writable layer to the sandbox's root: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static void discard(instance_t *in) {
    if (in->pid > 0) kill(in->pid, SIGKILL); /* reaped later, through SIGCHLD */
    if (in->sock >= 0) close(in->sock);
    if (in->sync >= 0) close(in->sync);
    if (in->stage[0]) {
        umount2(in->stage, MNT_DETACH);
        rmdir(in->stage);
    }
    memset(in, 0, sizeof *in);
    in->sock = in->sync = -1;
}

/* Clone a new init over the configured layers; setup continues in the child. */
static int begin(instance_t *in, char *err, size_t errlen) {
    memset(in, 0, sizeof *in);
    in->sock = in->sync = -1;
    snprintf(in->stage, sizeof in->stage, "%s/%u.%u", stages, sandbox_id, ++generation);
    if (prepare_stage(in->stage, err, errlen) < 0) return -1;
    int sv[2], sy[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) goto sockfail;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sy) < 0) { close(sv[0]); close(sv[1]); goto sockfail; }
    const char *net = field(config, "net");
    int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
    if (!net || strcmp(net, "host") != 0) flags |= CLONE_NEWNET;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid < 0) {
        snprintf(err, errlen, "clone new namespaces: %s", strerror(errno));
        close(sv[0]); close(sv[1]); close(sy[0]); close(sy[1]);
        return -1;
    }
    if (pid == 0) {
        int inherited[] = {daemon_sock, control_fd, signal_fd, current.sock, current.sync, spare.sock, spare.sync,
                      sv[0], sy[0]};
        for (size_t i = 0; i < sizeof inherited / sizeof *inherited; i++)
            if (inherited[i] >= 0) close(inherited[i]);
        sandbox_child(config, in->stage, sv[1], sy[1]);
    }
    close(sv[1]);
    close(sy[1]);
    in->pid = pid;
    in->sock = sv[0];
    in->sync = sy[0];
    in->state = STARTING;
    if (write(in->sync, "g", 1) != 1) {
        snprintf(err, errlen, "sandbox init exited at start");
        return -1;
    }
    return 0;
sockfail:
    snprintf(err, errlen, "socketpair: %s", strerror(errno));
    return -1;
}

static int write_id_maps(pid_t pid) {
    char path[64];
    const char *uid_map = field(config, "uid_map"), *gid_map = field(config, "gid_map");
    if (!uid_map || !gid_map) { errno = EINVAL; return -1; }
    snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
    if (write_file_str(path, uid_map) < 0) return -1;
    snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
    return write_file_str(path, gid_map);
}

/* Take the next step of an instance's setup handshake: 1 ready, 0 not yet, -1 failed. */
static int advance(instance_t *in, char *err, size_t errlen) {
    char buf[4096];
    ssize_t n;
    do n = read(in->sync, buf, sizeof buf - 1); while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN) return 0;
    if (n == 1 && buf[0] == 'u' && in->state == STARTING) {
        if (write_id_maps(in->pid) < 0) {
            snprintf(err, errlen, "write the sandbox's uid/gid map: %s", strerror(errno));
            return -1;
        }
        in->state = MAPPED;
        return write(in->sync, "m", 1) == 1 ? 0 : -1;
    }
    if (n == 1 && buf[0] == 'r' && in->state == MAPPED) {
        close(in->sync);
        in->sync = -1;
        in->state = READY;
        return 1;
    }
    if (n > 1 && buf[0] == 'e') {
        buf[n] = 0;
        snprintf(err, errlen, "%s", buf + 1);
    } else {
        snprintf(err, errlen, "sandbox init exited during setup");
    }
    return -1;
}

static int wait_ready(instance_t *in, char *err, size_t errlen) {
    int rc;
    while ((rc = advance(in, err, errlen)) == 0) {}
    return rc;
}

static int start_spare(void) {
    const char *want = field(config, "spare");
    if (!want || strcmp(want, "1") != 0) return 0;
    char err[4096];
    if (begin(&spare, err, sizeof err) < 0) {
        discard(&spare);
        return -1;
    }
    fcntl(spare.sync, F_SETFL, O_NONBLOCK);
    return 0;
}

static void reply_started(uint32_t seq) {
    reply(REPLY_OK, sandbox_id, seq, "pid=%d\nstage=%s", (int)current.pid, current.stage);
}

/* Same layers and settings as now? The header (with its sequence) is not compared. */
static int same_config(msg_t *m) {
    return m->rawlen == config->rawlen && memcmp(m->raw + HDR_SIZE, config->raw + HDR_SIZE, m->rawlen - HDR_SIZE) == 0;
}

static void adopt_config(msg_t *m) {
    memcpy(config->raw, m->raw, m->rawlen);
    config->rawlen = m->rawlen;
    parse_msg(config, config->raw, config->rawlen);
}

static void restore(msg_t *m) {
    char err[4096] = "";
    discard(&current);
    if (!same_config(m)) {
        discard(&spare);
        adopt_config(m);
    }
    int rc = -1;
    if (spare.state != NONE) {
        fcntl(spare.sync, F_SETFL, 0);
        if (spare.state == READY || wait_ready(&spare, err, sizeof err) == 1) {
            current = spare;
            memset(&spare, 0, sizeof spare);
            spare.sock = spare.sync = -1;
            rc = 0;
        } else {
            discard(&spare);
        }
    }
    if (rc < 0) {
        err[0] = 0;
        rc = begin(&current, err, sizeof err);
        if (rc == 0) rc = wait_ready(&current, err, sizeof err) == 1 ? 0 : -1;
        if (rc < 0) discard(&current);
    }
    if (rc < 0) reply(REPLY_ERR, sandbox_id, m->seq, "%s", err);
    else reply_started(m->seq);
    start_spare();
}

static void join_cgroups(char *err, size_t errlen) {
    char text[32];
    snprintf(text, sizeof text, "%d\n", getpid());
    for (uint32_t i = 0; i < config->nfields; i++) {
        if (strcmp(config->key[i], "cgroup") != 0) continue;
        if (write_file_str(config->val[i], text) < 0 && !*err)
            snprintf(err, errlen, "join cgroup %s: %s", config->val[i], strerror(errno));
    }
    /* The keeper shares the sandbox's memory cgroup; the OOM killer must pick
     * the sandbox's processes, never the keeper. Needs root; harmless if refused. */
    write_file_str("/proc/self/oom_score_adj", "-1000");
}

static void shutdown_and_exit(int code) {
    discard(&current);
    discard(&spare);
    _exit(code);
}

static void serve(msg_t *m) {
    switch (m->op) {
    case OP_PING:
        reply(REPLY_OK, sandbox_id, m->seq, "pid=%d", current.state == READY ? (int)current.pid : 0);
        break;
    case OP_RESTORE:
        close_fds(m);
        restore(m);
        break;
    case OP_CLOSE:
        close_fds(m);
        discard(&current);
        discard(&spare);
        reply(REPLY_OK, sandbox_id, m->seq, "pid=0");
        _exit(0);
    case OP_EXEC: case OP_READ: case OP_WRITE: case OP_FREEZE: case OP_THAW:
        if (current.state == READY) forward_msg(current.sock, m); /* the init answers on the fds */
        else close_fds(m);
        break;
    default:
        close_fds(m);
        reply(REPLY_ERR, sandbox_id, m->seq, "unknown operation %u", m->op);
    }
}

static void reap(void) {
    pid_t pid;
    while ((pid = waitpid(-1, NULL, WNOHANG)) > 0) {
        if (pid == current.pid) { /* died on its own (OOM, killed from the host) */
            close(current.sock);
            current.sock = -1;
            current.pid = 0;
            current.state = NONE;
        }
        if (pid == spare.pid) discard(&spare);
    }
}

void keeper_main(msg_t *create, const char *stage_root, int sock) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    set_title("snapgym-keeper");
    daemon_sock = sock;
    stages = stage_root;
    sandbox_id = create->sbx;
    current.sock = current.sync = spare.sock = spare.sync = -1;
    config = msg_new();
    msg_t *m = msg_new();
    if (!config || !m) _exit(1);
    adopt_config(create);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    signal_fd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);

    char err[4096] = "";
    join_cgroups(err, sizeof err);
    if (!*err && begin(&current, err, sizeof err) == 0 && wait_ready(&current, err, sizeof err) == 1) {
        reply_started(create->seq);
    } else {
        reply(REPLY_ERR, sandbox_id, create->seq, "%s", *err ? err : "sandbox setup failed");
        shutdown_and_exit(1);
    }
    start_spare();
    for (;;) {
        struct pollfd p[3] = {{daemon_sock, POLLIN, 0}, {signal_fd, POLLIN, 0}, {spare.sync, POLLIN, 0}};
        if (poll(p, spare.sync >= 0 ? 3 : 2, -1) < 0) continue;
        if (p[1].revents) {
            struct signalfd_siginfo si;
            while (read(signal_fd, &si, sizeof si) > 0) {}
            reap();
        }
        if (spare.sync >= 0 && p[2].revents && advance(&spare, err, sizeof err) < 0) discard(&spare);
        if (p[0].revents) {
            if (recv_msg(daemon_sock, m) < 0) shutdown_and_exit(0); /* the daemon is gone */
            serve(m);
        }
    }
}
