/* Native state of the paged KV block pool (armature.kv.block_pool.NativeBlockPool): every
 * block's reference count, hashes and hits, the free queue and the cached map, in C arrays.
 *
 * The rules are those of armature.kv.block_pool.PyBlockPool (the reference; tests hold the two
 * equal under hypothesis); events and the eviction observer stay in the Python wrapper, which
 * asks this core what changed:
 *
 *     by block id:  ref (int32), seq/local/parent hash (u64) with has-flags, hits (int32)
 *     free queue:   blocks [next_fresh, num_blocks) never taken (its head, counted, not
 *                   listed), then a doubly linked list of freed blocks (prev/next), LRU order
 *     cached map:   seq_hash -> block id, open addressing with linear probing, deletion by
 *                   shifting back (no tombstones)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "pyint.h"

#define HAS_SEQ 1
#define HAS_PARENT 2
#define NONE_ID (-1)

typedef struct {
    uint64_t key;
    int32_t block; /* NONE_ID: empty */
} Slot;

typedef struct {
    size_t capacity; /* a power of two, or 0 before the first insert */
    size_t count;
    Slot *slots;
} Map;

typedef struct {
    PyObject_HEAD
    Py_ssize_t num_blocks;
    int prefix_caching;
    int32_t *ref;
    int32_t *hits;
    uint64_t *seq, *local, *parent;
    uint8_t *flags;
    int32_t *prev, *next; /* the freed list; NONE_ID ends it */
    int32_t head, tail;
    Py_ssize_t num_listed; /* blocks in the freed list */
    Py_ssize_t next_fresh;
    Map cached;
    /* hashes that left `cached` (evictions; a reset counts one): a prefix found while this
     * stayed the same is still cached, block for block */
    uint64_t num_removals;
} PoolCore;

/* ---- the cached map ------------------------------------------------------------------- */

static inline size_t home(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & mask;
}

/* Start loading `key`'s home slot: the map spreads a worker's cached blocks over megabytes, so
 * a prompt's or an allocation's lookups would otherwise wait for memory one after another. */
static inline void map_prefetch(const Map *m, uint64_t key) {
    if (m->capacity) __builtin_prefetch(&m->slots[home(key, m->capacity - 1)]);
}

/* find_prefix reads this many hashes ahead of the one it looks up */
#define PREFETCH_AHEAD 8

static int32_t map_get(const Map *m, uint64_t key) {
    if (m->count == 0) return NONE_ID;
    size_t mask = m->capacity - 1;
    for (size_t i = home(key, mask);; i = (i + 1) & mask) {
        const Slot *s = &m->slots[i];
        if (s->block == NONE_ID) return NONE_ID;
        if (s->key == key) return s->block;
    }
}

static int map_grow(Map *m, size_t capacity) {
    Slot *slots = PyMem_Malloc(capacity * sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < capacity; i++) slots[i].block = NONE_ID;
    size_t mask = capacity - 1;
    for (size_t j = 0; j < m->capacity; j++) {
        const Slot *old = &m->slots[j];
        if (old->block == NONE_ID) continue;
        size_t i = home(old->key, mask);
        while (slots[i].block != NONE_ID) i = (i + 1) & mask;
        slots[i] = *old;
    }
    PyMem_Free(m->slots);
    m->slots = slots;
    m->capacity = capacity;
    return 0;
}

/* Room for `count` entries at a load factor of at most 1/2. */
static int map_reserve(Map *m, size_t count) {
    if (count * 2 <= m->capacity) return 0;
    size_t capacity = m->capacity ? m->capacity : 64;
    while (count * 2 > capacity) capacity *= 2;
    return map_grow(m, capacity);
}

/* Insert key -> block (absent; room reserved). */
static void map_put(Map *m, uint64_t key, int32_t block) {
    size_t mask = m->capacity - 1;
    size_t i = home(key, mask);
    while (m->slots[i].block != NONE_ID) i = (i + 1) & mask;
    m->slots[i].key = key;
    m->slots[i].block = block;
    m->count++;
}

