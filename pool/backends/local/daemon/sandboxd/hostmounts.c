/* The daemon's copy of the host's mounts, cut down to what sandboxes reach through it.
 *
 * Every keeper starts from a copy of the daemon's mount namespace and every instance from a copy of
 * its keeper's, so each mount the daemon holds is copied (and torn down again) twice per instance:
 * about 2 us a mount (docs/results/cost.md). A host that runs containers or Kubernetes pods holds
 * hundreds, none of which a sandbox uses. At start, in its private copy, the daemon detaches every
 * mount that is neither on the way to nor under a path it was told to keep (the store's layers, the
 * host base's bind sources, its stage directory) or /proc, /sys and /dev (new /proc mounts, cgroup
 * files, device nodes). Mount events do not propagate out of the private copy, so the host keeps
 * its mounts; later host mounts never reached the daemon anyway.
 *
 * Without host root (user mode) the copied mounts are locked to the daemon's user namespace and
 * cannot be detached; the daemon keeps them all there.
 */
#include "sandboxd.h"

enum { MAX_MOUNTS = 65536, MAX_KEEP = MAX_KEEP_PATHS + 1, MAX_PASSES = 64 };

typedef struct {
    int id, parent;
    char *point; /* unescaped mount point, as this process sees it */
} mount_entry_t;

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s) {
    char *out = s;
    while (*s) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
            *out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 4;
        } else {
            *out++ = *s++;
        }
    }
    *out = 0;
}

/* Is `a` the path `b` or one of its parents? */
static int covers(const char *a, const char *b) {
    size_t n = strlen(a);
    if (n == 1 && a[0] == '/') return 1;
    return strncmp(a, b, n) == 0 && (b[n] == 0 || b[n] == '/');
}

static int needed(const char *point, char *const *keep, int nkeep) {
    for (int i = 0; i < nkeep; i++)
        if (covers(point, keep[i]) || covers(keep[i], point)) return 1;
    return 0;
}

/* This process's mounts; each point is the caller's to free. -1: unreadable. */
static int read_mounts(mount_entry_t *out, int max) {
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (n < max && getline(&line, &cap, f) > 0) {
        int id, parent;
        char *point = NULL;
        /* id parent major:minor root mount-point ... */
        if (sscanf(line, "%d %d %*s %*s %ms", &id, &parent, &point) < 3) continue;
        unescape(point);
        out[n++] = (mount_entry_t){id, parent, point};
    }
    free(line);
    fclose(f);
    return n;
}

static int is_stuck(const int *stuck, int nstuck, int id) {
    for (int i = 0; i < nstuck; i++)
        if (stuck[i] == id) return 1;
    return 0;
}

int prune_host_mounts(char *const *paths, int npaths) {
    static mount_entry_t mounts[MAX_MOUNTS];
    static int stuck[MAX_MOUNTS];
    char *keep[MAX_KEEP + 3];
    int nkeep = 0, nstuck = 0, detached = 0;
    keep[nkeep++] = "/proc";
    keep[nkeep++] = "/sys";
    keep[nkeep++] = "/dev";
    for (int i = 0; i < npaths && i < MAX_KEEP; i++) {
        char *real = realpath(paths[i], NULL); /* the mounts a lookup walks are those of its target */
        keep[nkeep++] = real ? real : paths[i];
    }
    for (int pass = 0; pass < MAX_PASSES; pass++) {
        int n = read_mounts(mounts, MAX_MOUNTS);
        if (n < 0) break;
        int progress = 0;
        for (int i = 0; i < n; i++) {
            if (needed(mounts[i].point, keep, nkeep) || is_stuck(stuck, nstuck, mounts[i].id)) continue;
            int parent_kept = 1; /* the top of an unneeded subtree: detaching it takes the rest */
            for (int j = 0; j < n; j++)
                if (mounts[j].id == mounts[i].parent && j != i)
                    parent_kept = needed(mounts[j].point, keep, nkeep) || is_stuck(stuck, nstuck, mounts[j].id);
            if (!parent_kept) continue;
            if (umount2(mounts[i].point, MNT_DETACH | UMOUNT_NOFOLLOW) == 0) {
                detached++;
                progress = 1;
            } else if (nstuck < MAX_MOUNTS) {
                stuck[nstuck++] = mounts[i].id;
            }
        }
        for (int i = 0; i < n; i++) free(mounts[i].point);
        if (!progress) break;
    }
    return detached;
}
