/*
 * The proof that a dead instance's network namespace is as empty as a new one.
 *
 * The keeper hands an emptied network namespace to the sandbox's next instance
 * instead of creating one (creating and tearing one down is the dearest part of
 * an instance). The agent cannot configure it (its owner is the daemon's user
 * namespace: no addresses, routes, firewall rules or sysctls of the agent's),
 * so what it could leave is sockets; the host could leave more (the egress
 * gate's listener, a test's plant). The namespace is reused only when, seen
 * from a child that joined it:
 *
 *   - it holds no socket: the per-namespace counters of sockstat (TCP also
 *     counts orphans and TIME_WAIT there) and the unix and packet lists;
 *   - its interfaces, IPv4 routes and addresses (fib_trie), IPv6 routes and
 *     addresses, legacy iptables tables, nftables tables and a few sysctls read
 *     as those of a new namespace set up as instance/sandbox.c sets up an instance's
 *     (made once per keeper);
 *   - so do its counters (each interface's, and the IP, ICMP, TCP and UDP ones of
 *     snmp, snmp6 and netstat) and its IPv6 flow labels: the kernel never zeroes a
 *     counter, and an unprivileged socket can leave a label of its choosing behind
 *     for seconds after it closes, so a namespace that carried a packet (or tried
 *     to), or holds a label, would show the next episode what the last one did.
 *     Such a namespace is torn down; a quiet one (no network used) is reused.
 *
 * As root the keeper joins the namespace itself and comes back; rootless (where it could not
 * come back) a child of its does the looking.
 */
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>

#include "sandboxd.h"

enum { PRINT_MAX = 32768 }; /* the counters take about 12 KB */

static int no_sockets(void) {
    static const char *counters[] = {"/proc/thread-self/net/sockstat", "/proc/thread-self/net/sockstat6"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(counters[i], "r");
        char line[512];
        int empty = 1;
        while (f && empty && fgets(line, sizeof line, f)) {
            if (strncmp(line, "sockets:", 8) == 0) continue; /* host-wide */
            long inuse = 0, tw = 0;
            char *at = strstr(line, "inuse ");
            if (at) inuse = atol(at + 6);
            if ((at = strstr(line, " tw "))) tw = atol(at + 4);
            empty = inuse == 0 && tw == 0;
        }
        if (f) fclose(f);
        if (!empty) return 0;
    }
    static const char *lists[] = {"/proc/thread-self/net/unix", "/proc/thread-self/net/packet"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(lists[i], "r");
        char line[512];
        int lines = 0;
        while (f && fgets(line, sizeof line, f)) lines++;
        if (f) fclose(f);
        if (lines > 1) return 0; /* more than the header */
    }
    return 1;
}

/* Append to the fingerprint, never past PRINT_MAX: a full one (used == PRINT_MAX) does not count. */
static void append(char *out, size_t *used, const char *fmt, ...) {
    if (*used >= PRINT_MAX) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *used, PRINT_MAX - *used, fmt, ap);
    va_end(ap);
    *used = n < 0 || (size_t)n >= PRINT_MAX - *used ? PRINT_MAX : *used + (size_t)n;
}

/* Append a file's lines, only the columns in `keep` (a bit per column; 0: the whole file). */
static void add_file(char *out, size_t *used, const char *path, unsigned keep) {
    append(out, used, "[%s]\n", path);
    if (!keep) { /* read as it is: most of the 12 KB, with no copy line by line */
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 || *used >= PRINT_MAX ? 0 : read_all(fd, out + *used, PRINT_MAX - *used);
        if (fd >= 0) close(fd);
        if (n > 0) *used += (size_t)n;
        return;
    }
    FILE *f = fopen(path, "r");
    char line[1024];
    while (f && *used < PRINT_MAX && fgets(line, sizeof line, f)) {
        char *save = NULL;
        int col = 0;
        for (char *t = strtok_r(line, " \t\n:|", &save); t; t = strtok_r(NULL, " \t\n:|", &save), col++)
            if (col < 32 && (keep & (1u << col))) append(out, used, "%s ", t);
        append(out, used, "\n");
    }
    if (f) fclose(f);
}

/* How many nftables tables the namespace holds; -1: nftables cannot be asked. */
static int nft_tables(void) {
    int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (s < 0) return -1;
    struct {
        struct nlmsghdr h;
        struct nfgenmsg g;
    } req = {{sizeof req, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, NLM_F_REQUEST | NLM_F_DUMP, 1, 0},
             {AF_UNSPEC, NFNETLINK_V0, 0}};
    int tables = 0;
    if (send(s, &req, sizeof req, 0) < 0) tables = -1;
    char buf[16384];
    for (int done = tables < 0; !done;) {
        ssize_t n = recv(s, buf, sizeof buf, 0);
        if (n <= 0) { tables = -1; break; }
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_DONE) { done = 1; break; }
            if (h->nlmsg_type == NLMSG_ERROR) { tables = -1; done = 1; break; }
            tables++;
        }
    }
    close(s);
    return tables;
}

