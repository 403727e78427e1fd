/*
 * Process trees through /proc, shared by the sandbox daemon's reaper (sandboxd/instance/init.c,
 * sandboxd/instance/session.c) and the Docker helper (docker/helper.c): a command's processes are the
 * descendants of its child subreaper, and a timeout kills all of them.
 */
#ifndef SNAPGYM_PROCTREE_H
#define SNAPGYM_PROCTREE_H
#include <sys/types.h>

/* State and parent pid of a process, from /proc/PID/stat; -1 when it is gone. */
int read_proc_stat(const char *pid, char *state, int *ppid);
/* Every live (not zombie) descendant of root, through the parent links in /proc; how many. */
int descendants(pid_t root, pid_t *out, int max);
/* SIGKILL every descendant of root until none is left (orphans of dying ones come back to root,
 * a subreaper, and are found in the next round). reap: root is the caller, which also reaps them
 * all (it returns once it has no child left). */
void kill_tree(pid_t root, int reap);

#endif
