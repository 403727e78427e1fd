/*
 * A strict verifier's filesystem, put together in the cloned child before it
 * becomes init (the namespaces are new, so nothing of the agent runs).
 *
 * The root is the known-good snapshot (the task's, also when the episode
 * started from a checkpoint) with a fresh writable layer. Onto it go, for each
 * output directory P, an overlay that shows P as the agent left it: the
 * agent's layers at P (its writable layer, then the layers of the checkpoint
 * it started from above the known-good ones: the "agent_layer" fields) over
 * the known-good layers at P, stacked from the layers themselves (not over
 * another overlay, which could exceed the kernel's stacking depth), with a
 * fresh upper so the tests may write.
 * Then the task's tests (a stored layer) at /tests with their own upper, and
 * the private directories (the reward channel), created empty.
 *
 * A symbolic link the agent left in an output that would lead the verifier
 * into /tests, a private directory, /proc or /sys (say answer.txt ->
 * /tests/expected.txt) is removed (a whiteout in the graft's upper) and
 * reported in STAGE/report, as is an output that is not a directory in the
 * agent's end state (the verifier then sees it empty).
 */
#include "sandboxd.h"

launch_t launch;

static FILE *report;
static int grafts;

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

static void report_link(parts_t *dir, const char *name, const char *target) {
    fputs("removed=", report);
    for (int i = 0; i < dir->n; i++) fprintf(report, "/%s", dir->part[i]);
    fprintf(report, "/%s\x1f%s\n", name, target);
}

/* Walk what the agent wrote under the output (one of its layers, fd by fd,
 * never following links) beside the same directory in the verifier's view,
 * and remove the links that lead into protected places. */
static void audit_links(msg_t *cfg, int rootfd, const char *agent_upper, const char *rel) {
    typedef struct { DIR *agent; int view; } frame_t;
    int cap = 64, depth = 0;
    frame_t *stack = malloc(sizeof *stack * cap);
    parts_t path = {0};
    parts_split(&path, rel);
    int a = open(agent_upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (a >= 0) {
        int sub = open_beneath(a, rel, O_RDONLY | O_DIRECTORY);
        close(a);
        a = sub;
    }
    int v = open_beneath(rootfd, rel, O_RDONLY | O_DIRECTORY);
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
            if (leads_into_protected(cfg, rootfd, &path, target)) {
                if (unlinkat(top->view, e->d_name, 0) < 0) child_fail("remove the link %s", e->d_name);
                report_link(&path, e->d_name, target);
            }
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
    for (char *part = strtok(copy, "/"); part; part = strtok(NULL, "/")) {
        off += snprintf(path + off, sizeof path - off, "/%s", part);
        if (mkdir(path, 0755) == 0) {
            if (chown(path, uid, uid) < 0) child_fail("hand %s to the sandbox's root", path);
        } else if (errno != EEXIST) {
            child_fail("create %s", path);
        }
    }
}

static void graft_output(msg_t *cfg, const char *root, int rootfd, const char *out, uid_t uid) {
    const char *rel = out + 1;
    /* The agent's layers first (its writable layer on top), then the known-good ones. */
    char *stack[520];
    int n = 0;
    stack[n++] = launch.agent_upper;
    n += fields_of(cfg, "agent_layer", stack + n, 256);
    int n_agent = n;
    n += fields_of(cfg, "lower", stack + n, 256);
    int dirs[520], touched;
    int found = stack_dirs(stack, n, n_agent, rel, dirs, 512, &touched);
    if (!touched) return; /* untouched by the agent: the known-good snapshot shows it as it was */
    char target[8192], dir[64], upper[96], work[96];
    snprintf(target, sizeof target, "%s%s", root, out);
    mkdirs_owned(root, rel, uid);
    int id = grafts++;
    if (found == 0) { /* deleted, or replaced by something that is not a directory */
        snprintf(dir, sizeof dir, "E%d", id);
        if (mkdir(dir, 0755) < 0 || chown(dir, uid, uid) < 0) child_fail("create an empty %s", out);
        if (mount(dir, target, NULL, MS_BIND, NULL) < 0) child_fail("show %s empty", out);
        fprintf(report, "missing=%s\n", out);
        return;
    }
    /* Each lower is the layer's copy of the output directory itself. */
    char *paths[520];
    for (int i = 0; i < found; i++)
        if (asprintf(&paths[i], "%s/%s", stack[dirs[i]], rel) < 0) child_fail("out of memory");
    snprintf(dir, sizeof dir, "G%d", id);
    snprintf(upper, sizeof upper, "%s/upper", dir);
    snprintf(work, sizeof work, "%s/work", dir);
    struct stat top;
    if (stat(paths[0], &top) < 0) child_fail("read %s in the agent's end state", out);
    if (mkdir(dir, 0700) < 0 || mkdir(upper, top.st_mode & 07777) < 0 || mkdir(work, 0700) < 0 ||
        chown(upper, top.st_uid, top.st_gid) < 0 || chmod(upper, top.st_mode & 07777) < 0)
        child_fail("prepare the writable layer of %s", out);
    if (mount_overlay(target, paths, found, upper, work) < 0) child_fail("show the agent's %s", out);
    for (int i = 0; i < found; i++) free(paths[i]);
    for (int i = 0; i < n_agent; i++) audit_links(cfg, rootfd, stack[i], rel);
}

void graft_verifier(msg_t *cfg, const char *root) {
    const char *uid_s = field(cfg, "root_uid");
    uid_t uid = uid_s ? (uid_t)atol(uid_s) : 0;
    report = fopen("report", "w");
    if (!report) child_fail("open the verification report");
    int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) child_fail("open the verifier's root");
    /* Deep trees in the outputs need an open directory per level. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    for (uint32_t i = 0; i < cfg->nfields; i++)
        if (strcmp(cfg->key[i], "output") == 0) graft_output(cfg, root, rootfd, cfg->val[i], uid);
    const char *tests = field(cfg, "tests_lower"), *tests_at = field(cfg, "tests_at");
    if (tests && tests_at) {
        char target[8192];
        char *lower[1] = {(char *)tests};
        snprintf(target, sizeof target, "%s%s", root, tests_at);
        mkdirs_owned(root, tests_at + 1, uid);
        if (mkdir("T", 0700) < 0 || mkdir("T/upper", 0755) < 0 || mkdir("T/work", 0700) < 0 ||
            chown("T/upper", uid, uid) < 0)
            child_fail("prepare the writable layer of %s", tests_at);
        if (mount_overlay(target, lower, 1, "T/upper", "T/work") < 0) child_fail("mount the tests at %s", tests_at);
    }
    for (uint32_t i = 0; i < cfg->nfields; i++)
        if (strcmp(cfg->key[i], "private") == 0) mkdirs_owned(root, cfg->val[i] + 1, uid);
    close(rootfd);
    if (fclose(report) != 0) child_fail("write the verification report");
    report = NULL;
}
