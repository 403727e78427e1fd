/*
 * What a shared verifier (shared.c) takes from the known-good snapshot instead
 * of the agent's filesystem: the hooks (the loader's, shells' and Python's
 * configuration, dotfiles: "hook=PATH" fields) and the top-level links (/bin ->
 * usr/bin and the like, which the agent could otherwise point at its own
 * programs). Both are read in the keeper's namespace, while host paths can
 * still be reached, and placed in the verifier's private root later.
 *
 * Also the detached writable overlays both this and shared.c build: their
 * uppers, and the names of their lower layers, live in the verifier's private
 * scratch tmpfs, so no host path shows in the verifier's mountinfo.
 */
#include "sandboxd.h"

enum { MAX_HOOKS = 256 };

typedef struct {
    char path[512]; /* absolute, in the sandbox */
    char kind;      /* f file, d directory, l link, 0 absent in the known-good snapshot */
    int fd;         /* f: the known-good file; d: a detached writable overlay of the known-good directory */
    char link[4096];
} hook_t;

static hook_t hooks[MAX_HOOKS];
static int nhooks;
static uid_t owner; /* of the hook files copied */
static char *known_good[MAX_LAYERS];
static int nknown;
static int scratch = -1; /* a private tmpfs, never attached: uppers and layer names live here */
static int names;

/* The known-good layers ("known_good" fields, top first), the owner of what is copied, the scratch tmpfs. */
void known_good_init(msg_t *cfg, uid_t copies_owner, int scratch_fs) {
    nknown = fields_of(cfg, "known_good", known_good, MAX_LAYERS);
    owner = copies_owner;
    scratch = scratch_fs;
}

int known_good_layers(char ***layers) {
    *layers = known_good;
    return nknown;
}

/* A name in the scratch tmpfs for a host path, as /proc/self/fd/N/NAME. */
static int scratch_name(const char *target, char *out, size_t outlen) {
    char name[32];
    snprintf(name, sizeof name, "L%d", names++);
    if (symlinkat(target, scratch, name) < 0) return -1;
    snprintf(out, outlen, "/proc/self/fd/%d/%s", scratch, name);
    return 0;
}

/* A detached overlay: lowers (host paths, top first) under a fresh upper in the scratch tmpfs. */
int writable_overlay(char *const *lowers, int n, mode_t mode, uid_t uid, gid_t gid) {
    char up[32], wk[32], path[96];
    int id = names++;
    snprintf(up, sizeof up, "U%d", id);
    snprintf(wk, sizeof wk, "W%d", id);
    if (mkdirat(scratch, up, mode & 07777) < 0 || mkdirat(scratch, wk, 0700) < 0 ||
        fchownat(scratch, up, uid, gid, 0) < 0 || fchmodat(scratch, up, mode & 07777, 0) < 0)
        return -1;
    size_t size = 64 * (size_t)n + 16;
    char *lowerdir = malloc(size);
    if (!lowerdir) return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (scratch_name(lowers[i], path, sizeof path) < 0) { free(lowerdir); return -1; }
        off += snprintf(lowerdir + off, size - off, "%s%s", i ? ":" : "", path);
    }
    char upper[96], work[96];
    snprintf(upper, sizeof upper, "/proc/self/fd/%d/%s", scratch, up);
    snprintf(work, sizeof work, "/proc/self/fd/%d/%s", scratch, wk);
    int mnt = overlay_fsmount(lowerdir, upper, work);
    free(lowerdir);
    return mnt;
}

/* The known-good directory at rel as a writable private overlay (-1 and errno on failure). */
static int known_good_dir(const char *rel, mode_t mode, uid_t uid, gid_t gid) {
    int idx[MAX_LAYERS], touched;
    int n = stack_dirs(known_good, nknown, 0, rel, idx, MAX_LAYERS, &touched);
    char *lowers[MAX_LAYERS];
    for (int i = 0; i < n; i++)
        if (asprintf(&lowers[i], "%s/%s", known_good[idx[i]], rel) < 0) return -1;
    int mnt = n ? writable_overlay(lowers, n, mode, uid, gid) : -1;
    for (int i = 0; i < n; i++) free(lowers[i]);
    return mnt;
}

/* Hooks arrive as "hook=PATH": what the known-good snapshot has there is
 * looked up and opened now, while host paths can still be reached. */
