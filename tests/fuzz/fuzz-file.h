/* For the targets whose entry point reads a file by path (fuzz-ini,
 * fuzz-profile, fuzz-workload): each input goes into one in-memory file
 * (memfd) named through /proc/self/fd, so no input touches the disk. */
#ifndef PV_TESTS_FUZZ_FILE_H
#define PV_TESTS_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

static int fuzz_file_fd = -1;
static char fuzz_file_path[64];

/* The memfd, once (from LLVMFuzzerInitialize); `target` names it in errors. */
static inline void fuzz_file_open(const char *target)
{
    fuzz_file_fd = memfd_create(target, 0);
    if (fuzz_file_fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(fuzz_file_path, sizeof fuzz_file_path, "/proc/self/fd/%d", fuzz_file_fd);
}

/* The target's LLVMFuzzerInitialize: opens the memfd, once. */
#define FUZZ_FILE_INITIALIZE(target)                                                                \
    int LLVMFuzzerInitialize(int *argc, char ***argv);                                             \
    int LLVMFuzzerInitialize(int *argc, char ***argv)                                              \
    {                                                                                              \
        (void)argc;                                                                                \
        (void)argv;                                                                                \
        fuzz_file_open(target);                                                                    \
        return 0;                                                                                  \
    }

/* The file's contents become data; returns its path. */
static inline const char *fuzz_file_write(const uint8_t *data, size_t size)
{
    if (ftruncate(fuzz_file_fd, 0) != 0 || pwrite(fuzz_file_fd, data, size, 0) != (ssize_t)size) {
        perror("writing the memfd");
        abort();
    }
    return fuzz_file_path;
}

#endif
