/* The verifier's link audit: see linkaudit.h. */
#define _GNU_SOURCE
#include "linkaudit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ----------------------------------------------------------- components */

void parts_push(parts_t *p, const char *s, size_t len) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->part = realloc(p->part, sizeof *p->part * (size_t)p->cap);
        if (!p->part) linkaudit_fail("out of memory");
    }
    p->part[p->n] = strndup(s, len);
    if (!p->part[p->n]) linkaudit_fail("out of memory");
    p->n++;
}

void parts_pop(parts_t *p) {
    if (p->n > 0) free(p->part[--p->n]);
}

void parts_free(parts_t *p) {
    while (p->n) parts_pop(p);
    free(p->part);
    p->part = NULL;
    p->cap = 0;
}

void parts_split(parts_t *p, const char *path) {
    for (const char *s = path; *s;) {
        while (*s == '/') s++;
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len) parts_push(p, s, len);
        s += len;
    }
}

int open_parts(int rootfd, const parts_t *at) {
    int fd = dup(rootfd);
    for (int i = 0; fd >= 0 && i < at->n; i++) {
        int next = openat(fd, at->part[i], O_PATH | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = next;
    }
    return fd;
}

/* ----------------------------------------------------- protected places */

/* The top-level folders of the private places ("" for one at the root: then all is protected). */
static char **tops;
static int ntops, captops;

void protect(const char *path) {
    while (*path == '/') path++;
    size_t len = strcspn(path, "/");
    if (ntops == captops) {
        captops = captops ? 2 * captops : 8;
        tops = realloc(tops, sizeof *tops * (size_t)captops);
        if (!tops) linkaudit_fail("out of memory");
    }
    if (!(tops[ntops++] = strndup(path, len))) linkaudit_fail("out of memory");
}

void unprotect_all(void) {
    while (ntops) free(tops[--ntops]);
}

int is_protected(const parts_t *at) {
    if (at->n == 0) return 0;
    if (strcmp(at->part[0], "proc") == 0 || strcmp(at->part[0], "sys") == 0) return 1;
    for (int i = 0; i < ntops; i++)
        if (!tops[i][0] || strcmp(at->part[0], tops[i]) == 0) return 1;
    return 0;
}

int leads_into_protected(int rootfd, const parts_t *dir, const char *target) {
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
        if ((hit = is_protected(&at))) break;
        int fd = open_parts(rootfd, &at);
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

typedef struct { int dir; char *name; } doomed_t;
static doomed_t *doomed;
static int ndoomed, capdoomed;

int judge_link(int rootfd, int dirfd_, const parts_t *dir, const char *name, const char *target, found_fn found) {
    if (!leads_into_protected(rootfd, dir, target)) return 0;
    if (ndoomed == capdoomed) {
        capdoomed = capdoomed ? 2 * capdoomed : 16;
        doomed = realloc(doomed, sizeof *doomed * (size_t)capdoomed);
        if (!doomed) linkaudit_fail("out of memory");
    }
    doomed[ndoomed].dir = dup(dirfd_);
    doomed[ndoomed].name = strdup(name);
    if (doomed[ndoomed].dir < 0 || !doomed[ndoomed].name) linkaudit_fail("remember a link to remove");
    ndoomed++;
    size_t len = strlen(name) + 2;
    for (int i = 0; i < dir->n; i++) len += strlen(dir->part[i]) + 1;
    char *path = malloc(len), *p = path;
    if (!path) linkaudit_fail("out of memory");
    for (int i = 0; i < dir->n; i++) p += sprintf(p, "/%s", dir->part[i]);
    sprintf(p, "/%s", name);
    found(path, target);
    free(path);
    return 1;
}

void audit_tree(int rootfd, int a, int v, const char *rel, found_fn found) {
    typedef struct { DIR *agent; int view; } frame_t;
    int cap = 64, depth = 0;
    frame_t *stack = malloc(sizeof *stack * (size_t)cap);
    DIR *top_dir = a >= 0 ? fdopendir(a) : NULL;
    if (!stack || !top_dir || v < 0) {
        if (top_dir) closedir(top_dir); else if (a >= 0) close(a);
        if (v >= 0) close(v);
        free(stack);
        return;
    }
    parts_t path = {0};
    parts_split(&path, rel);
    stack[depth++] = (frame_t){top_dir, v};
    while (depth > 0) {
        frame_t *top = &stack[depth - 1];
        struct dirent *e = readdir(top->agent);
        if (!e) {
            closedir(top->agent);
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
            /* The verifier sees this link only if nothing above the agent's tree replaced it. */
            ssize_t k = readlinkat(top->view, e->d_name, shown, sizeof shown - 1);
            if (k != n || memcmp(shown, target, (size_t)n) != 0) continue;
            judge_link(rootfd, top->view, &path, e->d_name, target, found);
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
                stack = realloc(stack, sizeof *stack * (size_t)cap);
                if (!stack) linkaudit_fail("out of memory");
            }
            parts_push(&path, e->d_name, strlen(e->d_name));
            stack[depth++] = (frame_t){sd, sv};
        }
    }
    free(stack);
    parts_free(&path);
}

const char *remove_doomed(void) {
    static char failed[256];
    const char *bad = NULL;
    int saved = 0;
    for (int i = 0; i < ndoomed; i++) {
        if (unlinkat(doomed[i].dir, doomed[i].name, 0) < 0 && errno != ENOENT && !bad) {
            saved = errno;
            snprintf(failed, sizeof failed, "%s", doomed[i].name);
            bad = failed;
        }
        close(doomed[i].dir);
        free(doomed[i].name);
    }
    ndoomed = 0;
    errno = saved;
    return bad;
}
