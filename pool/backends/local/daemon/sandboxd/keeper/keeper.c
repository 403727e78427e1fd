/*
 * The keeper of one sandbox: it starts the sandbox's inits, forwards requests
 * to the current one, restores it, and seals it for the verifier.
 *
 * An instance is one init in its own namespaces over the snapshot's layers,
 * with a fresh writable tmpfs and cgroups of its own (created per instance
 * beside the others, <sandbox>-i<N>, limits applied, or a dead instance's proven
 * clean: cgpool.c), so nothing of one episode (its page cache, tmpfs pages, dying
 * processes, PIDs) counts against the next.
 *
 * A restore hands over to a spare instance that was set up ahead of time, so
 * the slow part, creating namespaces and mounts, runs while the agent is still
 * busy with the previous episode. The old instance is killed first and
 * restore() answers once the spare has taken over; the old processes finish
 * dying off the request path (the death of a PID namespace's init means all of
 * its processes are gone), and are waited for by the next restore or close if
 * they are not gone by then. Unmounting its tmpfs and removing its cgroups
 * (seconds after a million small files) is left to a janitor process.
 *
 * Sealing (OP_SEAL) ends the agent's turn; see pool/verification/plan.py:
 *   strict  the agent's instance is killed, its writable layer kept, and a new
 *           instance (verifier/graft.c) becomes current for the verifier;
 *   shared  the agent's instance lives on; the verifier's commands go through
 *           verifier/shared.c's mount namespace, started from here.
 * The next restore ends the seal.
 */
#include "sandboxd.h"

enum { NONE = 0, STARTING, MAPPED, READY };
enum { UNSEALED = 0, SEALED_STRICT, SEALED_SHARED };

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

static instance_t current, spare, sealed; /* sealed: the dead agent whose layer a strict verifier reads */
/* The instance a restore killed: it dies off the request path (see restore()); held: its mount
 * namespace, net: its network namespace, kept until it is gone. */
static instance_t dying;
static int dying_held = -1, dying_net = -1;
static msg_t *config; /* the layers and settings the sandbox runs with */
static uint32_t sandbox_id, generation;
static const char *stages;
static int daemon_sock = -1, signal_fd = -1;
static int seal_mode = UNSEALED;
static int shared_ns[6] = {-1, -1, -1, -1, -1, -1}; /* verifier's mnt; the sandbox's pid net ipc uts user */
static char shared_cgroups[4][512];
static int shared_ncgroups;

static void instance_reset(instance_t *in) {
    memset(in, 0, sizeof *in);
    in->sock = in->sync = in->net_fd = -1;
}

/* ------------------------------------------------------------- cgroups */

/* The instance's own cgroup in each of the sandbox's hierarchies: "cgroup" fields name
 * the path it starts with, and the suffix follows a dash (no cgroup per sandbox above
 * the instances: each memory cgroup costs kernel memory per superblock on the machine).
 * The limits of the "cgset" fields (FILE\tVALUE) are written where that file exists. */
static void drop_cgroup(const char *dir) { janitor_send('R', dir, -1); }

