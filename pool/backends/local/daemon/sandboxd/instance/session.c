/* A persistent shell: one process per episode that runs each step's command, so a step costs a
 * write to a running shell instead of starting one.
 *
 * The exec's four descriptors mean something else in a session:
 *   fds[0]  steps from the host: u32 timeout_ms, u32 length, then the command and a NUL
 *   fds[1]  the shell's stdout, fds[2] its stderr (shared by every step, as in a terminal)
 *   fds[3]  status records to the host: one per finished step (4th field STATUS_STEP), then one
 *           when the session ends (STATUS_FINAL: the shell's exit code, or 137 + timed_out)
 *
 * This process (the session's reaper, a child subreaper) relays each step to the shell's stdin,
 * arms the step's deadline and records the highest PID in use when the step began. The shell
 * runs the command and writes its exit code as a line on its fd 3, which comes back here and is
 * passed on. On a deadline, the shell and everything started during the step die; processes
 * started by earlier steps (a server the agent left running) live on, as they do after an exec.
 * The shell is the agent's: what it reports about its own steps is the agent's to forge, but
 * the deadline and the kill are enforced here, and the host never waits past its own backstop.
 *
 * The "cmd" field is the shell's loop: it runs as `bash --noprofile --norc -c CMD` (from /bin or
 * /usr/bin). errno ENOENT in the final record: the shell never said it was ready (no bash).
 */
#include "sandboxd.h"

#define MAX_STEP_BYTES (1u << 20)
#define SHELL_PIPE_BYTES (1 << 20) /* pipe-max-size's default: a step of the usual size goes in at once */
#define MAX_PROCS 65536

static void status_record(int fd, int code, int timed_out, int err, int kind) {
    int32_t rec[4] = {code, timed_out, err, kind};
    ssize_t n;
    do n = write(fd, rec, sizeof rec); while (n < 0 && errno == EINTR);
}

/* The last PID handed out in this PID namespace. */
static long long last_pid(void) {
    char buf[32] = "";
    int fd = open("/proc/sys/kernel/ns_last_pid", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    return atoll(buf);
}

/* Kill the shell and what the step started: every descendant of this process that is newer than
 * `watermark` and not below an older (earlier step's) process. When PIDs wrapped around during
 * the step, or the watermark is unknown, everything below this process dies. Returns how many
 * such processes were still alive. */
static int kill_step_round(pid_t shell, long long watermark) {
    static pid_t pids[MAX_PROCS], ppids[MAX_PROCS];
    static char doomed[MAX_PROCS], seen[MAX_PROCS], zombie[MAX_PROCS];
    long long now = last_pid();
    int everything = watermark < 0 || now < 0 || now < watermark;
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < MAX_PROCS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char state;
        int ppid;
        if (read_proc_stat(e->d_name, &state, &ppid) < 0) continue;
        pids[n] = atoi(e->d_name);
        ppids[n] = ppid;
        zombie[n] = state == 'Z' || state == 'X';
        doomed[n] = seen[n] = 0;
        n++;
    }
    if (d) closedir(d);
    pid_t self = getpid();
    int alive = 0;
    /* Parents before children: repeat until no entry changes (the tree is shallow). */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < n; i++) {
            if (seen[i]) continue;
            int parent_doomed = -1; /* -1: parent not known yet */
            if (ppids[i] == self) parent_doomed = 1;
            for (int j = 0; j < n && parent_doomed < 0; j++)
                if (pids[j] == ppids[i] && seen[j]) parent_doomed = doomed[j];
            if (parent_doomed < 0) continue;
            seen[i] = 1;
            changed = 1;
            doomed[i] = pids[i] == shell || (parent_doomed && (everything || pids[i] > watermark));
            if (doomed[i] && !zombie[i]) {
                kill(pids[i], SIGKILL);
                alive++;
            }
        }
    }
    return alive;
}

static void kill_step(pid_t shell, long long watermark) {
    for (int round = 0; round < 1000; round++) {
        int alive = kill_step_round(shell, watermark);
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        if (!alive) return;
        usleep(1000);
    }
}

static void end_session(int st, int code, int timed_out, int err) {
    status_record(st, code, timed_out, err, STATUS_FINAL);
    /* Earlier steps' background processes live on: init adopts them. */
    _exit(0);
}

/* The shell's input is closed: a shell that never got ready died before it read a step (no bash),
 * which is said as its own exit says it (ENOENT), whichever of the two the loop notices first;
 * a ready shell that closed its input ends the session with the step killed. */
static void input_closed(int st, pid_t shell, long long watermark, int ready) {
    if (!ready) {
        int status = 0;
        while (waitpid(shell, &status, 0) < 0 && errno == EINTR) {}
        end_session(st, exit_code_of(status), 0, ENOENT);
    }
    kill_step(shell, watermark);
    end_session(st, 128 + SIGKILL, 1, 0);
}

