/*
 * Looking a path up in a stack of overlayfs layers (top first) the way
 * overlayfs would, without mounting them: a whiteout (a 0/0 character
 * device) deletes what the layers below have at that path, an opaque
 * directory hides what they have below it, and a non-directory on the way
 * ends the path. Every step is an openat() that never follows a link.
 */
#include "sandboxd.h"

#include <sys/xattr.h>

static int is_opaque(int fd) {
    char v[4];
    const char *name = user_mode ? "user.overlay.opaque" : "trusted.overlay.opaque";
    return fgetxattr(fd, name, v, sizeof v) == 1 && v[0] == 'y';
}

static int is_whiteout(const struct stat *st) {
    return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

/* One layer's word on rel (no leading "/"): fills *st when the layer has an
 * entry there. *stop is set when the layers below must not be consulted. */
static int layer_entry(const char *layer, const char *rel, struct stat *st, int *stop) {
    int fd = open(layer, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return LAYER_ABSENT;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", rel);
    int verdict = LAYER_ABSENT;
    char *save = NULL;
    char *part = strtok_r(copy, "/", &save);
    if (!part) { /* the layer's root */
        if (fstat(fd, st) == 0) verdict = LAYER_HAS;
    }
    while (part) {
        char *next = strtok_r(NULL, "/", &save);
        if (fstatat(fd, part, st, AT_SYMLINK_NOFOLLOW) < 0) break;
        if (is_whiteout(st)) { *stop = 1; break; }
        if (!next) { verdict = LAYER_HAS; if (!S_ISDIR(st->st_mode)) *stop = 1; }
        if (!S_ISDIR(st->st_mode)) { if (next) *stop = 1; break; }
        int sub = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = sub;
        if (fd < 0) { verdict = LAYER_ABSENT; break; }
        if (is_opaque(fd)) *stop = 1;
        part = next;
    }
    if (fd >= 0) close(fd);
    return verdict;
}

int stack_lookup(char *const *layers, int n, const char *rel, struct stat *st, int *index) {
    int stop = 0;
    for (int i = 0; i < n; i++) {
        if (layer_entry(layers[i], rel, st, &stop) == LAYER_HAS) {
            *index = i;
            return 1;
        }
        if (stop) break;
    }
    return 0;
}

int stack_dirs(char *const *layers, int n, int n_agent, const char *rel, int *out, int max, int *agent_touched) {
    int found = 0, stop = 0;
    *agent_touched = 0;
    for (int i = 0; i < n && !stop; i++) {
        struct stat st;
        int verdict = layer_entry(layers[i], rel, &st, &stop);
        if (i < n_agent && (verdict == LAYER_HAS || stop)) *agent_touched = 1;
        if (verdict != LAYER_HAS) continue;
        if (!S_ISDIR(st.st_mode)) break;
        if (found < max) out[found++] = i;
    }
    return found;
}