/* 1: a proven-clean set of a dead instance's (cgpool.c), its limits set; 0: created here. */
static int cgroups_create(msg_t *cfg, const char *suffix, char dirs[][512], int *n) {
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
static int cgroups_oom_killed(char dirs[][512], int n, long base) {
    return cgpool_oom_kills(dirs, n) > base;
}

/* A dead instance's cgroups go to the pool of emptied ones (proven before reuse), else away. */
static void cgroups_remove(char dirs[][512], int *n) {
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
static void wait_gone(pid_t pid) {
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
}

/* An fd on an instance's mount namespace: while we hold it, the instance's
 * processes die without tearing the namespace down (the janitor does, later). */
static int hold_mount_ns(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)pid);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Kill an instance, wait until its processes are gone, and leave its tmpfs,
 * mount namespace and cgroups to the janitor. keep_stage: the writable layer
 * stays mounted. held: its mount namespace, if the caller opened it before the
 * kill (-1: opened here; -2: not held, torn down before this returns). */
static void discard_held(instance_t *in, int keep_stage, int held) {
    if (in->pid > 0) {
        if (held == -1) held = hold_mount_ns(in->pid);
        kill(in->pid, SIGKILL);
        wait_gone(in->pid);
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

static void discard_keep(instance_t *in, int keep_stage) { discard_held(in, keep_stage, -1); }

static void discard(instance_t *in) { discard_keep(in, 0); }

static int is_host_net(msg_t *cfg) {
    const char *net = field(cfg, "net");
    return net && strcmp(net, "host") == 0;
}

/* Clone a new init over cfg's layers; setup continues in the child. */
static int begin(instance_t *in, msg_t *cfg, char *err, size_t errlen) {
    instance_reset(in);
    ++generation;
    snprintf(in->stage, sizeof in->stage, "%s/%u.%u", stages, sandbox_id, generation);
    if (prepare_stage(cfg, in->stage, err, errlen) < 0) return -1;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "i%u", generation);
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
        int inherited[] = {daemon_sock, control_fd, signal_fd, current.sock, current.sync,
                           spare.sock, spare.sync, dying.sock, dying.sync, dying_held, dying_net, sv[0], sy[0]};
        for (size_t i = 0; i < sizeof inherited / sizeof *inherited; i++)
            if (inherited[i] >= 0) close(inherited[i]);
        for (int i = 0; i < 6; i++)
            if (shared_ns[i] >= 0) close(shared_ns[i]);
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

static int wait_ready(instance_t *in, char *err, size_t errlen) {
    int rc;
    while ((rc = advance(in, err, errlen)) == 0) {}
    return rc;
}

static int start_spare(void) {
    const char *want = field(config, "spare");
    if (!want || strcmp(want, "1") != 0) return 0;
    char err[4096];
    if (begin(&spare, config, err, sizeof err) < 0) {
        discard(&spare);
        return -1;
    }
    fcntl(spare.sync, F_SETFL, O_NONBLOCK);
    return 0;
}

static void reply_started(uint32_t seq, const char *extra) {
    reply(REPLY_OK, sandbox_id, seq, "pid=%d\nstage=%s\nkeeper=%d\nreused_cgroup=%d\nreused_netns=%d%s",
          (int)current.pid, current.stage, (int)getpid(), current.reused_cgroup, current.reused_netns, extra);
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

/* ---------------------------------------------------------------- seals */

static void unseal(void) {
    if (seal_mode == SEALED_STRICT) discard(&sealed);
    for (int i = 0; i < 6; i++) {
        if (shared_ns[i] >= 0) close(shared_ns[i]);
        shared_ns[i] = -1;
    }
    cgroups_remove(shared_cgroups, &shared_ncgroups);
    seal_mode = UNSEALED;
}

/* The report verifier/graft.c left in the verifier's stage, as reply fields. */
static void read_report(const char *stage, char *out, size_t outlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s/report", stage);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t used = 0;
    char line[8192];
    while (fgets(line, sizeof line, f) && used + strlen(line) + 2 < outlen) used += snprintf(out + used, outlen - used, "\n%.*s", (int)strcspn(line, "\n"), line);
    fclose(f);
}

/* Graft the verifier's filesystem onto the current instance, in a helper. */
static int graft(msg_t *m, char *err, size_t errlen) {
    int fail[2];
    if (pipe2(fail, O_CLOEXEC) < 0) return snprintf(err, errlen, "pipe: %s", strerror(errno)), -1;
    pid_t helper = fork();
    if (helper == 0) {
        close(fail[0]);
        graft_verifier(m, current.pid, current.stage, fail[1]);
    }
    close(fail[1]);
    char text[4096];
    ssize_t n = helper > 0 ? read_all(fail[0], text, sizeof text - 1) : -1;
    close(fail[0]);
    int status = -1;
    if (helper > 0) while (waitpid(helper, &status, 0) < 0 && errno == EINTR) {}
    if (helper > 0 && n == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    text[n > 1 ? n : 0] = 0;
    snprintf(err, errlen, "%s", n > 1 ? text + 1 : "the verifier's filesystem could not be prepared");
    return -1;
}

/* Same "lower" fields (layers) in both messages? */
static int same_layers(msg_t *a, msg_t *b) {
    char *la[512], *lb[512];
    int na = fields_of(a, "lower", la, 512), nb = fields_of(b, "lower", lb, 512);
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (strcmp(la[i], lb[i]) != 0) return 0;
    return 1;
}

/* Make the next instance current: the spare when there is one and it may serve (use_spare),
 * else a new one over cfg, waited for. 0, or -1 with err set and nothing left half-started. */
static int next_instance(msg_t *cfg, int use_spare, char *err, size_t errlen) {
    if (spare.state != NONE && use_spare) {
        fcntl(spare.sync, F_SETFL, 0);
        if (spare.state == READY || wait_ready(&spare, err, errlen) == 1) {
            current = spare;
            instance_reset(&spare);
            return 0;
        }
        discard(&spare);
    }
    err[0] = 0;
    int rc = begin(&current, cfg, err, errlen);
    if (rc == 0) rc = wait_ready(&current, err, errlen) == 1 ? 0 : -1;
    if (rc < 0) discard(&current);
    return rc;
}

/* The verifier takes the spare, a fresh instance at the known-good snapshot (a new one
 * when the episode started from a checkpoint); the agent's mount namespace is torn down
 * before the grafts use its writable layer as a lower layer, and its network namespace,
 * if the agent left it empty, goes to the next spare. */
static void seal_strict(msg_t *m) {
    char err[4096] = "", report[6144], path[64];
    sealed = current; /* its writable layer stays mounted for the verifier */
    instance_reset(&current);
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)sealed.pid);
    int net = sealed.pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    discard_held(&sealed, 1, -2);
    seal_mode = SEALED_STRICT;
    snprintf(launch.agent_upper, sizeof launch.agent_upper, "%s/upper", sealed.stage);
    int rc = next_instance(m, same_layers(m, config), err, sizeof err);
    if (rc == 0) rc = graft(m, err, sizeof err);
    if (rc == 0) {
        read_report(current.stage, report, sizeof report);
        reply_started(m->seq, report);
    } else {
        discard(&current);
        reply(REPLY_ERR, sandbox_id, m->seq, "start the verifier: %s", err);
    }
    nets_recycle(net);
    start_spare();
}

static void seal_shared(msg_t *m) {
    char err[4096] = "", path[64];
    int ready[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ready) < 0) {
        reply(REPLY_ERR, sandbox_id, m->seq, "socketpair: %s", strerror(errno));
        return;
    }
    pid_t builder = fork();
    if (builder == 0) {
        close(ready[0]);
        set_failure_fd(ready[1]); /* child_fail's "e<message>" goes to the keeper */
        char msg[4200] = "r";
        if (shared_view_build(m, current.pid, current.stage, err, sizeof err) < 0) snprintf(msg, sizeof msg, "e%s", err);
        if (write(ready[1], msg, strlen(msg)) < 0) {}
        char done;
        if (read(ready[1], &done, 1) < 0) {} /* the keeper has taken the namespace */
        _exit(0);
    }
    close(ready[1]);
    char answer[4200];
    ssize_t n = builder > 0 ? read(ready[0], answer, sizeof answer - 1) : -1;
    answer[n > 0 ? n : 0] = 0;
    if (n > 0 && answer[0] == 'r') {
        snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)builder);
        shared_ns[0] = open(path, O_RDONLY | O_CLOEXEC);
    }
    close(ready[0]); /* lets the builder go */
    if (builder > 0) wait_gone(builder);
    static const char *kinds[] = {"pid", "net", "ipc", "uts", "user"};
    for (int i = 0; shared_ns[0] >= 0 && i < 5; i++) {
        snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)current.pid, kinds[i]);
        shared_ns[i + 1] = open(path, O_RDONLY | O_CLOEXEC);
    }
    seal_mode = SEALED_SHARED;
    for (int i = 0; i < 6; i++) {
        if (shared_ns[i] >= 0) continue;
        reply(REPLY_ERR, sandbox_id, m->seq, "prepare the shared verifier: %s",
              answer[0] == 'e' ? answer + 1 : "its namespaces are gone");
        return;
    }
    char suffix[32], report[6144];
    snprintf(suffix, sizeof suffix, "v%u", generation);
    cgroups_create(config, suffix, shared_cgroups, &shared_ncgroups);
    read_report(current.stage, report, sizeof report);
    reply_started(m->seq, report);
}

