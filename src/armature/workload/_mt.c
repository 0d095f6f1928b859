/* A trace block's synthetic token ids at C speed (armature.workload.traces).
 *
 * `synthesize_prompt` defines block i's tokens as `random.Random(f"{seed}:{hash_id}")
 * .randbytes(4 * n)` read as little-endian u32, each `% span + low`. CPython's Random is
 * MT19937 (init_by_array seeding, the generator of Matsumoto and Nishimura); randbytes(4 * n)
 * is its next n 32-bit outputs in order. This module runs the same generator from the same key
 * words (the seed string's integer, which Python derives with SHA-512 and hands over as
 * bytes), so it gives exactly the tokens the pure-Python path gives; tests compare the two.
 * A replay synthesizes millions of blocks, and the Python path costs about 40 us a block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t state[MT_N];
    int index;
} Mt;

static void init_genrand(Mt *mt, uint32_t s) {
    mt->state[0] = s;
    for (int i = 1; i < MT_N; i++) {
        uint32_t prev = mt->state[i - 1];
        mt->state[i] = 1812433253U * (prev ^ (prev >> 30)) + (uint32_t)i;
    }
    mt->index = MT_N;
}

/* init_genrand(19650218), where every init_by_array starts: made once, copied after */
static Mt base_state;

static void init_by_array(Mt *mt, const uint32_t *key, size_t key_length) {
    memcpy(mt, &base_state, sizeof(Mt));
    uint32_t *s = mt->state;
    size_t i = 1, j = 0;
    size_t k = MT_N > key_length ? MT_N : key_length;
    for (; k; k--) {
        s[i] = (s[i] ^ ((s[i - 1] ^ (s[i - 1] >> 30)) * 1664525U)) + key[j] + (uint32_t)j;
        i++;
        j++;
        if (i >= MT_N) {
            s[0] = s[MT_N - 1];
            i = 1;
        }
        if (j >= key_length) j = 0;
    }
    for (k = MT_N - 1; k; k--) {
        s[i] = (s[i] ^ ((s[i - 1] ^ (s[i - 1] >> 30)) * 1566083941U)) - (uint32_t)i;
        i++;
        if (i >= MT_N) {
            s[0] = s[MT_N - 1];
            i = 1;
        }
    }
    s[0] = 0x80000000U;
}

static void twist(Mt *mt) {
    static const uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    uint32_t *s = mt->state;
    int kk;
    uint32_t y;
    for (kk = 0; kk < MT_N - MT_M; kk++) {
        y = (s[kk] & 0x80000000U) | (s[kk + 1] & 0x7fffffffU);
        s[kk] = s[kk + MT_M] ^ (y >> 1) ^ mag01[y & 0x1U];
    }
    for (; kk < MT_N - 1; kk++) {
        y = (s[kk] & 0x80000000U) | (s[kk + 1] & 0x7fffffffU);
        s[kk] = s[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 0x1U];
    }
    y = (s[MT_N - 1] & 0x80000000U) | (s[0] & 0x7fffffffU);
    s[MT_N - 1] = s[MT_M - 1] ^ (y >> 1) ^ mag01[y & 0x1U];
    mt->index = 0;
}

static inline uint32_t genrand_uint32(Mt *mt) {
    if (mt->index >= MT_N) twist(mt);
    uint32_t y = mt->state[mt->index++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

/* block_tokens(key, num_tokens, low, span, ints=None) -> tuple[int, ...]: MT19937 seeded by
 * init_by_array with `key` (little-endian u32 words), its next num_tokens outputs, each
 * `% span + low`. `ints`: a tuple of span ints, ints[i] == low + i; the tokens are then those
 * objects (shared by every block), not new ones. */
static PyObject *block_tokens(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer key;
    Py_ssize_t num_tokens;
    unsigned long low, span;
    PyObject *ints = NULL;
    if (!PyArg_ParseTuple(args, "y*nkk|O!", &key, &num_tokens, &low, &span, &PyTuple_Type, &ints))
        return NULL;
    if (key.len <= 0 || key.len % 4 != 0 || num_tokens < 0 || span == 0 || span > 0xFFFFFFFFUL) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "key must be a positive number of u32 words, "
                                          "num_tokens >= 0, 0 < span < 2**32");
        return NULL;
    }
    if (ints != NULL && (unsigned long)PyTuple_GET_SIZE(ints) != span) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "ints must hold span ints");
        return NULL;
    }
    size_t key_length = (size_t)key.len / 4;
    uint32_t *words = PyMem_Malloc(key_length * sizeof(uint32_t));
    if (words == NULL) {
        PyBuffer_Release(&key);
        return PyErr_NoMemory();
    }
    const uint8_t *bytes = key.buf;
    for (size_t w = 0; w < key_length; w++) {
        const uint8_t *b = bytes + 4 * w;
        words[w] = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
                   ((uint32_t)b[3] << 24);
    }
    PyBuffer_Release(&key);
    Mt mt;
    init_by_array(&mt, words, key_length);
    PyMem_Free(words);
    PyObject *out = PyTuple_New(num_tokens);
    if (out == NULL) return NULL;
    /* x % span for 32-bit x and span without a division (Lemire, Kaser and Kurz, "Faster
     * remainder by direct computation", 2019: exact for 32-bit operands) */
    const uint64_t magic = UINT64_MAX / (uint64_t)span + 1;
    for (Py_ssize_t i = 0; i < num_tokens; i++) {
        uint64_t lowbits = magic * genrand_uint32(&mt);
        uint64_t remainder = (uint64_t)(((__uint128_t)lowbits * span) >> 64);
        PyObject *item;
        if (ints != NULL) {
            item = PyTuple_GET_ITEM(ints, (Py_ssize_t)remainder);
            Py_INCREF(item);
        } else {
            item = PyLong_FromLongLong((long long)(remainder + low));
            if (item == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        }
        PyTuple_SET_ITEM(out, i, item);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"block_tokens", block_tokens, METH_VARARGS,
     "block_tokens(key, num_tokens, low, span, ints=None) -> tuple[int, ...]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "armature.workload._mt", "Synthetic trace tokens (MT19937).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__mt(void) {
    init_genrand(&base_state, 19650218U);
    return PyModule_Create(&module);
}