static int load_hooks(msg_t *cfg, char *err, size_t errlen) {
    nhooks = 0;
    for (uint32_t i = 0; i < cfg->nfields && nhooks < MAX_HOOKS; i++) {
        if (strcmp(cfg->key[i], "hook") != 0) continue;
        hook_t *h = &hooks[nhooks++];
        memset(h, 0, sizeof *h);
        h->fd = -1;
        snprintf(h->path, sizeof h->path, "%s", cfg->val[i]);
        struct stat st;
        int at;
        if (!stack_lookup(known_good, nknown, h->path + 1, &st, &at)) continue;
        char source[8192];
        snprintf(source, sizeof source, "%s%s", known_good[at], h->path);
        if (S_ISREG(st.st_mode)) {
            h->kind = 'f';
            if ((h->fd = open(source, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
                return errno_fail(err, errlen, "open a known-good hook file");
        } else if (S_ISLNK(st.st_mode)) {
            ssize_t n = readlink(source, h->link, sizeof h->link - 1);
            if (n < 0) return errno_fail(err, errlen, "read a known-good hook link");
            h->link[n] = 0;
            h->kind = 'l';
        } else if (S_ISDIR(st.st_mode)) {
            h->kind = 'd';
            if ((h->fd = known_good_dir(h->path + 1, st.st_mode, st.st_uid, st.st_gid)) < 0)
                return errno_fail(err, errlen, "mount a known-good hook directory");
        }
    }
    return 0;
}

int is_hook(const char *path) {
    for (int i = 0; i < nhooks; i++)
        if (strcmp(hooks[i].path, path) == 0) return 1;
    return 0;
}

static int copy_fd_to(int from, int to_dir, const char *name) {
    int out = openat(to_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (out < 0) return -1;
    struct stat st;
    char buf[65536];
    ssize_t n;
    lseek(from, 0, SEEK_SET);
    while ((n = read(from, buf, sizeof buf)) > 0)
        if (write(out, buf, n) != n) { close(out); return -1; }
    if (fstat(from, &st) == 0) {
        if (fchmod(out, st.st_mode & 07777) < 0 || fchown(out, owner, owner) < 0) { close(out); return -1; }
    }
    return close(out);
}

/* The hooks, from the known-good snapshot (absent there: absent here too). */
int place_hooks(int troot, char *err, size_t errlen) {
    for (int i = 0; i < nhooks; i++) {
        hook_t *h = &hooks[i];
        const char *rel = h->path + 1;
        int rc = 0;
        if (h->kind == 'd') rc = mkdirat(troot, rel, 0755) < 0 ? -1 : attach_mount(h->fd, troot, rel);
        else if (h->kind == 'l') rc = symlinkat(h->link, troot, rel);
        else if (h->kind == 'f') rc = copy_fd_to(h->fd, troot, rel);
        if (rc < 0) return errno_fail(err, errlen, "place a known-good hook");
        if (h->fd >= 0) close(h->fd);
    }
    return 0;
}

/* The known-good snapshot's top-level links (/bin -> usr/bin and the like),
 * read while host paths can still be reached. */
typedef struct { char name[256], target[1024]; } toplink_t;
static toplink_t toplinks[128];
static int ntoplinks;

static void load_top_links(void) {
    ntoplinks = 0;
    for (int i = 0; i < nknown; i++) {
        DIR *d = opendir(known_good[i]);
        struct dirent *e;
        while (d && (e = readdir(d)) && ntoplinks < 128) {
            if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
            struct stat st;
            int at;
            if (!stack_lookup(known_good, nknown, e->d_name, &st, &at) || at != i || !S_ISLNK(st.st_mode)) continue;
            char source[8192];
            toplink_t *t = &toplinks[ntoplinks];
            snprintf(source, sizeof source, "%s/%s", known_good[at], e->d_name);
            ssize_t n = readlink(source, t->target, sizeof t->target - 1);
            if (n < 0) continue;
            t->target[n] = 0;
            snprintf(t->name, sizeof t->name, "%s", e->d_name);
            ntoplinks++;
        }
        if (d) closedir(d);
    }
}

int is_top_link(const char *name) {
    for (int i = 0; i < ntoplinks; i++)
        if (strcmp(toplinks[i].name, name) == 0) return 1;
    return 0;
}

int place_top_links(int troot, char *err, size_t errlen) {
    for (int i = 0; i < ntoplinks; i++)
        if (symlinkat(toplinks[i].target, troot, toplinks[i].name) < 0)
            return errno_fail(err, errlen, "place a known-good top-level link");
    return 0;
}

/* The hooks and the top-level links, looked up (and opened) in the known-good layers now. */
int known_good_load(msg_t *cfg, char *err, size_t errlen) {
    if (load_hooks(cfg, err, errlen) < 0) return -1;
    load_top_links();
    return 0;
}
