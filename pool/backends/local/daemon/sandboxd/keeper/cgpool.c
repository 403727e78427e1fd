/*
 * Emptied cgroups of dead instances, reused for new ones only with proof.
 *
 * A dead instance's cgroups (one per hierarchy) go to a small pool instead of
 * being removed: every removed memory cgroup lives on, dying, while page cache
 * is charged to it, and creating one costs kernel time. An instance takes the
 * oldest set in the pool (the janitor has unmounted its writable layer by then),
 * (never one of the last AGED given), and only after cgpool_prove() finds it clean:
 *
 *   - no member process (cgroup.procs, and v1's tasks) and no child cgroup;
 *   - nothing charged: pids.current 0, no page of a file or a process charged (after
 *     memory.force_empty, v1, or memory.reclaim, v2, reclaimed what can be:
 *     page cache and slab; a tmpfs page or a live process's cannot be), and the kernel
 *     objects left (a dead instance's namespace structures, which no process can read)
 *     under 1 MiB and re-based: the memory limits are raised by them;
 *   - v2: not frozen;
 *   - every limit reads as the dead instance had it, which is what the new one
 *     asks for (a limit someone else changed is refused); then the limits are
 *     written again and read back: the instance's value, unlimited where it asks
 *     for none;
 *   - the records re-based: v1's failcnt files are zeroed, its max_usage ones set
 *     to the kept objects' charge, and
 *     the OOM-kill count it starts with is kept (cgpool_oom_kills) so that the
 *     instance's own OOM record counts only its kills.
 *
 * A set that fails is removed (the caller's `drop`) and the next one tried;
 * with none left the caller creates fresh cgroups.
 */
#include "sandboxd.h"

#define POOL 4 /* a strict episode frees two sets (agent, verifier) */
#define AGED 2 /* the last sets given stay: their writable layers may not be unmounted yet */

typedef struct {
    char dirs[4][512];
    int n;
} cgset_t;

enum { KERNEL_SLACK = 1 << 20 }; /* kernel objects of a dead instance's a reused set may hold */

static cgset_t pool[POOL];
static int pooled;

/* Files a hierarchy does not have (v1's pids hierarchy has no memory.*, v2 no memory.limit_in_bytes):
 * a proof opens some forty names per instance, and most are absent in any one hierarchy. One found
 * absent while its cgroup exists is not looked for again in that hierarchy (the cgroup's path
 * without its "-<instance>" suffix): a hierarchy's files do not appear later. */
enum { ABSENT_MAX = 64 };
static char absent[ABSENT_MAX][600];
static int nabsent;

static void absent_key(const char *dir, const char *name, char *key, size_t len) {
    const char *dash = strrchr(dir, '-');
    snprintf(key, len, "%.*s/%s", (int)(dash ? dash - dir : (long)strlen(dir)), dir, name);
}

static int known_absent(const char *dir, const char *name) {
    char key[600];
    absent_key(dir, name, key, sizeof key);
    for (int i = 0; i < nabsent; i++)
        if (strcmp(absent[i], key) == 0) return 1;
    return 0;
}

/* After an open of dir/name failed with `err`: remember an absent file of a cgroup that is there. */
static void note_absent(const char *dir, const char *name, int err) {
    struct stat st;
    if (err != ENOENT || nabsent == ABSENT_MAX || stat(dir, &st) < 0) return;
    absent_key(dir, name, absent[nabsent], sizeof absent[nabsent]);
    nabsent++;
}

/* The cgroup folder being proved, held open: its files are opened relative to it, not walked to
 * from / each time (a proof opens some forty). */
static const char *held_dir;
static int held_fd = -1;

static int open_in(const char *dir, const char *name, int flags) {
    char path[800];
    if (known_absent(dir, name)) return errno = ENOENT, -1;
    int fd;
    if (held_fd >= 0 && dir == held_dir) {
        fd = openat(held_fd, name, flags | O_CLOEXEC);
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        fd = open(path, flags | O_CLOEXEC);
    }
    if (fd < 0) {
        int err = errno;
        note_absent(dir, name, err);
        errno = err;
    }
    return fd;
}

