/* Native block hashing (DESIGN §3) for the router's hot path and the engine.
 *
 * One call hashes a whole prompt: local hash = XXH3-64(seed) of each full block's token ids as
 * little-endian u32; seq[0] = local[0] (or chained from a parent); seq[i] =
 * XXH3-64(seed)(le64(seq[i-1]) || le64(local[i])). The XXH3-64 here is our own implementation
 * of the published algorithm (XXH3_64bits_withSeed, scalar path); tests check it against the
 * `xxhash` package for every input length up to several KiB and the pure-Python module for
 * whole prompts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "pyint.h"
#include "xxh3.h"
#include "token_blocks.h"

/* ---- Python bindings ------------------------------------------------------------------- */

static int parse_u64(PyObject *obj, uint64_t *out, const char *what) {
    unsigned long long v = as_u64(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be an unsigned 64-bit integer", what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* hash_blocks(token_ids, block_size, seed, parent, with_local, start=0) of the full blocks of
 * token_ids[start:]: with_local 0, a list[int] of sequence hashes; 1, a list[tuple[int, int]]
 * of (seq, local); 2, both, as (pairs, seqs) sharing the seq ints (a caller that needs the
 * pairs and a list of the seqs, as the simulator does for engine and router). */
static PyObject *hash_blocks(PyObject *self, PyObject *args) {
    PyObject *tokens, *seed_obj, *parent_obj;
    Py_ssize_t block_size, start = 0;
    int with_local;
    if (!PyArg_ParseTuple(args, "OnOOi|n", &tokens, &block_size, &seed_obj, &parent_obj,
                          &with_local, &start))
        return NULL;
    if (block_size <= 0) {
        PyErr_Format(PyExc_ValueError, "block_size must be positive, got %zd", block_size);
        return NULL;
    }
    if (with_local < 0 || with_local > 2) {
        PyErr_Format(PyExc_ValueError, "with_local must be 0, 1 or 2, got %d", with_local);
        return NULL;
    }
    uint64_t seed, parent = 0;
    int has_parent = parent_obj != Py_None;
    if (parse_u64(seed_obj, &seed, "seed") < 0) return NULL;
    if (has_parent && parse_u64(parent_obj, &parent, "parent_seq_hash") < 0) return NULL;
    Py_ssize_t num_blocks;
    uint8_t *buf = pack_tokens(tokens, block_size, start, &num_blocks);
    if (buf == NULL) return NULL;
    PyObject *pairs = with_local ? PyList_New(num_blocks) : NULL;
    PyObject *seqs = with_local != 1 ? PyList_New(num_blocks) : NULL;
    if ((with_local && pairs == NULL) || (with_local != 1 && seqs == NULL)) goto fail;
    const size_t step = (size_t)block_size * 4;
    for (Py_ssize_t i = 0; i < num_blocks; i++) {
        uint64_t local;
        uint64_t seq = hash_block(buf + (size_t)i * step, step, seed, &has_parent, &parent, &local);
        PyObject *seq_obj = PyLong_FromUnsignedLongLong(seq);
        if (seq_obj == NULL) goto fail;
        if (seqs != NULL) {
            Py_INCREF(seq_obj);
            PyList_SET_ITEM(seqs, i, seq_obj);
        }
        if (pairs != NULL) {
            PyObject *item = PyTuple_New(2);
            PyObject *local_obj = PyLong_FromUnsignedLongLong(local);
            if (item == NULL || local_obj == NULL) {
                Py_XDECREF(item);
                Py_XDECREF(local_obj);
                Py_DECREF(seq_obj);
                goto fail;
            }
            PyTuple_SET_ITEM(item, 0, seq_obj); /* takes the first reference */
            PyTuple_SET_ITEM(item, 1, local_obj);
            PyList_SET_ITEM(pairs, i, item);
        } else {
            Py_DECREF(seq_obj);
        }
    }
    PyMem_Free(buf);
    if (with_local == 0) return seqs;
    if (with_local == 1) return pairs;
    PyObject *both = PyTuple_Pack(2, pairs, seqs);
    Py_DECREF(pairs);
    Py_DECREF(seqs);
    return both;
fail:
    PyMem_Free(buf);
    Py_XDECREF(pairs);
    Py_XDECREF(seqs);
    return NULL;
}

/* token_id_range(token_ids) -> (min, max), or None when an item is not a small non-negative
 * exact int (the caller's general path decides then). One pass at C speed: validating a long
 * prompt with min() and max() compares every item as an object, twice. A u32 buffer is read
 * as it is. */
static PyObject *token_id_range(PyObject *self, PyObject *tokens) {
    (void)self;
    Py_buffer view;
    if (get_u32_view(tokens, &view)) {
        const uint32_t *ids = view.buf;
        Py_ssize_t n = view.len / 4;
        uint32_t low = UINT32_MAX, high = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            low = ids[i] < low ? ids[i] : low;
            high = ids[i] > high ? ids[i] : high;
        }
        PyBuffer_Release(&view);
        if (n == 0) Py_RETURN_NONE;
        return Py_BuildValue("(kk)", (unsigned long)low, (unsigned long)high);
    }
    PyObject *seq = PySequence_Fast(tokens, "token_ids must be a sequence of ints");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    unsigned long low = ULONG_MAX, high = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long v;
        if (!read_small_int(items[i], &v)) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        if (v < low) low = v;
        if (v > high) high = v;
    }
    Py_DECREF(seq);
    if (n == 0) Py_RETURN_NONE;
    return Py_BuildValue("(kk)", low, high);
}

