/* A synthetic prompt's token ids at C speed (armature.workload.traces).
 *
 * `synthesize_prompt` defines a trace block's tokens as the first outputs of SplitMix64
 * (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014) started at
 * key = mix64(mix64(seed) + hash_id), each output x reduced to low + ((x >> 32) * span >> 32)
 * (Lemire's multiply-shift range reduction); all arithmetic mod 2**64. `_block_tokens_py` is
 * the same in numpy; tests hold the two equal. A replay synthesizes ~150M tokens per trace:
 * counter-based, a block costs no seeding, and a whole prompt is one call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../kv/pyint.h"

#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ULL

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* The generator's state at the start of the trace block of hash id `id`: 0, or -1 with a
 * TypeError when `id` is not an int. */
static int block_state(PyObject *id, uint64_t seed_key, uint64_t *state) {
    if (!PyLong_Check(id)) {
        PyErr_SetString(PyExc_TypeError, "hash_ids must be ints");
        return -1;
    }
    *state = mix64(seed_key + (uint64_t)PyLong_AsUnsignedLongLongMask(id));
    return 0;
}

/* The next token's offset in [0, span). */
static inline uint64_t next_offset(uint64_t *state, uint64_t span) {
    *state += GOLDEN_GAMMA;
    return ((mix64(*state) >> 32) * span) >> 32;
}

/* The ids of `count` tokens of one trace block, from the generator's state at its start:
 * token k is low + next_offset after k + 1 steps, computed from the state directly (state +
 * (k + 1) x gamma, as next_offset's additions give it mod 2**64) so that no token waits for
 * the one before it and the compiler can run several lanes at once. Built for the vector
 * units this x86-64 CPU has, picked when the module loads; the same ids on every path. */
#ifndef BLOCK_CLONES /* a build may give its own (empty: one path) */
/* GCC 11 named the x86-64 levels; ifunc dispatch needs an ELF target (Linux) */
#if defined(__x86_64__) && defined(__linux__) && !defined(__clang__) && __GNUC__ >= 11
#define BLOCK_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef BLOCK_CLONES
#define BLOCK_CLONES
#endif

BLOCK_CLONES
static void block_token_ids(uint32_t *out, Py_ssize_t count, uint64_t state, uint32_t low,
                            uint64_t span) {
    for (Py_ssize_t k = 0; k < count; k++) {
        uint64_t z = state + (uint64_t)(k + 1) * GOLDEN_GAMMA;
        out[k] = low + (uint32_t)(((mix64(z) >> 32) * span) >> 32);
    }
}

/* prompt_tokens(seed, hash_ids, num_tokens, block_tokens, low, span, ints=None) -> list[int]:
 * num_tokens ids, block i (of block_tokens each; the last may be cut) from hash_ids[i]; seed
 * and ids are taken mod 2**64. `ints`: a tuple of span ints, ints[i] == low + i; the tokens
 * are then those objects (shared by every prompt), not new ones. */
static PyObject *prompt_tokens(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *seed_obj, *ids_obj, *ints = NULL;
    Py_ssize_t num_tokens, block_tokens, low, span;
    if (!PyArg_ParseTuple(args, "OOnnnn|O!", &seed_obj, &ids_obj, &num_tokens, &block_tokens,
                          &low, &span, &PyTuple_Type, &ints))
        return NULL;
    if (!PyLong_Check(seed_obj)) {
        PyErr_SetString(PyExc_TypeError, "seed must be an int");
        return NULL;
    }
    if (num_tokens < 0 || block_tokens < 1 || low < 0 || span <= 0 || span > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "num_tokens >= 0, block_tokens >= 1, low >= 0 and "
                                          "0 < span < 2**32 are required");
        return NULL;
    }
    if (ints != NULL && PyTuple_GET_SIZE(ints) != span) {
        PyErr_SetString(PyExc_ValueError, "ints must hold span ints");
        return NULL;
    }
    uint64_t seed_key = mix64((uint64_t)PyLong_AsUnsignedLongLongMask(seed_obj));
    if (PyErr_Occurred()) return NULL;
    PyObject *ids = PySequence_Fast(ids_obj, "hash_ids must be a sequence of ints");
    if (ids == NULL) return NULL;
    Py_ssize_t num_blocks = num_tokens / block_tokens + (num_tokens % block_tokens != 0);
    if (PySequence_Fast_GET_SIZE(ids) < num_blocks) {
        Py_DECREF(ids);
        PyErr_SetString(PyExc_ValueError, "too few hash_ids for num_tokens");
        return NULL;
    }
    PyObject *out = PyList_New(num_tokens);
    if (out == NULL) {
        Py_DECREF(ids);
        return NULL;
    }
    PyObject **id_items = PySequence_Fast_ITEMS(ids);
    Py_ssize_t t = 0;
    for (Py_ssize_t b = 0; b < num_blocks; b++) {
        uint64_t state;
        if (block_state(id_items[b], seed_key, &state) < 0) goto fail;
        Py_ssize_t end = t + block_tokens < num_tokens ? t + block_tokens : num_tokens;
        for (; t < end; t++) {
            uint64_t offset = next_offset(&state, (uint64_t)span);
            PyObject *item;
            if (ints != NULL) {
                item = PyTuple_GET_ITEM(ints, (Py_ssize_t)offset);
                Py_INCREF(item);
            } else {
                item = PyLong_FromUnsignedLongLong((uint64_t)low + offset);
                if (item == NULL) goto fail;
            }
            PyList_SET_ITEM(out, t, item);
        }
    }
    Py_DECREF(ids);
    return out;
