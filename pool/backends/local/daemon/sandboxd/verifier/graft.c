/*
 * A strict verifier's filesystem, grafted by a helper of the keeper onto a
 * fresh instance (the prewarmed spare, usually) before the verifier's first
 * command. Nothing of the agent runs: its instance is dead by then.
 *
 * The instance's root is the known-good snapshot (the task's, also when the
 * episode started from a checkpoint) with a fresh writable layer. Onto it go,
 * for each output directory P, an overlay that shows P as the agent left it:
 * the agent's layers at P (its writable layer, then the layers of the
 * checkpoint it started from above the known-good ones: the "agent_layer"
 * fields) over the known-good layers at P, stacked from the layers themselves
 * (not over another overlay, which could exceed the kernel's stacking
 * depth), with a fresh upper so the tests may write. Then the task's tests (a
 * stored layer) at /tests with their own upper, and the private directories
 * (the reward channel), created empty.
 *
 * The mounts are made detached in the keeper's namespace, where the layers
 * can be reached, and attached after entering the instance's. A symbolic link
 * the agent left in an output that would lead the verifier into /tests, a
 * private directory, /proc or /sys (say answer.txt -> /tests/expected.txt) is
 * then removed (a whiteout in the graft's upper) and reported in STAGE/report,
 * as is an output that is not a directory in the agent's end state (the
 * verifier sees it empty).
 */
#include "sandboxd.h"

launch_t launch;

static FILE *report;

void set_report(FILE *to) { report = to; }
static int names;

/* ------------------------------------------------------------ the audit */

/* Which links lead where: ../../csrc/linkaudit.c, the same audit as the Docker helper's. */

void linkaudit_fail(const char *what) { child_fail("%s", what); }

static void report_removed(const char *path, const char *target) {
    fprintf(report, "removed=%s\x1f%s\n", path, target);
}

/* Walk what the agent wrote under the output (one of its layers, fd by fd,
 * never following links) beside the same directory in the verifier's view,
 * and doom the links that lead into protected places: /proc, /sys, and the
 * top-level folders of the tests and the private directories. */
void audit_links(msg_t *cfg, int rootfd, int a, const char *rel) {
    unprotect_all();
    for (uint32_t i = 0; i < cfg->nfields; i++)
        if (strcmp(cfg->key[i], "private") == 0 || strcmp(cfg->key[i], "tests_at") == 0) protect(cfg->val[i]);
    int v = open_beneath(rootfd, *rel ? rel : ".", O_RDONLY | O_DIRECTORY);
    audit_tree(rootfd, a, v, rel, report_removed);
}

void remove_links(void) {
    const char *bad = remove_doomed();
    if (bad) child_fail("remove the link %s", bad);
}

/* ------------------------------------------------------------- mounting */

/* mkdir -p below root, giving what it creates to the sandbox's root user. */
static void mkdirs_owned(const char *root, const char *rel, uid_t uid) {
    char path[8192];
    size_t off = snprintf(path, sizeof path, "%s", root);
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", rel);
    char *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        off += snprintf(path + off, sizeof path - off, "/%s", part);
        if (mkdir(path, 0755) == 0) {
            if (chown(path, uid, uid) < 0) child_fail("hand %s to the sandbox's root", path);
        } else if (errno != EEXIST) {
            child_fail("create %s", path);
        }
    }
}

/* A detached overlay of lowers (host paths, top first) under upper/work
 * (relative to the stage, the current directory); the layers are named
 * through links in the stage, so the options the sandbox can read hold no
 * host paths. */
static int detached_overlay(char *const *lowers, int n, const char *upper, const char *work) {
    size_t size = 24 * (size_t)n + 16;
    char *lowerdir = malloc(size), name[32];
    if (!lowerdir) return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "V%d", names++);
        if (symlink(lowers[i], name) < 0) { free(lowerdir); return -1; }
        off += snprintf(lowerdir + off, size - off, "%s%s", i ? ":" : "", name);
    }
    int mnt = overlay_fsmount(lowerdir, upper, work);
    free(lowerdir);
    return mnt;
}

/* A fresh upper directory for a graft, owned and moded like the directory it covers. */
static void fresh_upper(const char *dir, mode_t mode, uid_t uid, gid_t gid) {
    char upper[96], work[96];
    snprintf(upper, sizeof upper, "%s/upper", dir);
    snprintf(work, sizeof work, "%s/work", dir);
    if (mkdir(dir, 0700) < 0 || mkdir(upper, mode & 07777) < 0 || mkdir(work, 0700) < 0 ||
        chown(upper, uid, gid) < 0 || chmod(upper, mode & 07777) < 0)
        child_fail("prepare a writable layer for the verifier");
}

/* A private directory, empty and in the writable layer: whatever the known-good snapshot
 * has there is removed (whiteouts), so what the verifier finds there is its own. */
static void make_private(const char *path, uid_t uid) {
    mkdirs_owned("", path + 1, uid);
    int dir = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = dir >= 0 ? fdopendir(dir) : NULL;
    if (!d) child_fail("open the private directory %s", path);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) < 0 && unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) < 0)
            child_fail("empty the private directory %s (a non-empty folder %s is in the snapshot)", path, e->d_name);
    }
    closedir(d);
}

