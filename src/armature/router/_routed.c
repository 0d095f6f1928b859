/* Native routed-prefix index (armature.router.routed_index): the prefixes the router assumes
 * a worker holds because it just routed them there, each with an expiry.
 *
 * The same rules as armature.router.routed_index.PyRoutedPrefixIndex (tests hold the two equal
 * under hypothesis), kept in flat C arrays instead of dicts of Python ints and floats:
 *
 *     by_worker: per worker slot, seq_hash -> expiry_s       open addressing, linear probing
 *     holders:   (first seq_hash, worker slot) present     the lookup's filter (by_first)
 *     decisions: ring of (expiry_s, slot, copy of the prompt's hashes), record order
 *     names:     slot -> worker id; slots: worker id -> slot (a worker keeps its slot)
 *
 * An entry is 16 bytes, a hash and a value (the expiry, or the slot + 1 in the holders table; 0
 * marks a free entry), so a fleet of hundreds of workers, each with its last 120 s of
 * prompts, takes two thirds of the memory a slot and a flag beside the expiry would.
 * Deletion shifts the following entries back (no tombstones). A worker's entries are a table
 * of their own (a decision touches one small table, not one spread over the fleet). A hash's
 * home slot ignores the worker, so the holders of one first block sit in one probe run: a
 * lookup walks that run, then binary-searches each holder's depth, O(holders x log blocks).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../kv/bigmem.h"
#include "../kv/pyint.h"

/* 16 bytes. In a worker's table, `value` is the expiry (a double's bits, +0.0 kept as -0.0);
 * in the holders table, the slot + 1; 0 marks a free entry in both. */
typedef struct {
    uint64_t hash;
    uint64_t value;
} Entry;

typedef struct {
    size_t capacity; /* a power of two, or 0 before the first insert */
    size_t count;
    Entry *entries;
} Table;

typedef struct {
    double expiry_s;
    Py_ssize_t slot;
    Py_ssize_t num_hashes;
    uint64_t *hashes; /* owned copy */
} Decision;

typedef struct {
    PyObject_HEAD
    double ttl_s;
    Py_ssize_t max_entries;
    double last_expiry_s;
    Table *by_worker; /* by slot, as many as names */
    size_t num_entries; /* over every worker */
    Table holders;
    Decision *ring; /* capacity ring_capacity; ring_len from ring_head */
    size_t ring_capacity, ring_head, ring_len;
    PyObject *names; /* list: slot -> worker id */
    PyObject *slots; /* dict: worker id -> slot */
} RoutedTable;

/* Expired decisions dropped per record at most (as the Python index). */
#define PRUNE_PER_RECORD 2
#define STACK_HASHES 1024

/* By the hash alone: the entries of one hash (holders of one first block) share a run. */
static inline size_t home(uint64_t hash, size_t mask) {
    return (size_t)((hash * 0x9E3779B97F4A7C15ULL) >> 17) & mask;
}

static inline uint64_t expiry_value(double expiry_s) {
    uint64_t value;
    memcpy(&value, &expiry_s, sizeof(value));
    return value ? value : 1ULL << 63; /* +0.0 as -0.0, equal to it */
}

static inline double expiry_in(const Entry *e) {
    double expiry_s;
    memcpy(&expiry_s, &e->value, sizeof(expiry_s));
    return expiry_s;
}

static inline uint64_t holder_value(uint32_t slot) {
    return (uint64_t)slot + 1;
}

static inline uint32_t holder_slot(const Entry *e) {
    return (uint32_t)(e->value - 1);
}

/* The entry of `hash` in a worker's table (holder 0), or of (hash, slot) in the holders
 * table (holder_value(slot)); NULL if absent. */
static Entry *find(const Table *t, uint64_t hash, uint64_t holder) {
    if (t->count == 0) return NULL;
    size_t mask = t->capacity - 1;
    for (size_t i = home(hash, mask);; i = (i + 1) & mask) {
        Entry *e = &t->entries[i];
        if (!e->value) return NULL;
        if (e->hash == hash && (!holder || e->value == holder)) return e;
    }
}

