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

/* ---------------------------------------------------------- resolution */

typedef struct {
    char **part;
    int n, cap;
} parts_t;

static void parts_push(parts_t *p, const char *s, size_t len) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->part = realloc(p->part, sizeof *p->part * p->cap);
        if (!p->part) child_fail("out of memory");
    }
    p->part[p->n] = strndup(s, len);
    if (!p->part[p->n]) child_fail("out of memory");
    p->n++;
}

static void parts_pop(parts_t *p) {
    if (p->n > 0) free(p->part[--p->n]);
}

static void parts_free(parts_t *p) {
    while (p->n) parts_pop(p);
    free(p->part);
    p->part = NULL;
    p->cap = 0;
}

/* Split path into its components, in order. */
static void parts_split(parts_t *p, const char *path) {
    for (const char *s = path; *s;) {
        while (*s == '/') s++;
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len) parts_push(p, s, len);
        s += len;
    }
}

/* The verifier's private places: where no link in the outputs may lead. */
static int is_protected(msg_t *cfg, parts_t *at) {
    if (at->n == 0) return 0;
    if (strcmp(at->part[0], "proc") == 0 || strcmp(at->part[0], "sys") == 0) return 1;
    for (uint32_t i = 0; i < cfg->nfields; i++) {
        const char *k = cfg->key[i], *v = cfg->val[i];
        if (strcmp(k, "private") != 0 && strcmp(k, "tests_at") != 0) continue;
        /* a private dir's top-level folder (e.g. /logs) as a whole; /tests itself */
        parts_t prot = {0};
        parts_split(&prot, v);
        int depth = strcmp(k, "private") == 0 ? 1 : prot.n;
        int hit = prot.n > 0 && at->n >= depth;
        for (int j = 0; hit && j < depth; j++) hit = strcmp(at->part[j], prot.part[j]) == 0;
        parts_free(&prot);
        if (hit) return 1;
    }
    return 0;
}

/* Open the path at (components from the root) without following its last
 * component; -1 if it does not exist. */
