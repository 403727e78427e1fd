/*
 * snapgym's helper inside every Docker sandbox, mounted read-only at /.snapgym/helper.
 *
 *   helper init                 the container's PID 1: reaps orphans; as a namespace's init it
 *                               cannot be killed from inside (kill -9 -1 spares it)
 *   helper run MS CAP ALL CWD CMD
 *                               run `sh -c CMD` in CWD as a child subreaper: everything the
 *                               command starts (setsid and double forks included) stays in its
 *                               tree, so a timeout (MS > 0) kills all of it. Output is relayed
 *                               on stdout as frames [type][u32 length][bytes]: 'p' its pid,
 *                               'o'/'e' the command's stdout/stderr (at most CAP bytes each), 's'
 *                               "CODE TIMED_OUT OUT_TRUNCATED ERR_TRUNCATED" last. ALL=1 kills what
 *                               the command left running (the verifier's leftovers) before 's'.
 *   helper kill PID             kill a `run` helper stopped by the sandbox's processes, and its tree
 *   helper fresh PATH...        remove each path (never following links) and make it an empty folder
 *   helper remove PATH...       remove each path, never following links
 *   helper mkdirs PATH          mkdir -p
 *   helper audit                read NUL-terminated records on stdin: "T/tests" the tests folder,
 *                               "P/logs/verifier" a private directory (its top-level folder counts),
 *                               "W/dir" a tree to walk, "C/path" one path to check; remove every
 *                               symbolic link among them that leads into a private place, /proc or
 *                               /sys, and print "path\x1ftarget\0" for each
 *
 * Static, so it runs in any image (no libc needed there). Nothing here trusts the sandbox's files.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DRAIN_MS 50
#define MAX_PIDS 65536

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) _exit(3); /* the host went away */
        p += k;
        len -= (size_t)k;
    }
}

static void frame(char type, const void *data, size_t len) {
    unsigned char head[5] = {(unsigned char)type, (unsigned char)(len >> 24), (unsigned char)(len >> 16),
                             (unsigned char)(len >> 8), (unsigned char)len};
    write_all(1, head, sizeof head);
    if (len) write_all(1, data, len);
}

static void framef(char type, const char *fmt, ...) {
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    frame(type, buf, (size_t)n);
}

static void raise_nofile(void) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
}

/* ---------------------------------------------------------------- init */

static _Noreturn void run_init(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        sigwaitinfo(&set, NULL);
    }
}

/* ------------------------------------------------------- process trees */

static int parent_of(const char *pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return -1;
    buf[k] = 0;
    char *rp = strrchr(buf, ')'); /* the command name may hold spaces and parens */
    char state;
    int ppid;
    if (!rp || sscanf(rp + 2, "%c %d", &state, &ppid) != 2) return -1;
    return state == 'Z' || state == 'X' ? -1 : ppid; /* a zombie is dead already: only its parent can reap it */
}