static void map_del(Map *m, uint64_t key) {
    size_t mask = m->capacity - 1;
    size_t i = home(key, mask);
    for (;; i = (i + 1) & mask) {
        if (m->slots[i].block == NONE_ID) return;
        if (m->slots[i].key == key) break;
    }
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        Slot *next = &m->slots[j];
        if (next->block == NONE_ID) break;
        size_t k = home(next->key, mask);
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        m->slots[i] = *next;
        i = j;
    }
    m->slots[i].block = NONE_ID;
    m->count--;
}

/* ---- the freed list -------------------------------------------------------------------- */

static void list_append(PoolCore *p, int32_t b) {
    p->prev[b] = p->tail;
    p->next[b] = NONE_ID;
    if (p->tail != NONE_ID)
        p->next[p->tail] = b;
    else
        p->head = b;
    p->tail = b;
    p->num_listed++;
}

static void list_unlink(PoolCore *p, int32_t b) {
    if (p->prev[b] != NONE_ID)
        p->next[p->prev[b]] = p->next[b];
    else
        p->head = p->next[b];
    if (p->next[b] != NONE_ID)
        p->prev[p->next[b]] = p->prev[b];
    else
        p->tail = p->prev[b];
    p->num_listed--;
}

/* Put the never-taken blocks at the list's head in id order. */
static void list_fresh_blocks(PoolCore *p) {
    for (Py_ssize_t b = p->num_blocks - 1; b >= p->next_fresh; b--) {
        int32_t id = (int32_t)b;
        p->prev[id] = NONE_ID;
        p->next[id] = p->head;
        if (p->head != NONE_ID)
            p->prev[p->head] = id;
        else
            p->tail = id;
        p->head = id;
        p->num_listed++;
    }
    p->next_fresh = p->num_blocks;
}

/* ---- arguments ------------------------------------------------------------------------- */

static PyObject *seq_to_fast(PyObject *obj) {
    return PySequence_Fast(obj, "a sequence is required");
}

static int read_u64(PyObject *item, uint64_t *out) {
    if (!PyLong_Check(item)) {
        PyErr_SetString(PyExc_TypeError, "hashes must be ints");
        return -1;
    }
    unsigned long long v = as_u64(item);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "a hash must be in [0, 2**64)");
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int read_block(PoolCore *p, PyObject *item, int32_t *out) {
    Py_ssize_t b = PyLong_AsSsize_t(item);
    if (b == -1 && PyErr_Occurred()) return -1;
    if (b < 0 || b >= p->num_blocks) {
        PyErr_Format(PyExc_IndexError, "block id %zd out of range", b);
        return -1;
    }
    *out = (int32_t)b;
    return 0;
}

static PyObject *hash_or_none(const PoolCore *p, const uint64_t *values, int32_t b, int flag) {
    if (!(p->flags[b] & flag)) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(values[b]);
}

/* ---- the type --------------------------------------------------------------------------- */

static int PoolCore_init(PoolCore *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"num_blocks", "enable_prefix_caching", NULL};
    Py_ssize_t n;
    int caching;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "np", kwlist, &n, &caching)) return -1;
    if (n <= 0 || n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "num_blocks must be in [1, 2**31 - 1)");
        return -1;
    }
    if (self->ref != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "PoolCore is initialized once");
        return -1;
    }
    size_t count = (size_t)n;
    self->ref = PyMem_Calloc(count, sizeof(int32_t));
    self->hits = PyMem_Calloc(count, sizeof(int32_t));
    self->seq = PyMem_Calloc(count, sizeof(uint64_t));
    self->local = PyMem_Calloc(count, sizeof(uint64_t));
    self->parent = PyMem_Calloc(count, sizeof(uint64_t));
    self->flags = PyMem_Calloc(count, sizeof(uint8_t));
    self->prev = PyMem_Calloc(count, sizeof(int32_t));
    self->next = PyMem_Calloc(count, sizeof(int32_t));
    if (!self->ref || !self->hits || !self->seq || !self->local || !self->parent ||
        !self->flags || !self->prev || !self->next) {
        PyErr_NoMemory();
        return -1;
    }
    self->num_blocks = n;
    self->prefix_caching = caching;
    self->head = self->tail = NONE_ID;
    return 0;
}