static int walk(int rootfd, parts_t *at) {
    int fd = dup(rootfd);
    for (int i = 0; fd >= 0 && i < at->n; i++) {
        int next = openat(fd, at->part[i], O_PATH | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = next;
    }
    return fd;
}

/* Would a process in the verifier's root, following the link at dir/target,
 * pass through a protected place? Links are followed as the kernel would
 * (at most 40); components that do not exist are taken as written. */
static int leads_into_protected(msg_t *cfg, int rootfd, parts_t *dir, const char *target) {
    parts_t at = {0}, todo = {0};
    if (target[0] != '/')
        for (int i = 0; i < dir->n; i++) parts_push(&at, dir->part[i], strlen(dir->part[i]));
    parts_split(&todo, target);
    int hops = 0, hit = 0, first = 0; /* todo is consumed from index `first` */
    while (!hit && first < todo.n) {
        const char *c = todo.part[first++];
        if (strcmp(c, ".") == 0) continue;
        if (strcmp(c, "..") == 0) { parts_pop(&at); continue; }
        parts_push(&at, c, strlen(c));
        if ((hit = is_protected(cfg, &at))) break;
        int fd = walk(rootfd, &at);
        if (fd < 0) continue; /* missing: the rest is taken literally */
        struct stat st;
        char link[4096];
        ssize_t n = -1;
        if (fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) n = readlinkat(fd, "", link, sizeof link - 1);
        close(fd);
        if (n < 0) continue;
        if (++hops > 40) break;
        link[n] = 0;
        parts_pop(&at);
        if (link[0] == '/') while (at.n) parts_pop(&at);
        /* the link's components go before what is left to do */
        parts_t rest = {0};
        parts_split(&rest, link);
        for (int i = first; i < todo.n; i++) parts_push(&rest, todo.part[i], strlen(todo.part[i]));
        parts_free(&todo);
        todo = rest;
        first = 0;
    }
    parts_free(&at);
    parts_free(&todo);
    return hit;
}

/* ------------------------------------------------------------ the audit */

/* Links found to lead somewhere protected; removed only once every output was
 * walked, so a chain (a -> b -> /tests) is judged as the agent left it. */
typedef struct { int dir; char *name; } doomed_t;
static doomed_t *doomed;
static int ndoomed, capdoomed;

static void doom_link(int view_dir, parts_t *dir, const char *name, const char *target) {
    if (ndoomed == capdoomed) {
        capdoomed = capdoomed ? 2 * capdoomed : 16;
        doomed = realloc(doomed, sizeof *doomed * capdoomed);
        if (!doomed) child_fail("out of memory");
    }
    doomed[ndoomed].dir = dup(view_dir);
    doomed[ndoomed].name = strdup(name);
    if (doomed[ndoomed].dir < 0 || !doomed[ndoomed].name) child_fail("remember a link to remove");
    ndoomed++;
    fputs("removed=", report);
    for (int i = 0; i < dir->n; i++) fprintf(report, "/%s", dir->part[i]);
    fprintf(report, "/%s\x1f%s\n", name, target);
}

void remove_doomed(void) {
    for (int i = 0; i < ndoomed; i++) {
        if (unlinkat(doomed[i].dir, doomed[i].name, 0) < 0 && errno != ENOENT)
            child_fail("remove the link %s", doomed[i].name);
        close(doomed[i].dir);
        free(doomed[i].name);
    }
    ndoomed = 0;
}

/* Walk what the agent wrote under the output (one of its layers, fd by fd,
 * never following links) beside the same directory in the verifier's view,
 * and remove the links that lead into protected places. */
void audit_links(msg_t *cfg, int rootfd, int a, const char *rel) {
    typedef struct { DIR *agent; int view; } frame_t;
    int cap = 64, depth = 0;
    frame_t *stack = malloc(sizeof *stack * cap);
    parts_t path = {0};
    parts_split(&path, rel);
    int v = open_beneath(rootfd, *rel ? rel : ".", O_RDONLY | O_DIRECTORY);
    if (!stack || a < 0 || v < 0) {
        if (a >= 0) close(a);
        if (v >= 0) close(v);
        free(stack);
        parts_free(&path);
        return;
    }
    stack[depth++] = (frame_t){fdopendir(a), v};
    while (depth > 0) {
        frame_t *top = &stack[depth - 1];
        struct dirent *e = top->agent ? readdir(top->agent) : NULL;
        if (!e) {
            if (top->agent) closedir(top->agent);
            close(top->view);
            depth--;
            if (depth > 0) parts_pop(&path);
            continue;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        int afd = dirfd(top->agent);
        struct stat st;
        if (fstatat(afd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (S_ISLNK(st.st_mode)) {
            char target[4096], shown[4096];
            ssize_t n = readlinkat(afd, e->d_name, target, sizeof target - 1);
            if (n < 0) continue;
            target[n] = 0;
            /* The verifier sees this layer's link only if no layer above replaced it. */
            ssize_t k = readlinkat(top->view, e->d_name, shown, sizeof shown - 1);
            if (k != n || memcmp(shown, target, n) != 0) continue;
            if (leads_into_protected(cfg, rootfd, &path, target)) doom_link(top->view, &path, e->d_name, target);
        } else if (S_ISDIR(st.st_mode)) {
            int sa = openat(afd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            int sv = openat(top->view, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            DIR *sd = sa >= 0 ? fdopendir(sa) : NULL;
            if (!sd || sv < 0) {
                if (sd) closedir(sd); else if (sa >= 0) close(sa);
                if (sv >= 0) close(sv);
                continue;
            }
            if (depth == cap) {
                cap *= 2;
                stack = realloc(stack, sizeof *stack * cap);
                if (!stack) child_fail("out of memory");
            }
            parts_push(&path, e->d_name, strlen(e->d_name));
            stack[depth++] = (frame_t){sd, sv};
        }
    }
    free(stack);
    parts_free(&path);
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
    remove_doomed();
    if (tests_mount >= 0) {
        mkdirs_owned("", tests_at + 1, uid);
        if (attach_mount(tests_mount, AT_FDCWD, tests_at) < 0) child_fail("attach the tests at %s", tests_at);
    }
    for (uint32_t i = 0; i < cfg->nfields; i++)
        if (strcmp(cfg->key[i], "private") == 0) make_private(cfg->val[i], uid);
    if (fclose(report) != 0) child_fail("write the verification report");
    _exit(0);
}