static int read_text(const char *dir, const char *name, char *out, size_t len) {
    int fd = open_in(dir, name, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read_all(fd, out, len - 1);
    close(fd);
    if (n < 0) return -1;
    out[n] = 0;
    out[strcspn(out, "\n")] = 0;
    return 0;
}

static int write_in(const char *dir, const char *name, const char *value) {
    return write_str_closing(open_in(dir, name, O_WRONLY), value);
}

static FILE *fopen_in(const char *dir, const char *name) {
    int fd = open_in(dir, name, O_RDONLY);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
    if (!f && fd >= 0) close(fd);
    return f;
}

/* "max", "-1" and v1's page-rounded LLONG_MAX all mean unlimited; tokens compared one by one. */
static void normalize(const char *in, char *out, size_t len) {
    size_t used = 0;
    char copy[256], *save = NULL;
    snprintf(copy, sizeof copy, "%s", in);
    out[0] = 0;
    for (char *tok = strtok_r(copy, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save)) {
        int unlimited = strcmp(tok, "max") == 0 || strcmp(tok, "-1") == 0 || strtoll(tok, NULL, 10) >= (1LL << 62);
        used += snprintf(out + used, len - used, "%s%s", used ? " " : "", unlimited ? "max" : tok);
        if (used >= len) break;
    }
}

/* The limit files an instance's cgroup may hold, and what each reads when nothing is asked. */
static const char *limit_files[][2] = {
    {"memory.max", "max"},        {"memory.swap.max", "max"}, {"memory.high", "max"},
    {"memory.limit_in_bytes", "max"}, {"memory.memsw.limit_in_bytes", "max"},
    {"memory.soft_limit_in_bytes", "max"}, {"pids.max", "max"}, {"cpu.max", "max 100000"},
    {"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", "max"},
};

static int is_raised(const char *name) {
    return strcmp(name, "memory.max") == 0 || strcmp(name, "memory.limit_in_bytes") == 0 ||
           strcmp(name, "memory.memsw.limit_in_bytes") == 0;
}

/* The value the instance asks for in `name`; a memory limit is raised by `kept`, the kernel's
 * objects left charged (see kernel_only), so that the instance starts with all of its limit. */
static const char *wanted_limit(msg_t *cfg, const char *name, const char *otherwise, long kept, char *buf, size_t len) {
    size_t n = strlen(name);
    int raised = is_raised(name);
    for (uint32_t j = 0; j < cfg->nfields; j++) {
        if (strcmp(cfg->key[j], "cgset") != 0) continue;
        if (strncmp(cfg->val[j], name, n) == 0 && cfg->val[j][n] == '\t') {
            const char *value = cfg->val[j] + n + 1;
            char *end;
            long long asked = strtoll(value, &end, 10);
            if (raised && end != value && *end == 0) snprintf(buf, len, "%lld", asked + kept);
            else snprintf(buf, len, "%s", value);
            return buf;
        }
    }
    return otherwise;
}

/* Every limit file must read as the dead instance left it, i.e. as this one asks (a memory limit
 * raised by under KERNEL_SLACK): anything else was changed by someone else, and is refused. Then
 * the ones that differ from what this instance gets (its limit, raised by `kept`) are written and
 * read back. Absent files are skipped. */
static int limits_reset(msg_t *cfg, const char *dir, long kept, char *why, size_t whylen) {
    enum { COUNT = sizeof limit_files / sizeof *limit_files };
    int stale[COUNT] = {0}, nstale = 0;
    for (size_t i = 0; i < COUNT; i++) {
        const char *name = limit_files[i][0];
        char buf[256], got[256], want_n[256], got_n[256], now_n[256];
        if (read_text(dir, name, got, sizeof got) < 0) continue;
        normalize(got, got_n, sizeof got_n);
        normalize(wanted_limit(cfg, name, limit_files[i][1], 0, buf, sizeof buf), want_n, sizeof want_n);
        char *end;
        long long want = strtoll(want_n, &end, 10), raise = strtoll(got_n, NULL, 10) - want;
        int numeric = end != want_n && *end == 0;
        if (strcmp(want_n, got_n) != 0 && !(is_raised(name) && numeric && raise > 0 && raise <= KERNEL_SLACK))
            return snprintf(why, whylen, "%s reads %s where the instance asks for %s: changed", name, got_n, want_n), -1;
        normalize(wanted_limit(cfg, name, limit_files[i][1], kept, buf, sizeof buf), now_n, sizeof now_n);
        if (strcmp(now_n, got_n) != 0) stale[i] = 1, nstale++;
    }
    /* Two passes when several: v1 refuses a memory limit above memsw's, and memsw's below memory's. */
    for (int pass = 0; pass < (nstale > 1 ? 2 : 1); pass++)
        for (size_t i = 0; i < COUNT; i++) {
            char buf[256];
            if (!stale[i]) continue;
            const char *value = wanted_limit(cfg, limit_files[i][0], limit_files[i][1], kept, buf, sizeof buf);
            write_in(dir, limit_files[i][0], strcmp(value, "max") == 0 && strchr(limit_files[i][0], '_') ? "-1" : value);
        }
    for (size_t i = 0; i < COUNT; i++) {
        char buf[256], got[256], want_n[256], got_n[256];
        if (!stale[i] || read_text(dir, limit_files[i][0], got, sizeof got) < 0) continue;
        normalize(wanted_limit(cfg, limit_files[i][0], limit_files[i][1], kept, buf, sizeof buf), want_n, sizeof want_n);
        normalize(got, got_n, sizeof got_n);
        if (strcmp(want_n, got_n) != 0)
            return snprintf(why, whylen, "%s reads %s, not %s", limit_files[i][0], got_n, want_n), -1;
    }
    return 0;
}


static long read_long(const char *dir, const char *name) {
    char text[128];
    return read_text(dir, name, text, sizeof text) < 0 ? -1 : atol(text);
}

/* Member processes (v1's tasks, v2's cgroup.procs), a child cgroup (a kernfs directory links one per
 * child), pids.current, v2's cgroup.freeze: a read or a stat each. */
static int is_empty(const char *dir, char *why, size_t whylen) {
    char text[64];
    struct stat st;
    const char *members = read_text(dir, "tasks", text, sizeof text) == 0 ? "tasks" : "cgroup.procs";
    if ((members[0] == 't' || read_text(dir, members, text, sizeof text) == 0) && text[0])
        return snprintf(why, whylen, "a process is left in it (%s: %s)", members, text), 0;
    int got = held_fd >= 0 && dir == held_dir ? fstat(held_fd, &st) : stat(dir, &st);
    if (got < 0 || st.st_nlink > 2) return snprintf(why, whylen, "it holds a child cgroup"), 0;
    long pids = read_long(dir, "pids.current");
    if (pids > 0) return snprintf(why, whylen, "pids.current is %ld", pids), 0;
    if (read_long(dir, "cgroup.freeze") > 0) return snprintf(why, whylen, "it is frozen"), 0;
    return 1;
}


/* Bytes of files' or processes' pages charged (memory.stat: v1's total_cache, total_rss and
 * total_swap, v2's anon and file), naming the first in `key`; -1: unreadable. */
static long user_bytes(const char *dir, char *key, size_t keylen) {
    static const char *user[] = {"total_cache", "total_rss", "total_swap", "anon", "file"};
    char name[64];
    long value, total = 0;
    FILE *f = fopen_in(dir, "memory.stat");
    if (!f) return -1;
    while (fscanf(f, "%63s %ld", name, &value) == 2)
        for (size_t i = 0; i < sizeof user / sizeof *user; i++)
            if (strcmp(name, user[i]) == 0 && value > 0) {
                if (!total) snprintf(key, keylen, "%s", name);
                total += value;
            }
    fclose(f);
    return total;
}

/* The memory charge a dead instance left, to re-base: 0 when none; -1 (saying why) when a page of
 * a file's or a process's is still charged after reclaim (a tmpfs page, a process's), or more than
 * KERNEL_SLACK of the kernel's own objects (its namespaces' structures, which no process of a new
 * instance can read, kept a while by the kernel). Reclaim (v1 memory.force_empty, v2
 * memory.reclaim: about 0.3 ms of CPU, and waits on every CPU) only when such pages are there. */
static long memory_left(const char *dir, char *why, size_t whylen) {
    const char *usage = "memory.usage_in_bytes";
    long left = read_long(dir, usage);
    if (left < 0) left = read_long(dir, usage = "memory.current");
    if (left <= 0) return 0; /* not a memory hierarchy's, or nothing charged */
    char key[64] = "";
    long user = user_bytes(dir, key, sizeof key);
    if (user != 0) {
        if (write_in(dir, "memory.force_empty", "0") < 0 && errno == ENOENT) write_in(dir, "memory.reclaim", "1G");
        left = read_long(dir, usage);
        user = left ? user_bytes(dir, key, sizeof key) : 0;
    }
    if (user < 0) return snprintf(why, whylen, "its memory.stat cannot be read"), -1;
    if (user > 0) return snprintf(why, whylen, "%ld bytes of files or process memory are still charged to it (%s)", user, key), -1;
    if (left > KERNEL_SLACK) return snprintf(why, whylen, "%ld bytes of kernel memory are still charged to it", left), -1;
    return left;
}

/* One cgroup of the set: empty, its memory charge re-based, its limits as asked, its records zeroed. */
static int prove_one(msg_t *cfg, const char *dir, char *why, size_t whylen) {
    if (!is_empty(dir, why, whylen)) return -1;
    long kept = memory_left(dir, why, whylen);
    if (kept < 0 || limits_reset(cfg, dir, kept, why, whylen) < 0) return -1;
    /* Writing 0 zeroes a failcnt, and sets a max_usage to the usage now (the kept objects). */
    static const char *records[] = {"memory.failcnt", "memory.memsw.failcnt", "memory.kmem.failcnt",
                                    "memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"};
    for (size_t r = 0; r < sizeof records / sizeof *records; r++)
        if (write_in(dir, records[r], "0") < 0 && errno != ENOENT)
            return snprintf(why, whylen, "%s could not be re-based: %s", records[r], strerror(errno)), -1;
    return 0;
}

int cgpool_prove(msg_t *cfg, char dirs[][512], int n, char *why, size_t whylen) {
    char prefixes[4][512];
    int np = 0;
    for (uint32_t i = 0; i < cfg->nfields && np < 4; i++)
        if (strcmp(cfg->key[i], "cgroup") == 0) snprintf(prefixes[np++], 512, "%s-", cfg->val[i]);
    if (np != n) return snprintf(why, whylen, "the instance asks for other hierarchies"), -1;
    for (int i = 0; i < n; i++) {
        if (strncmp(dirs[i], prefixes[i], strlen(prefixes[i])) != 0)
            return snprintf(why, whylen, "%s is not of this sandbox's hierarchy %s", dirs[i], prefixes[i]), -1;
        held_dir = dirs[i];
        held_fd = open(dirs[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
        int proved = prove_one(cfg, dirs[i], why, whylen);
        if (held_fd >= 0) close(held_fd);
        held_fd = -1, held_dir = NULL;
        if (proved < 0) return -1;
    }
    return 0;
}

long cgpool_oom_kills(char dirs[][512], int n) {
    long total = 0;
    for (int i = 0; i < n; i++) {
        static const char *files[] = {"memory.oom_control", "memory.events"};
        for (int f = 0; f < 2; f++) {
            char line[256];
            FILE *in = fopen_in(dirs[i], files[f]);
            long kills = 0;
            while (in && fgets(line, sizeof line, in))
                if (sscanf(line, "oom_kill %ld", &kills) == 1) total += kills;
            if (in) fclose(in);
        }
    }
    return total;
}

int cgpool_give(char dirs[][512], int n) {
    if (n == 0 || pooled == POOL) return 0;
    memcpy(pool[pooled].dirs, dirs, sizeof pool[pooled].dirs);
    pool[pooled++].n = n;
    return 1;
}

int cgpool_take(msg_t *cfg, char dirs[][512], int *n, void (*drop)(const char *dir)) {
    while (pooled > AGED) {
        cgset_t set = pool[0];
        memmove(pool, pool + 1, sizeof *pool * (size_t)--pooled);
        char why[1024] = "";
        if (cgpool_prove(cfg, set.dirs, set.n, why, sizeof why) == 0) {
            memcpy(dirs, set.dirs, sizeof set.dirs);
            *n = set.n;
            return 1;
        }
        fprintf(stderr, "snapgym-keeper: cgroup %s not reused: %s\n", set.dirs[0], why);
        for (int i = 0; i < set.n; i++) drop(set.dirs[i]);
    }
    return 0;
}

void cgpool_drain(void (*drop)(const char *dir)) {
    for (int s = 0; s < pooled; s++)
        for (int i = 0; i < pool[s].n; i++) drop(pool[s].dirs[i]);
    pooled = 0;
}
