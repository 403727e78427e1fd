/*
 * One instance of a sandbox, from its clone to its discard: the writable layer
 * (a tmpfs at its stage), its cgroups (created beside the others,
 * <sandbox>-i<N>, limits applied, or a dead instance's proven clean: cgpool.c),
 * a network namespace handed to it (nets.c), and its init's setup handshake
 * with the keeper (the id maps are written from here). What a dead instance
 * leaves (its tmpfs, mount namespace, cgroups) goes to the janitor.
 * The keeper (keeper.c) decides which instance is current, spare or dying.
 */
#include "keeper.h"

void instance_reset(instance_t *in) {
    memset(in, 0, sizeof *in);
    in->sock = in->sync = in->net_fd = -1;
}

/* ------------------------------------------------------------- cgroups */

/* The instance's own cgroup in each of the sandbox's hierarchies: "cgroup" fields name
 * the path it starts with, and the suffix follows a dash (no cgroup per sandbox above
 * the instances: each memory cgroup costs kernel memory per superblock on the machine).
 * The limits of the "cgset" fields (FILE\tVALUE) are written where that file exists. */
void drop_cgroup(const char *dir) { janitor_send('R', dir, -1); }

/* 1: a proven-clean set of a dead instance's (cgpool.c), its limits set; 0: created here. */
int cgroups_create(msg_t *cfg, const char *suffix, char dirs[][512], int *n) {
    *n = 0;
    if (cgpool_take(cfg, dirs, n, drop_cgroup)) return 1;
    for (uint32_t i = 0; i < cfg->nfields && *n < 4; i++) {
        if (strcmp(cfg->key[i], "cgroup") != 0) continue;
        char *dir = dirs[(*n)++];
        snprintf(dir, 512, "%s-%s", cfg->val[i], suffix);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) continue; /* joining it fails, and says why */
        for (uint32_t j = 0; j < cfg->nfields; j++) {
            if (strcmp(cfg->key[j], "cgset") != 0) continue;
            char spec[256], path[800];
            snprintf(spec, sizeof spec, "%s", cfg->val[j]);
            char *value = strchr(spec, '\t');
            if (!value) continue;
            *value++ = 0;
            snprintf(path, sizeof path, "%s/%s", dir, spec);
            if (access(path, W_OK) == 0) write_file_str(path, value);
        }
    }
    return 0;
}

/* Has the kernel's OOM killer struck in one of these cgroups since `base` (the count a reused set
 * started with)? (v1: memory.oom_control, v2: memory.events) */
int cgroups_oom_killed(char dirs[][512], int n, long base) {
    return cgpool_oom_kills(dirs, n) > base;
}

/* A dead instance's cgroups go to the pool of emptied ones (proven before reuse), else away. */
void cgroups_remove(char dirs[][512], int *n) {
    if (!cgpool_give(dirs, *n))
        for (int i = 0; i < *n; i++) janitor_send('R', dirs[i], -1);
    *n = 0;
}

/* ----------------------------------------------------------- instances */

static int prepare_stage(msg_t *cfg, const char *stage, char *err, size_t errlen) {
    const char *size = field(cfg, "tmpfs_bytes");
    const char *uid_s = field(cfg, "root_uid");
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

/* Wait until a killed init is gone: then so is every process of its PID namespace. */
void instance_wait_gone(pid_t pid) {
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
}

/* An fd on an instance's mount namespace: while we hold it, the instance's
 * processes die without tearing the namespace down (the janitor does, later). */
int instance_hold_mount_ns(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)pid);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Kill an instance, wait until its processes are gone, and leave its tmpfs,
 * mount namespace and cgroups to the janitor. keep_stage: the writable layer
 * stays mounted. held: its mount namespace, if the caller opened it before the
 * kill (-1: opened here; -2: not held, torn down before this returns). */
