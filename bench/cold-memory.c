/*
 * cold-memory.c: how long touching fresh anonymous memory takes, a write
 * per 4 KiB page, optionally with MADV_HUGEPAGE. On a virtual machine
 * whose guest hands free memory back to its host (virtio-balloon free
 * page reporting), memory touched a few idle seconds after it was freed
 * is far slower than memory touched back to back: what a command run
 * once pays for its peak memory (docs/benchmarks.md, "Memory a run
 * touches first").
 *
 *   cc -O2 -o /tmp/cold-memory bench/cold-memory.c
 *   for i in 1 2 3; do sleep 4; /tmp/cold-memory 256; /tmp/cold-memory 256; done
 *   for i in 1 2 3; do sleep 4; /tmp/cold-memory 256 huge; /tmp/cold-memory 256 huge; done
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cold-memory MIB [huge]\n");
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    int huge = argc > 2;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    if (huge && madvise(p, n, MADV_HUGEPAGE) != 0)
        perror("madvise");
    for (size_t i = 0; i < n; i += 4096)
        p[i] = 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("%zu MiB%s: %.3f s, %.2f GB/s\n", n >> 20, huge ? " (MADV_HUGEPAGE)" : "", s, n / 1e9 / s);
    return 0;
}
