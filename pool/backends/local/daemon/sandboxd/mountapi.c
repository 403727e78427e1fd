/* The new mount API, openat2 and Landlock by system call number (the C library
 * of older distributions has no wrappers), and small helpers built on them. */
#include "sandboxd.h"

#include <linux/openat2.h>

int sys_fsopen(const char *fs) { return (int)syscall(SYS_fsopen, fs, FSOPEN_CLOEXEC_); }

int sys_fsconfig_str(int fd, const char *key, const char *value) {
    return (int)syscall(SYS_fsconfig, fd, value ? FSCONFIG_SET_STRING_ : FSCONFIG_SET_FLAG_, key, value, 0);
}

/* Create the superblock configured on fd and return a detached mount of it. */
int sys_fsmount(int fd, unsigned attrs) {
    if (syscall(SYS_fsconfig, fd, FSCONFIG_CMD_CREATE_, NULL, NULL, 0) < 0) return -1;
    return (int)syscall(SYS_fsmount, fd, FSMOUNT_CLOEXEC_, attrs);
}

int sys_open_tree(int dfd, const char *path, unsigned flags) {
    return (int)syscall(SYS_open_tree, dfd, path, flags | OPEN_TREE_CLOEXEC_);
}

/* Attach a detached mount (from fsmount or open_tree) at to_dfd/to_path. */
int attach_mount(int mount_fd, int to_dfd, const char *to_path) {
    return (int)syscall(SYS_move_mount, mount_fd, "", to_dfd, to_path, MOVE_MOUNT_F_EMPTY_PATH_);
}

/* A detached overlay of lowerdir (layers joined by ':', top first) under upper and work, with
 * the options every snapgym overlay gets (userxattr without host root; no redirects, index or
 * metacopy with it). -1 on failure. */
int overlay_fsmount(const char *lowerdir, const char *upper, const char *work) {
    int fs = sys_fsopen("overlay");
    int ok = fs >= 0 && sys_fsconfig_str(fs, "lowerdir", lowerdir) == 0 && sys_fsconfig_str(fs, "upperdir", upper) == 0 &&
             sys_fsconfig_str(fs, "workdir", work) == 0;
    if (ok && user_mode) ok = sys_fsconfig_str(fs, "userxattr", NULL) == 0;
    if (ok && !user_mode)
        ok = sys_fsconfig_str(fs, "redirect_dir", "off") == 0 && sys_fsconfig_str(fs, "index", "off") == 0 &&
             sys_fsconfig_str(fs, "metacopy", "off") == 0;
    int mnt = ok ? sys_fsmount(fs, 0) : -1;
    if (fs >= 0) close(fs);
    return mnt;
}

/* open(2) of path under dirfd that never follows a symbolic link, nor leaves dirfd. */
int open_beneath(int dirfd, const char *path, int flags) {
    struct open_how how = {0};
    how.flags = (unsigned long long)(flags | O_CLOEXEC);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

/* ------------------------------------------------------------- Landlock */

#define LANDLOCK_CREATE_RULESET_VERSION_ (1U << 0)
#define LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET_ (1ULL << 0)
#define LANDLOCK_SCOPE_SIGNAL_ (1ULL << 1)
#define LANDLOCK_ACCESS_FS_EXECUTE_ (1ULL << 0)
#define LANDLOCK_RULE_PATH_BENEATH_ 1

struct ruleset_attr_ {
    uint64_t handled_access_fs, handled_access_net, scoped;
};
struct path_beneath_attr_ {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

/* Put the caller and everything it will start into a Landlock domain that
 * denies nothing but reaching outside it: processes in the domain cannot
 * ptrace (or read the memory of) processes outside it, and from ABI 6 on
 * cannot signal them or connect to their abstract sockets. Returns the
 * ABI in force (0: this kernel has no Landlock, nothing was done). */
int landlock_confine(void) {
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION_);
    if (abi < 1) return 0;
    struct ruleset_attr_ attr = {0};
    size_t size = sizeof attr;
    if (abi >= 6) {
        attr.scoped = LANDLOCK_SCOPE_SIGNAL_ | LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET_;
    } else {
        attr.handled_access_fs = LANDLOCK_ACCESS_FS_EXECUTE_; /* allowed everywhere below */
        size = sizeof(uint64_t);                              /* ABI 1-3 know only this field */
    }
    int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (rs < 0) return 0;
    if (abi < 6) {
        int root = open("/", O_PATH | O_CLOEXEC | O_DIRECTORY);
        struct path_beneath_attr_ rule = {LANDLOCK_ACCESS_FS_EXECUTE_, root};
        long rc = root < 0 ? -1 : syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH_, &rule, 0);
        if (root >= 0) close(root);
        if (rc < 0) { close(rs); return 0; }
    }
    long rc = syscall(SYS_landlock_restrict_self, rs, 0);
    close(rs);
    return rc < 0 ? 0 : (int)abi;
}