/* Every descendant of root, through the parent links in /proc. */
static int descendants(pid_t root, pid_t *out, int max) {
    static pid_t pids[MAX_PIDS], ppids[MAX_PIDS];
    int n = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_PIDS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        int ppid = parent_of(e->d_name);
        if (ppid < 0) continue;
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

/* Kill every descendant of root until none is left (new children of dying ones come back to
 * root, a subreaper, and are found in the next round). */
static void kill_tree(pid_t root, int reap) {
    static pid_t found[MAX_PIDS];
    for (int round = 0; round < 2000; round++) {
        int n = descendants(root, found, MAX_PIDS);
        for (int i = 0; i < n; i++) kill(found[i], SIGKILL);
        if (reap)
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
        if (n == 0) {
            if (!reap || (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD)) return;
        }
        usleep(1000);
    }
}

/* ----------------------------------------------------------------- run */

typedef struct {
    int fd;
    char type;
    long long left; /* bytes still relayed */
    int truncated;
} stream_t;

/* Relay what the pipe holds now; 0 at end of file. */
static int pump(stream_t *s) {
    static char buf[1 << 16];
    for (;;) {
        ssize_t n = read(s->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 1; /* EAGAIN: nothing more for now */
        if (n == 0) return 0;
        size_t keep = (long long)n > s->left ? (size_t)s->left : (size_t)n;
        if (keep < (size_t)n) s->truncated = 1;
        if (keep) frame(s->type, buf, keep);
        s->left -= (long long)keep;
    }
}

static int run_command(long long timeout_ms, long long cap, int reap_all, const char *cwd, const char *cmd) {
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    framef('p', "%d", (int)getpid());
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
        framef('s', "126 0 0 0");
        return 0;
    }
    sigset_t chld, none;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigemptyset(&none);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    pid_t child = fork();
    if (child < 0) {
        const char *msg = "snapgym: cannot start the command: fork failed (the sandbox's process limit?)\n";
        frame('e', msg, strlen(msg));
        framef('s', "126 0 0 0");
        return 0;
    }
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        setsid();
        dup2(out[1], 1);
        dup2(err[1], 2);
        if (cwd[0] && chdir(cwd) < 0) {
            dprintf(2, "snapgym: cannot enter working directory %s: %s\n", cwd, strerror(errno));
            _exit(126);
        }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        dprintf(2, "snapgym: cannot run /bin/sh in the sandbox: %s\n", strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    stream_t streams[2] = {{out[0], 'o', cap, 0}, {err[0], 'e', cap, 0}};
    int open_streams[2] = {1, 1};
    long long deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
    int status = 0, done = 0, timed_out = 0;
    while (!done) {
        struct pollfd fds[3] = {{sfd, POLLIN, 0}, {out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
        if (!open_streams[0]) fds[1].fd = -1;
        if (!open_streams[1]) fds[2].fd = -1;
        int wait_ms = -1;
        if (deadline) {
            long long left = deadline - now_ms();
            if (left <= 0) { timed_out = 1; break; }
            wait_ms = left > 1000000 ? 1000000 : (int)left;
        }
        if (poll(fds, 3, wait_ms) < 0 && errno != EINTR) break;
        for (int i = 0; i < 2; i++)
            if (open_streams[i] && fds[i + 1].revents) open_streams[i] = pump(&streams[i]);
        struct signalfd_siginfo info;
        while (read(sfd, &info, sizeof info) > 0) {}
        pid_t r;
        int st;
        while ((r = waitpid(-1, &st, WNOHANG)) > 0)
            if (r == child) { status = st; done = 1; }
    }
    if (timed_out) kill_tree(getpid(), 1);
    /* The command has exited: relay what its pipes already hold, no more (a background
     * writer may keep them full). */
    long long drain_until = now_ms() + DRAIN_MS;
    for (int i = 0; i < 2; i++)
        while (open_streams[i] && now_ms() < drain_until) {
            struct pollfd p = {streams[i].fd, POLLIN, 0};
            if (poll(&p, 1, 5) <= 0) break;
            open_streams[i] = pump(&streams[i]);
        }
    if (reap_all && !timed_out) kill_tree(getpid(), 1);
    int code = timed_out ? 128 + SIGKILL
               : WIFEXITED(status) ? WEXITSTATUS(status)
               : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    framef('s', "%d %d %d %d", code, timed_out, streams[0].truncated, streams[1].truncated);
    /* What the command left running lives on: init adopts it. */
    return 0;
}

static int run_kill(const char *pid_s) {
    pid_t pid = (pid_t)atoi(pid_s);
    char path[64], cmdline[256] = {0};
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0; /* gone already */
    ssize_t n = read(fd, cmdline, sizeof cmdline - 1);
    close(fd);
    /* argv[1] of a run helper is "run" */
    if (n <= 0 || strcmp(cmdline + strlen(cmdline) + 1, "run") != 0) return 0;
    kill(pid, SIGSTOP);
    kill_tree(pid, 0);
    kill(pid, SIGKILL);
    return 0;
}

/* ------------------------------------------------------------- folders */

/* Remove name in dir, recursively, never following links (fd by fd: no depth limit). */
static int remove_at(int dir, const char *name) {
    if (unlinkat(dir, name, 0) == 0 || errno == ENOENT) return 0;
    if (errno != EISDIR && errno != EPERM) return -1;
    fchmodat(dir, name, 0700, 0); /* a folder the agent locked (chmod 000) is still emptied */
    int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return -1; }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && remove_at(dirfd(d), e->d_name) < 0) rc = -1;
    closedir(d);
    if (unlinkat(dir, name, AT_REMOVEDIR) < 0 && errno != ENOENT) rc = -1;
    return rc;
}

static int mkdirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static int remove_path(const char *path) {
    if (strcmp(path, "/") == 0) return -1;
    return remove_at(AT_FDCWD, path);
}

static int run_folders(const char *op, int argc, char **argv) {
    int rc = 0;
    for (int i = 0; i < argc; i++) {
        int bad = 0;
        if (strcmp(op, "mkdirs") != 0) bad = remove_path(argv[i]) < 0;
        if (!bad && strcmp(op, "remove") != 0) bad = mkdirs(argv[i]) < 0;
        if (bad) {
            fprintf(stderr, "snapgym: cannot %s %s: %s\n", op, argv[i], strerror(errno));
            rc = 1;
        }
    }
    return rc;
}

/* --------------------------------------------------------------- audit */

typedef struct {
    char **part;
    int n, cap;
} parts_t;

static void parts_push(parts_t *p, const char *s, size_t len) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->part = realloc(p->part, sizeof *p->part * (size_t)p->cap);
        if (!p->part) _exit(4);
    }
    p->part[p->n] = strndup(s, len);
    if (!p->part[p->n]) _exit(4);
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

static void parts_split(parts_t *p, const char *path) {
    for (const char *s = path; *s;) {
        while (*s == '/') s++;
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len) parts_push(p, s, len);
        s += len;
    }
}

