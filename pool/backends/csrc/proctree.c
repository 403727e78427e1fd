/* Process trees through /proc: see proctree.h. */
#define _GNU_SOURCE
#include "proctree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PIDS 65536

int read_proc_stat(const char *pid, char *state, int *ppid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return -1;
    buf[k] = 0;
    char *rp = strrchr(buf, ')'); /* the command name may hold spaces and parens */
    if (!rp || sscanf(rp + 2, "%c %d", state, ppid) != 2) return -1;
    return 0;
}

int descendants(pid_t root, pid_t *out, int max) {
    static pid_t pids[MAX_PIDS], ppids[MAX_PIDS];
    int n = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_PIDS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char state;
        int ppid;
        if (read_proc_stat(e->d_name, &state, &ppid) < 0) continue;
        if (state == 'Z' || state == 'X') continue; /* dead already: only its parent can reap it */
        pids[n] = atoi(e->d_name);
        ppids[n++] = ppid;
    }
    closedir(d);
    int count = 0;
    out[count++] = root;
    for (int head = 0; head < count; head++)
        for (int i = 0; i < n && count < max; i++)
            if (ppids[i] == out[head]) out[count++] = pids[i];
    for (int i = 1; i < count; i++) out[i - 1] = out[i];
    return count - 1;
}

void kill_tree(pid_t root, int reap) {
    static pid_t found[MAX_PIDS];
    for (int round = 0; round < 2000; round++) {
        int n = descendants(root, found, MAX_PIDS);
        for (int i = 0; i < n; i++) kill(found[i], SIGKILL);
        if (reap)
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
        if (n == 0 && (!reap || (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD))) return;
        usleep(1000);
    }
}