static void PoolCore_dealloc(PoolCore *self) {
    PyMem_Free(self->ref);
    PyMem_Free(self->hits);
    PyMem_Free(self->seq);
    PyMem_Free(self->local);
    PyMem_Free(self->parent);
    PyMem_Free(self->flags);
    PyMem_Free(self->prev);
    PyMem_Free(self->next);
    PyMem_Free(self->cached.slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(PoolCore *self) {
    if (self->ref != NULL) return 0;
    PyErr_SetString(PyExc_RuntimeError, "PoolCore.__init__ was not called");
    return -1;
}

/* The seq hash to look up in item `item`: the item itself, or with `pairs` its first field
 * (a (seq, local) pair); NULL with an exception when a pair is not one. */
static PyObject *hash_item(PyObject *item, int pairs) {
    if (!pairs) return item;
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) return PyTuple_GET_ITEM(item, 0);
    if (PyList_Check(item) && PyList_GET_SIZE(item) == 2) return PyList_GET_ITEM(item, 0);
    PyErr_SetString(PyExc_TypeError, "block hashes must be (seq_hash, local_hash) pairs");
    return NULL;
}

/* The block ids of the longest cached prefix of the first `n` of `items` (seq hashes, or with
 * `pairs` (seq, local) pairs), looked up until the first miss. */
static PyObject *find_prefix_of(PoolCore *self, PyObject **items, Py_ssize_t n, int pairs) {
    PyObject *found = PyList_New(0);
    if (found == NULL || !self->prefix_caching) return found;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t key;
        uint64_t ahead;
        if (i + PREFETCH_AHEAD < n) {
            PyObject *next = items[i + PREFETCH_AHEAD];
            if (pairs && PyTuple_Check(next) && PyTuple_GET_SIZE(next) == 2)
                next = PyTuple_GET_ITEM(next, 0);
            if (peek_u64(next, &ahead)) map_prefetch(&self->cached, ahead);
        }
        PyObject *hash = hash_item(items[i], pairs);
        if (hash == NULL || read_u64(hash, &key) < 0) goto fail;
        int32_t b = map_get(&self->cached, key);
        if (b == NONE_ID) break;
        PyObject *id = PyLong_FromLong(b);
        if (id == NULL) goto fail;
        int failed = PyList_Append(found, id) < 0;
        Py_DECREF(id);
        if (failed) goto fail;
    }
    return found;
fail:
    Py_DECREF(found);
    return NULL;
}

static PyObject *PoolCore_find_prefix(PoolCore *self, PyObject *obj) {
    if (ready(self) < 0) return NULL;
    PyObject *seq = seq_to_fast(obj);
    if (seq == NULL) return NULL;
    PyObject *found =
        find_prefix_of(self, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), 0);
    Py_DECREF(seq);
    return found;
}

static PyObject *PoolCore_find_prefix_of_pairs(PoolCore *self, PyObject *const *args,
                                               Py_ssize_t nargs) {
    if (ready(self) < 0) return NULL;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "find_prefix_of_pairs(block_hashes, max_blocks, start=0)");
        return NULL;
    }
    Py_ssize_t max_blocks = PyLong_AsSsize_t(args[1]);
    if (max_blocks == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t start = 0;
    if (nargs == 3) {
        start = PyLong_AsSsize_t(args[2]);
        if (start == -1 && PyErr_Occurred()) return NULL;
        if (start < 0) start = 0;
    }
    PyObject *seq = seq_to_fast(args[0]);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (max_blocks < n) n = max_blocks > 0 ? max_blocks : 0;
    if (start >= n) { /* nothing to read (an empty list's items pointer may be NULL) */
        Py_DECREF(seq);
        return PyList_New(0);
    }
    PyObject *found = find_prefix_of(self, PySequence_Fast_ITEMS(seq) + start, n - start, 1);
    Py_DECREF(seq);
    return found;
}

