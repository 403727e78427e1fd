/*
 * The keeper of one sandbox: it starts the sandbox's inits, forwards requests
 * to the current one, restores it, and seals it for the verifier.
 *
 * An instance (instance.c) is one init in its own namespaces over the
 * snapshot's layers, with a fresh writable tmpfs and cgroups of its own, so
 * nothing of one episode (its page cache, tmpfs pages, dying processes, PIDs)
 * counts against the next.
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
#include "keeper.h"

enum { UNSEALED = 0, SEALED_STRICT, SEALED_SHARED };

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

/* Clone the next instance over cfg (instance.c), its stage and cgroups named after the next generation. */
static int begin(instance_t *in, msg_t *cfg, char *err, size_t errlen) {
    char stage[4096], suffix[32];
    instance_reset(in);
    ++generation;
    snprintf(stage, sizeof stage, "%s/%u.%u", stages, sandbox_id, generation);
    snprintf(suffix, sizeof suffix, "i%u", generation);
    int inherited[] = {daemon_sock, control_fd, signal_fd, current.sock, current.sync, spare.sock, spare.sync,
                       dying.sock, dying.sync, dying_held, dying_net, shared_ns[0], shared_ns[1], shared_ns[2],
                       shared_ns[3], shared_ns[4], shared_ns[5]};
    return instance_begin(in, cfg, stage, suffix, inherited, (int)(sizeof inherited / sizeof *inherited), err, errlen);
}

static int start_spare(void) {
    const char *want = field(config, "spare");
    if (!want || strcmp(want, "1") != 0) return 0;
    char err[4096];
    if (begin(&spare, config, err, sizeof err) < 0) {
        instance_discard(&spare);
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
    if (seal_mode == SEALED_STRICT) instance_discard(&sealed);
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
        if (spare.state == READY || instance_wait_ready(&spare, config, err, errlen) == 1) {
            current = spare;
            instance_reset(&spare);
            return 0;
        }
        instance_discard(&spare);
    }
    err[0] = 0;
    int rc = begin(&current, cfg, err, errlen);
    if (rc == 0) rc = instance_wait_ready(&current, config, err, errlen) == 1 ? 0 : -1;
    if (rc < 0) instance_discard(&current);
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
    instance_discard_held(&sealed, 1, -2);
    seal_mode = SEALED_STRICT;
    snprintf(launch.agent_upper, sizeof launch.agent_upper, "%s/upper", sealed.stage);
    int rc = next_instance(m, same_layers(m, config), err, sizeof err);
    if (rc == 0) rc = graft(m, err, sizeof err);
    if (rc == 0) {
        read_report(current.stage, report, sizeof report);
        reply_started(m->seq, report);
    } else {
        instance_discard(&current);
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
    if (builder > 0) instance_wait_gone(builder);
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
    if (dying.pid > 0) instance_wait_gone(dying.pid);
    dying.pid = 0;
    instance_discard_held(&dying, 0, dying_held);
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
    dying_held = dying.pid > 0 ? instance_hold_mount_ns(dying.pid) : -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)dying.pid);
    dying_net = dying.pid > 0 && !is_host_net(config) ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (dying.pid > 0) kill(dying.pid, SIGKILL);
    else nets_drop(settle()); /* no process: its remains go now */
    if (!same_config(m)) {
        instance_discard(&spare);
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
    instance_discard(&current);
    instance_discard(&spare);
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
        instance_discard(&current);
        instance_discard(&spare);
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
        if (pid == spare.pid) instance_discard(&spare);
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
    if (begin(&current, config, err, sizeof err) == 0 && instance_wait_ready(&current, config, err, sizeof err) == 1) {
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
        if (spare.sync >= 0 && p[2].revents && instance_advance(&spare, config, err, sizeof err) < 0) instance_discard(&spare);
        if (p[0].revents) {
            if (recv_msg(daemon_sock, m) < 0) shutdown_and_exit(0); /* the daemon is gone */
            serve(m);
        }
    }
}
