/*
 * A shared verifier: it runs beside the agent's live processes (a service the
 * tests talk to) and sees the agent's filesystem, but through a mount
 * namespace of its own whose root is a private tmpfs:
 *
 *   /<dir>        the agent's top-level directories, bound live (recursively)
 *   /<link>       the top-level symbolic links of the known-good snapshot
 *   /etc, /root   private skeletons: every entry bound from the agent's,
 *                 except the hooks, from the known-good snapshot (knowngood.c)
 *   /dev          fresh device nodes, a new devpts; shm and mqueue bound
 *   /tests        the task's tests (a stored layer) with their own upper
 *   private dirs  empty (the reward channel); the agent cannot see them
 *   /<output top> each top-level directory that holds one of the task's
 *                 outputs (the workdir by default), frozen: a copy of the
 *                 agent's writable layer there, made when its turn ended,
 *                 over the layers below, with a fresh upper (freeze.c). Its
 *                 sockets and FIFOs, and mounts snapgym made inside it, are
 *                 bound live, so the tests still reach the agent's services.
 *
 * Every mount point lives in the private tmpfs (or in a frozen copy), so the
 * agent cannot detach or redirect one by renaming or deleting its own files.
 * New top-level entries the agent makes after the verifier began are not
 * seen. What the agent's live processes write outside the frozen outputs the
 * verifier sees as it happens (that is shared mode).
 *
 * Each of the verifier's commands starts from the keeper (shared_exec), joins
 * the sandbox's pid, net, ipc, uts and user namespaces and this mount
 * namespace, takes the same privileges as the agent's commands, and so stays
 * outside the Landlock domain of the agent's processes: they can neither
 * ptrace nor signal it.
 */
#include "sandboxd.h"

static uid_t owner;

typedef struct {
    char name[256]; /* a top-level directory holding an output */
    int mount;      /* its frozen view: a detached writable overlay */
    int agent[64];  /* the agent's checkpoint layers there (open directories), for the link audit */
    int nagent;
} frozen_t;
enum { MAX_FROZEN = 32 };
static frozen_t frozen[MAX_FROZEN];
static int nfrozen;
static int frozen_fs = -1; /* the private tmpfs with the copies */
static freeze_t copied;

/* Clone the mount tree at dirfd/name (recursively, never following a final
 * link) and attach it at to_dir/name, which is created first. */
static int bind_entry(int dirfd, const char *name, int to_dir, int is_dir) {
    if (is_dir) {
        if (mkdirat(to_dir, name, 0755) < 0 && errno != EEXIST) return -1;
    } else {
        int fd = openat(to_dir, name, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) return -1;
        close(fd);
    }
    int tree = sys_open_tree(dirfd, name, OPEN_TREE_CLONE_ | AT_RECURSIVE_ | AT_SYMLINK_NOFOLLOW);
    if (tree < 0) return -1;
    int rc = attach_mount(tree, to_dir, name);
    close(tree);
    return rc;
}

static int mkdir_owned(int dirfd, const char *name, mode_t mode) {
    if (mkdirat(dirfd, name, mode) < 0 && errno != EEXIST) return -1;
    return fchownat(dirfd, name, owner, owner, AT_SYMLINK_NOFOLLOW);
}

/* A private copy of the agent's directory `name` (e.g. "etc"): entries bound
 * live, links copied, hooks from the known-good snapshot. */
