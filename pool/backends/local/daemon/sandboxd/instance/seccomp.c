/*
 * A seccomp filter for everything that runs in a sandbox: system calls that
 * reach past the sandbox's namespaces fail with EPERM.
 *
 * Denied: new namespaces (unshare, setns, clone with namespace flags),
 * mounting, kernel keyrings, BPF, perf, modules, kexec, file handles,
 * userfaultfd, swap, reboot, accounting, quotas and io_uring (whose
 * requests no seccomp filter can see); as in Docker's default profile. clone3 answers ENOSYS, so the C library falls back to clone, whose
 * flags the filter can read. Other architectures' system calls are killed.
 */
#include "sandboxd.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#define ARCH 0
#endif

#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP)
#define DENY(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)

int install_seccomp(void) {
    if (ARCH == 0) return 0; /* unknown architecture: namespaces and capabilities only */
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#ifdef __x86_64__
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1), /* x32 ABI */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
#endif
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        DENY(__NR_unshare), DENY(__NR_setns), DENY(__NR_mount), DENY(__NR_umount2),
        DENY(__NR_pivot_root), DENY(__NR_fsopen), DENY(__NR_fsconfig), DENY(__NR_fsmount),
        DENY(__NR_fspick), DENY(__NR_move_mount), DENY(__NR_open_tree), DENY(__NR_mount_setattr),
        DENY(__NR_keyctl), DENY(__NR_add_key), DENY(__NR_request_key), DENY(__NR_bpf),
        DENY(__NR_perf_event_open), DENY(__NR_init_module), DENY(__NR_finit_module),
        DENY(__NR_delete_module), DENY(__NR_kexec_load), DENY(__NR_kexec_file_load),
        DENY(__NR_open_by_handle_at), DENY(__NR_name_to_handle_at), DENY(__NR_userfaultfd),
        DENY(__NR_swapon), DENY(__NR_swapoff), DENY(__NR_reboot), DENY(__NR_acct),
        DENY(__NR_quotactl), DENY(__NR_io_uring_setup), DENY(__NR_io_uring_enter),
        DENY(__NR_io_uring_register),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof *filter), filter};
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}
