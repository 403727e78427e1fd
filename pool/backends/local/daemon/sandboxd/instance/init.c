/* The sandbox's PID 1: runs each exec under a reaper, and file operations. */
#include "sandboxd.h"

/* ------------------------------------------------------------- reaper */

/* read_proc_stat(), descendants() and kill_tree(): pool/backends/csrc/proctree.c, shared with the
 * Docker helper. */

int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

/* Children of init inherit its OOM immunity; give it up (it cannot be taken back).
 * Like init, they are not dumpable (it changed its uid), so their /proc files
 * are not theirs to write: dumpable just for the write. */
void become_killable(void) {
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    write_file_str("/proc/self/oom_score_adj", "0");
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

/* A request with "program" fields runs the first of them that can be run, with the "arg" fields as its
 * arguments, and no shell in front (the verifier's `bash test.sh`: one program start, not two). */
static void run_program(msg_t *m, char **envp) {
    static char *programs[8], *args[MAX_FIELDS + 2];
    int n = fields_of(m, "program", programs, 8);
    if (n == 0) return;
    args[fields_of(m, "arg", args + 1, MAX_FIELDS) + 1] = NULL;
    for (int i = 0; i < n; i++) {
        args[0] = programs[i];
        execve(programs[i], args, envp);
    }
    dprintf(2, "snapgym: cannot run %s in the sandbox: %s\n", programs[0], strerror(errno));
    _exit(127);
}

void run_reaper(msg_t *m) {
    if (field(m, "session")) run_session(m);
    int in = m->fds[0], out = m->fds[1], err = m->fds[2], st = m->fds[3];
    const char *cmd = field(m, "cmd");
    const char *cwd = field(m, "cwd");
    const char *tmo = field(m, "timeout_ms");
    long long timeout_ms = tmo ? atoll(tmo) : 0;
    /* reap_all: nothing the command started outlives it (the verifier's
     * leftovers must not touch the reward after it was written). */
    int reap_all = field(m, "reap_all") != NULL;
    become_killable();
    static char *envp[MAX_FIELDS + 1];
    envp[fields_of(m, "env", envp, MAX_FIELDS)] = NULL;

    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigset_t chld = block_sigchld();
    /* vfork: nothing of ours is copied for a child that only sets its signal mask, session,
     * descriptors and directory (its own: no CLONE_FILES or CLONE_FS) and execs or _exits; it
     * writes no memory of ours that we read again, and we wait until it has exec'd. */
    pid_t child = vfork();
    if (child < 0) { write_status(st, -1, 0, errno); _exit(1); }
    if (child == 0) {
        unblock_signals();
        setsid();
        dup2(in, 0); dup2(out, 1); dup2(err, 2);
        syscall(SYS_close_range, 3, ~0U, 0);
        const char *cwd_else = field(m, "cwd_else");
        if (!(cwd_else && cwd && *cwd && chdir(cwd) == 0)) /* cd CWD || cd CWD_ELSE */
            enter_cwd(cwd_else ? cwd_else : cwd);
        run_program(m, envp);
        char *argv[] = {"sh", "-c", (char *)(cmd ? cmd : ""), NULL};
        execve("/bin/sh", argv, envp);
        dprintf(2, "snapgym: cannot run /bin/sh in the sandbox: %s\n", strerror(errno));
        _exit(127);
    }
    close(in); close(out); close(err);

    long long deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
    int status = 0, done = 0, timed_out = 0;
    while (!done) {
        pid_t r;
        while ((r = waitpid(-1, &status, WNOHANG)) > 0)
            if (r == child) { done = 1; break; }
        if (done) break;
        struct timespec ts = {1, 0};
        if (deadline) {
            long long left = deadline - now_ms();
            if (left <= 0) { timed_out = 1; break; }
            ts.tv_sec = left / 1000;
            ts.tv_nsec = (left % 1000) * 1000000;
        }
        sigtimedwait(&chld, NULL, &ts);
    }
    if (timed_out) {
        kill_tree(getpid(), 1);
        write_status(st, 128 + SIGKILL, 1, 0);
        _exit(0);
    }
    if (reap_all) kill_tree(getpid(), 1);
    write_status(st, exit_code_of(status), 0, 0);
    close(st);
    /* Background processes the command left running live on: init adopts and
     * reaps them, so this process need not stay (one process less to tear
     * down at the next restore). */
    _exit(0);
}

/* --------------------------------------------------------- file worker */

static int copy_fd(int from, int to, long long max, int *too_big) {
    static char buf[1 << 16];
    long long total = 0;
    for (;;) {
        ssize_t n = read(from, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) return 0;
        total += n;
        if (max > 0 && total > max) { *too_big = 1; return 0; }
        for (ssize_t w = 0; w < n;) {
            ssize_t k = write(to, buf + w, n - w);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) return -1;
            w += k;
        }
    }
}

