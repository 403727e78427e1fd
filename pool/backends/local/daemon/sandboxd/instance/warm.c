/* Warm what the first command of an instance opens, while the instance is still a spare.
 *
 * Every instance mounts a new overlay, whose dentries and inodes start cold: the first
 * command's /bin/sh, its ELF interpreter, the loader's cache and the shell's libraries are
 * looked up through every layer at that command's expense. An instance that is set up ahead
 * of time (a spare, a ready sandbox) looks them up here instead, off the request path. Only
 * lookups and header reads: nothing runs, nothing is written, no layer is copied up. */
#include "sandboxd.h"
#include <elf.h>

enum { MAX_PHDRS = 64, MAX_DYN = 512 };

static void touch(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd >= 0) close(fd);
}

/* A library the way the loader finds one without its cache: the first standard folder that has it. */
static void touch_library(const char *name) {
    static const char *dirs[] = {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                                 "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"};
    char path[512];
    struct stat st;
    if (strchr(name, '/')) return;
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        snprintf(path, sizeof path, "%s/%s", dirs[i], name);
        if (stat(path, &st) == 0) {
            touch(path);
            return;
        }
    }
}

/* The file offset of a virtual address, through the PT_LOAD segment that maps it; 0: none. */
static off_t file_offset(const Elf64_Phdr *ph, int n, uint64_t vaddr) {
    for (int i = 0; i < n; i++)
        if (ph[i].p_type == PT_LOAD && vaddr >= ph[i].p_vaddr && vaddr < ph[i].p_vaddr + ph[i].p_filesz)
            return (off_t)(vaddr - ph[i].p_vaddr + ph[i].p_offset);
    return 0;
}

/* The libraries an ELF file's dynamic section names (DT_NEEDED). */
static void touch_needed(int fd, const Elf64_Phdr *ph, int n, const Elf64_Phdr *dynamic) {
    static Elf64_Dyn dyn[MAX_DYN];
    size_t count = dynamic->p_filesz / sizeof *dyn;
    if (count > MAX_DYN) count = MAX_DYN;
    ssize_t got = pread(fd, dyn, count * sizeof *dyn, (off_t)dynamic->p_offset);
    if (got <= 0) return;
    count = (size_t)got / sizeof *dyn;
    uint64_t strtab = 0;
    for (size_t i = 0; i < count && dyn[i].d_tag != DT_NULL; i++)
        if (dyn[i].d_tag == DT_STRTAB) strtab = dyn[i].d_un.d_ptr;
    off_t strings = strtab ? file_offset(ph, n, strtab) : 0;
    for (size_t i = 0; strings && i < count && dyn[i].d_tag != DT_NULL; i++) {
        if (dyn[i].d_tag != DT_NEEDED) continue;
        char name[256];
        ssize_t len = pread(fd, name, sizeof name - 1, strings + (off_t)dyn[i].d_un.d_val);
        if (len <= 0) continue;
        name[len] = 0;
        touch_library(name);
    }
}

/* An executable, its ELF interpreter and the libraries it names. */
static void touch_program(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return;
    Elf64_Ehdr eh;
    static Elf64_Phdr ph[MAX_PHDRS];
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phnum > MAX_PHDRS ||
        pread(fd, ph, eh.e_phnum * sizeof *ph, (off_t)eh.e_phoff) != (ssize_t)(eh.e_phnum * sizeof *ph)) {
        close(fd);
        return;
    }
    for (int i = 0; i < eh.e_phnum; i++) {
        if (ph[i].p_type == PT_INTERP && ph[i].p_filesz > 1 && ph[i].p_filesz < 512) {
            char interp[512];
            if (pread(fd, interp, ph[i].p_filesz, (off_t)ph[i].p_offset) == (ssize_t)ph[i].p_filesz) {
                interp[ph[i].p_filesz - 1] = 0;
                touch(interp);
            }
        } else if (ph[i].p_type == PT_DYNAMIC) {
            touch_needed(fd, ph, eh.e_phnum, &ph[i]);
        }
    }
    close(fd);
}

void warm_first_command(void) {
    touch("/etc/ld.so.cache");
    touch_program("/bin/sh");
}