/* mock_tokens(prefix, start, stop, seed, vocab_size) -> list[int]: XXH3-64(seed) of `prefix`
 * followed by each position's decimal digits, modulo vocab_size, for positions start..stop-1:
 * the mocker's synthetic output tokens (`xxhash.xxh3_64_intdigest(f"{id}/{p}".encode(), seed)
 * % vocab_size`) without a string, a bytes object and a call per token. */
static PyObject *mock_tokens(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer prefix;
    Py_ssize_t start, stop;
    PyObject *seed_obj;
    unsigned long long vocab_size;
    if (!PyArg_ParseTuple(args, "y*nnOK", &prefix, &start, &stop, &seed_obj, &vocab_size))
        return NULL;
    enum { MAX_PREFIX = 1024, MAX_DIGITS = 24 };
    if (start < 0 || stop < start || vocab_size == 0 || prefix.len > MAX_PREFIX) {
        PyBuffer_Release(&prefix);
        PyErr_SetString(PyExc_ValueError,
                        "need 0 <= start <= stop, vocab_size > 0 and a prefix of <= 1024 bytes");
        return NULL;
    }
    uint64_t seed;
    if (parse_u64(seed_obj, &seed, "seed") < 0) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    char buf[MAX_PREFIX + MAX_DIGITS];
    size_t head = (size_t)prefix.len;
    memcpy(buf, prefix.buf, head);
    PyBuffer_Release(&prefix);
    PyObject *out = PyList_New(stop - start);
    if (out == NULL) return NULL;
    for (Py_ssize_t p = start; p < stop; p++) {
        PyObject *item = PyLong_FromUnsignedLongLong(mock_token(buf, head, p, seed, vocab_size));
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, p - start, item);
    }
    return out;
}

/* xxh3_64(data, seed) -> int: the raw hash, for conformance tests. */
static PyObject *py_xxh3_64(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *seed_obj;
    if (!PyArg_ParseTuple(args, "y*O", &data, &seed_obj)) return NULL;
    uint64_t seed;
    if (parse_u64(seed_obj, &seed, "seed") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    uint64_t h = xxh3_64(data.buf, (size_t)data.len, seed);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"hash_blocks", hash_blocks, METH_VARARGS,
     "hash_blocks(token_ids, block_size, seed, parent, with_local, start=0) -> list"},
    {"xxh3_64", py_xxh3_64, METH_VARARGS, "xxh3_64(data, seed) -> int"},
    {"mock_tokens", mock_tokens, METH_VARARGS,
     "mock_tokens(prefix, start, stop, seed, vocab_size) -> list[int]"},
    {"token_id_range", token_id_range, METH_O,
     "token_id_range(token_ids) -> (min, max) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "armature.kv._native", "Native block hashing.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