/* What a namespace holds besides sockets, as text; in a child that joined it. */
static size_t fingerprint(char *out) {
    size_t used = 0;
    add_file(out, &used, "/proc/thread-self/net/dev", 0);                   /* interfaces and their counters */
    add_file(out, &used, "/proc/thread-self/net/snmp", 0);                  /* IP, ICMP, TCP, UDP counters */
    add_file(out, &used, "/proc/thread-self/net/snmp6", 0);
    add_file(out, &used, "/proc/thread-self/net/netstat", 0);               /* TCP's and IP's extended ones */
    add_file(out, &used, "/proc/thread-self/net/ip6_flowlabel", 0);         /* labels lingering after a socket */
    add_file(out, &used, "/proc/thread-self/net/fib_trie", 0);              /* IPv4 routes, addresses */
    add_file(out, &used, "/proc/thread-self/net/ipv6_route", 0x33fu);       /* not the use counters */
    add_file(out, &used, "/proc/thread-self/net/if_inet6", 0);
    static const char *files[] = {"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names",
                                  "/proc/thread-self/net/arp_tables_names", "/proc/sys/net/ipv4/ip_forward",
                                  "/proc/sys/net/ipv4/ip_local_port_range", "/proc/sys/net/ipv4/ping_group_range",
                                  "/proc/sys/net/ipv4/ip_unprivileged_port_start", "/proc/sys/net/core/somaxconn",
                                  "/proc/sys/net/ipv4/tcp_max_tw_buckets",
                                  "/proc/sys/net/ipv6/conf/all/disable_ipv6"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) add_file(out, &used, files[i], 0);
    append(out, &used, "nft tables %d\n", nft_tables());
    return used;
}

/* The fingerprint of `net` (or, with net < 0, of a new namespace with its loopback up), taken in a
 * child: we could not always come back to our own namespace (rootless). "" when it failed. */
static void fingerprint_of(int net, char *out) {
    int pipefd[2];
    out[0] = 0;
    if (pipe2(pipefd, O_CLOEXEC) < 0) return;
    pid_t child = fork();
    if (child == 0) {
        close(pipefd[0]);
        int joined = net >= 0 ? setns(net, CLONE_NEWNET) : unshare(CLONE_NEWNET);
        if (joined < 0 || (net >= 0 && !no_sockets())) _exit(1);
        if (net < 0 && net_set_up() < 0) _exit(1);
        static char print[PRINT_MAX + 1];
        size_t n = fingerprint(print);
        _exit(n < PRINT_MAX && write(pipefd[1], print, n) == (ssize_t)n ? 0 : 1);
    }
    close(pipefd[1]);
    ssize_t n = child > 0 ? read_all(pipefd[0], out, PRINT_MAX) : -1;
    close(pipefd[0]);
    int status = 1;
    if (child > 0) while (waitpid(child, &status, 0) < 0 && errno == EINTR) {}
    out[n > 0 && n < PRINT_MAX && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? n : 0] = 0;
}

/* The fingerprint of `net` taken by this thread, which joins it and comes back (as root it
 * can; a fork costs more than the reading): 0, or -1 when it could not join it. */
static int fingerprint_here(int net, char *out) {
    static int home = -2;
    out[0] = 0;
    if (home == -2) home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0 || setns(net, CLONE_NEWNET) < 0) return -1;
    if (no_sockets()) {
        size_t n = fingerprint(out);
        out[n < PRINT_MAX ? n : 0] = 0; /* "" (not empty) when it did not fit */
    }
    if (setns(home, CLONE_NEWNET) < 0) { /* later host-network instances would start in it */
        fprintf(stderr, "snapgym-keeper: cannot return to its own network namespace: %s\n", strerror(errno));
        _exit(1);
    }
    return 0;
}

int net_is_empty(int net) {
    static char reference[PRINT_MAX + 1], seen[PRINT_MAX + 1];
    if (!reference[0]) fingerprint_of(-1, reference);
    if (user_mode || fingerprint_here(net, seen) < 0) fingerprint_of(net, seen);
    int empty = reference[0] && strcmp(seen, reference) == 0;
    if (!empty && reference[0]) {
        size_t at = 0, line = 0;
        while (seen[at] && seen[at] == reference[at]) if (seen[at++] == '\n') line = at;
        fprintf(stderr, "snapgym-keeper: network namespace not reused: %s%.*s\n",
                seen[0] ? "it differs from a new one at: " : "it holds a socket", seen[0] ? (int)strcspn(seen + line, "\n") : 0,
                seen + line);
    }
    return empty;
}
