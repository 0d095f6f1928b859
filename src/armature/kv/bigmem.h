/* Zeroed arrays for the hash tables that grow to hundreds of megabytes: the router's prefix
 * index and routed predictions over fleets of hundreds of workers.
 *
 * A table is rebuilt into a fresh array at every doubling, and its entries land all over it,
 * so every page of the new array is touched at once. From calloc, each 4 KiB page then costs
 * a page fault of its own, often two (a probe reads the shared zero page, the insert that
 * follows copies it). An array of at least BIG_ALLOC_BYTES is instead mapped on its own with
 * MAP_POPULATE on Linux: the kernel hands over all its zeroed pages in the one call, with no
 * fault per page. Smaller arrays, and every array off Linux, come from PyMem.
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

#ifndef BIG_ALLOC_BYTES
#define BIG_ALLOC_BYTES ((size_t)1 << 20)
#endif

#if defined(__linux__) && defined(MAP_POPULATE)
#define BIGMEM_MAPS 1
#else
#define BIGMEM_MAPS 0
#endif

static inline int big_is_mapped(size_t count, size_t size) {
    return BIGMEM_MAPS && size != 0 && count >= BIG_ALLOC_BYTES / size;
}

/* `count` zeroed elements of `size` bytes; NULL (no exception set) when out of memory. */
static inline void *big_calloc(size_t count, size_t size) {
#if BIGMEM_MAPS
    if (big_is_mapped(count, size)) {
        if (count > SIZE_MAX / size) return NULL;
        void *p = mmap(NULL, count * size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
#endif
    return PyMem_Calloc(count, size);
}

static inline void big_free(void *p, size_t count, size_t size) {
    if (p == NULL) return;
#if BIGMEM_MAPS
    if (big_is_mapped(count, size)) {
        munmap(p, count * size);
        return;
    }
#endif
    (void)count;
    (void)size;
    PyMem_Free(p);
}

#endif
