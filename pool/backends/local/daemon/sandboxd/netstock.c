/*
 * Network namespaces made ahead of time, for new sandboxes.
 *
 * Creating a network namespace is the dearest part of a new instance (its loopback, the IPv4 and
 * IPv6 sysctl tables, conntrack: about 0.35 ms of kernel CPU here, 79% of what the clone of an
 * instance's namespaces costs). A keeper's later instances get theirs off the request path (the
 * spare, or a dead instance's proven empty: keeper/netproof.c), but a new sandbox's first
 * instance, a fork's children and a ready sandbox's spare made theirs on the spot. The daemon
 * keeps a stock of new, never-used ones instead, made by a helper process beside it (the netmaker), off
 * every request's path, and hands one or two to each keeper it
 * forks. A stocked namespace is set up as an instance would set up its own (net_set_up) and has
 * never held a process: nothing to prove, and a result does not count it as reused.
 *
 * The stock grows with demand: it starts at STOCK_START, and when a burst of creates draws more
 * than that before the stock is full again (a fork of 128), the next refill aims at the burst's
 * size, up to the daemon's limit (its NETNS_STOCK argument; 0 turns the stock off). While creates
 * keep coming, the netmaker refills the stock to STOCK_START only (what it makes is taken in the
 * same burst, work the keepers would have done); the growth for the next burst waits until no
 * create has come for QUIET_MS, so it never competes with the burst that asked for it. It is asked
 * for STOCK_START at a time, so a burst that begins meanwhile waits for at most that many. Each stocked
 * namespace holds about 80 KiB of kernel memory. When the stock is empty, or the netmaker fails,
 * a keeper's instance creates its own namespace as before.
 */
#include "sandboxd.h"

enum { STOCK_START = 8, STOCK_MAX = 256, QUIET_MS = 20 };

static int stock[STOCK_MAX];
static int stocked, limit, target, drawn_since_full, asked; /* asked: requested, not yet received */
static long long last_draw_ms;
static int maker_fd = -1;

/* Set up the current network namespace as every instance's starts: loopback up (the only interface), no TIME_WAIT
 * (loopback has no stray segments to guard against, and a port left in it would refuse the next
 * server's bind), every port bindable (the namespace belongs to the daemon's user namespace, where
 * the sandbox's root has no CAP_NET_BIND_SERVICE: without this no server could listen on 80). */
int net_set_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct ifreq ifr = {0};
    strcpy(ifr.ifr_name, "lo");
    int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (rc == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    close(s);
    if (rc < 0) return -1;
    /* Best effort, as always: a kernel without either setting still runs sandboxes. */
    write_file_str("/proc/sys/net/ipv4/tcp_max_tw_buckets", "0");
    write_file_str("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0");
    return 0;
}

/* The netmaker: for each count it reads, that many new namespaces, each set up and sent as it is
 * made. It moves into each one it makes (unshare) and keeps no descriptor of any. */
static void netmaker(int sock) __attribute__((noreturn));
static void netmaker(int sock) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    set_title("snapgym-netstock");
    /* A batch job: it does not preempt a keeper when it wakes. Not SCHED_IDLE: starved while it
     * holds the kernel's network locks, it would hold up every keeper that needs them. */
    struct sched_param batch = {0};
    sched_setscheduler(0, SCHED_BATCH, &batch);
    uint32_t want;
    while (read_full(sock, &want, sizeof want) == 0) {
        for (uint32_t i = 0; i < want; i++) {
            int net = -1;
            if (unshare(CLONE_NEWNET) < 0 || net_set_up() < 0 ||
                (net = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0) {
                dprintf(2, "snapgym-netstock: cannot make a network namespace: %s\n", strerror(errno));
                _exit(1); /* the daemon sees the end and stops asking: keepers make their own */
            }
            uint32_t h[4] = {0, 0, 0, 0};
            if (send_raw(sock, (const char *)h, HDR_SIZE, &net, 1) < 0) _exit(0);
            close(net);
        }
    }
    _exit(0);
}

void netstock_start(int max) {
    limit = max < STOCK_MAX ? max : STOCK_MAX;
    /* Each stocked namespace is a descriptor of the daemon's, beside one per sandbox: an eighth of
     * its limit at most (128 where the limit is the common 1024). */
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur / 8 < (rlim_t)limit) limit = (int)(files.rlim_cur / 8);
    target = limit < STOCK_START ? limit : STOCK_START;
    if (limit <= 0) return;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return;
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return;
    }
    if (pid == 0) {
        if (sv[1] > 3) syscall(SYS_close_range, 3, sv[1] - 1, 0); /* nothing of the daemon's but its channel */
        syscall(SYS_close_range, sv[1] + 1, ~0U, 0);
        unblock_signals();
        netmaker(sv[1]);
    }
    close(sv[1]);
    maker_fd = sv[0];
}

int netstock_fd(void) { return maker_fd; }

/* No more asking (the netmaker ended): what is in stock is still handed out. */
static void stop_asking(void) {
    if (maker_fd >= 0) close(maker_fd);
    maker_fd = -1;
    asked = 0;
}

void netstock_receive(void) {
    static msg_t *packet;
    if (!packet) packet = msg_new();
    if (!packet || recv_msg(maker_fd, packet) < 0) {
        stop_asking();
        return;
    }
    for (int i = 0; i < packet->nfds; i++) {
        if (stocked < STOCK_MAX) stock[stocked++] = packet->fds[i];
        else close(packet->fds[i]);
        if (asked > 0) asked--;
    }
    packet->nfds = 0;
    if (stocked >= target) drawn_since_full = 0;
}

int netstock_refill(void) {
    if (maker_fd < 0 || asked > 0 || stocked >= target) return -1; /* a receipt wakes the daemon */
    int ceiling = target;
    long long quiet = now_ms() - last_draw_ms;
    if (stocked >= STOCK_START && quiet < QUIET_MS) return (int)(QUIET_MS - quiet); /* growth waits */
    if (quiet < QUIET_MS && ceiling > STOCK_START) ceiling = STOCK_START;
    uint32_t want = (uint32_t)(ceiling - stocked < STOCK_START ? ceiling - stocked : STOCK_START);
    if (write(maker_fd, &want, sizeof want) == (ssize_t)sizeof want) asked = (int)want;
    else stop_asking();
    return -1;
}

int netstock_take(int *nets, int want) {
    int got = 0;
    for (int i = 0; i < want; i++) {
        drawn_since_full++; /* a miss is demand too */
        last_draw_ms = now_ms();
        if (stocked > 0) nets[got++] = stock[--stocked];
    }
    if (drawn_since_full > target) target = drawn_since_full < limit ? drawn_since_full : limit;
    return got;
}

void netstock_forget(void) {
    for (int i = 0; i < stocked; i++) close(stock[i]);
    stocked = 0;
    if (maker_fd >= 0) close(maker_fd);
    maker_fd = -1;
}
