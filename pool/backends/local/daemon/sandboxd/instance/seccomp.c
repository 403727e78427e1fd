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

enum verdict { DENY_EPERM, DENY_ENOSYS, CHECK_CLONE_FLAGS };

struct rule {
    unsigned int nr;
    enum verdict verdict;
};

/* Every system call the filter does not simply allow. */
static struct rule rules[] = {
    {__NR_clone3, DENY_ENOSYS}, {__NR_clone, CHECK_CLONE_FLAGS},
    {__NR_unshare, DENY_EPERM}, {__NR_setns, DENY_EPERM}, {__NR_mount, DENY_EPERM},
    {__NR_umount2, DENY_EPERM}, {__NR_pivot_root, DENY_EPERM}, {__NR_fsopen, DENY_EPERM},
    {__NR_fsconfig, DENY_EPERM}, {__NR_fsmount, DENY_EPERM}, {__NR_fspick, DENY_EPERM},
    {__NR_move_mount, DENY_EPERM}, {__NR_open_tree, DENY_EPERM}, {__NR_mount_setattr, DENY_EPERM},
    {__NR_keyctl, DENY_EPERM}, {__NR_add_key, DENY_EPERM}, {__NR_request_key, DENY_EPERM},
    {__NR_bpf, DENY_EPERM}, {__NR_perf_event_open, DENY_EPERM}, {__NR_init_module, DENY_EPERM},
    {__NR_finit_module, DENY_EPERM}, {__NR_delete_module, DENY_EPERM}, {__NR_kexec_load, DENY_EPERM},
    {__NR_kexec_file_load, DENY_EPERM}, {__NR_open_by_handle_at, DENY_EPERM},
    {__NR_name_to_handle_at, DENY_EPERM}, {__NR_userfaultfd, DENY_EPERM}, {__NR_swapon, DENY_EPERM},
    {__NR_swapoff, DENY_EPERM}, {__NR_reboot, DENY_EPERM}, {__NR_acct, DENY_EPERM},
    {__NR_quotactl, DENY_EPERM}, {__NR_io_uring_setup, DENY_EPERM}, {__NR_io_uring_enter, DENY_EPERM},
    {__NR_io_uring_register, DENY_EPERM},
};
#define NRULES ((int)(sizeof rules / sizeof *rules))
#define LEAF_RULES 3 /* a search ends in at most this many equality tests */

static int by_number(const void *a, const void *b) {
    unsigned int x = ((const struct rule *)a)->nr, y = ((const struct rule *)b)->nr;
    return (x > y) - (x < y);
}

/* Instructions of the search over rules[lo, hi): a leaf tests each number for
 * equality and allows the rest; a node compares with the middle number. */
static int search_length(int lo, int hi) {
    if (hi - lo <= LEAF_RULES) return hi - lo + 1;
    int mid = lo + (hi - lo) / 2;
    return 1 + search_length(lo, mid) + search_length(mid, hi);
}

/* Emit the search over rules[lo, hi) at prog[*pc]; a rule's match jumps to
 * its verdict's block (verdict_pc). */
static void emit_search(struct sock_filter *prog, int *pc, int lo, int hi, const int *verdict_pc) {
    if (hi - lo <= LEAF_RULES) {
        for (int i = lo; i < hi; i++, (*pc)++)
            prog[*pc] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, rules[i].nr,
                                                     (unsigned char)(verdict_pc[rules[i].verdict] - *pc - 1), 0);
        prog[(*pc)++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
        return;
    }
    int mid = lo + (hi - lo) / 2;
    prog[(*pc)++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, rules[mid].nr,
                                                 (unsigned char)search_length(lo, mid), 0);
    emit_search(prog, pc, lo, mid, verdict_pc);
    emit_search(prog, pc, mid, hi, verdict_pc);
}

/* The filter, as a binary search over the rules' system call numbers rather
 * than one test after another: the kernel runs it for every system call it
 * cannot answer from its per-filter cache, and when it attaches the filter it
 * runs it once for each of the ~460 system call numbers to fill that cache, so
 * a filter of a few tests per call costs a sandbox's start about a tenth of a
 * chain of 35 (tests/contract/test_seccomp_filter.py reads the installed filter
 * back and checks its verdict for every number). */
static int build_filter(struct sock_filter *prog, int room) {
    qsort(rules, NRULES, sizeof *rules, by_number);
    int head = 4;
#ifdef __x86_64__
    head += 2;
#endif
    int search = search_length(0, NRULES);
    int verdict_pc[3];
    verdict_pc[DENY_EPERM] = head + search;
    verdict_pc[DENY_ENOSYS] = verdict_pc[DENY_EPERM] + 1;
    verdict_pc[CHECK_CLONE_FLAGS] = verdict_pc[DENY_ENOSYS] + 1;
    int total = verdict_pc[CHECK_CLONE_FLAGS] + 4;
    if (total > room || total - head > 255) return -1; /* jumps reach 255 instructions ahead */

    int pc = 0;
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    prog[pc++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0);
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
#ifdef __x86_64__
    prog[pc++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1); /* x32 ABI */
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
#endif
    emit_search(prog, &pc, 0, NRULES, verdict_pc);
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
    prog[pc++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 0, 1);
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    prog[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    return pc;
}

int install_seccomp(void) {
    if (ARCH == 0) return 0; /* unknown architecture: namespaces and capabilities only */
    struct sock_filter filter[128];
    int length = build_filter(filter, (int)(sizeof filter / sizeof *filter));
    if (length < 0) {
        errno = E2BIG;
        return -1;
    }
    struct sock_fprog prog = {(unsigned short)length, filter};
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}