static parts_t privates[64];
static int depths[64];
static int nprivates;

/* /proc, /sys, the tests folder, or the top-level folder of a private directory (/logs). */
static int is_protected(parts_t *at) {
    if (at->n == 0) return 0;
    if (strcmp(at->part[0], "proc") == 0 || strcmp(at->part[0], "sys") == 0) return 1;
    for (int i = 0; i < nprivates; i++) {
        parts_t *prot = &privates[i];
        int depth = depths[i];
        int hit = at->n >= depth;
        for (int j = 0; hit && j < depth; j++) hit = strcmp(at->part[j], prot->part[j]) == 0;
        if (hit) return 1;
    }
    return 0;
}

static int walk(int rootfd, parts_t *at) {
    int fd = dup(rootfd);
    for (int i = 0; fd >= 0 && i < at->n; i++) {
        int next = openat(fd, at->part[i], O_PATH | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = next;
    }
    return fd;
}

/* Would a process following the link at dir/target pass through a protected place? Links are
 * followed as the kernel would (at most 40); missing components are taken as written. */
static int leads_into_protected(int rootfd, parts_t *dir, const char *target) {
    parts_t at = {0}, todo = {0};
    if (target[0] != '/')
        for (int i = 0; i < dir->n; i++) parts_push(&at, dir->part[i], strlen(dir->part[i]));
    parts_split(&todo, target);
    int hops = 0, hit = 0, first = 0;
    while (!hit && first < todo.n) {
        const char *c = todo.part[first++];
        if (strcmp(c, ".") == 0) continue;
        if (strcmp(c, "..") == 0) { parts_pop(&at); continue; }
        parts_push(&at, c, strlen(c));
        if ((hit = is_protected(&at))) break;
        int fd = walk(rootfd, &at);
        if (fd < 0) continue;
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

/* Links judged to lead somewhere protected; removed only once everything was judged, so a
 * chain (a -> b -> /tests) is judged as the agent left it. */
typedef struct { int dir; char *name; } doomed_t;
static doomed_t *doomed;
static int ndoomed, capdoomed;

static void judge(int rootfd, int dirfd_, parts_t *dir, const char *name) {
    char target[4096];
    ssize_t n = readlinkat(dirfd_, name, target, sizeof target - 1);
    if (n < 0) return;
    target[n] = 0;
    if (!leads_into_protected(rootfd, dir, target)) return;
    if (ndoomed == capdoomed) {
        capdoomed = capdoomed ? 2 * capdoomed : 16;
        doomed = realloc(doomed, sizeof *doomed * (size_t)capdoomed);
        if (!doomed) _exit(4);
    }
    doomed[ndoomed].dir = dup(dirfd_);
    doomed[ndoomed].name = strdup(name);
    ndoomed++;
    for (int i = 0; i < dir->n; i++) printf("/%s", dir->part[i]);
    printf("/%s\x1f%s", name, target);
    putchar(0);
}

static void audit_tree(int rootfd, const char *rel) {
    parts_t path = {0};
    parts_split(&path, rel);
    int top = walk(rootfd, &path);
    if (top < 0) { parts_free(&path); return; }
    int fd = openat(top, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(top);
    if (fd < 0) { parts_free(&path); return; }
    int cap = 64, depth = 0;
    DIR **stack = malloc(sizeof *stack * (size_t)cap);
    if (!stack) _exit(4);
    stack[depth++] = fdopendir(fd);
    while (depth > 0) {
        DIR *d = stack[depth - 1];
        struct dirent *e = d ? readdir(d) : NULL;
        if (!e) {
            if (d) closedir(d);
            depth--;
            if (depth > 0) parts_pop(&path);
            continue;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (S_ISLNK(st.st_mode)) {
            judge(rootfd, dirfd(d), &path, e->d_name);
        } else if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            DIR *sd = sub >= 0 ? fdopendir(sub) : NULL;
            if (!sd) { if (sub >= 0) close(sub); continue; }
            if (depth == cap) {
                cap *= 2;
                stack = realloc(stack, sizeof *stack * (size_t)cap);
                if (!stack) _exit(4);
            }
            parts_push(&path, e->d_name, strlen(e->d_name));
            stack[depth++] = sd;
        }
    }
    free(stack);
    parts_free(&path);
}

static void audit_one(int rootfd, const char *rel) {
    parts_t path = {0};
    parts_split(&path, rel);
    if (path.n == 0) return;
    char *name = strdup(path.part[path.n - 1]);
    parts_pop(&path);
    int dir = walk(rootfd, &path);
    if (dir >= 0) {
        struct stat st;
        int real = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (real >= 0 && fstatat(real, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            judge(rootfd, real, &path, name);
        if (real >= 0) close(real);
        close(dir);
    }
    free(name);
    parts_free(&path);
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) _exit(4);
        if (n == cap) buf = realloc(buf, cap *= 2);
        if (!buf) _exit(4);
        ssize_t k = read(0, buf + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        n += (size_t)k;
    }
    *len = n;
    return buf;
}

static int run_audit(void) {
    raise_nofile();
    int rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    size_t len;
    char *input = read_stdin(&len);
    /* privates first, whatever the order of the records */
    for (size_t at = 0; at < len; at += strlen(input + at) + 1)
        if ((input[at] == 'P' || input[at] == 'T') && nprivates < 64) {
            parts_split(&privates[nprivates], input + at + 1);
            depths[nprivates] = input[at] == 'P' ? 1 : privates[nprivates].n;
            nprivates++;
        }
    for (size_t at = 0; at < len; at += strlen(input + at) + 1) {
        if (input[at] == 'W') audit_tree(rootfd, input + at + 1);
        else if (input[at] == 'C') audit_one(rootfd, input + at + 1);
    }
    int rc = 0;
    for (int i = 0; i < ndoomed; i++)
        if (unlinkat(doomed[i].dir, doomed[i].name, 0) < 0 && errno != ENOENT) {
            fprintf(stderr, "snapgym: cannot remove the link %s: %s\n", doomed[i].name, strerror(errno));
            rc = 1;
        }
    fflush(stdout);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "init") == 0) run_init();
    if (argc == 7 && strcmp(argv[1], "run") == 0)
        return run_command(atoll(argv[2]), atoll(argv[3]), atoi(argv[4]), argv[5], argv[6]);
    if (argc == 3 && strcmp(argv[1], "kill") == 0) return run_kill(argv[2]);
    if (argc >= 2 && (strcmp(argv[1], "fresh") == 0 || strcmp(argv[1], "remove") == 0 || strcmp(argv[1], "mkdirs") == 0))
        return run_folders(argv[1], argc - 2, argv + 2);
    if (argc == 2 && strcmp(argv[1], "audit") == 0) return run_audit();
    fprintf(stderr, "usage: helper init | run MS CAP ALL CWD CMD | kill PID | fresh|remove|mkdirs PATH... | audit\n");
    return 2;
}
