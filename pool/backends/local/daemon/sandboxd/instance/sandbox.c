/* Inside the cloned child: mount the root filesystem, enter the user namespace, become init. */
#include "sandboxd.h"

/* ------------------------------------------------------- sandbox child */

/* Errors during setup travel back to the daemon as "e<message>" on the sync
 * socket, so the caller sees which step failed and why. */
static int sync_fd = -1;
int fail_status_fd = -1;

void set_failure_fd(int fd) { sync_fd = fd; }
void child_fail(const char *fmt, ...) {
    if (fail_status_fd >= 0) {
        write_status(fail_status_fd, -2, 0, errno);
        _exit(1);
    }
    char text[4096] = "e";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + 1, sizeof text - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(text);
    snprintf(text + len, sizeof text - len, ": %s", strerror(errno));
    if (write(sync_fd, text, strlen(text)) < 0) {}
    _exit(1);
}

static void bind_into(const char *root, const char *src, const char *dst, int ro) {
    char target[4096];
    snprintf(target, sizeof target, "%s%s", root, dst);
    if (mount(src, target, NULL, MS_BIND, NULL) < 0)
        child_fail("bind-mount %s onto %s", src, dst);
    if (ro && mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
        child_fail("make %s read-only", dst);
}

/* Mount an overlay at target. Layers are named through symbolic links in the
 * current directory (the instance's stage), so the mount options that
 * /proc/self/mountinfo shows inside the sandbox hold no host paths. */
int mount_overlay(const char *target, char *const *lowers, int nlowers, const char *upper, const char *work) {
    static int links;
    char opts[16384], name[32];
    size_t off = snprintf(opts, sizeof opts, "lowerdir=");
    for (int i = 0; i < nlowers; i++) {
        snprintf(name, sizeof name, "L%d", links++);
        if (symlink(lowers[i], name) < 0) return -1;
        off += snprintf(opts + off, sizeof opts - off, "%s%s", i ? ":" : "", name);
    }
    if (upper)
        off += snprintf(opts + off, sizeof opts - off, ",upperdir=%s,workdir=%s", upper, work);
    /* Redirects, index and metacopy would make the writable layer depend on
     * the layers under it; without them it can be frozen into a layer as is.
     * In a user namespace the kernel refuses those options but keeps them off. */
    off += snprintf(opts + off, sizeof opts - off, ",%s", user_mode ? "userxattr" : "redirect_dir=off,index=off,metacopy=off");
    if (off >= sizeof opts) { errno = E2BIG; return -1; }
    return mount("overlay", target, "overlay", upper ? 0 : MS_RDONLY, opts);
}

/* /dev: one tmpfs for the device nodes, their links and /dev/shm (its 64 MiB), as in Docker.
 * The nodes are the host's, bound in rather than made with mknod (about 60 us cheaper per
 * instance here): the sandbox's root owns this tmpfs, and could remove and replace a node it
 * made, not a mount point (tests/contract/test_sandbox_holes.py).
 * /dev/shm is a folder of it, bound onto itself for its own flags, not a tmpfs of its own: the
 * kernel keeps per-memory-cgroup bookkeeping for every superblock on the machine, so each one a
 * sandbox adds costs memory in proportion to the number of sandboxes. */
static void setup_dev(const char *root, const char *root_uid) {
    char p[4096], q[4096], opts[128];
    snprintf(p, sizeof p, "%s/dev", root);
    snprintf(opts, sizeof opts, "mode=755,size=65m,uid=%s,gid=%s", root_uid, root_uid);
    if (mount("tmpfs", p, "tmpfs", MS_NOSUID, opts) < 0)
        child_fail("mount tmpfs on /dev");
    static const char *nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++) {
        snprintf(p, sizeof p, "%s/dev/%s", root, nodes[i]);
        int fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        if (fd < 0) child_fail("create /dev/%s", nodes[i]);
        close(fd);
        snprintf(q, sizeof q, "/dev/%s", nodes[i]);
        if (mount(q, p, NULL, MS_BIND, NULL) < 0) child_fail("bind /dev/%s", nodes[i]);
    }
    static const char *links[][2] = {{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
                                     {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
                                     {"pts/ptmx", "ptmx"}};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        snprintf(p, sizeof p, "%s/dev/%s", root, links[i][1]);
        if (symlink(links[i][0], p) < 0) child_fail("symlink /dev/%s", links[i][1]);
    }
    snprintf(p, sizeof p, "%s/dev/shm", root);
    uid_t owner = (uid_t)atol(root_uid);
    if (mkdir(p, 0) < 0 || chmod(p, 01777) < 0 || chown(p, owner, owner) < 0)
        child_fail("create /dev/shm");
    if (mount(p, p, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL) < 0)
        child_fail("mount /dev/shm");
    snprintf(p, sizeof p, "%s/dev/pts", root);
    mkdir(p, 0755);
    if (mount("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620") < 0)
        child_fail("mount /dev/pts");
    snprintf(p, sizeof p, "%s/dev/mqueue", root);
    mkdir(p, 0755);
    if (mount("mqueue", p, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        child_fail("mount /dev/mqueue");
}

static int syscall_pivot_root(const char *new_root, const char *put_old) {
    return (int)syscall(SYS_pivot_root, new_root, put_old);
}

/* Docker's default capability set: enough to be root inside the sandbox
 * (own files, change users), nothing that touches the kernel or devices. */
static void drop_capabilities(void) {
    static const int keep[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL,
                               CAP_SETGID, CAP_SETUID, CAP_SETPCAP, CAP_NET_BIND_SERVICE,
                               CAP_SYS_CHROOT, CAP_AUDIT_WRITE, CAP_SETFCAP};
    uint64_t mask = 0;
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) mask |= 1ULL << keep[i];
    for (int cap = 0; cap <= 63; cap++) {
        if (mask & (1ULL << cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break;
    }
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t)mask;
    data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t)(mask >> 32);
    if (syscall(SYS_capset, &hdr, data) < 0) child_fail("drop capabilities");
}

static void apply_rlimits(msg_t *cfg) {
    for (uint32_t i = 0; i < cfg->nfields; i++) {
        if (strcmp(cfg->key[i], "rlimit") != 0) continue;
        int res;
        unsigned long long soft, hard;
        if (sscanf(cfg->val[i], "%d:%llu:%llu", &res, &soft, &hard) != 3) continue;
        struct rlimit rl = {soft, hard};
        if (setrlimit(res, &rl) < 0) child_fail("set rlimit %d", res);
    }
}

/* rlimits, Docker's capability set, no_new_privs and the seccomp filter: what
 * every process that runs a sandbox's commands starts with. */
void drop_privileges(msg_t *cfg) {
    apply_rlimits(cfg);
    drop_capabilities();
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail("set no_new_privs");
    if (install_seccomp() < 0) child_fail("install the seccomp filter");
}

static void join_instance_cgroups(void) {
    char path[600];
    for (int i = 0; i < launch.ncgroups; i++) {
        snprintf(path, sizeof path, "%s/cgroup.procs", launch.cgroups[i]);
        if (write_file_str(path, "0") < 0) child_fail("join cgroup %s", launch.cgroups[i]);
    }
    /* The OOM killer must pick the sandbox's processes, never its init (whose
     * death would look like an infrastructure failure). Children of init set
     * their own score back to 0 (init.c), which they cannot lower again. Needs
     * host root; harmless if refused. */
    write_file_str("/proc/self/oom_score_adj", "-1000");
}

void sandbox_child(msg_t *cfg, const char *stage, int sock, int syncfd) {
    sync_fd = syncfd;
    char go;
    if (read_full(sync_fd, &go, 1) < 0) _exit(1); /* the keeper is ready for us */
    join_instance_cgroups();
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) child_fail("make mounts private");
    if (chdir(stage) < 0) child_fail("enter the stage %s", stage);

    char root[4096];
    snprintf(root, sizeof root, "%s/root", stage);
    char *lowers[512];
    int nlowers = 0;
    for (uint32_t i = 0; i < cfg->nfields && nlowers < 512; i++)
        if (strcmp(cfg->key[i], "lower") == 0) lowers[nlowers++] = cfg->val[i];
    if (mount_overlay(root, lowers, nlowers, "upper", "work") < 0) child_fail("mount overlay root filesystem");

    for (uint32_t i = 0; i < cfg->nfields; i++) {
        if (strcmp(cfg->key[i], "bind") != 0) continue;
        char spec[8192];
        snprintf(spec, sizeof spec, "%s", cfg->val[i]);
        char *src = spec, *dst = strchr(spec, '\t');
        if (!dst) continue;
        *dst++ = 0;
        char *mode = strchr(dst, '\t');
        int ro = 1;
        if (mode) { *mode++ = 0; ro = strcmp(mode, "rw") != 0; }
        bind_into(root, src, dst, ro);
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/proc", root);
    if (mount("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) child_fail("mount /proc");
    const char *root_uid = field(cfg, "root_uid");
    setup_dev(root, root_uid ? root_uid : "0");

    const char *hostname = field(cfg, "hostname");
    if (hostname && sethostname(hostname, strlen(hostname)) < 0) child_fail("set hostname");
    const char *net = field(cfg, "net");
    if (launch.net_fd >= 0) {
        if (setns(launch.net_fd, CLONE_NEWNET) < 0) child_fail("join the network namespace handed over");
        close(launch.net_fd);
    } else if ((!net || strcmp(net, "host") != 0) && net_set_up() < 0) {
        child_fail("set up the network namespace");
    }

    if (chdir(root) < 0) child_fail("enter root filesystem");
    if (syscall_pivot_root(".", ".") < 0) child_fail("pivot_root");
    if (umount2(".", MNT_DETACH) < 0) child_fail("detach host filesystem");
    if (chdir("/") < 0) child_fail("chdir /");

    /* The user namespace comes last, so the mount, pid and net namespaces stay
     * owned by the daemon's user namespace: root in the sandbox can neither
     * mount nor reconfigure the network. */
    if (unshare(CLONE_NEWUSER) < 0) child_fail("create user namespace");
    if (write(sync_fd, "u", 1) != 1) _exit(1);
    if (read_full(sync_fd, &go, 1) < 0 || go != 'm') _exit(1);
    if (setresgid(0, 0, 0) < 0) child_fail("become gid 0 in the sandbox");
    setgroups(0, NULL); /* denied where setgroups is disabled; harmless */
    if (setresuid(0, 0, 0) < 0) child_fail("become uid 0 in the sandbox");

    drop_privileges(cfg);
    /* Everything the agent runs descends from this init and so stays in its
     * Landlock domain; a shared verifier's processes start outside it. */
    landlock_confine();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) child_fail("set parent-death signal");
    /* getppid() is 0 across the PID namespace; a dead daemon shows as a failed write below. */
    umask(022);
    set_title("snapgym-init");
    warm_first_command(); /* while a spare: off the request path */
    if (write(sync_fd, "r", 1) != 1) _exit(1);
    close(sync_fd);
    init_loop(sock);
}
