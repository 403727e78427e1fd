/*
 * A keeper's janitor: a child that shares the keeper's mount namespace and does
 * the slow cleanup of dead instances off the request path (see keeper.c): lazy
 * unmounts (whose last reference frees a tmpfs), cgroup removal, and the last
 * reference to a dead instance's mount or network namespace (tearing one down
 * waits for RCU).
 */
#include "sandboxd.h"

static int janitor_fd = -1;
static pid_t janitor_pid;

/* Fork the janitor. Requests are packets with one field "OP=PATH", optionally carrying one fd
 * to close. */
static void janitor_start(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return;
    pid_t pid = fork();
    if (pid < 0) { close(sv[0]); close(sv[1]); return; }
    if (pid == 0) {
        /* Nothing of the keeper's but its channel: a descriptor on an instance's namespace
         * held here would keep that namespace alive. */
        if (sv[0] > 3) syscall(SYS_close_range, 3, sv[0] - 1, 0);
        syscall(SYS_close_range, sv[0] + 1, ~0U, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        set_title("snapgym-janitor");
        msg_t *m = msg_new();
        while (m && recv_msg(sv[0], m) == 0) {
            const char *path = m->nfields ? m->val[0] : "";
            char op = m->nfields ? m->key[0][0] : 0;
            close_fds(m); /* a namespace held for us: its teardown happens here */
            if (op == 'U') {
                umount2(path, MNT_DETACH);
                rmdir(path);
            } else if (op == 'R') {
                for (int i = 0; i < 500 && rmdir(path) < 0 && errno == EBUSY; i++) usleep(10000);
            }
        }
        _exit(0);
    }
    close(sv[0]);
    janitor_fd = sv[1];
    janitor_pid = pid;
}

/* Hand the janitor a request (op U unmount and remove, R remove, N only the fd). It starts with
 * the first request: a sandbox that never restores (a warm one in a pool) has no janitor. */
void janitor_send(char op, const char *path, int fd) {
    static int started;
    if (!started) {
        started = 1;
        janitor_start();
    }
    char packet[4200 + HDR_SIZE + 4];
    int len = snprintf(packet + HDR_SIZE + 4, 4200, "%c=%s", op, path);
    uint32_t h[4] = {0, 0, 0, 1}, l = (uint32_t)len;
    memcpy(packet, h, HDR_SIZE);
    memcpy(packet + HDR_SIZE, &l, 4);
    if (janitor_fd >= 0 && len < 4200 && send_raw(janitor_fd, packet, HDR_SIZE + 4 + len, &fd, fd >= 0) == 0) {
        if (fd >= 0) close(fd);
        return;
    }
    if (fd >= 0) close(fd);
    if (op == 'U') { umount2(path, MNT_DETACH); rmdir(path); }
    else if (op == 'R') rmdir(path);
}

/* Let the janitor finish what it was given (it exits at end of input) before we go:
 * it dies with us, and a stage it has not unmounted would hold its memory until the
 * daemon ends. */
void janitor_drain(void) {
    if (janitor_fd < 0) return;
    close(janitor_fd);
    janitor_fd = -1;
    while (waitpid(janitor_pid, NULL, 0) < 0 && errno == EINTR) {}
}

/* The keeper reaped pid: if it was the janitor, clean up inline from now on. */
void janitor_reaped(pid_t pid) {
    if (pid != janitor_pid || janitor_fd < 0) return;
    close(janitor_fd);
    janitor_fd = -1;
}

/* In a child the keeper forks (an instance): close the channel. */
void janitor_forget(void) {
    if (janitor_fd >= 0) close(janitor_fd);
}
