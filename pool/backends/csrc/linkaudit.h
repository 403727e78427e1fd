/*
 * The verifier's link audit, shared by the local backend's sandbox daemon (sandboxd/verifier/graft.c,
 * sandboxd/verifier/shared.c) and the Docker backend's helper (docker/helper.c): one implementation of
 * which symbolic links the agent left may lead the verifier into its private places.
 *
 * A link is judged as the kernel would follow it from the verifier's root (at most 40 links;
 * components that do not exist are taken as written): if any path it passes through is /proc,
 * /sys, or the top-level folder of the tests folder or of a private directory (/tests, /logs
 * for /logs/verifier), it is doomed. Doomed links are removed only once every link was judged,
 * so a chain (a -> b -> /tests) is judged as the agent left it.
 *
 * The program that links this in defines linkaudit_fail(), called when memory runs out.
 */
#ifndef SNAPGYM_LINKAUDIT_H
#define SNAPGYM_LINKAUDIT_H
#include <stddef.h>

void linkaudit_fail(const char *what) __attribute__((noreturn));

/* A path as its components, root first. */
typedef struct {
    char **part;
    int n, cap;
} parts_t;

void parts_push(parts_t *p, const char *s, size_t len);
void parts_pop(parts_t *p);
void parts_free(parts_t *p);
void parts_split(parts_t *p, const char *path); /* appends path's components, in order */

/* Open the path at (components from the root) without following any link on it; -1 if it
 * does not exist. */
int open_parts(int rootfd, const parts_t *at);

/* A private place (the tests folder, a private directory): its top-level folder is protected. */
void protect(const char *path);
/* Forget every protected place (before auditing for another verifier). */
void unprotect_all(void);
/* Whether a process at `at` is in /proc, /sys or a protected top-level folder. */
int is_protected(const parts_t *at);
/* Would a process in the root at rootfd, following a link in dir (components) to target,
 * pass through a protected place? */
int leads_into_protected(int rootfd, const parts_t *dir, const char *target);

/* Called with each doomed link: its path in the verifier's root, and its target. */
typedef void (*found_fn)(const char *path, const char *target);

/* Judge the link name in the folder dirfd (at dir, in the verifier's root); doom it if it leads
 * into a protected place (found is told). 1: doomed. */
int judge_link(int rootfd, int dirfd, const parts_t *dir, const char *name, const char *target, found_fn found);
/* Walk the tree open at agent_dir (closed here), fd by fd and never following links, beside the
 * same folder open at view_dir (closed here; the verifier's view of it, at rel), and judge every
 * link of the agent's tree that the view still shows (a layer above may have replaced it). */
void audit_tree(int rootfd, int agent_dir, int view_dir, const char *rel, found_fn found);
/* Remove the doomed links; NULL, or the name of one that could not be removed (errno says why). */
const char *remove_doomed(void);

#endif