fail:
    /* the unset tail is NULL, which list dealloc skips */
    Py_DECREF(ids);
    Py_DECREF(out);
    return NULL;
}

/* prompt_token_ids_into(out, seed, hash_ids, num_tokens, block_tokens, low, span) -> None: the
 * same ids as prompt_tokens, written as unsigned 32-bit ints into `out` (a writable buffer of
 * num_tokens of them, e.g. array('I')): a prompt with no int objects at all. */
static PyObject *prompt_token_ids_into(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *out_obj, *seed_obj, *ids_obj;
    Py_ssize_t num_tokens, block_tokens, low, span;
    if (!PyArg_ParseTuple(args, "OOOnnnn", &out_obj, &seed_obj, &ids_obj, &num_tokens,
                          &block_tokens, &low, &span))
        return NULL;
    if (!PyLong_Check(seed_obj)) {
        PyErr_SetString(PyExc_TypeError, "seed must be an int");
        return NULL;
    }
    if (num_tokens < 0 || block_tokens < 1 || low < 0 || span <= 0 || span > 0xFFFFFFFFLL ||
        (uint64_t)low > 0xFFFFFFFFULL - (uint64_t)(span - 1)) {
        PyErr_SetString(PyExc_ValueError, "num_tokens >= 0, block_tokens >= 1, low >= 0, "
                                          "0 < span < 2**32 and ids below 2**32 are required");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(out_obj, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) <
        0)
        return NULL;
    if (!is_u32_buffer(&view) || view.len != num_tokens * 4) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "out must be a writable buffer of num_tokens "
                                          "unsigned 32-bit ints");
        return NULL;
    }
    uint64_t seed_key = mix64((uint64_t)PyLong_AsUnsignedLongLongMask(seed_obj));
    PyObject *ids = PySequence_Fast(ids_obj, "hash_ids must be a sequence of ints");
    if (ids == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t num_blocks = num_tokens / block_tokens + (num_tokens % block_tokens != 0);
    if (PySequence_Fast_GET_SIZE(ids) < num_blocks) {
        PyErr_SetString(PyExc_ValueError, "too few hash_ids for num_tokens");
        goto fail;
    }
    PyObject **id_items = PySequence_Fast_ITEMS(ids);
    uint32_t *out = view.buf;
    Py_ssize_t t = 0;
    for (Py_ssize_t b = 0; b < num_blocks; b++) {
        uint64_t state;
        if (block_state(id_items[b], seed_key, &state) < 0) goto fail;
        Py_ssize_t end = t + block_tokens < num_tokens ? t + block_tokens : num_tokens;
        block_token_ids(out + t, end - t, state, (uint32_t)low, (uint64_t)span);
        t = end;
    }
    Py_DECREF(ids);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_DECREF(ids);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"prompt_token_ids_into", prompt_token_ids_into, METH_VARARGS,
     "prompt_token_ids_into(out, seed, hash_ids, num_tokens, block_tokens, low, span) -> None"},
    {"prompt_tokens", prompt_tokens, METH_VARARGS,
     "prompt_tokens(seed, hash_ids, num_tokens, block_tokens, low, span, ints=None) -> "
     "list[int]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "armature.workload._synth", "Synthetic prompt tokens (SplitMix64).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__synth(void) { return PyModule_Create(&module); }