void instance_discard_held(instance_t *in, int keep_stage, int held) {
    if (in->pid > 0) {
        if (held == -1) held = instance_hold_mount_ns(in->pid);
        kill(in->pid, SIGKILL);
        instance_wait_gone(in->pid);
    }
    if (held >= 0) janitor_send('N', "", held);
    if (in->sock >= 0) close(in->sock);
    if (in->sync >= 0) close(in->sync);
    if (in->net_fd >= 0) close(in->net_fd);
    in->pid = 0;
    in->sock = in->sync = in->net_fd = -1;
    in->state = NONE;
    cgroups_remove(in->cgroups, &in->ncgroups);
    if (keep_stage) return;
    if (in->stage[0]) janitor_send('U', in->stage, -1);
    instance_reset(in);
}

void instance_discard(instance_t *in) { instance_discard_held(in, 0, -1); }

int is_host_net(msg_t *cfg) {
    const char *net = field(cfg, "net");
    return net && strcmp(net, "host") == 0;
}

/* Clone a new init over cfg's layers, its writable layer mounted at `stage` and its cgroups named
 * with `suffix`; setup continues in the child, which first closes the keeper's `inherited` fds. */
int instance_begin(instance_t *in, msg_t *cfg, const char *stage, const char *suffix, const int *inherited,
                   int ninherited, char *err, size_t errlen) {
    instance_reset(in);
    snprintf(in->stage, sizeof in->stage, "%s", stage);
    if (prepare_stage(cfg, in->stage, err, errlen) < 0) return -1;
    in->reused_cgroup = cgroups_create(cfg, suffix, in->cgroups, &in->ncgroups);
    in->oom_base = in->reused_cgroup ? cgpool_oom_kills(in->cgroups, in->ncgroups) : 0;
    memcpy(launch.cgroups, in->cgroups, sizeof launch.cgroups);
    launch.ncgroups = in->ncgroups;
    if (!is_host_net(cfg)) in->net_fd = nets_take(&in->reused_netns); /* instead of a new one */
    launch.net_fd = in->net_fd;
    int sv[2], sy[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) goto sockfail;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sy) < 0) { close(sv[0]); close(sv[1]); goto sockfail; }
    int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
    if (!is_host_net(cfg) && launch.net_fd < 0) flags |= CLONE_NEWNET;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid < 0) {
        snprintf(err, errlen, "clone new namespaces: %s", strerror(errno));
        close(sv[0]); close(sv[1]); close(sy[0]); close(sy[1]);
        return -1;
    }
    if (pid == 0) {
        for (int i = 0; i < ninherited; i++)
            if (inherited[i] >= 0) close(inherited[i]);
        close(sv[0]);
        close(sy[0]);
        janitor_forget();
        nets_forget();
        sandbox_child(cfg, in->stage, sv[1], sy[1]);
    }
    close(sv[1]);
    close(sy[1]);
    launch.net_fd = -1;
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

static int write_id_maps(msg_t *cfg, pid_t pid) {
    char path[64];
    const char *uid_map = field(cfg, "uid_map"), *gid_map = field(cfg, "gid_map");
    if (!uid_map || !gid_map) { errno = EINVAL; return -1; }
    snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
    if (write_file_str(path, uid_map) < 0) return -1;
    snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
    return write_file_str(path, gid_map);
}

/* Take the next step of an instance's setup handshake: 1 ready, 0 not yet, -1 failed. */
int instance_advance(instance_t *in, msg_t *cfg, char *err, size_t errlen) {
    char buf[4096];
    ssize_t n;
    do n = read(in->sync, buf, sizeof buf - 1); while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN) return 0;
    if (n == 1 && buf[0] == 'u' && in->state == STARTING) {
        if (write_id_maps(cfg, in->pid) < 0) {
            snprintf(err, errlen, "write the sandbox's uid/gid map: %s", strerror(errno));
            return -1;
        }
        in->state = MAPPED;
        if (in->net_fd >= 0) { /* it has joined the namespace by now */
            close(in->net_fd);
            in->net_fd = -1;
        }
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

/* Take the setup steps until the instance is ready (1) or failed (-1). */
int instance_wait_ready(instance_t *in, msg_t *cfg, char *err, size_t errlen) {
    int rc;
    while ((rc = instance_advance(in, cfg, err, errlen)) == 0) {}
    return rc;
}