static int grow(Table *t, size_t capacity) {
    Entry *entries = big_calloc(capacity, sizeof(Entry));
    if (entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = capacity - 1;
    for (size_t j = 0; j < t->capacity; j++) {
        const Entry *old = &t->entries[j];
        if (!old->value) continue;
        size_t i = home(old->hash, mask);
        while (entries[i].value) i = (i + 1) & mask;
        entries[i] = *old;
    }
    big_free(t->entries, t->capacity, sizeof(Entry));
    t->entries = entries;
    t->capacity = capacity;
    return 0;
}

/* Room for `count` entries at a load factor of at most 1/2. */
static int reserve(Table *t, size_t count) {
    if (count * 2 <= t->capacity) return 0;
    size_t capacity = t->capacity ? t->capacity : 64;
    while (count * 2 > capacity) capacity *= 2;
    return grow(t, capacity);
}

/* The entry find() gives, inserted if absent (in a worker's table with expiry -inf, in the
 * holders table as the holder); room must have been reserved. */
static Entry *upsert(Table *t, uint64_t hash, uint64_t holder, int *inserted) {
    size_t mask = t->capacity - 1;
    for (size_t i = home(hash, mask);; i = (i + 1) & mask) {
        Entry *e = &t->entries[i];
        if (!e->value) {
            e->hash = hash;
            e->value = holder ? holder : expiry_value(-INFINITY);
            t->count++;
            *inserted = 1;
            return e;
        }
        if (e->hash == hash && (!holder || e->value == holder)) {
            *inserted = 0;
            return e;
        }
    }
}

/* Drop entry `e`, shifting the entries after it back. */
static void erase(Table *t, Entry *e) {
    size_t mask = t->capacity - 1;
    size_t i = (size_t)(e - t->entries), j = i;
    for (;;) {
        j = (j + 1) & mask;
        Entry *next = &t->entries[j];
        if (!next->value) break;
        size_t k = home(next->hash, mask);
        /* move j to the hole at i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        t->entries[i] = *next;
        i = j;
    }
    t->entries[i].value = 0;
    t->count--;
}

/* Hashes this far ahead of the one being looked up have their home entries loaded early: a
 * decision's hundreds of hashes are scattered over tables of up to a million entries. */
#define PREFETCH_AHEAD 16

static inline void prefetch_home(const Table *t, const uint64_t *hashes, Py_ssize_t i,
                                 Py_ssize_t n) {
    if (i + PREFETCH_AHEAD < n && t->capacity)
        __builtin_prefetch(&t->entries[home(hashes[i + PREFETCH_AHEAD], t->capacity - 1)]);
}

static inline double expiry_of(const Table *t, uint64_t hash) {
    const Entry *e = find(t, hash, 0);
    return e == NULL ? -INFINITY : expiry_in(e);
}

/* ---- arguments ------------------------------------------------------------------------ */

/* The hashes of a sequence of ints in [0, 2**64) into `stack` when they fit, else a
 * PyMem buffer (free it with free_hashes); NULL with an exception on bad input. */
static uint64_t *read_hashes(PyObject *obj, Py_ssize_t *n, uint64_t *stack) {
    PyObject *seq = PySequence_Fast(obj, "seq_hashes must be a sequence of ints");
    if (seq == NULL) return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    uint64_t *out = len <= STACK_HASHES ? stack : PyMem_Malloc((size_t)len * sizeof(uint64_t));
    if (out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < len; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "seq_hashes must be ints");
            goto fail;
        }
        unsigned long long v = as_u64(items[i]);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "a seq_hash must be in [0, 2**64)");
            goto fail;
        }
        out[i] = (uint64_t)v;
    }
    Py_DECREF(seq);
    *n = len;
    return out;
fail:
    if (out != stack) PyMem_Free(out);
    Py_DECREF(seq);
    return NULL;
}

