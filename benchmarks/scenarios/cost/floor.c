/*
 * The floor of a fresh instance: the least a sandbox start can cost on this kernel.
 *
 * Each repetition makes what snapgym's local backend makes per instance, and
 * nothing else: a tmpfs for the writable layer, a child in new mount, PID, IPC
 * and UTS namespaces that mounts an overlay over LOWER, binds /usr, mounts
 * /proc and a tmpfs /dev, pivots into it and runs COMMAND with /bin/bash; the
 * child exits, the tmpfs is unmounted. No network namespace, cgroup, seccomp
 * filter, capability drop, device nodes, egress gate or daemon round trip.
 * With MODE "plain" it forks and runs the same command in the caller's
 * namespaces instead (the no-isolation baseline's way).
 *
 * Usage: floor MODE REPETITIONS LOWER STAGE COMMAND
 * Prints "CPU_US_PER_OP WALL_US_PER_OP": user and kernel time of this process
 * and every child it waited for, per repetition (three untimed ones first).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *lower, *stage, *command;

static void die(const char *what) {
    perror(what);
    _exit(2);
}

static int run_bash(void) {
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/bash", "bash", "-c", command, (char *)NULL);
        _exit(127);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void enter_instance(void) {
    char root[512], path[600], options[1400];
    snprintf(root, sizeof root, "%s/root", stage);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) die("private mounts");
    snprintf(options, sizeof options, "lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lower, stage, stage);
    if (mount("overlay", root, "overlay", 0, options) < 0) die("overlay");
    snprintf(path, sizeof path, "%s/usr", root);
    if (mount("/usr", path, NULL, MS_BIND | MS_REC, NULL) < 0) die("bind /usr");
    snprintf(path, sizeof path, "%s/proc", root);
    if (mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) die("proc");
    snprintf(path, sizeof path, "%s/dev", root);
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID, "size=1m") < 0) die("dev");
    if (chdir(root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0) die("pivot_root");
    if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0) die("detach the old root");
}

static int one(int isolated) {
    if (!isolated) return run_bash();
    char path[600];
    if (mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m") < 0) die("stage tmpfs");
    const char *dirs[] = {"upper", "work", "root"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", stage, dirs[i]);
        if (mkdir(path, 0755) < 0) die("mkdir");
    }
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) {
        enter_instance();
        _exit(run_bash());
    }
    int status = -1;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) die("clone");
    if (umount2(stage, MNT_DETACH) < 0) die("unmount the stage");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static double cpu_s(void) {
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    return (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + children.ru_utime.tv_sec + children.ru_stime.tv_sec) +
           1e-6 * (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec + children.ru_utime.tv_usec +
                           children.ru_stime.tv_usec);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: floor instance|plain REPETITIONS LOWER STAGE COMMAND\n");
        return 2;
    }
    int isolated = strcmp(argv[1], "instance") == 0, repetitions = atoi(argv[2]);
    lower = argv[3], stage = argv[4], command = argv[5];
    for (int i = 0; i < 3; i++)
        if (one(isolated) != 0) return fprintf(stderr, "the command failed\n"), 1;
    double cpu = cpu_s(), wall = now_s();
    for (int i = 0; i < repetitions; i++)
        if (one(isolated) != 0) return fprintf(stderr, "the command failed\n"), 1;
    printf("%.1f %.1f\n", 1e6 * (cpu_s() - cpu) / repetitions, 1e6 * (now_s() - wall) / repetitions);
    return 0;
}
