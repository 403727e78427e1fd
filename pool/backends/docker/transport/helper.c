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
 *                               "P/logs/verifier" a private directory (for both, the top-level
 *                               folder counts), "W/dir" a tree to walk, "C/path" one path to check;
 *                               remove every symbolic link among them that leads into a private
 *                               place, /proc or /sys (../csrc/linkaudit.c, the same audit as the
 *                               local backend's), and print "path\x1ftarget\0" for each
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

#include "linkaudit.h"
#include "proctree.h"

#define DRAIN_MS 50

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

/* The process trees (descendants, kill_tree) are ../csrc/proctree.c, shared with the local backend. */

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

/* The audit itself (which links lead where the verifier's private places are): csrc/linkaudit.c. */

void linkaudit_fail(const char *what) {
    fprintf(stderr, "snapgym: link audit: %s\n", what);
    _exit(4);
}

static void print_found(const char *path, const char *target) {
    printf("%s\x1f%s", path, target);
    putchar(0);
}

/* The tree at rel (a path from the root whose components are no links), every link in it. */
static void audit_walk(int rootfd, const char *rel) {
    parts_t path = {0};
    parts_split(&path, rel);
    int top = open_parts(rootfd, &path);
    parts_free(&path);
    if (top < 0) return;
    int fd = openat(top, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(top);
    if (fd < 0) return;
    int view = dup(fd);
    if (view < 0) { close(fd); return; }
    audit_tree(rootfd, fd, view, rel, print_found);
}

static void audit_one(int rootfd, const char *rel) {
    parts_t path = {0};
    parts_split(&path, rel);
    if (path.n == 0) return;
    char *name = strdup(path.part[path.n - 1]);
    if (!name) linkaudit_fail("out of memory");
    parts_pop(&path);
    int dir = open_parts(rootfd, &path);
    if (dir >= 0) {
        struct stat st;
        int real = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        char target[4096];
        ssize_t n = -1;
        if (real >= 0 && fstatat(real, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            n = readlinkat(real, name, target, sizeof target - 1);
        if (n >= 0) {
            target[n] = 0;
            judge_link(rootfd, real, &path, name, target, print_found);
        }
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
    /* the private places first, whatever the order of the records */
    for (size_t at = 0; at < len; at += strlen(input + at) + 1)
        if (input[at] == 'P' || input[at] == 'T') protect(input + at + 1);
    for (size_t at = 0; at < len; at += strlen(input + at) + 1) {
        if (input[at] == 'W') audit_walk(rootfd, input + at + 1);
        else if (input[at] == 'C') audit_one(rootfd, input + at + 1);
    }
    int rc = 0;
    const char *bad = remove_doomed();
    if (bad) {
        fprintf(stderr, "snapgym: cannot remove the link %s: %s\n", bad, strerror(errno));
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