static void free_hashes(uint64_t *hashes, const uint64_t *stack) {
    if (hashes != stack) PyMem_Free(hashes);
}

/* ---- the index ------------------------------------------------------------------------ */

static int RoutedTable_init(RoutedTable *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"ttl_s", "max_entries", NULL};
    double ttl_s;
    Py_ssize_t max_entries;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "dn", kwlist, &ttl_s, &max_entries)) return -1;
    if (!(ttl_s > 0) || max_entries <= 0) {
        PyErr_SetString(PyExc_ValueError, "ttl_s and max_entries must be > 0");
        return -1;
    }
    if (self->names != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "RoutedTable is initialized once");
        return -1;
    }
    self->names = PyList_New(0);
    self->slots = PyDict_New();
    if (self->names == NULL || self->slots == NULL) return -1;
    self->ttl_s = ttl_s;
    self->max_entries = max_entries;
    self->last_expiry_s = -INFINITY;
    return 0;
}

static void RoutedTable_dealloc(RoutedTable *self) {
    for (size_t k = 0; k < self->ring_len; k++)
        PyMem_Free(self->ring[(self->ring_head + k) % self->ring_capacity].hashes);
    PyMem_Free(self->ring);
    Py_ssize_t num_slots = self->names != NULL ? PyList_GET_SIZE(self->names) : 0;
    for (Py_ssize_t i = 0; i < num_slots; i++)
        big_free(self->by_worker[i].entries, self->by_worker[i].capacity, sizeof(Entry));
    PyMem_Free(self->by_worker);
    big_free(self->holders.entries, self->holders.capacity, sizeof(Entry));
    Py_XDECREF(self->names);
    Py_XDECREF(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(RoutedTable *self) {
    if (self->names != NULL) return 0;
    PyErr_SetString(PyExc_RuntimeError, "RoutedTable.__init__ was not called");
    return -1;
}

/* `worker`'s slot, given one on first sight. */
static Py_ssize_t slot_of(RoutedTable *self, PyObject *worker) {
    PyObject *found = PyDict_GetItemWithError(self->slots, worker);
    if (found != NULL) return PyLong_AsSsize_t(found);
    if (PyErr_Occurred()) return -1;
    Py_ssize_t slot = PyList_GET_SIZE(self->names);
    if (slot >= (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "too many workers");
        return -1;
    }
    Table *tables = PyMem_Realloc(self->by_worker, (size_t)(slot + 1) * sizeof(Table));
    if (tables == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(&tables[slot], 0, sizeof(Table));
    self->by_worker = tables;
    PyObject *number = PyLong_FromSsize_t(slot);
    if (number == NULL) return -1;
    int failed = PyDict_SetItem(self->slots, worker, number) < 0;
    Py_DECREF(number);
    if (failed || PyList_Append(self->names, worker) < 0) return -1;
    return slot;
}

/* Drop the oldest decision: its entries not refreshed by a later record, and the worker as a
 * holder of its first block when that entry is gone. */
static void drop_oldest(RoutedTable *self) {
    Decision *d = &self->ring[self->ring_head];
    uint32_t slot = (uint32_t)d->slot;
    Table *entries = &self->by_worker[slot];
    for (Py_ssize_t i = 0; i < d->num_hashes; i++) {
        prefetch_home(entries, d->hashes, i, d->num_hashes);
        Entry *e = find(entries, d->hashes[i], 0);
        if (e != NULL && expiry_in(e) == d->expiry_s) {
            erase(entries, e);
            self->num_entries--;
        }
    }
    if (d->num_hashes > 0 && find(entries, d->hashes[0], 0) == NULL) {
        Entry *h = find(&self->holders, d->hashes[0], holder_value(slot));
        if (h != NULL) erase(&self->holders, h);
    }
    PyMem_Free(d->hashes);
    d->hashes = NULL;
    self->ring_head = (self->ring_head + 1) % self->ring_capacity;
    self->ring_len--;
}

static int push_decision(RoutedTable *self, double expiry_s, Py_ssize_t slot,
                         const uint64_t *hashes, Py_ssize_t n) {
    if (self->ring_len == self->ring_capacity) {
        size_t capacity = self->ring_capacity ? self->ring_capacity * 2 : 64;
        Decision *ring = PyMem_Malloc(capacity * sizeof(Decision));
        if (ring == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t k = 0; k < self->ring_len; k++)
            ring[k] = self->ring[(self->ring_head + k) % self->ring_capacity];
        PyMem_Free(self->ring);
        self->ring = ring;
        self->ring_capacity = capacity;
        self->ring_head = 0;
    }
    uint64_t *copy = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (copy == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(copy, hashes, (size_t)n * sizeof(uint64_t));
    Decision *d = &self->ring[(self->ring_head + self->ring_len) % self->ring_capacity];
    d->expiry_s = expiry_s;
    d->slot = slot;
    d->num_hashes = n;
    d->hashes = copy;
    self->ring_len++;
    return 0;
}

static void prune(RoutedTable *self, double now_s, Py_ssize_t max_decisions) {
    Py_ssize_t dropped = 0;
    while (self->ring_len && self->ring[self->ring_head].expiry_s <= now_s) {
        if (max_decisions >= 0 && dropped >= max_decisions) return;
        drop_oldest(self);
        dropped++;
    }
}

static PyObject *RoutedTable_record(RoutedTable *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"worker", "seq_hashes", "now_s", NULL};
    PyObject *worker, *obj;
    double now_s;
    if (ready(self) < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOd", kwlist, &worker, &obj, &now_s))
        return NULL;
    uint64_t stack[STACK_HASHES];
    Py_ssize_t n;
    uint64_t *hashes = read_hashes(obj, &n, stack);
    if (hashes == NULL) return NULL;
    Py_ssize_t slot = slot_of(self, worker);
    if (slot < 0) goto fail;
    Table *entries = &self->by_worker[slot];
    if (reserve(entries, entries->count + (size_t)n) < 0) goto fail;
    if (reserve(&self->holders, self->holders.count + 1) < 0) goto fail;
    double expiry_s = fmax(now_s + self->ttl_s, nextafter(self->last_expiry_s, INFINITY));
    if (push_decision(self, expiry_s, slot, hashes, n) < 0) goto fail;
    self->last_expiry_s = expiry_s;
    for (Py_ssize_t i = 0; i < n; i++) {
        int inserted;
        prefetch_home(entries, hashes, i, n);
        upsert(entries, hashes[i], 0, &inserted)->value = expiry_value(expiry_s);
        self->num_entries += (size_t)inserted;
    }
    if (n > 0) {
        int inserted;
        upsert(&self->holders, hashes[0], holder_value((uint32_t)slot), &inserted);
    }
    free_hashes(hashes, stack);
    while ((Py_ssize_t)self->num_entries > self->max_entries) drop_oldest(self);
    prune(self, now_s, PRUNE_PER_RECORD);
    Py_RETURN_NONE;
fail:
    free_hashes(hashes, stack);
    return NULL;
}

static PyObject *RoutedTable_prune(RoutedTable *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"now_s", "max_decisions", NULL};
    double now_s;
    PyObject *limit = Py_None;
    if (ready(self) < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|O", kwlist, &now_s, &limit)) return NULL;
    Py_ssize_t max_decisions = -1;
    if (limit != Py_None) {
        max_decisions = PyLong_AsSsize_t(limit);
        if (max_decisions == -1 && PyErr_Occurred()) return NULL;
        if (max_decisions < 0) max_decisions = 0;
    }
    prune(self, now_s, max_decisions);
    Py_RETURN_NONE;
}

/* known[worker] as a block count into *depth (0 when absent or negative); -1 with an
 * exception. */
static int known_depth(PyObject *known, PyObject *worker, Py_ssize_t *depth) {
    *depth = 0;
    if (known == NULL) return 0;
    PyObject *value;
    if (PyDict_CheckExact(known)) {
        value = PyDict_GetItemWithError(known, worker);
        if (value == NULL) return PyErr_Occurred() ? -1 : 0;
        Py_INCREF(value);
    } else {
        value = PyObject_CallMethod(known, "get", "OO", worker, Py_None);
        if (value == NULL) return -1;
        if (value == Py_None) {
            Py_DECREF(value);
            return 0;
        }
    }
    Py_ssize_t number = PyNumber_AsSsize_t(value, PyExc_OverflowError);
    Py_DECREF(value);
    if (number == -1 && PyErr_Occurred()) return -1;
    *depth = number > 0 ? number : 0;
    return 0;
}

/* A holder of a lookup's first block: its slot and the depth already known (where its probe
 * starts). */
typedef struct {
    uint32_t slot;
    Py_ssize_t floor;
} Holder;

#define STACK_HOLDERS 512

/* Double *found's room (a heap copy once it outgrows `stack`); -1 with an exception. */
static int grow_holders(Holder **found, size_t *capacity, Holder *stack) {
    size_t bigger = *capacity * 2;
    Holder *grown = PyMem_Malloc(bigger * sizeof(Holder));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(grown, *found, *capacity * sizeof(Holder));
    if (*found != stack) PyMem_Free(*found);
    *found = grown;
    *capacity = bigger;
    return 0;
}

static PyObject *RoutedTable_find_overlaps(RoutedTable *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"seq_hashes", "now_s", "known", NULL};
    PyObject *obj, *known = Py_None;
    double now_s;
    if (ready(self) < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Od|O", kwlist, &obj, &now_s, &known))
        return NULL;
    uint64_t stack[STACK_HASHES];
    Py_ssize_t n;
    uint64_t *hashes = read_hashes(obj, &n, stack);
    if (hashes == NULL) return NULL;
    PyObject *overlaps = PyDict_New();
    if (overlaps == NULL || n == 0 || self->holders.count == 0) {
        free_hashes(hashes, stack);
        return overlaps;
    }
    PyObject *known_map = (known == Py_None || (PyDict_Check(known) && !PyDict_GET_SIZE(known)))
                              ? NULL
                              : known;
    uint64_t first = hashes[0], last = hashes[n - 1];
    const Table *holders = &self->holders;
    size_t mask = holders->capacity - 1;
    /* the holders of `first` are in the probe run from its home to the next empty slot; each
     * one's first probe, in a table of its own, is loaded early (a fleet's hundreds of
     * holders' tables are cold), then the holders are looked up in the same order */
    Holder stack_holders[STACK_HOLDERS];
    Holder *found = stack_holders;
    size_t num_found = 0, found_capacity = STACK_HOLDERS;
    for (size_t i = home(first, mask); holders->entries[i].value; i = (i + 1) & mask) {
        const Entry *h = &holders->entries[i];
        if (h->hash != first) continue;
        uint32_t slot = holder_slot(h);
        const Table *entries = &self->by_worker[slot];
        PyObject *worker = PyList_GET_ITEM(self->names, (Py_ssize_t)slot);
        Py_ssize_t floor;
        if (known_depth(known_map, worker, &floor) < 0) goto fail;
        if (floor >= n || entries->count == 0) continue;
        if (num_found == found_capacity && grow_holders(&found, &found_capacity, stack_holders) < 0)
            goto fail;
        found[num_found++] = (Holder){slot, floor};
        __builtin_prefetch(&entries->entries[home(hashes[floor], entries->capacity - 1)]);
    }
    for (size_t k = 0; k < num_found; k++) {
        uint32_t slot = found[k].slot;
        Py_ssize_t floor = found[k].floor;
        const Table *entries = &self->by_worker[slot];
        PyObject *worker = PyList_GET_ITEM(self->names, (Py_ssize_t)slot);
        if (expiry_of(entries, hashes[floor]) <= now_s) continue;
        Py_ssize_t depth;
        if (expiry_of(entries, last) > now_s) {
            depth = n;
        } else { /* hashes[live] is live, [dead] is not */
            Py_ssize_t live = floor, dead = n - 1;
            while (dead - live > 1) {
                Py_ssize_t mid = (live + dead) / 2;
                if (expiry_of(entries, hashes[mid]) > now_s)
                    live = mid;
                else
                    dead = mid;
            }
            depth = live + 1;
        }
        PyObject *value = PyLong_FromSsize_t(depth);
        if (value == NULL) goto fail;
        int failed = PyDict_SetItem(overlaps, worker, value) < 0;
        Py_DECREF(value);
        if (failed) goto fail;
    }
    if (found != stack_holders) PyMem_Free(found);
    free_hashes(hashes, stack);
    return overlaps;
fail:
    if (found != stack_holders) PyMem_Free(found);
    free_hashes(hashes, stack);
    Py_DECREF(overlaps);
    return NULL;
}

static PyObject *RoutedTable_get_num_entries(RoutedTable *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromSize_t(self->num_entries);
}

static PyObject *RoutedTable_get_ttl_s(RoutedTable *self, void *closure) {
    (void)closure;
    return PyFloat_FromDouble(self->ttl_s);
}

static PyObject *RoutedTable_get_max_entries(RoutedTable *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->max_entries);
}

static PyMethodDef RoutedTable_methods[] = {
    {"record", (PyCFunction)(void (*)(void))RoutedTable_record, METH_VARARGS | METH_KEYWORDS,
     "record(worker, seq_hashes, now_s): worker was sent a prompt with these block hashes"},
    {"prune", (PyCFunction)(void (*)(void))RoutedTable_prune, METH_VARARGS | METH_KEYWORDS,
     "prune(now_s, max_decisions=None): drop expired decisions"},
    {"find_overlaps", (PyCFunction)(void (*)(void))RoutedTable_find_overlaps,
     METH_VARARGS | METH_KEYWORDS,
     "find_overlaps(seq_hashes, now_s, known=None) -> {worker: leading blocks assumed held}"},
    {"get_num_entries", (PyCFunction)RoutedTable_get_num_entries, METH_NOARGS,
     "get_num_entries() -> live (worker, block) entries"},
    {NULL, NULL, 0, NULL},
};

static int RoutedTable_set_max_entries(RoutedTable *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "max_entries cannot be deleted");
        return -1;
    }
    Py_ssize_t max_entries = PyNumber_AsSsize_t(value, PyExc_OverflowError);
    if (max_entries == -1 && PyErr_Occurred()) return -1;
    if (max_entries <= 0) {
        PyErr_SetString(PyExc_ValueError, "max_entries must be > 0");
        return -1;
    }
    self->max_entries = max_entries; /* the next record drops down to it */
    return 0;
}

static PyGetSetDef RoutedTable_getset[] = {
    {"ttl_s", (getter)RoutedTable_get_ttl_s, NULL, "seconds an entry lives after its record",
     NULL},
    {"max_entries", (getter)RoutedTable_get_max_entries, (setter)RoutedTable_set_max_entries,
     "bound on live entries", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RoutedTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "armature.router._routed.RoutedTable",
    .tp_basicsize = sizeof(RoutedTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Routed prefixes with expiries (see the module's comment).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RoutedTable_init,
    .tp_dealloc = (destructor)RoutedTable_dealloc,
    .tp_methods = RoutedTable_methods,
    .tp_getset = RoutedTable_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "armature.router._routed",
    "Native routed-prefix index of the kv policy.", -1, NULL,
};

PyMODINIT_FUNC PyInit__routed(void) {
    if (PyType_Ready(&RoutedTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RoutedTableType);
    if (PyModule_AddObject(m, "RoutedTable", (PyObject *)&RoutedTableType) < 0) {
        Py_DECREF(&RoutedTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
