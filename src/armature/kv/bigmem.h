/* Zeroed arrays for the tables that grow to hundreds of megabytes: the router's prefix index
 * and routed predictions over fleets of hundreds of workers.
 *
 * An array of at least BIG_ALLOC_BYTES is mapped on its own, 2 MiB aligned, and on Linux
 * advised to transparent huge pages (MADV_HUGEPAGE: used where the kernel's THP mode is
 * "always" or "madvise"; ignored where it is "never"). Its first touches then fault once per
 * 2 MiB instead of once per 4 KiB page, and random probes over it miss the TLB less. A replay
 * of 256 workers grew its index tables through ~1M page faults, a quarter of its CPU time in
 * the kernel on a VM. Smaller arrays, and every array off Linux, come from PyMem as before.
 *
 * big_free takes the element count and size the array was allocated with.
 */
#ifndef ARMATURE_BIGMEM_H
#define ARMATURE_BIGMEM_H

#include <Python.h>
#include <stdint.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#define BIG_ALLOC_BYTES ((size_t)4 << 20)
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define BIGMEM_MAPS 1
#else
#define BIGMEM_MAPS 0
#endif

/* count * size rounded up to whole huge pages; 0 on overflow */
static inline size_t big_mapped_bytes(size_t count, size_t size) {
    if (size != 0 && count > (SIZE_MAX - HUGE_PAGE_BYTES) / size) return 0;
    return (count * size + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1);
}

static inline int big_is_mapped(size_t count, size_t size) {
    return BIGMEM_MAPS && size != 0 && count >= BIG_ALLOC_BYTES / size;
}

/* `count` zeroed elements of `size` bytes; NULL (no exception set) when out of memory. */
static inline void *big_calloc(size_t count, size_t size) {
#if BIGMEM_MAPS
    if (big_is_mapped(count, size)) {
        size_t bytes = big_mapped_bytes(count, size);
        if (bytes == 0) return NULL;
        size_t mapped = bytes + HUGE_PAGE_BYTES; /* room to align the start */
        char *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        uintptr_t start = ((uintptr_t)p + HUGE_PAGE_BYTES - 1) & ~(uintptr_t)(HUGE_PAGE_BYTES - 1);
        size_t head = (size_t)(start - (uintptr_t)p);
        if (head) munmap(p, head);
        size_t tail = mapped - head - bytes;
        if (tail) munmap((char *)start + bytes, tail);
        (void)madvise((void *)start, bytes, MADV_HUGEPAGE); /* advice: refused is fine */
        return (void *)start;
    }
#endif
    return PyMem_Calloc(count, size);
}

static inline void big_free(void *p, size_t count, size_t size) {
    if (p == NULL) return;
#if BIGMEM_MAPS
    if (big_is_mapped(count, size)) {
        munmap(p, big_mapped_bytes(count, size));
        return;
    }
#endif
    (void)count;
    (void)size;
    PyMem_Free(p);
}

#endif