static PyObject *PoolCore_get_num_unreferenced(PoolCore *self, PyObject *obj) {
    if (ready(self) < 0) return NULL;
    PyObject *seq = seq_to_fast(obj);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), count = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b;
        if (read_block(self, items[i], &b) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        count += self->ref[b] == 0;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(count);
}

/* touch(block_ids, is_hit) */
static PyObject *PoolCore_touch(PoolCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (ready(self) < 0) return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "touch(block_ids, is_hit)");
        return NULL;
    }
    int is_hit = PyObject_IsTrue(args[1]);
    if (is_hit < 0) return NULL;
    PyObject *seq = seq_to_fast(args[0]);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) { /* check every id first: all or nothing */
        int32_t b;
        if (read_block(self, items[i], &b) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = (int32_t)PyLong_AsSsize_t(items[i]);
        if (self->ref[b] == 0) {
            if (b >= self->next_fresh) list_fresh_blocks(self);
            list_unlink(self, b);
        }
        self->ref[b]++;
        if (is_hit) self->hits[b]++;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* The cached blocks that allocate(n) would evict (those among the freed blocks it takes
 * after the never-taken ones), as (block_id, seq_hash, local_hash, parent_hash | None,
 * num_hits), in eviction order. */
static PyObject *PoolCore_peek_evictions(PoolCore *self, PyObject *arg) {
    if (ready(self) < 0) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    n -= self->num_blocks - self->next_fresh; /* the never-taken ones come first */
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    int32_t b = self->head;
    for (Py_ssize_t i = 0; i < n && b != NONE_ID; i++, b = self->next[b]) {
        if (!(self->flags[b] & HAS_SEQ)) continue;
        PyObject *parent = hash_or_none(self, self->parent, b, HAS_PARENT);
        if (parent == NULL) goto fail;
        PyObject *item = Py_BuildValue("(lKKNl)", (long)b, (unsigned long long)self->seq[b],
                                       (unsigned long long)self->local[b], parent,
                                       (long)self->hits[b]);
        if (item == NULL) goto fail;
        int failed = PyList_Append(out, item) < 0;
        Py_DECREF(item);
        if (failed) goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static Py_ssize_t num_free(const PoolCore *self) {
    return self->num_blocks - self->next_fresh + self->num_listed;
}

/* How many blocks allocate() hands out, up to limit, before it would evict a cached one: the
 * never-taken ones, then the freed ones at the list's head that hold no hash. */
static PyObject *PoolCore_count_allocations_before_eviction(PoolCore *self, PyObject *arg) {
    if (ready(self) < 0) return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t count = self->num_blocks - self->next_fresh;
    for (int32_t b = self->head; count < limit && b != NONE_ID && !(self->flags[b] & HAS_SEQ);
         b = self->next[b])
        count++;
    if (count > limit) count = limit > 0 ? limit : 0;
    return PyLong_FromSsize_t(count);
}

/* allocate(n) -> (block_ids, evicted seq_hashes); the caller checked n <= free blocks. */
static PyObject *PoolCore_allocate(PoolCore *self, PyObject *arg) {
    if (ready(self) < 0) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > num_free(self)) {
        PyErr_Format(PyExc_ValueError, "cannot allocate %zd of %zd free blocks", n,
                     num_free(self));
        return NULL;
    }
    PyObject *ids = PyList_New(n);
    PyObject *evicted = PyList_New(0);
    if (ids == NULL || evicted == NULL) goto fail;
    Py_ssize_t num_fresh = self->num_blocks - self->next_fresh;
    if (num_fresh > n) num_fresh = n;
    for (Py_ssize_t i = 0; i < num_fresh; i++) {
        int32_t b = (int32_t)(self->next_fresh + i);
        PyObject *id = PyLong_FromLong(b);
        if (id == NULL) goto fail;
        PyList_SET_ITEM(ids, i, id);
    }
    /* the queued blocks' ids and evicted hashes first: nothing can fail after */
    {
        int32_t b = self->head;
        for (Py_ssize_t i = num_fresh; i < n; i++, b = self->next[b]) {
            PyObject *id = PyLong_FromLong(b);
            if (id == NULL) goto fail;
            PyList_SET_ITEM(ids, i, id);
            if (self->flags[b] & HAS_SEQ) {
                map_prefetch(&self->cached, self->seq[b]); /* map_del below */
                PyObject *h = PyLong_FromUnsignedLongLong(self->seq[b]);
                if (h == NULL) goto fail;
                int failed = PyList_Append(evicted, h) < 0;
                Py_DECREF(h);
                if (failed) goto fail;
            }
        }
    }
    for (Py_ssize_t i = 0; i < num_fresh; i++) self->ref[self->next_fresh + i] = 1;
    self->next_fresh += num_fresh;
    for (Py_ssize_t i = num_fresh; i < n; i++) {
        int32_t b = self->head;
        list_unlink(self, b);
        if (self->flags[b] & HAS_SEQ) {
            map_del(&self->cached, self->seq[b]);
            self->num_removals++;
        }
        self->flags[b] = 0;
        self->hits[b] = 0;
        self->ref[b] = 1;
    }
    PyObject *result = PyTuple_Pack(2, ids, evicted);
    Py_DECREF(ids);
    Py_DECREF(evicted);
    return result;
fail:
    Py_XDECREF(ids);
    Py_XDECREF(evicted);
    return NULL;
}

/* free(block_ids): one reference less each, in order; a block at zero joins the tail. */
static PyObject *PoolCore_free(PoolCore *self, PyObject *obj) {
    if (ready(self) < 0) return NULL;
    PyObject *seq = seq_to_fast(obj);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b;
        if (read_block(self, items[i], &b) < 0) goto fail;
        if (self->ref[b] <= 0) {
            PyErr_Format(PyExc_AssertionError, "double free of block %ld", (long)b);
            goto fail;
        }
        if (--self->ref[b] == 0) list_append(self, b);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* (parent, [made[start], ..., made[stop - 1]]): one run of newly cached blocks, the blocks'
 * references moved from `made` (their slots left NULL). */
static PyObject *make_run(PyObject *parent, Py_ssize_t start, Py_ssize_t stop,
                          PyObject **made) {
    PyObject *blocks = PyList_New(stop - start);
    if (blocks == NULL) {
        Py_DECREF(parent);
        return NULL;
    }
    for (Py_ssize_t i = start; i < stop; i++) {
        PyList_SET_ITEM(blocks, i - start, made[i]);
        made[i] = NULL;
    }
    return Py_BuildValue("(NN)", parent, blocks);
}

/* cache_blocks(block_ids, hashes, parent_hash, block_type) -> [(run_parent | None, blocks)]:
 * register full blocks under their (seq_hash, local_hash); a block already cached keeps its
 * hash, a hash cached under another block is left alone. Each run of newly cached blocks
 * comes with its `block_type(seq_hash, local_hash)`s (made from the pairs' own ints: what the
 * wrapper's Stored event for the run holds). All or nothing: every block is made, then every
 * block checked against the pool, before anything is cached (`block_type` may run code). */
static PyObject *PoolCore_cache_blocks(PoolCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (ready(self) < 0) return NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "cache_blocks(block_ids, hashes, parent_hash, block_type)");
        return NULL;
    }
    PyObject *block_type = args[3];
    if (!self->prefix_caching) return PyList_New(0);
    int has_prev = args[2] != Py_None;
    uint64_t prev = 0;
    if (has_prev && read_u64(args[2], &prev) < 0) return NULL;
    PyObject *ids_seq = seq_to_fast(args[0]);
    if (ids_seq == NULL) return NULL;
    PyObject *hashes_seq = seq_to_fast(args[1]);
    if (hashes_seq == NULL) {
        Py_DECREF(ids_seq);
        return NULL;
    }
    PyObject *runs = NULL;
    uint64_t *pairs = NULL;
    int32_t *blocks = NULL;
    PyObject **made = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids_seq);
    if (PySequence_Fast_GET_SIZE(hashes_seq) != n) {
        PyErr_SetString(PyExc_ValueError, "one (seq_hash, local_hash) per block is required");
        goto fail;
    }
    pairs = PyMem_Malloc((size_t)(2 * n + 1) * sizeof(uint64_t));
    blocks = PyMem_Malloc((size_t)(n + 1) * sizeof(int32_t));
    made = PyMem_Calloc((size_t)(n + 1), sizeof(PyObject *));
    if (pairs == NULL || blocks == NULL || made == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* read afresh each time: code run by block_type may change the sequences */
        if (i >= PySequence_Fast_GET_SIZE(ids_seq) || i >= PySequence_Fast_GET_SIZE(hashes_seq)) {
            PyErr_SetString(PyExc_RuntimeError, "block ids or hashes changed while read");
            goto fail;
        }
        if (read_block(self, PySequence_Fast_ITEMS(ids_seq)[i], &blocks[i]) < 0) goto fail;
        PyObject *pair = PySequence_Fast_ITEMS(hashes_seq)[i];
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "hashes must be (seq_hash, local_hash) tuples");
            goto fail;
        }
        if (read_u64(PyTuple_GET_ITEM(pair, 0), &pairs[2 * i]) < 0) goto fail;
        if (read_u64(PyTuple_GET_ITEM(pair, 1), &pairs[2 * i + 1]) < 0) goto fail;
        Py_INCREF(pair); /* a tuple: its items stay what was read */
        made[i] = PyObject_Vectorcall(block_type, &PyTuple_GET_ITEM(pair, 0), 2, NULL);
        Py_DECREF(pair);
        if (made[i] == NULL) goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* the pool as it is now, after block_type ran */
        if (self->ref[blocks[i]] <= 0) {
            PyErr_SetString(PyExc_AssertionError, "only blocks in use can be cached");
            goto fail;
        }
        if ((self->flags[blocks[i]] & HAS_SEQ) && self->seq[blocks[i]] != pairs[2 * i]) {
            PyErr_SetString(PyExc_AssertionError, "block re-cached under another hash");
            goto fail;
        }
    }
    runs = PyList_New(0);
    if (runs == NULL) goto fail;
    if (n == 0) goto done;
    if (map_reserve(&self->cached, self->cached.count + (size_t)n) < 0) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) map_prefetch(&self->cached, pairs[2 * i]);
    /* cache first (nothing below can fail), then the runs' lists */
    Py_ssize_t run_start = -1;
    int run_has_parent = 0;
    uint64_t run_parent = 0;
    for (Py_ssize_t i = 0; i <= n; i++) {
        int is_new = 0;
        if (i < n) {
            int32_t b = blocks[i];
            uint64_t seq_hash = pairs[2 * i];
            if (!(self->flags[b] & HAS_SEQ) && map_get(&self->cached, seq_hash) == NONE_ID) {
                self->seq[b] = seq_hash;
                self->local[b] = pairs[2 * i + 1];
                self->parent[b] = prev;
                self->flags[b] = HAS_SEQ | (has_prev ? HAS_PARENT : 0);
                map_put(&self->cached, seq_hash, b);
                is_new = 1;
            }
        }
        if (is_new && run_start < 0) {
            run_start = i;
            run_has_parent = has_prev;
            run_parent = prev;
        } else if (!is_new && run_start >= 0) {
            PyObject *parent =
                run_has_parent ? PyLong_FromUnsignedLongLong(run_parent) : Py_NewRef(Py_None);
            if (parent == NULL) goto fail;
            PyObject *run = make_run(parent, run_start, i, made);
            if (run == NULL) goto fail;
            int failed = PyList_Append(runs, run) < 0;
            Py_DECREF(run);
            if (failed) goto fail;
            run_start = -1;
        }
        if (i < n) {
            prev = pairs[2 * i];
            has_prev = 1;
        }
    }
done:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(made[i]); /* blocks not newly cached */
    PyMem_Free(made);
    PyMem_Free(pairs);
    PyMem_Free(blocks);
    Py_DECREF(ids_seq);
    Py_DECREF(hashes_seq);
    return runs;
fail:
    if (made != NULL)
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(made[i]);
    PyMem_Free(made);
    PyMem_Free(pairs);
    PyMem_Free(blocks);
    Py_XDECREF(runs);
    Py_DECREF(ids_seq);
    Py_DECREF(hashes_seq);
    return NULL;
}

static PyObject *PoolCore_reset(PoolCore *self, PyObject *unused) {
    (void)unused;
    if (ready(self) < 0) return NULL;
    if (self->next_fresh - self->num_listed > 0) Py_RETURN_FALSE;
    memset(self->flags, 0, (size_t)self->num_blocks * sizeof(uint8_t));
    memset(self->hits, 0, (size_t)self->num_blocks * sizeof(int32_t));
    for (size_t i = 0; i < self->cached.capacity; i++) self->cached.slots[i].block = NONE_ID;
    self->cached.count = 0;
    self->num_removals++;
    Py_RETURN_TRUE;
}

static PyObject *PoolCore_get_cached_block(PoolCore *self, PyObject *arg) {
    if (ready(self) < 0) return NULL;
    uint64_t key;
    if (read_u64(arg, &key) < 0) return NULL;
    int32_t b = map_get(&self->cached, key);
    if (b == NONE_ID) Py_RETURN_NONE;
    return PyLong_FromLong(b);
}