static void seal(msg_t *m) {
    const char *mode = field(m, "seal");
    /* A strict verifier needs only the agent's files: an init the agent's own memory use killed still gets one. */
    int usable = current.state == READY || (current.died_of_oom && current.stage[0] && mode && strcmp(mode, "strict") == 0);
    if (seal_mode != UNSEALED || !usable || !mode) {
        reply(REPLY_ERR, sandbox_id, m->seq, "%s", seal_mode != UNSEALED ? "the sandbox is sealed already; restore it first"
                                                   : !mode ? "no seal mode"
                                                   : current.died_of_oom ? "out of memory: the agent's processes used up the sandbox's memory and its init died"
                                                   : "the sandbox is not running; restore it first");
        return;
    }
    if (strcmp(mode, "strict") == 0) seal_strict(m);
    else if (strcmp(mode, "shared") == 0) seal_shared(m);
    else reply(REPLY_ERR, sandbox_id, m->seq, "unknown seal mode %s", mode);
}

/* A shared verifier's command starts from here, outside the agent's processes. */
static void shared_run(msg_t *m) {
    pid_t pid = fork();
    if (pid == 0) {
        close(daemon_sock);
        close(signal_fd);
        unblock_signals();
        shared_exec(m, config, shared_ns, shared_cgroups, shared_ncgroups);
    }
    if (pid < 0) write_status(m->fds[m->nfds - 1], -2, 0, errno);
    close_fds(m);
}