void run_session(msg_t *m) {
    int ctl = m->fds[0], out = m->fds[1], err = m->fds[2], st = m->fds[3];
    const char *cmd = field(m, "cmd");
    const char *cwd = field(m, "cwd");
    become_killable();
    static char *envp[MAX_FIELDS + 1];
    envp[fields_of(m, "env", envp, MAX_FIELDS)] = NULL;

    int in[2], steps[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(steps, O_CLOEXEC) < 0) end_session(st, -2, 0, errno);
    fcntl(in[1], F_SETPIPE_SZ, SHELL_PIPE_BYTES);
    fcntl(in[1], F_SETFL, O_NONBLOCK); /* what does not fit waits for the shell to read (POLLOUT) */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    int sfd = sigchld_fd();
    pid_t shell = vfork(); /* it only sets up its descriptors and execs: see run_reaper */
    if (shell < 0) end_session(st, -2, 0, errno);
    if (shell == 0) {
        unblock_signals();
        setsid();
        dup2(in[0], 0); dup2(out, 1); dup2(err, 2); dup2(steps[1], 3);
        syscall(SYS_close_range, 4, ~0U, 0);
        enter_cwd(cwd);
        /* cmd is the shell's loop, in bash; no bash here: the shell never gets ready (ENOENT) */
        char *argv[] = {"bash", "--noprofile", "--norc", "-c", (char *)(cmd ? cmd : ""), NULL};
        execve("/bin/bash", argv, envp);
        execve("/usr/bin/bash", argv, envp);
        _exit(127);
    }
    close(in[0]); close(steps[1]); close(out); close(err);

    char *buf = malloc(MAX_STEP_BYTES);
    char line[32];
    int linelen = 0, ready = 0, in_step = 0;
    uint32_t unsent = 0, sent = 0; /* the part of the step's bytes the shell's pipe had no room for */
    long long watermark = -1, deadline = 0;
    for (;;) {
        /* the next step is read only once this one is wholly in the shell's pipe */
        struct pollfd p[4] = {{sfd, POLLIN, 0}, {steps[0], POLLIN, 0}, {unsent ? -1 : ctl, POLLIN, 0},
                              {unsent ? in[1] : -1, POLLOUT, 0}};
        int timeout = -1;
        if (deadline) {
            long long left = deadline - now_ms();
            if (left <= 0) {
                kill_step(shell, watermark);
                end_session(st, 128 + SIGKILL, 1, 0);
            }
            timeout = (int)left;
        }
        if (poll(p, 4, timeout) < 0) continue;
        if (p[3].revents) {
            ssize_t w = write(in[1], buf + sent, unsent);
            if (w > 0) { sent += w; unsent -= w; }
            else if (w < 0 && errno != EAGAIN && errno != EINTR) input_closed(st, shell, watermark, ready);
        }
        if (p[1].revents) { /* the shell's step reports: "R" once, then an exit code per step */
            char chunk[256];
            ssize_t k = read(steps[0], chunk, sizeof chunk);
            if (k <= 0) { close(steps[0]); steps[0] = -1; }
            for (ssize_t i = 0; i < k; i++) {
                if (chunk[i] != '\n') {
                    if (linelen < (int)sizeof line - 1) line[linelen++] = chunk[i];
                    continue;
                }
                line[linelen] = 0;
                linelen = 0;
                if (!ready) { ready = line[0] == 'R'; continue; }
                if (!in_step) continue; /* nothing asked: not a step's report */
                in_step = 0;
                deadline = 0;
                status_record(st, atoi(line), 0, 0, STATUS_STEP);
            }
        }
        if (p[0].revents) {
            drain_signalfd(sfd);
            int status;
            pid_t r;
            while ((r = waitpid(-1, &status, WNOHANG)) > 0)
                if (r == shell) end_session(st, exit_code_of(status), 0, ready ? 0 : ENOENT);
        }
        if (p[2].revents) {
            uint32_t hdr[2];
            if (read_full(ctl, hdr, sizeof hdr) < 0) { /* the host is done: the shell reads EOF and ends */
                close(ctl);
                ctl = -1;
                close(in[1]);
                in[1] = -1;
                continue;
            }
            if (hdr[1] == 0 || hdr[1] > MAX_STEP_BYTES || !buf || read_full(ctl, buf, hdr[1]) < 0) {
                kill_step(shell, -1);
                end_session(st, -2, 0, EPROTO);
            }
            watermark = last_pid();
            deadline = hdr[0] ? now_ms() + hdr[0] : 0;
            in_step = 1;
            ssize_t w = in[1] >= 0 ? write(in[1], buf, hdr[1]) : -1;
            if (w < 0 && errno == EAGAIN) w = 0;
            if (w < 0) input_closed(st, shell, watermark, ready); /* this step cannot start */
            sent = (uint32_t)w;
            unsent = hdr[1] - sent;
        }
    }
}