static int skeleton(int agent_root, const char *name, int troot, char *err, size_t errlen) {
    struct stat st;
    if (fstatat(agent_root, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode)) st.st_mode = 0755;
    if (mkdir_owned(troot, name, st.st_mode & 07777) < 0) return errno_fail(err, errlen, "create a private directory");
    int to = openat(troot, name, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int from = openat(agent_root, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = from >= 0 ? fdopendir(from) : NULL;
    char path[4096];
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "/%s/%s", name, e->d_name);
        if (is_hook(path)) continue;
        struct stat es;
        if (fstatat(from, e->d_name, &es, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (S_ISLNK(es.st_mode)) {
            char target[4096];
            ssize_t n = readlinkat(from, e->d_name, target, sizeof target - 1);
            if (n < 0) continue;
            target[n] = 0;
            if (symlinkat(target, to, e->d_name) < 0) return errno_fail(err, errlen, "copy a link");
        } else if ((S_ISDIR(es.st_mode) || S_ISREG(es.st_mode)) &&
                   bind_entry(from, e->d_name, to, S_ISDIR(es.st_mode)) < 0) {
            return errno_fail(err, errlen, "bind an entry of the agent's filesystem");
        }
    }
    if (d) closedir(d);
    close(to);
    return 0;
}

static int tmpfs_mount(const char *size, unsigned attrs) {
    char opt[32];
    snprintf(opt, sizeof opt, "%u", owner);
    int fs = sys_fsopen("tmpfs");
    if (fs < 0 || sys_fsconfig_str(fs, "size", size) < 0 || sys_fsconfig_str(fs, "mode", "755") < 0 ||
        sys_fsconfig_str(fs, "uid", opt) < 0 || sys_fsconfig_str(fs, "gid", opt) < 0)
        return -1;
    int mnt = sys_fsmount(fs, attrs);
    close(fs);
    return mnt;
}

static const char *devices[] = {"null", "zero", "full", "random", "urandom", "tty"};
enum { NDEV = sizeof devices / sizeof *devices };

static int fresh_dev(int troot, int agent_root, const int *nodes, int pts, char *err, size_t errlen) {
    int dev = tmpfs_mount("1m", MOUNT_ATTR_NOSUID_);
    if (dev < 0 || mkdirat(troot, "dev", 0755) < 0 || attach_mount(dev, troot, "dev") < 0)
        return errno_fail(err, errlen, "mount /dev");
    for (int i = 0; i < NDEV; i++) {
        int fd = openat(dev, devices[i], O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        if (fd < 0) return errno_fail(err, errlen, "create a device node");
        close(fd);
        if (attach_mount(nodes[i], dev, devices[i]) < 0) return errno_fail(err, errlen, "bind a device node");
        close(nodes[i]);
    }
    static const char *links[][2] = {{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
                                     {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
                                     {"pts/ptmx", "ptmx"}};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++)
        if (symlinkat(links[i][0], dev, links[i][1]) < 0) return errno_fail(err, errlen, "link in /dev");
    if (mkdirat(dev, "pts", 0755) < 0 || attach_mount(pts, dev, "pts") < 0) return errno_fail(err, errlen, "mount /dev/pts");
    int agent_dev = openat(agent_root, "dev", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    for (int i = 0; agent_dev >= 0 && i < 2; i++) {
        const char *name = i ? "mqueue" : "shm";
        if (bind_entry(agent_dev, name, dev, 1) < 0) return errno_fail(err, errlen, "bind /dev/shm or /dev/mqueue");
    }
    if (agent_dev >= 0) close(agent_dev);
    close(dev);
    return 0;
}

static int is_skipped(msg_t *cfg, const char *name) {
    if (strcmp(name, "dev") == 0) return 1;
    for (uint32_t i = 0; i < cfg->nfields; i++) {
        const char *k = cfg->key[i], *v = cfg->val[i];
        if (strcmp(k, "tests_at") && strcmp(k, "private") && strcmp(k, "skeleton")) continue;
        size_t len = strlen(name);
        if (v[0] == '/' && strncmp(v + 1, name, len) == 0 && (v[1 + len] == 0 || v[1 + len] == '/')) return 1;
    }
    return 0;
}

static int is_frozen(const char *name) {
    for (int i = 0; i < nfrozen; i++)
        if (strcmp(frozen[i].name, name) == 0) return 1;
    return 0;
}

/* The top-level directories that hold the task's outputs ("output" fields),
 * frozen: the agent's writable layer there is copied (freeze.c), then stacked
 * with the layers the agent's sandbox has below it (its checkpoints', then the
 * known-good snapshot's) into a detached writable overlay. Done in the
 * keeper's namespace, where the layers can be reached; the copies are named
 * through /proc/self/fd, so no host path shows in the verifier's mountinfo.
 * An output directory the agent deleted, or replaced by something else, is
 * shown empty and reported missing, as in strict mode. */
static int freeze_outputs(msg_t *cfg, int agent_upper, FILE *report, char *err, size_t errlen) {
    nfrozen = 0;
    for (uint32_t i = 0; i < cfg->nfields && nfrozen < MAX_FROZEN; i++) {
        if (strcmp(cfg->key[i], "output") != 0) continue;
        const char *top = cfg->val[i];
        while (*top == '/') top++;
        size_t len = strcspn(top, "/");
        if (len == 0 || len >= sizeof frozen[0].name) continue; /* "/": shown live */
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)len, top);
        if (is_skipped(cfg, name) || is_frozen(name) || strcmp(name, "proc") == 0 || strcmp(name, "sys") == 0)
            continue; /* private, or a skeleton (/etc, /root): handled on their own */
        snprintf(frozen[nfrozen].name, sizeof frozen[nfrozen].name, "%s", name);
        frozen[nfrozen].mount = -1;
        frozen[nfrozen++].nagent = 0;
    }
    if (nfrozen == 0) return 0;
    const char *size = field(cfg, "tmpfs_bytes");
    if ((frozen_fs = tmpfs_mount(size ? size : "1073741824", MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_)) < 0)
        return errno_fail(err, errlen, "mount the space for the frozen outputs");
    char copies[64];
    snprintf(copies, sizeof copies, "/proc/self/fd/%d", frozen_fs);
    char *stack[2 * MAX_LAYERS + 1];
    int n = 0;
    stack[n++] = copies;
    n += fields_of(cfg, "agent_layer", stack + n, MAX_LAYERS);
    int n_agent = n;
    char **known_good;
    int nknown = known_good_layers(&known_good);
    for (int i = 0; i < nknown; i++) stack[n++] = known_good[i];
    for (int f = 0; f < nfrozen; f++) {
        const char *name = frozen[f].name;
        if (freeze_tree(agent_upper, name, frozen_fs, &copied) < 0) copied.skipped++;
        int idx[2 * MAX_LAYERS + 1], touched;
        int found = stack_dirs(stack, n, n_agent, name, idx, 2 * MAX_LAYERS + 1, &touched);
        char *lowers[2 * MAX_LAYERS + 1], empty[96];
        if (found == 0 && !touched) continue; /* absent in the snapshot too: shown absent */
        if (found == 0) {
            snprintf(empty, sizeof empty, ".empty-%d", f);
            if (mkdirat(frozen_fs, empty, 0755) < 0 || fchownat(frozen_fs, empty, owner, owner, 0) < 0)
                return errno_fail(err, errlen, "create an empty output directory");
            snprintf(empty, sizeof empty, "%s/.empty-%d", copies, f);
            lowers[0] = empty;
            found = 1;
            fprintf(report, "missing=/%s\n", name);
        } else {
            for (int i = 0; i < found; i++)
                if (asprintf(&lowers[i], "%s/%s", stack[idx[i]], name) < 0) return errno_fail(err, errlen, "out of memory");
        }
        struct stat st;
        if (stat(lowers[0], &st) < 0) return errno_fail(err, errlen, "read a frozen output directory");
        frozen[f].mount = writable_overlay(lowers, found, st.st_mode, st.st_uid, st.st_gid);
        if (frozen[f].mount < 0) return errno_fail(err, errlen, "mount a frozen output directory");
        if (lowers[0] != empty)
            for (int i = 0; i < found; i++) free(lowers[i]);
        for (int i = 1; i < n_agent && frozen[f].nagent < 64; i++) {
            int layer = open(stack[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            int at = layer >= 0 ? open_beneath(layer, name, O_RDONLY | O_DIRECTORY) : -1;
            if (layer >= 0) close(layer);
            if (at >= 0) frozen[f].agent[frozen[f].nagent++] = at;
        }
    }
    return 0;
}

/* Open the directory that holds rel (below root, never following a link) and name its last component. */
static int parent_beneath(int root, const char *rel, char *base, size_t baselen) {
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", rel);
    char *slash = strrchr(parent, '/');
    snprintf(base, baselen, "%s", slash ? slash + 1 : parent);
    if (slash) *slash = 0;
    return open_beneath(root, slash ? parent : ".", O_PATH | O_DIRECTORY);
}

/* Over the frozen copy of a socket or FIFO, the live one (if it still is one), so the tests reach
 * the service behind it. */
static void bind_live_endpoint(int agent_root, int troot, const char *rel) {
    int at = open_beneath(agent_root, rel, O_PATH); /* no link on the way: the agent may have made one since */
    int tree = at >= 0 ? sys_open_tree(at, "", OPEN_TREE_CLONE_ | AT_EMPTY_PATH) : -1;
    if (at >= 0) close(at);
    struct stat st;
    char base[256];
    if (tree >= 0 && fstat(tree, &st) == 0 && (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode))) {
        int dir = parent_beneath(troot, rel, base, sizeof base);
        if (dir >= 0 && attach_mount(tree, dir, base) < 0) {}
        if (dir >= 0) close(dir);
    }
    if (tree >= 0) close(tree);
}

/* Mounts snapgym made inside a frozen directory (the sandbox's own binds) are shown live over it. */
static void bind_live_submounts(int agent_root, int troot) {
    FILE *info = fopen("/proc/self/mountinfo", "r");
    char line[8192], bound[64][PATH_MAX];
    int nbound = 0;
    while (info && nbound < 64 && fgets(line, sizeof line, info)) {
        char point[PATH_MAX], *field5 = line;
        for (int i = 0; i < 4 && field5; i++) field5 = strchr(field5 + 1, ' ');
        if (!field5 || sscanf(field5 + 1, "%4095s", point) != 1) continue;
        char rel[PATH_MAX];
        size_t o = 0;
        for (const char *c = point + 1; *c && o + 1 < sizeof rel; c++) { /* mountinfo escapes " \t\n\\" as \ooo */
            if (c[0] == '\\' && c[1] >= '0' && c[1] <= '7' && c[2] && c[3]) {
                rel[o++] = (char)((c[1] - '0') * 64 + (c[2] - '0') * 8 + (c[3] - '0'));
                c += 3;
            } else {
                rel[o++] = *c;
            }
        }
        rel[o] = 0;
        size_t top = strcspn(rel, "/");
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)top, rel);
        if (!rel[top] || !is_frozen(name)) continue; /* not strictly inside a frozen directory */
        int inside = 0;
        for (int i = 0; i < nbound && !inside; i++) {
            size_t l = strlen(bound[i]);
            inside = strncmp(rel, bound[i], l) == 0 && rel[l] == '/';
        }
        if (inside) continue; /* came with the recursive bind of a mount above it */
        int tree = sys_open_tree(agent_root, rel, OPEN_TREE_CLONE_ | AT_RECURSIVE_ | AT_SYMLINK_NOFOLLOW);
        struct stat st;
        char base[256];
        if (tree >= 0 && fstat(tree, &st) == 0) {
            /* the mount point, made in the frozen view if the agent's layers do not have it */
            for (char *slash = strchr(rel, '/'); slash; slash = strchr(slash + 1, '/')) {
                *slash = 0;
                if (mkdirat(troot, rel, 0755) < 0 && errno != EEXIST) {}
                *slash = '/';
            }
            int dir = parent_beneath(troot, rel, base, sizeof base);
            if (dir >= 0) {
                if (S_ISDIR(st.st_mode)) { if (mkdirat(dir, base, 0755) < 0) {} }
                else { int fd = openat(dir, base, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644); if (fd >= 0) close(fd); }
                if (attach_mount(tree, dir, base) == 0) snprintf(bound[nbound++], PATH_MAX, "%s", rel);
                close(dir);
            }
        }
        if (tree >= 0) close(tree);
    }
    if (info) fclose(info);
}

/* Is name, in the sandbox's root, a mount of its own (a bind snapgym made, not a directory of the layers)? */
static int is_mount_root(int agent_root, const char *name) {
    struct statx sx;
    return syscall(SYS_statx, agent_root, name, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) == 0 &&
           (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

/* Everything that needs a host path, done in the keeper's namespace: the
 * scratch tmpfs, the tests' overlay, the private root, devpts, clones of the
 * host's device nodes.
 * Layers are named through /proc/self/fd, so the mount options the sandbox
 * can read hold no host paths. */
static int detached_mounts(msg_t *cfg, int *tests, int *troot, int *pts, int *nodes, char *err, size_t errlen) {
    const char *size = field(cfg, "tmpfs_bytes");
    if (!size) size = "1073741824";
    int scratch = tmpfs_mount(size, MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_); /* kept open: the uppers live there */
    if (scratch < 0)
        return errno_fail(err, errlen, "mount the verifier's scratch space");
    known_good_init(cfg, owner, scratch);
    char *lower[1] = {(char *)field(cfg, "tests_lower")};
    if (!lower[0] || (*tests = writable_overlay(lower, 1, 0755, owner, owner)) < 0)
        return errno_fail(err, errlen, "mount the tests");
    if ((*troot = tmpfs_mount(size, MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_)) < 0)
        return errno_fail(err, errlen, "mount the verifier's root");
    int fs = sys_fsopen("devpts");
    if (fs < 0 || sys_fsconfig_str(fs, "ptmxmode", "0666") < 0 || sys_fsconfig_str(fs, "mode", "620") < 0 ||
        (*pts = sys_fsmount(fs, MOUNT_ATTR_NOSUID_)) < 0)
        return errno_fail(err, errlen, "mount /dev/pts");
    close(fs);
    for (int i = 0; i < NDEV; i++) {
        char path[64];
        snprintf(path, sizeof path, "/dev/%s", devices[i]);
        /* cloned now: a mount can only be cloned from the namespace it is in */
        if ((nodes[i] = sys_open_tree(AT_FDCWD, path, OPEN_TREE_CLONE_)) < 0)
            return errno_fail(err, errlen, "clone a host device node");
    }
    return 0;
}

int shared_view_build(msg_t *cfg, pid_t init_pid, const char *stage, char *err, size_t errlen) {
    const char *uid_s = field(cfg, "root_uid");
    owner = uid_s ? (uid_t)atol(uid_s) : 0;
    int tests = -1, troot = -1, pts = -1, nodes[NDEV];
    if (detached_mounts(cfg, &tests, &troot, &pts, nodes, err, errlen) < 0) return -1;
    if (known_good_load(cfg, err, errlen) < 0) return -1;
    /* The agent's writable layer, for the link audit, and the report, while host paths reach them. */
    char path[4200];
    snprintf(path, sizeof path, "%s/upper", stage);
    int agent_upper = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    snprintf(path, sizeof path, "%s/report", stage);
    FILE *report = fopen(path, "w");
    if (agent_upper < 0 || !report) return errno_fail(err, errlen, "open the agent's writable layer");
    if (freeze_outputs(cfg, agent_upper, report, err, errlen) < 0) return -1;
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)init_pid);
    int mnt = open(path, O_RDONLY | O_CLOEXEC);
    if (mnt < 0 || setns(mnt, CLONE_NEWNS) < 0) return errno_fail(err, errlen, "enter the sandbox's mount namespace");
    close(mnt);
    if (unshare(CLONE_NEWNS) < 0) return errno_fail(err, errlen, "copy the sandbox's mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return errno_fail(err, errlen, "make mounts private");
    int agent_root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (agent_root < 0) return errno_fail(err, errlen, "open the sandbox's root");
    if (attach_mount(troot, AT_FDCWD, "/") < 0) return errno_fail(err, errlen, "attach the verifier's root");

    DIR *d = fdopendir(dup(agent_root));
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || is_skipped(cfg, name) || is_top_link(name))
            continue;
        if (is_frozen(name) && !is_mount_root(agent_root, name)) continue; /* attached below */
        struct stat st;
        if (fstatat(agent_root, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
            continue; /* top-level files and links the agent made are not shown */
        if (bind_entry(agent_root, name, troot, 1) < 0) return errno_fail(err, errlen, "bind a top-level directory");
    }
    if (d) closedir(d);
    for (int f = 0; f < nfrozen; f++) {
        if (is_mount_root(agent_root, frozen[f].name)) { /* a bind snapgym made: shown live, as it is */
            if (frozen[f].mount >= 0) close(frozen[f].mount);
            frozen[f].name[0] = 0;
            continue;
        }
        if (frozen[f].mount < 0) continue;
        if (mkdir_owned(troot, frozen[f].name, 0755) < 0 || attach_mount(frozen[f].mount, troot, frozen[f].name) < 0)
            return errno_fail(err, errlen, "attach a frozen output directory");
        close(frozen[f].mount);
    }
    for (int i = 0; i < copied.nlive; i++) bind_live_endpoint(agent_root, troot, copied.live[i]);
    bind_live_submounts(agent_root, troot);
    if (place_top_links(troot, err, errlen) < 0) return -1;
    for (uint32_t i = 0; i < cfg->nfields; i++)
        if (strcmp(cfg->key[i], "skeleton") == 0 && skeleton(agent_root, cfg->val[i] + 1, troot, err, errlen) < 0)
            return -1;
    if (place_hooks(troot, err, errlen) < 0) return -1;
    if (fresh_dev(troot, agent_root, nodes, pts, err, errlen) < 0) return -1;
    const char *tests_at = field(cfg, "tests_at");
    if (!tests_at || mkdir_owned(troot, tests_at + 1, 0755) < 0 || attach_mount(tests, troot, tests_at + 1) < 0)
        return errno_fail(err, errlen, "attach the tests");
    for (uint32_t i = 0; i < cfg->nfields; i++) {
        if (strcmp(cfg->key[i], "private") != 0) continue;
        char rel[4096];
        snprintf(rel, sizeof rel, "%s", cfg->val[i] + 1);
        for (char *slash = strchr(rel, '/');; slash = strchr(slash + 1, '/')) {
            if (slash) *slash = 0;
            if (mkdir_owned(troot, rel, 0755) < 0) return errno_fail(err, errlen, "create a private directory");
            if (!slash) break;
            *slash = '/';
        }
    }
    close(agent_root);
    if (fchdir(troot) < 0) return errno_fail(err, errlen, "enter the verifier's root");
    if (syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0)
        return errno_fail(err, errlen, "switch to the verifier's root");
    if (chdir("/") < 0) return errno_fail(err, errlen, "chdir /");
    /* Links the agent left that would lead the verifier into its private paths are removed, as in
     * strict mode (the agent's live processes could make new ones: that is shared mode). */
    int rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) return errno_fail(err, errlen, "open the verifier's root");
    set_report(report);
    /* frozen outputs: the copies and the agent's checkpoint layers there; elsewhere its live layer */
    for (int f = 0; f < nfrozen; f++) {
        const char *name = frozen[f].name;
        if (!name[0]) continue;
        audit_links(cfg, rootfd, openat(frozen_fs, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), name);
        for (int i = 0; i < frozen[f].nagent; i++) audit_links(cfg, rootfd, frozen[f].agent[i], name);
    }
    DIR *live = fdopendir(dup(agent_upper));
    while (live && (e = readdir(live))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        if (is_frozen(e->d_name)) continue;
        audit_links(cfg, rootfd, openat(agent_upper, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), e->d_name);
    }
    if (live) closedir(live);
    remove_links();
    if (fclose(report) != 0) return errno_fail(err, errlen, "write the verification report");
    set_report(NULL);
    return 0;
}

/* ---------------------------------------------------------------- exec */

enum { NS_MNT, NS_PID, NS_NET, NS_IPC, NS_UTS, NS_USER };

void shared_exec(msg_t *m, msg_t *cfg, const int ns[6], char cgroups[][512], int ncg) {
    int status_fd = m->fds[m->nfds - 1];
    fail_status_fd = status_fd;
    char path[600];
    for (int i = 0; i < ncg; i++) {
        snprintf(path, sizeof path, "%s/cgroup.procs", cgroups[i]);
        if (write_file_str(path, "0") < 0) child_fail("join the verifier's cgroup");
    }
    static const int order[] = {NS_NET, NS_IPC, NS_UTS, NS_PID, NS_MNT, NS_USER};
    static const int kinds[] = {CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWPID, CLONE_NEWNS, CLONE_NEWUSER};
    for (int i = 0; i < 6; i++)
        if (setns(ns[order[i]], kinds[i]) < 0) child_fail("enter the sandbox's namespaces");
    if (chdir("/") < 0) child_fail("chdir /");
    if (setresgid(0, 0, 0) < 0) child_fail("become gid 0 in the sandbox");
    setgroups(0, NULL);
    if (setresuid(0, 0, 0) < 0) child_fail("become uid 0 in the sandbox");
    drop_privileges(cfg);
    /* Twice, so that the reaper's parent, which exits at once, is inside the
     * sandbox's pid namespace: its init adopts the reaper and reaps it (an
     * orphan of a process outside would be left to the host's init, and the
     * namespace could not end before it did). */
    pid_t pid = fork();
    if (pid < 0) child_fail("fork into the sandbox");
    if (pid == 0) {
        pid_t reaper = fork();
        if (reaper < 0) child_fail("fork into the sandbox");
        if (reaper == 0) {
            fail_status_fd = -1;
            set_title(m->op == OP_EXEC ? "snapgym-exec" : "snapgym-file");
            if (m->op == OP_EXEC) run_reaper(m);
            run_file_op(m);
        }
        _exit(0);
    }
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    _exit(0);
}