static PyObject *PoolCore_get_cached_hashes(PoolCore *self, PyObject *unused) {
    (void)unused;
    if (ready(self) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (size_t i = 0; i < self->cached.capacity; i++) {
        if (self->cached.slots[i].block == NONE_ID) continue;
        PyObject *h = PyLong_FromUnsignedLongLong(self->cached.slots[i].key);
        if (h == NULL || PyList_Append(out, h) < 0) {
            Py_XDECREF(h);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(h);
    }
    return out;
}

static PyObject *PoolCore_get_free_block_ids(PoolCore *self, PyObject *unused) {
    (void)unused;
    if (ready(self) < 0) return NULL;
    PyObject *out = PyList_New(num_free(self));
    if (out == NULL) return NULL;
    Py_ssize_t i = 0;
    for (Py_ssize_t b = self->next_fresh; b < self->num_blocks; b++, i++) {
        PyObject *id = PyLong_FromSsize_t(b);
        if (id == NULL) goto fail;
        PyList_SET_ITEM(out, i, id);
    }
    for (int32_t b = self->head; b != NONE_ID; b = self->next[b], i++) {
        PyObject *id = PyLong_FromLong(b);
        if (id == NULL) goto fail;
        PyList_SET_ITEM(out, i, id);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* Every block's (ref_count, seq_hash, local_hash, parent_hash, num_hits), by id. */
static PyObject *PoolCore_snapshot(PoolCore *self, PyObject *unused) {
    (void)unused;
    if (ready(self) < 0) return NULL;
    PyObject *out = PyList_New(self->num_blocks);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->num_blocks; i++) {
        int32_t b = (int32_t)i;
        PyObject *seq = hash_or_none(self, self->seq, b, HAS_SEQ);
        PyObject *local = hash_or_none(self, self->local, b, HAS_SEQ);
        PyObject *parent = hash_or_none(self, self->parent, b, HAS_PARENT);
        if (seq == NULL || local == NULL || parent == NULL) {
            Py_XDECREF(seq);
            Py_XDECREF(local);
            Py_XDECREF(parent);
            Py_DECREF(out);
            return NULL;
        }
        PyObject *item =
            Py_BuildValue("(lNNNl)", (long)self->ref[b], seq, local, parent, (long)self->hits[b]);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *PoolCore_get_num_free_blocks(PoolCore *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromSsize_t(num_free(self));
}

static PyObject *PoolCore_get_num_active_blocks(PoolCore *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromSsize_t(self->next_fresh - self->num_listed);
}

static PyObject *PoolCore_get_num_cached_blocks(PoolCore *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromSize_t(self->cached.count);
}

static PyObject *PoolCore_get_num_removals(PoolCore *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromUnsignedLongLong(self->num_removals);
}

#include "pool_decode.h"

static PyMethodDef PoolCore_methods[] = {
    {"find_prefix", (PyCFunction)PoolCore_find_prefix, METH_O,
     "find_prefix(seq_hashes) -> block ids of the longest cached prefix"},
    {"find_prefix_of_pairs", (PyCFunction)(void (*)(void))PoolCore_find_prefix_of_pairs,
     METH_FASTCALL,
     "find_prefix_of_pairs(block_hashes, max_blocks, start=0) -> find_prefix of the seq "
     "hashes of pairs start to max_blocks"},
    {"get_num_unreferenced", (PyCFunction)PoolCore_get_num_unreferenced, METH_O,
     "get_num_unreferenced(block_ids) -> how many no request holds"},
    {"touch", (PyCFunction)(void (*)(void))PoolCore_touch, METH_FASTCALL,
     "touch(block_ids, is_hit): one more reference each"},
    {"peek_evictions", (PyCFunction)PoolCore_peek_evictions, METH_O,
     "peek_evictions(n) -> the cached blocks allocate(n) would evict"},
    {"count_allocations_before_eviction", (PyCFunction)PoolCore_count_allocations_before_eviction,
     METH_O,
     "count_allocations_before_eviction(limit) -> blocks allocate hands out, up to limit, "
     "before it evicts a cached one"},
    {"allocate", (PyCFunction)PoolCore_allocate, METH_O,
     "allocate(n) -> (block_ids, evicted seq_hashes)"},
    {"free", (PyCFunction)PoolCore_free, METH_O, "free(block_ids): one reference less each"},
    {"cache_blocks", (PyCFunction)(void (*)(void))PoolCore_cache_blocks, METH_FASTCALL,
     "cache_blocks(block_ids, hashes, parent_hash, block_type) -> runs of newly cached blocks"},
    {"reset", (PyCFunction)PoolCore_reset, METH_NOARGS,
     "reset() -> whether every hash was forgotten (refused while blocks are in use)"},
    {"get_cached_block", (PyCFunction)PoolCore_get_cached_block, METH_O,
     "get_cached_block(seq_hash) -> block id or None"},
    {"get_cached_hashes", (PyCFunction)PoolCore_get_cached_hashes, METH_NOARGS,
     "get_cached_hashes() -> every cached seq_hash"},
    {"get_free_block_ids", (PyCFunction)PoolCore_get_free_block_ids, METH_NOARGS,
     "get_free_block_ids() -> the free queue, head first"},
    {"snapshot", (PyCFunction)PoolCore_snapshot, METH_NOARGS,
     "snapshot() -> every block's (ref_count, seq_hash, local_hash, parent_hash, num_hits)"},
    {"get_num_free_blocks", (PyCFunction)PoolCore_get_num_free_blocks, METH_NOARGS, NULL},
    {"get_num_active_blocks", (PyCFunction)PoolCore_get_num_active_blocks, METH_NOARGS, NULL},
    {"get_num_cached_blocks", (PyCFunction)PoolCore_get_num_cached_blocks, METH_NOARGS, NULL},
    {"get_num_removals", (PyCFunction)PoolCore_get_num_removals, METH_NOARGS,
     "get_num_removals() -> hashes that left the prefix map so far (a reset counts one)"},
    {"run_decodes", (PyCFunction)(void (*)(void))PoolCore_run_decodes, METH_FASTCALL,
     "run_decodes(...) -> (status, step, kv_tokens, now_s, last_step_ms, num_steps): a decode "
     "run's stretches (pool_decode.h)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PoolCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "armature.kv._pool.PoolCore",
    .tp_basicsize = sizeof(PoolCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A KV block pool's per-block state (see the module's comment).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PoolCore_init,
    .tp_dealloc = (destructor)PoolCore_dealloc,
    .tp_methods = PoolCore_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "armature.kv._pool", "Native state of the KV block pool.", -1, NULL,
};

PyMODINIT_FUNC PyInit__pool(void) {
    if (PyType_Ready(&PoolCoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PoolCoreType);
    if (PyModule_AddObject(m, "PoolCore", (PyObject *)&PoolCoreType) < 0) {
        Py_DECREF(&PoolCoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