typedef struct {
    const char *out;   /* absolute, in the sandbox */
    int mount;         /* detached, attached at out */
    int agent[256];    /* the agent's layers at out (open directories), for the link audit */
    int nagent;
} graft_t;

/* The graft of one output, made in the keeper's namespace. 0: the agent did not touch it. */
static int prepare_graft(msg_t *cfg, const char *out, uid_t uid, graft_t *g) {
    const char *rel = out + 1;
    /* The agent's layers first (its writable layer on top), then the known-good ones. */
    char *stack[520];
    int n = 0;
    stack[n++] = launch.agent_upper;
    n += fields_of(cfg, "agent_layer", stack + n, 255);
    int n_agent = n;
    n += fields_of(cfg, "lower", stack + n, 256);
    int dirs[520], touched;
    int found = stack_dirs(stack, n, n_agent, rel, dirs, 512, &touched);
    if (!touched) return 0; /* the known-good snapshot shows it as it was */
    char dir[32];
    int id = names++;
    *g = (graft_t){out, -1, {0}, 0};
    if (found == 0) { /* deleted, or replaced by something that is not a directory */
        snprintf(dir, sizeof dir, "E%d", id);
        if (mkdir(dir, 0755) < 0 || chown(dir, uid, uid) < 0) child_fail("create an empty %s", out);
        if ((g->mount = sys_open_tree(AT_FDCWD, dir, OPEN_TREE_CLONE_)) < 0) child_fail("show %s empty", out);
        fprintf(report, "missing=%s\n", out);
        return 1;
    }
    char *paths[520], upper[64], work[64];
    for (int i = 0; i < found; i++)
        if (asprintf(&paths[i], "%s/%s", stack[dirs[i]], rel) < 0) child_fail("out of memory");
    struct stat top;
    if (stat(paths[0], &top) < 0) child_fail("read %s in the agent's end state", out);
    snprintf(dir, sizeof dir, "G%d", id);
    fresh_upper(dir, top.st_mode, top.st_uid, top.st_gid);
    snprintf(upper, sizeof upper, "%s/upper", dir);
    snprintf(work, sizeof work, "%s/work", dir);
    if ((g->mount = detached_overlay(paths, found, upper, work)) < 0) child_fail("show the agent's %s", out);
    for (int i = 0; i < found; i++) free(paths[i]);
    for (int i = 0; i < n_agent && g->nagent < 256; i++) {
        int layer = open(stack[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int at = layer >= 0 ? open_beneath(layer, rel, O_RDONLY | O_DIRECTORY) : -1;
        if (layer >= 0) close(layer);
        if (at >= 0) g->agent[g->nagent++] = at;
    }
    return 1;
}

void graft_verifier(msg_t *cfg, pid_t init, const char *stage, int fail_fd) {
    set_failure_fd(fail_fd);
    const char *uid_s = field(cfg, "root_uid");
    uid_t uid = uid_s ? (uid_t)atol(uid_s) : 0;
    if (chdir(stage) < 0) child_fail("enter the verifier's stage");
    report = fopen("report", "w");
    if (!report) child_fail("open the verification report");
    static graft_t grafts[64];
    int ngrafts = 0;
    for (uint32_t i = 0; i < cfg->nfields && ngrafts < 64; i++)
        if (strcmp(cfg->key[i], "output") == 0 && prepare_graft(cfg, cfg->val[i], uid, &grafts[ngrafts])) ngrafts++;
    const char *tests = field(cfg, "tests_lower"), *tests_at = field(cfg, "tests_at");
    int tests_mount = -1;
    if (tests && tests_at) {
        char *lower[1] = {(char *)tests};
        fresh_upper("T", 0755, uid, uid);
        if ((tests_mount = detached_overlay(lower, 1, "T/upper", "T/work")) < 0) child_fail("mount the tests");
    }
    /* Deep trees in the outputs need an open directory per level. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)init);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNS) < 0) child_fail("enter the verifier's mount namespace");
    close(ns);
    int rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) child_fail("open the verifier's root");
    for (int i = 0; i < ngrafts; i++) {
        mkdirs_owned("", grafts[i].out + 1, uid);
        if (attach_mount(grafts[i].mount, AT_FDCWD, grafts[i].out) < 0) child_fail("attach %s", grafts[i].out);
    }
    for (int i = 0; i < ngrafts; i++)
        for (int j = 0; j < grafts[i].nagent; j++) audit_links(cfg, rootfd, grafts[i].agent[j], grafts[i].out + 1);
    remove_links();
    if (tests_mount >= 0) {
        mkdirs_owned("", tests_at + 1, uid);
        if (attach_mount(tests_mount, AT_FDCWD, tests_at) < 0) child_fail("attach the tests at %s", tests_at);
    }
    for (uint32_t i = 0; i < cfg->nfields; i++)
        if (strcmp(cfg->key[i], "private") == 0) make_private(cfg->val[i], uid);
    if (fclose(report) != 0) child_fail("write the verification report");
    _exit(0);
}
