/*
 * A frozen copy of a directory of the agent's live writable layer, for the
 * shared verifier: the agent's processes keep running (the tests talk to
 * them), but what the verifier reads of the task's outputs is what the agent
 * left when its turn ended, so nothing the agent still runs can swap a file
 * for a link to /tests, or rewrite an answer, while the tests read it.
 *
 * The copy is made in a private tmpfs, entry by entry, never following a
 * link, keeping what overlayfs needs (whiteouts, opaque directories: every
 * extended attribute), modes, owners and times, and holes (a sparse file
 * stays sparse). Sockets and FIFOs are copied as such and listed: the view
 * binds the live ones over them, so the tests still reach a service through
 * its socket. An entry that cannot be copied (the agent is changing it, or
 * made something the copy cannot hold) is left out: that is the agent's doing,
 * and the verifier sees the rest. Hard links become separate files.
 */
#include "sandboxd.h"

#include <limits.h>
#include <sys/sendfile.h>
#include <sys/xattr.h>

static void copy_xattrs(int from, int to) {
    char names[16384], value[65536];
    ssize_t len = flistxattr(from, names, sizeof names);
    for (ssize_t off = 0; len > 0 && off < len; off += (ssize_t)strlen(names + off) + 1) {
        ssize_t n = fgetxattr(from, names + off, value, sizeof value);
        if (n >= 0 && fsetxattr(to, names + off, value, (size_t)n, 0) < 0) {}
    }
}

static void copy_owner_times(int fd, const struct stat *st) {
    if (fchown(fd, st->st_uid, st->st_gid) < 0) {}
    if (fchmod(fd, st->st_mode & 07777) < 0) {}
    struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (futimens(fd, times) < 0) {}
}

/* The data of from, segment by segment (holes are skipped, so they stay holes). */
static int copy_data(int from, int to, off_t size) {
    off_t at = 0;
    while (at < size) {
        off_t data = lseek(from, at, SEEK_DATA);
        if (data < 0) break; /* only a hole is left */
        off_t hole = lseek(from, data, SEEK_HOLE);
        if (hole < 0) hole = size;
        off_t pos = data;
        if (lseek(to, data, SEEK_SET) < 0) return -1;
        while (pos < hole) {
            ssize_t n = sendfile(to, from, &pos, (size_t)(hole - pos < (1 << 30) ? hole - pos : (1 << 30)));
            if (n <= 0) return n < 0 ? -1 : 0; /* truncated meanwhile: what is there is copied */
        }
        at = hole;
    }
    return ftruncate(to, size);
}

static int copy_file(int src_dir, const char *name, int dst_dir, const struct stat *st) {
    int from = openat(src_dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (from < 0) return -1;
    struct stat now;
    if (fstat(from, &now) < 0 || !S_ISREG(now.st_mode)) { close(from); return -1; }
    int to = openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (to < 0) { close(from); return -1; }
    int rc = copy_data(from, to, now.st_size);
    copy_xattrs(from, to);
    copy_owner_times(to, st);
    close(from);
    if (close(to) < 0) rc = -1;
    if (rc < 0) unlinkat(dst_dir, name, 0);
    return rc;
}

static int copy_special(int src_dir, const char *name, int dst_dir, const struct stat *st) {
    if (S_ISLNK(st->st_mode)) {
        char target[4096];
        ssize_t n = readlinkat(src_dir, name, target, sizeof target - 1);
        if (n < 0) return -1;
        target[n] = 0;
        if (symlinkat(target, dst_dir, name) < 0) return -1;
    } else if (mknodat(dst_dir, name, st->st_mode & (S_IFMT | 07777), st->st_rdev) < 0) {
        return -1; /* whiteouts (0/0) are allowed; other device nodes need host root */
    }
    if (fchownat(dst_dir, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0) {}
    struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (utimensat(dst_dir, name, times, AT_SYMLINK_NOFOLLOW) < 0) {}
    return 0;
}

typedef struct {
    DIR *src;
    int dst;
    struct stat st; /* the source directory's, applied once its content is in */
    size_t pathlen; /* of the relative path up to this directory */
} frame_t;

static void finish_dir(frame_t *f) {
    copy_xattrs(dirfd(f->src), f->dst);
    copy_owner_times(f->dst, &f->st);
    closedir(f->src);
    close(f->dst);
}

/* A subdirectory's frame: created private (0700) until its content is in. */
static int open_dir_frame(int src_dir, const char *name, int dst_dir, const struct stat *st, frame_t *f) {
    if (mkdirat(dst_dir, name, 0700) < 0) return -1;
    int s = openat(src_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int d = openat(dst_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *sd = s >= 0 ? fdopendir(s) : NULL;
    if (!sd || d < 0) {
        if (sd) closedir(sd); else if (s >= 0) close(s);
        if (d >= 0) close(d);
        return -1;
    }
    *f = (frame_t){sd, d, *st, 0};
    return 0;
}

int freeze_tree(int src_dir, const char *name, int dst_dir, freeze_t *out) {
    struct stat st;
    if (fstatat(src_dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) {
        int rc = S_ISREG(st.st_mode) ? copy_file(src_dir, name, dst_dir, &st) : copy_special(src_dir, name, dst_dir, &st);
        if (rc < 0) out->skipped++;
        return 0;
    }
    struct rlimit nofile;
    int max_depth = 4096; /* two open directories per level; deeper ones are left out */
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur / 2 < 4096 + 64)
        max_depth = nofile.rlim_cur > 256 ? (int)(nofile.rlim_cur / 2 - 64) : 64;
    int cap = 64, depth = 0;
    frame_t *stack = malloc(sizeof *stack * cap);
    char path[PATH_MAX];
    size_t len = (size_t)snprintf(path, sizeof path, "%s", name);
    if (!stack || open_dir_frame(src_dir, name, dst_dir, &st, &stack[0]) < 0) {
        free(stack);
        return -1;
    }
    stack[0].pathlen = len;
    depth = 1;
    while (depth > 0) {
        frame_t *top = &stack[depth - 1];
        struct dirent *e = readdir(top->src);
        if (!e) {
            finish_dir(top);
            depth--;
            continue;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        int s = dirfd(top->src);
        if (fstatat(s, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) { out->skipped++; continue; }
        size_t here = top->pathlen + 1 + strlen(e->d_name);
        if (here >= sizeof path) { out->skipped++; continue; }
        snprintf(path + top->pathlen, sizeof path - top->pathlen, "/%s", e->d_name);
        if (S_ISDIR(st.st_mode)) {
            if (depth >= max_depth) { out->skipped++; continue; }
            if (depth == cap) {
                frame_t *grown = realloc(stack, sizeof *stack * cap * 2);
                if (!grown) { out->skipped++; continue; }
                stack = grown;
                cap *= 2;
                top = &stack[depth - 1];
            }
            if (open_dir_frame(s, e->d_name, top->dst, &st, &stack[depth]) < 0) { out->skipped++; continue; }
            stack[depth++].pathlen = here;
            continue;
        }
        int rc = S_ISREG(st.st_mode) ? copy_file(s, e->d_name, top->dst, &st) : copy_special(s, e->d_name, top->dst, &st);
        if (rc < 0) { out->skipped++; continue; }
        if ((S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode)) && out->nlive < FREEZE_MAX_LIVE)
            out->live[out->nlive++] = strdup(path);
    }
    free(stack);
    return 0;
}