/* ------------------------------------------------------------- restore */


/* Wait until the instance a restore killed is gone (so is every process of it: they died with
 * its PID namespace's init) and leave its tmpfs, mount namespace and cgroups to the janitor.
 * Returns its network namespace (or -1), for nets_recycle() once there is time. */
static int settle(void) {
    if (dying.pid > 0) wait_gone(dying.pid);
    dying.pid = 0;
    discard_held(&dying, 0, dying_held);
    dying_held = -1;
    int net = dying_net;
    dying_net = -1;
    return net;
}

/* Has a dead instance left remains to clear? (Cleared when the keeper is idle: see keeper_main.) */
static int has_remains(void) {
    return dying.pid == 0 && (dying.stage[0] || dying.ncgroups > 0 || dying_held >= 0 || dying_net >= 0);
}

static void bury(void) { nets_recycle(settle()); }

/* The old instance is killed first (SIGKILL to its init: the kernel then kills every process of
 * its PID namespace, and no new one can start there) and the spare, in namespaces and cgroups
 * of its own, takes over. The answer does not wait for the old processes to finish dying: the
 * kernel is killing them, and they hold nothing the new instance can see (their mounts, tmpfs,
 * IPC and PID namespaces are theirs; their network namespace is reused only once they are gone
 * and it is proven empty) and are charged to their own cgroups, so the new instance's limits
 * start full. reap() notes their end and bury() clears the remains once no request waits; a
 * request that needs it (the next restore, a close) waits for it, so at most one instance is
 * ever dying. */
static void restore(msg_t *m) {
    char err[4096] = "";
    int earlier_net = settle(); /* the one before, if still dying; its network is offered after the answer */
    dying = current;
    instance_reset(&current);
    dying_held = dying.pid > 0 ? hold_mount_ns(dying.pid) : -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)dying.pid);
    dying_net = dying.pid > 0 && !is_host_net(config) ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (dying.pid > 0) kill(dying.pid, SIGKILL);
    else nets_drop(settle()); /* no process: its remains go now */
    if (!same_config(m)) {
        discard(&spare);
        adopt_config(m);
    }
    int rc = next_instance(config, 1, err, sizeof err);
    unseal();
    if (rc < 0) reply(REPLY_ERR, sandbox_id, m->seq, "%s", err);
    else reply_started(m->seq, "");
    nets_recycle(earlier_net);
    start_spare();
}

