/* Children and SIGCHLD, as every level of the daemon handles them.
 *
 * The daemon, each keeper, each init and each exec's reaper wait for children: they block SIGCHLD
 * and learn of exits through a signalfd (or sigtimedwait), so no handler runs between two system
 * calls. A child they fork starts with no signal blocked. */
#include "sandboxd.h"

sigset_t block_sigchld(void) {
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    return chld;
}

int sigchld_fd(void) {
    sigset_t chld = block_sigchld();
    return signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
}

void drain_signalfd(int sfd) {
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) > 0) {}
}

void await_request(int sock, int sfd, void (*reap)(void)) {
    for (;;) {
        struct pollfd p[2] = {{sock, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) continue;
        if (p[1].revents) {
            drain_signalfd(sfd);
            reap();
        }
        if (p[0].revents) return;
    }
}

void unblock_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

void enter_cwd(const char *cwd) {
    if (cwd && *cwd && chdir(cwd) < 0) {
        dprintf(2, "snapgym: cannot enter working directory %s: %s\n", cwd, strerror(errno));
        _exit(126);
    }
}
