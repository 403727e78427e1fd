/* The daemon: owns the private mount namespace and routes requests to keepers. */
#include "sandboxd.h"

#define MAX_SANDBOXES 4096

typedef struct {
    uint32_t id;
    pid_t keeper;
    int sock;    /* to the keeper */
    int closing; /* a CLOSE was forwarded: its exit is expected */
} sandbox_t;

static sandbox_t sandboxes[MAX_SANDBOXES];
static int count;
static char stage_root[4096];
static int signal_fd = -1;

static sandbox_t *find(uint32_t id) {
    for (int i = 0; i < count; i++)
        if (sandboxes[i].id == id) return &sandboxes[i];
    return NULL;
}

static void forget(sandbox_t *s) {
    if (s->sock >= 0) close(s->sock);
    *s = sandboxes[--count];
}

static void create(msg_t *m) {
    if (find(m->sbx)) {
        close_fds(m);
        reply(REPLY_ERR, m->sbx, m->seq, "sandbox %u already exists", m->sbx);
        return;
    }
    if (count == MAX_SANDBOXES) {
        close_fds(m);
        reply(REPLY_ERR, m->sbx, m->seq, "too many sandboxes in one daemon (%d)", MAX_SANDBOXES);
        return;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        reply(REPLY_ERR, m->sbx, m->seq, "socketpair: %s", strerror(errno));
        return;
    }
    /* Stocked network namespaces (netstock.c): one for its first instance, one for the spare. */
    const char *net = field(m, "net"), *spare = field(m, "spare");
    int nets[2], want = net && strcmp(net, "host") == 0 ? 0 : spare && strcmp(spare, "1") == 0 ? 2 : 1;
    int nnets = netstock_take(nets, want);
    pid_t pid = fork();
    if (pid < 0) {
        reply(REPLY_ERR, m->sbx, m->seq, "fork a keeper: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        for (int i = 0; i < nnets; i++) close(nets[i]);
        return;
    }
    if (pid == 0) {
        close(sv[0]);
        close(signal_fd);
        for (int i = 0; i < count; i++) close(sandboxes[i].sock);
        netstock_forget();
        unblock_signals();
        keeper_main(m, stage_root, sv[1], nets, nnets); /* replies to Python itself */
    }
    for (int i = 0; i < nnets; i++) close(nets[i]);
    close(sv[1]);
    sandboxes[count++] = (sandbox_t){m->sbx, pid, sv[0], 0};
}

static void route(msg_t *m) {
    sandbox_t *s = find(m->sbx);
    if (m->op == OP_CREATE) {
        create(m);
    } else if (s && !s->closing) {
        if (m->op == OP_CLOSE) s->closing = 1;
        forward_msg(s->sock, m);
    } else {
        /* Gone, or going: a keeper that took a CLOSE exits without reading what came after it, so a
         * later request (a PING explaining a command the close cut) is answered here, not left hanging. */
        close_fds(m); /* fd-answered requests see their status pipe close */
        if (m->op == OP_PING || m->op == OP_CLOSE) reply(REPLY_OK, m->sbx, m->seq, "pid=0");
        else if (m->op == OP_RESTORE || m->op == OP_SEAL) reply(REPLY_ERR, m->sbx, m->seq, "no sandbox %u", m->sbx);
    }
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < count; i++) {
            if (sandboxes[i].keeper != pid) continue;
            if (!sandboxes[i].closing)
                reply(REPLY_ERR, sandboxes[i].id, 0, "the sandbox's keeper process died (status %d)", status);
            forget(&sandboxes[i]);
            break;
        }
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
        fprintf(stderr, "usage: %s root|user STAGE_DIR CONTROL_FD [NETNS_STOCK [KEEP_PATH...]]\n", argv[0]);
        return 2;
    }
    user_mode = strcmp(argv[1], "user") == 0;
    snprintf(stage_root, sizeof stage_root, "%s", argv[2]);
    control_fd = atoi(argv[3]);
    set_title_area(argv[0], (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) - argv[0]));
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
    if (argc - 5 > MAX_KEEP_PATHS) {
        fprintf(stderr, "snapgym-sandboxd: %d paths to keep, at most %d\n", argc - 5, MAX_KEEP_PATHS);
        return 2;
    }
    if (!user_mode) { /* user mode: the copied mounts are locked (hostmounts.c) */
        char *keep[MAX_KEEP_PATHS + 1] = {stage_root};
        int nkeep = 1;
        for (int i = 5; i < argc; i++) keep[nkeep++] = argv[i];
        prune_host_mounts(keep, nkeep);
    }
    if (mount("tmpfs", stage_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4k") < 0) {
        fprintf(stderr, "snapgym-sandboxd: mount %s: %s\n", stage_root, strerror(errno));
        return 3;
    }
    signal_fd = sigchld_fd();
    msg_t *m = msg_new();
    if (!m) return 1;
    netstock_start(argc > 4 ? atoi(argv[4]) : 0);
    for (;;) {
        int refill_in_ms = netstock_refill();
        struct pollfd p[3] = {{control_fd, POLLIN, 0}, {signal_fd, POLLIN, 0}, {netstock_fd(), POLLIN, 0}};
        if (poll(p, netstock_fd() >= 0 ? 3 : 2, refill_in_ms) <= 0) continue;
        if (p[1].revents) {
            drain_signalfd(signal_fd);
            reap();
        }
        if (netstock_fd() >= 0 && p[2].revents) netstock_receive();
        if (!p[0].revents) continue;
        if (recv_msg(control_fd, m) < 0) break; /* the host process is gone */
        if (m->op != 0) route(m);
    }
    /* Keepers die with us (parent-death signal) and take their inits along;
     * the stage mounts go with their mount namespaces. Kill them explicitly too. */
    for (int i = 0; i < count; i++) kill(sandboxes[i].keeper, SIGKILL);
    netstock_forget(); /* the netmaker ends when its channel does */
    while (wait(NULL) > 0) {}
    return 0;
}