static void shutdown_and_exit(int code) {
    nets_drop(settle());
    discard(&current);
    discard(&spare);
    unseal();
    cgpool_drain(drop_cgroup);
    janitor_drain();
    _exit(code);
}

static void serve(msg_t *m) {
    switch (m->op) {
    case OP_PING:
        reply(REPLY_OK, sandbox_id, m->seq, "pid=%d%s", current.state == READY ? (int)current.pid : 0,
              current.died_of_oom ? "\ndied=oom" : "");
        break;
    case OP_RESTORE:
        close_fds(m);
        restore(m);
        break;
    case OP_SEAL:
        close_fds(m);
        seal(m);
        break;
    case OP_CLOSE:
        close_fds(m);
        nets_drop(settle());
        discard(&current);
        discard(&spare);
        unseal();
        cgpool_drain(drop_cgroup);
        reply(REPLY_OK, sandbox_id, m->seq, "pid=0");
        janitor_drain();
        _exit(0);
    case OP_EXEC: case OP_READ: case OP_WRITE:
        if (seal_mode == SEALED_SHARED && current.state == READY) { shared_run(m); break; }
        /* fall through */
    case OP_FREEZE: case OP_THAW:
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
        if (pid == current.pid) { /* died on its own: killed from the host, or by the OOM killer */
            close(current.sock);
            current.sock = -1;
            current.pid = 0;
            current.state = NONE;
            current.died_of_oom = cgroups_oom_killed(current.cgroups, current.ncgroups, current.oom_base);
        }
        if (pid == spare.pid) discard(&spare);
        if (pid == dying.pid) dying.pid = 0; /* gone: its remains go when the keeper is idle */
        janitor_reaped(pid);
    }
}

void keeper_main(msg_t *create, const char *stage_root, int sock, const int *nets, int nnets) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    set_title("snapgym-keeper");
    /* A mount namespace of our own: this sandbox's stages are mounted here only, so the daemon's
     * stays small and every instance (a clone that copies its parent's mounts) copies a few
     * dozen mounts, not two per sandbox on the machine. The host reaches the stages through
     * /proc/KEEPER/root ("keeper=" in the replies); they go when this namespace does. */
    if (unshare(CLONE_NEWNS) < 0) {
        reply(REPLY_ERR, create->sbx, create->seq, "create the keeper's mount namespace: %s", strerror(errno));
        _exit(1);
    }
    daemon_sock = sock;
    stages = stage_root;
    sandbox_id = create->sbx;
    instance_reset(&current);
    instance_reset(&spare);
    instance_reset(&sealed);
    instance_reset(&dying);
    launch.net_fd = -1;
    nets_keep_new(nets, nnets);
    config = msg_new();
    msg_t *m = msg_new();
    if (!config || !m) _exit(1);
    adopt_config(create);
    signal_fd = sigchld_fd();

    char err[4096] = "";
    if (begin(&current, config, err, sizeof err) == 0 && wait_ready(&current, err, sizeof err) == 1) {
        reply_started(create->seq, "");
    } else {
        reply(REPLY_ERR, sandbox_id, create->seq, "%s", *err ? err : "sandbox setup failed");
        shutdown_and_exit(1);
    }
    start_spare();
    for (;;) {
        struct pollfd p[3] = {{daemon_sock, POLLIN, 0}, {signal_fd, POLLIN, 0}, {spare.sync, POLLIN, 0}};
        /* A dead instance's remains (and the check of its network namespace) wait until no
         * request does: the first command of the next episode does not queue behind them. */
        int ready = poll(p, spare.sync >= 0 ? 3 : 2, has_remains() ? 0 : -1);
        if (ready < 0) continue;
        if (ready == 0) {
            bury();
            continue;
        }
        if (p[1].revents) {
            drain_signalfd(signal_fd);
            reap();
        }
        if (spare.sync >= 0 && p[2].revents && advance(&spare, err, sizeof err) < 0) discard(&spare);
        if (p[0].revents) {
            if (recv_msg(daemon_sock, m) < 0) shutdown_and_exit(0); /* the daemon is gone */
            serve(m);
        }
    }
}
