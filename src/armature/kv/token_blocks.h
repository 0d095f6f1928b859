/* A prompt's token ids as the block hashes read them (DESIGN §3): full blocks packed into
 * little-endian u32 bytes, and one block's (seq, local) hash chained from its parent. Shared
 * by the hashing extension (_native.c) and the pool's decode kernel (pool_decode.h). */
#ifndef ARMATURE_TOKEN_BLOCKS_H
#define ARMATURE_TOKEN_BLOCKS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "pyint.h"
#include "xxh3.h"

/* A C-contiguous buffer of native unsigned 32-bit ints (array('I'), a numpy uint32 array)
 * held in *view: 1; else 0 (the view not held, no error: the caller reads items as ints). */
static int get_u32_view(PyObject *obj, Py_buffer *view) {
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj) || !PyObject_CheckBuffer(obj))
        return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (is_u32_buffer(view)) return 1;
    PyBuffer_Release(view);
    return 0;
}

/* Pack the full blocks of `tokens` from index `start` on into a fresh little-endian u32 buffer;
 * sets *num_blocks. (An offset rather than the caller's slice: a slice of a long prompt is a
 * copy, a reference taken and dropped per token.) A u32 buffer is copied as it is. */
static uint8_t *pack_tokens(PyObject *tokens, Py_ssize_t block_size, Py_ssize_t start,
                            Py_ssize_t *num_blocks) {
    Py_buffer view;
    if (get_u32_view(tokens, &view)) {
        Py_ssize_t n = view.len / 4;
        if (start < 0 || start > n) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "start must be in [0, %zd], got %zd", n, start);
            return NULL;
        }
        *num_blocks = (n - start) / block_size;
        Py_ssize_t used = *num_blocks * block_size;
        uint8_t *buf = PyMem_Malloc(used > 0 ? (size_t)used * 4 : 1);
        if (buf == NULL) {
            PyBuffer_Release(&view);
            PyErr_NoMemory();
            return NULL;
        }
        const uint32_t *src = (const uint32_t *)view.buf + start;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (Py_ssize_t i = 0; i < used; i++) {
            uint32_t t = __builtin_bswap32(src[i]);
            memcpy(buf + 4 * i, &t, 4);
        }
#else
        memcpy(buf, src, (size_t)used * 4);
#endif
        PyBuffer_Release(&view);
        return buf;
    }
    PyObject *seq = PySequence_Fast(tokens, "token_ids must be a sequence of ints");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (start < 0 || start > n) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "start must be in [0, %zd], got %zd", n, start);
        return NULL;
    }
    *num_blocks = (n - start) / block_size;
    Py_ssize_t used = *num_blocks * block_size;
    uint8_t *buf = PyMem_Malloc(used > 0 ? (size_t)used * 4 : 1);
    if (buf == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq) + start;
    for (Py_ssize_t i = 0; i < used; i++) {
        uint32_t t;
        if (read_token(items[i], &t) < 0) {
            PyMem_Free(buf);
            Py_DECREF(seq);
            return NULL;
        }
        memcpy(buf + 4 * i, &t, 4);
    }
    Py_DECREF(seq);
    return buf;
}

/* One full block's hashes: its local hash into *local, and its sequence hash returned,
 * chained from *parent when *has_parent (then *parent and *has_parent are this block's). */
static inline uint64_t hash_block(const uint8_t *block, size_t bytes, uint64_t seed,
                                  int *has_parent, uint64_t *parent, uint64_t *local) {
    *local = xxh3_64(block, bytes, seed);
    uint64_t seq = *has_parent ? chain(*parent, *local, seed) : *local;
    *parent = seq;
    *has_parent = 1;
    return seq;
}

#endif