static void make_parents(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash || slash == tmp) return;
    *slash = 0;
    mkdir_p(tmp, 0755);
}

void run_file_op(msg_t *m) {
    int data = m->fds[0], st = m->fds[1];
    const char *path = field(m, "path");
    int too_big = 0;
    become_killable();
    if (!path) { write_status(st, -1, 0, EINVAL); _exit(0); }
    if (m->op == OP_READ) {
        const char *mx = field(m, "max");
        int nofollow = field(m, "nofollow") ? O_NOFOLLOW : 0;
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | nofollow);
        if (fd < 0) { write_status(st, -1, 0, errno); _exit(0); }
        struct stat sb;
        if (fstat(fd, &sb) < 0 || S_ISDIR(sb.st_mode) || !S_ISREG(sb.st_mode)) {
            write_status(st, -1, 0, S_ISDIR(sb.st_mode) ? EISDIR : EINVAL);
            _exit(0);
        }
        int rc = copy_fd(fd, data, mx ? atoll(mx) : 0, &too_big);
        write_status(st, 0, 0, too_big ? EFBIG : rc < 0 ? errno : 0);
    } else {
        const char *mode_s = field(m, "mode");
        mode_t mode = mode_s ? (mode_t)strtol(mode_s, NULL, 8) : 0644;
        make_parents(path);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, mode);
        if (fd < 0) { write_status(st, -1, 0, errno); _exit(0); }
        lseek(data, 0, SEEK_SET);
        int rc = copy_fd(data, fd, 0, &too_big);
        int saved = errno;
        if (rc == 0 && mode_s && fchmod(fd, mode) < 0) { rc = -1; saved = errno; }
        if (close(fd) < 0 && rc == 0) { rc = -1; saved = errno; }
        write_status(st, 0, 0, rc < 0 ? saved : 0);
    }
    _exit(0);
}

/* Stop (or continue) every process of the sandbox but init, and wait until
 * the kernel reports them stopped, so a snapshot sees a quiet filesystem. */
static void signal_all(int sig, int st) {
    kill(-1, sig);
    if (sig == SIGSTOP) {
        for (int round = 0; round < 200; round++) {
            int running = 0;
            DIR *d = opendir("/proc");
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] < '0' || e->d_name[0] > '9' || strcmp(e->d_name, "1") == 0) continue;
                char state;
                int ppid;
                if (read_proc_stat(e->d_name, &state, &ppid) < 0) continue;
                if (state != 'T' && state != 't' && state != 'Z' && state != 'X') running++;
            }
            if (d) closedir(d);
            if (!running) break;
            kill(-1, SIGSTOP);
            usleep(500);
        }
    }
    write_status(st, 0, 0, 0);
}

/* ---------------------------------------------------------------- init */

/* init reaps every orphan of its PID namespace; the reapers report the commands' status. */
static void reap_all_children(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

void init_loop(int sock) {
    msg_t *m = msg_new();
    if (!m) _exit(1);
    int sfd = sigchld_fd();
    for (;;) {
        await_request(sock, sfd, reap_all_children);
        if (recv_msg(sock, m) < 0) _exit(0); /* the keeper is gone */
        if (m->op == 0) continue; /* malformed */
        int need = m->op == OP_EXEC ? 4 : (m->op == OP_READ || m->op == OP_WRITE) ? 2 : 1;
        if (m->nfds < need) { close_fds(m); continue; }
        if (m->op == OP_FREEZE || m->op == OP_THAW) {
            signal_all(m->op == OP_FREEZE ? SIGSTOP : SIGCONT, m->fds[0]);
            close_fds(m);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(sock);
            close(sfd);
            unblock_signals(); /* init blocks only SIGCHLD */
            set_title(m->op == OP_EXEC ? "snapgym-exec" : "snapgym-file");
            if (m->op == OP_EXEC) run_reaper(m);
            else run_file_op(m);
            _exit(0);
        }
        if (pid < 0) write_status(m->fds[m->nfds - 1], -1, 0, errno);
        close_fds(m);
    }
}
