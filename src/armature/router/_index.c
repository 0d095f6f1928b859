/* Native holder table for the router's prefix index (armature.router.holder_store), and the
 * kv policy's whole choice over the workers (armature.router.cost.choose).
 *
 * Four tables, one per KV tier (device, host, disk, external), each an open-addressing hash
 * map with linear probing: a block's sequence hash (u64) -> the worker slots holding it in
 * that tier. An entry is two words, its key and its holders, and exists exactly while it has
 * a holder (a zero holders word is a free entry, so no sentinel key is needed); deletion
 * shifts the following entries back (no tombstones).
 *
 *     entries: [h0 holders0 | h1 holders1 | ...]   capacity entries (a power of two)
 *     holders: up to INLINE_HOLDERS slots in the word itself, 16 bits each (slot + 1, packed
 *              from the low end, 0 after the last); with more, OVERFLOW_BIT and the number of
 *              a bit set of num_words u64 (worker slot s: word s / 64) in the table's pool
 *     names: worker slot -> worker id (None for a free slot); results are keyed by the ids
 *     workers: worker slot -> its event state (last event id, stale) and, per tier, its
 *              capacity (0: tier not indexed) and the blocks it holds there
 *
 * Most blocks have one holder even in fleets of hundreds of workers (a prompt's own blocks
 * live where it was routed; in the 256-worker replay of the conversation trace 89% of the
 * entries have one holder, 99.6% at most four), so an entry takes 16 bytes at any fleet size,
 * where a bit set in the entry would take 8 + 8 x num_words (40 bytes at 256 workers).
 *
 * The Python side (NativeHolderStore) owns the slots. `apply` keeps the event rules of
 * armature.router.py_holder_store.PyHolderStore.apply (event ids, capacities, staleness) in
 * C, so that an event costs one call; the walks follow armature.router.prefix_index /
 * tier_overlap exactly. Tests hold the two stores equal under hypothesis.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../kv/bigmem.h"
#include "../kv/pyint.h"
#include "../kv/xxh3.h"

#define NUM_TIERS 4
#define TIER_DEVICE 0
#define TIER_HOST 1
#define TIER_DISK 2
#define TIER_EXTERNAL 3
#define MAX_WORDS 64 /* 4,096 worker slots: slot + 1 fits a holder field with bit 63 clear */
#define INLINE_HOLDERS 4
#define OVERFLOW_BIT (1ULL << 63)
#define ENTRY_BYTES (2 * sizeof(uint64_t))
#define MAX_BITSETS UINT32_MAX /* a pool's bit sets are numbered in the holders' low 32 bits */

typedef struct {
    size_t capacity; /* a power of two, or 0 before the first insert */
    size_t count;
    uint64_t *entries; /* capacity * 2: key, holders */
    uint64_t *pool;    /* pool_capacity bit sets of num_words words, for entries past inline */
    size_t pool_capacity, pool_used; /* bit sets allocated; handed out at least once */
    size_t free_next;                /* a free bit set + 1 (its first word: the next + 1), or 0 */
} Table;

typedef struct {
    long long last_event_id;         /* -1 before the first event */
    int stale;                       /* an event was missed: apply refuses until set_synced */
    Py_ssize_t capacity[NUM_TIERS];  /* blocks; 0: the tier is not indexed for this worker */
    Py_ssize_t count[NUM_TIERS];     /* blocks held in each tier */
} WorkerState;

enum { EVENT_STORED, EVENT_REMOVED, EVENT_CLEARED, NUM_EVENT_TYPES };

typedef struct {
    PyObject_HEAD
    Py_ssize_t num_words;
    Table tables[NUM_TIERS];
    PyObject *names; /* list: slot -> worker id or None */
    PyObject *slots; /* dict: worker id -> slot */
    PyObject *tiers; /* dict: tier object -> 0..3 */
    WorkerState *workers; /* by slot, as many as names */
    PyObject *event_types[NUM_EVENT_TYPES]; /* the Stored, Removed and Cleared classes */
    int initialized; /* __init__ ran: it runs once */
} HolderTable;

static inline size_t home(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & mask;
}

/* Entry i of `t`: its key at [0], its holders at [1]. */
static inline uint64_t *entry(const Table *t, size_t i) {
    return t->entries + 2 * i;
}

/* The bit set of an overflowed holders word. */
static inline uint64_t *bitset(const Table *t, uint64_t holders, Py_ssize_t nw) {
    return t->pool + (size_t)(uint32_t)holders * (size_t)nw;
}

/* The slots of a holders word as a bit set: the pool's own for an overflowed word, else
 * `buf` (num_words words) filled. */
static inline const uint64_t *holder_bits(const Table *t, uint64_t holders, Py_ssize_t nw,
                                          uint64_t *buf) {
    if (holders & OVERFLOW_BIT) return bitset(t, holders, nw);
    memset(buf, 0, (size_t)nw * sizeof(uint64_t));
    for (; holders; holders >>= 16) {
        unsigned s = (unsigned)(holders & 0xFFFF) - 1;
        buf[s / 64] |= 1ULL << (s % 64);
    }
    return buf;
}

/* Whether the holders word has `slot`. */
static inline int holds(const Table *t, uint64_t holders, Py_ssize_t nw, Py_ssize_t slot) {
    if (holders & OVERFLOW_BIT)
        return (int)((bitset(t, holders, nw)[slot / 64] >> (slot % 64)) & 1);
    for (uint64_t want = (uint64_t)slot + 1; holders; holders >>= 16)
        if ((holders & 0xFFFF) == want) return 1;
    return 0;
}

/* The holders word of `key`'s entry, or NULL. */
static uint64_t *lookup(const Table *t, uint64_t key) {
    if (t->count == 0) return NULL;
    size_t mask = t->capacity - 1;
    for (size_t i = home(key, mask);; i = (i + 1) & mask) {
        uint64_t *e = entry(t, i);
        if (e[1] == 0) return NULL;
        if (e[0] == key) return e + 1;
    }
}

/* The holders of `key` as a bit set (holder_bits, into `buf` when inline), or NULL. */
static inline const uint64_t *lookup_bits(const Table *t, Py_ssize_t nw, uint64_t key,
                                          uint64_t *buf) {
    const uint64_t *holders = lookup(t, key);
    return holders ? holder_bits(t, *holders, nw, buf) : NULL;
}

/* `t`'s entries rehashed into the zeroed array `into` of `capacity` entries, which becomes
 * t's; t's old array is freed (its count and pool stay). */
static void move_into(Table *t, uint64_t *into, size_t capacity) {
    size_t mask = capacity - 1;
    for (size_t j = 0; j < t->capacity; j++) {
        const uint64_t *old = entry(t, j);
        if (old[1] == 0) continue;
        size_t i = home(old[0], mask);
        while (into[2 * i + 1] != 0) i = (i + 1) & mask;
        into[2 * i] = old[0];
        into[2 * i + 1] = old[1];
    }
    big_free(t->entries, t->capacity, ENTRY_BYTES);
    t->entries = into;
    t->capacity = capacity;
}

/* Room for `count` entries at a load factor of at most 1/2; -1 with MemoryError. */
static int reserve(Table *t, size_t count) {
    if (count * 2 <= t->capacity) return 0;
    size_t capacity = t->capacity ? t->capacity : 64;
    while (count * 2 > capacity) capacity *= 2;
    uint64_t *grown = big_calloc(capacity, ENTRY_BYTES);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    move_into(t, grown, capacity);
    return 0;
}

/* t's pool of bit sets of `nw` words, twice as large (16 at first); -1 with MemoryError. */
static int grow_pool(Table *t, Py_ssize_t nw) {
    size_t capacity = t->pool_capacity ? t->pool_capacity * 2 : 16;
    size_t bytes_each = (size_t)nw * sizeof(uint64_t);
    uint64_t *pool = t->pool_capacity >= MAX_BITSETS || capacity > SIZE_MAX / bytes_each
                         ? NULL
                         : PyMem_Realloc(t->pool, capacity * bytes_each);
    if (pool == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->pool = pool;
    t->pool_capacity = capacity;
    return 0;
}

/* A zeroed bit set from t's pool, grown as needed: its number in *out; -1 with MemoryError. */
static int take_bitset(Table *t, Py_ssize_t nw, uint32_t *out) {
    if (!t->free_next && t->pool_used == t->pool_capacity && grow_pool(t, nw) < 0) return -1;
    size_t b;
    if (t->free_next) {
        b = t->free_next - 1;
        t->free_next = (size_t)t->pool[b * (size_t)nw];
    } else {
        b = t->pool_used++;
    }
    memset(t->pool + b * (size_t)nw, 0, (size_t)nw * sizeof(uint64_t));
    *out = (uint32_t)b;
    return 0;
}

static void give_bitset(Table *t, Py_ssize_t nw, uint32_t b) {
    t->pool[(size_t)b * (size_t)nw] = (uint64_t)t->free_next;
    t->free_next = (size_t)b + 1;
}

/* The holders word of `key`'s entry, inserted empty if absent; room must have been reserved.
 * The caller adds a holder at once (an empty entry counts as free). */
static uint64_t *upsert(Table *t, uint64_t key) {
    size_t mask = t->capacity - 1;
    for (size_t i = home(key, mask);; i = (i + 1) & mask) {
        uint64_t *e = entry(t, i);
        if (e[1] == 0) {
            e[0] = key;
            t->count++;
            return e + 1;
        }
        if (e[0] == key) return e + 1;
    }
}

/* Add `slot` to the holders word `*holders` of t: 1 if it was not there, else 0; -1 with
 * MemoryError (nothing changed) when the holders past INLINE_HOLDERS need a bit set and the
 * pool cannot grow. */
static int add_holder(Table *t, Py_ssize_t nw, uint64_t *holders, Py_ssize_t slot) {
    uint64_t h = *holders, bit = 1ULL << (slot % 64);
    if (h & OVERFLOW_BIT) {
        uint64_t *bits = bitset(t, h, nw);
        if (bits[slot / 64] & bit) return 0;
        bits[slot / 64] |= bit;
        return 1;
    }
    int i = 0;
    for (; i < INLINE_HOLDERS && ((h >> (16 * i)) & 0xFFFF); i++)
        if (((h >> (16 * i)) & 0xFFFF) == (uint64_t)slot + 1) return 0;
    if (i < INLINE_HOLDERS) {
        *holders = h | (((uint64_t)slot + 1) << (16 * i));
        return 1;
    }
    uint32_t b;
    if (take_bitset(t, nw, &b) < 0) return -1;
    uint64_t *bits = bitset(t, b, nw);
    holder_bits(t, h, nw, bits);
    bits[slot / 64] |= bit;
    *holders = OVERFLOW_BIT | b;
    return 1;
}

/* Drop the entry `e` (now without holders), shifting the entries after it back. */
static void erase(Table *t, uint64_t *e) {
    size_t mask = t->capacity - 1;
    size_t i = (size_t)(e - t->entries) / 2;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t *next = entry(t, j);
        if (next[1] == 0) break;
        size_t k = home(next[0], mask);
        /* move j to the hole at i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        memcpy(entry(t, i), next, ENTRY_BYTES);
        memset(next, 0, ENTRY_BYTES);
        i = j;
    }
    t->count--;
}

/* Drop `slot` from the holders of entry `e` (key, holders) of t: 1 if it was there. The entry
 * is erased once it has no holder; an overflowed one goes back inline at INLINE_HOLDERS (so
 * a bit set always holds more). */
static int remove_holder(Table *t, Py_ssize_t nw, uint64_t *e, Py_ssize_t slot) {
    uint64_t h = e[1];
    if (h & OVERFLOW_BIT) {
        uint64_t *bits = bitset(t, h, nw), bit = 1ULL << (slot % 64);
        if (!(bits[slot / 64] & bit)) return 0;
        bits[slot / 64] &= ~bit;
        int count = 0;
        for (Py_ssize_t w = 0; w < nw; w++) count += __builtin_popcountll(bits[w]);
        if (count <= INLINE_HOLDERS) {
            uint64_t packed = 0;
            int i = 0;
            for (Py_ssize_t w = 0; w < nw; w++)
                for (uint64_t m = bits[w]; m; m &= m - 1)
                    packed |= ((uint64_t)(w * 64 + __builtin_ctzll(m)) + 1) << (16 * i++);
            give_bitset(t, nw, (uint32_t)h);
            e[1] = packed;
        }
        return 1;
    }
    int at = -1, last = -1;
    for (int i = 0; i < INLINE_HOLDERS && ((h >> (16 * i)) & 0xFFFF); i++) {
        if (((h >> (16 * i)) & 0xFFFF) == (uint64_t)slot + 1) at = i;
        last = i;
    }
    if (at < 0) return 0;
    uint64_t moved = (h >> (16 * last)) & 0xFFFF; /* the last field fills the hole */
    h &= ~(0xFFFFULL << (16 * last));
    if (at != last) h = (h & ~(0xFFFFULL << (16 * at))) | (moved << (16 * at));
    e[1] = h;
    if (h == 0) erase(t, e);
    return 1;
}

/* Start loading the home entries of `n` keys: an event's blocks are scattered over a table of
 * up to millions of entries, so each lookup would otherwise wait for memory in turn. */
static void prefetch_homes(const Table *t, const uint64_t *keys, Py_ssize_t n) {
    if (t->capacity == 0) return;
    size_t mask = t->capacity - 1;
    for (Py_ssize_t i = 0; i < n; i++) __builtin_prefetch(entry(t, home(keys[i], mask)));
}

/* Drop slot from the holders of `key`; 1 if it held it. */
static int clear_bit(Table *t, Py_ssize_t nw, uint64_t key, Py_ssize_t slot) {
    uint64_t *holders = lookup(t, key);
    return holders ? remove_holder(t, nw, holders - 1, slot) : 0;
}

/* t's pool rebuilt with bit sets of `nw` words where they had `old_nw` (free ones keep their
 * link); -1 with MemoryError and nothing changed. *out is the new pool (NULL when t has
 * none); the caller installs it. */
static int widen_pool(const Table *t, Py_ssize_t old_nw, Py_ssize_t nw, uint64_t **out) {
    *out = NULL;
    if (t->pool == NULL) return 0;
    uint64_t *pool = PyMem_Calloc(t->pool_capacity * (size_t)nw, sizeof(uint64_t));
    if (pool == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t b = 0; b < t->pool_used; b++)
        memcpy(pool + b * (size_t)nw, t->pool + b * (size_t)old_nw,
               (size_t)old_nw * sizeof(uint64_t));
    *out = pool;
    return 0;
}

/* ---- argument parsing ---------------------------------------------------------------- */

/* attribute names, interned at import */
static PyObject *seq_hash_name, *event_id_name, *tier_name, *blocks_name, *seq_hashes_name;

/* One hash from an int; -1 with a ValueError when it is not an int in [0, 2**64). */
static int to_hash(PyObject *item, uint64_t *out) {
    unsigned long long v = item ? as_u64(item) : (unsigned long long)-1;
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "seq_hashes must be ints in [0, 2**64)");
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* The type whose `seq_hash` is a plain slot at `slot_offset`, as of its version tag
 * `slot_version` (the last type read, held), so that an event's blocks are read without a
 * generic attribute lookup each. */
static PyTypeObject *slot_type;
static Py_ssize_t slot_offset;
static unsigned int slot_version;

static int is_cached_slot_type(PyTypeObject *tp) {
    return tp == slot_type && (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
           tp->tp_version_tag == slot_version;
}

/* Cache tp's `seq_hash` slot when it is a plain one: an object member of tp or a base of it,
 * read by the generic getattr. */
static void cache_slot_type(PyTypeObject *tp) {
    PyObject *descr = _PyType_Lookup(tp, seq_hash_name); /* borrowed; sets the version tag */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        tp->tp_getattro != PyObject_GenericGetAttr ||
        !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ||
        !PyType_IsSubtype(tp, PyDescr_TYPE(descr)))
        return;
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READ_RESTRICTED)) return;
    PyTypeObject *old = slot_type;
    Py_INCREF(tp);
    slot_offset = member->offset;
    slot_version = tp->tp_version_tag;
    slot_type = tp;
    Py_XDECREF(old); /* last: it may run code that reads again */
}

/* obj.<attr> (a new reference, or NULL with an error); `seq_hash` from its slot when obj's
 * type keeps it in a plain one. */
static PyObject *get_attr(PyObject *obj, PyObject *attr) {
    PyTypeObject *tp = Py_TYPE(obj);
    if (attr == seq_hash_name) {
        if (!is_cached_slot_type(tp)) cache_slot_type(tp);
        if (is_cached_slot_type(tp)) {
            PyObject *value = *(PyObject **)((char *)obj + slot_offset);
            if (value != NULL) {
                Py_INCREF(value);
                return value;
            }
        }
    }
    return PyObject_GetAttr(obj, attr);
}

#define STACK_HASHES 64 /* an event's blocks fit on the stack up to this many */

/* The hashes of a sequence of ints (or, with `attr`, of the items' `attr` attributes) as a
 * u64 array (*n set): `stack` when they fit in STACK_HASHES, else a fresh one the caller
 * frees with free_hashes; NULL with an error set. */
static uint64_t *read_hashes_of(PyObject *obj, PyObject *attr, Py_ssize_t *n, uint64_t *stack) {
    PyObject *seq = PySequence_Fast(obj, "seq_hashes must be a sequence of ints");
    if (seq == NULL) return NULL;
    *n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *out = *n <= STACK_HASHES ? stack : PyMem_Malloc((size_t)*n * sizeof(uint64_t));
    if (out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *item = attr ? get_attr(items[i], attr) : items[i];
        int rc = to_hash(item, &out[i]);
        if (attr) Py_XDECREF(item);
        if (rc < 0) {
            if (out != stack) PyMem_Free(out);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    return out;
}

static uint64_t *read_hashes(PyObject *obj, Py_ssize_t *n, uint64_t *stack) {
    return read_hashes_of(obj, NULL, n, stack);
}

static void free_hashes(uint64_t *hashes, const uint64_t *stack) {
    if (hashes != stack) PyMem_Free(hashes);
}

/* ---- type ------------------------------------------------------------------------------ */

/* HolderTable(tiers, event_types): `tiers` maps each tier object (device, host, disk,
 * external) to 0..3; `event_types` is (Stored, Removed, Cleared), the event classes `apply`
 * takes (exact types: the events carry event_id; Stored tier and blocks; Removed tier and
 * seq_hashes). */
static int HolderTable_init(HolderTable *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"tiers", "event_types", NULL};
    PyObject *tiers, *types;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!", kwlist, &PyDict_Type, &tiers,
                                     &PyTuple_Type, &types))
        return -1;
    if (PyTuple_GET_SIZE(types) != NUM_EVENT_TYPES) {
        PyErr_SetString(PyExc_ValueError, "event_types must be (Stored, Removed, Cleared)");
        return -1;
    }
    if (self->initialized) {
        PyErr_SetString(PyExc_RuntimeError, "HolderTable is initialized once");
        return -1;
    }
    for (int i = 0; i < NUM_EVENT_TYPES; i++) {
        PyObject *type = PyTuple_GET_ITEM(types, i);
        if (!PyType_Check(type)) {
            PyErr_SetString(PyExc_TypeError, "event_types must be classes");
            return -1;
        }
        Py_INCREF(type);
        Py_XSETREF(self->event_types[i], type);
    }
    PyObject *copy = PyDict_Copy(tiers);
    if (copy == NULL) return -1;
    Py_SETREF(self->tiers, copy);
    self->initialized = 1;
    return 0;
}

/* Empty and usable before __init__ (no worker, no tier, no event type): no method reads a
 * NULL. */
static PyObject *HolderTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    HolderTable *self = (HolderTable *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->num_words = 1;
    self->names = PyList_New(0);
    self->slots = PyDict_New();
    self->tiers = PyDict_New();
    if (self->names == NULL || self->slots == NULL || self->tiers == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void HolderTable_dealloc(HolderTable *self) {
    for (int t = 0; t < NUM_TIERS; t++) {
        Table *tab = &self->tables[t];
        big_free(tab->entries, tab->capacity, ENTRY_BYTES);
        PyMem_Free(tab->pool);
    }
    PyMem_Free(self->workers);
    Py_XDECREF(self->names);
    Py_XDECREF(self->slots);
    Py_XDECREF(self->tiers);
    for (int i = 0; i < NUM_EVENT_TYPES; i++) Py_XDECREF(self->event_types[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The slot of `worker`; -1 with a KeyError if it has none. */
static int slot_of(HolderTable *self, PyObject *worker, Py_ssize_t *slot) {
    PyObject *s = PyDict_GetItemWithError(self->slots, worker);
    if (s == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, worker);
        return -1;
    }
    *slot = PyLong_AsSsize_t(s);
    return 0;
}

/* The number of `tier`; -1 on error. */
static int tier_of(HolderTable *self, PyObject *tier, int *tier_no) {
    PyObject *t = PyDict_GetItemWithError(self->tiers, tier);
    if (t == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, tier);
        return -1;
    }
    *tier_no = (int)PyLong_AsLong(t);
    if (*tier_no < 0 || *tier_no >= NUM_TIERS) {
        PyErr_SetString(PyExc_ValueError, "tier numbers must be 0..3");
        return -1;
    }
    return 0;
}

/* The slot of `worker` (KeyError if it has none) and the number of `tier`; -1 on error. */
static int resolve(HolderTable *self, PyObject *worker, PyObject *tier, Py_ssize_t *slot,
                   int *tier_no) {
    return slot_of(self, worker, slot) < 0 ? -1 : tier_of(self, tier, tier_no);
}

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

/* set_name(slot, worker): put `worker` in `slot`, with a fresh event state (no event yet,
 * no tier indexed); worker None frees the slot (whose bits must be clear). */
static PyObject *HolderTable_set_name(HolderTable *self, PyObject *args) {
    Py_ssize_t slot;
    PyObject *name;
    if (!PyArg_ParseTuple(args, "nO", &slot, &name)) return NULL;
    if (slot < 0 || slot >= MAX_WORDS * 64) {
        PyErr_Format(PyExc_ValueError, "worker slot %zd out of range", slot);
        return NULL;
    }
    Py_ssize_t nw = slot / 64 + 1;
    if (nw > self->num_words) {
        /* every wider pool first, so that running out of memory leaves all as they were */
        uint64_t *wider[NUM_TIERS] = {NULL};
        for (int t = 0; t < NUM_TIERS; t++) {
            if (widen_pool(&self->tables[t], self->num_words, nw, &wider[t]) < 0) {
                for (int u = 0; u < t; u++) PyMem_Free(wider[u]);
                return NULL;
            }
        }
        for (int t = 0; t < NUM_TIERS; t++) {
            if (wider[t] == NULL) continue;
            PyMem_Free(self->tables[t].pool);
            self->tables[t].pool = wider[t];
        }
        self->num_words = nw;
    }
    Py_ssize_t num_slots = PyList_GET_SIZE(self->names);
    if (slot >= num_slots) {
        WorkerState *workers = PyMem_Realloc(self->workers, (size_t)(slot + 1) * sizeof(*workers));
        if (workers == NULL) return PyErr_NoMemory();
        self->workers = workers;
        for (; num_slots <= slot; num_slots++)
            if (PyList_Append(self->names, Py_None) < 0) return NULL;
    }
    PyObject *old = PyList_GET_ITEM(self->names, slot);
    if (old != Py_None && PyDict_DelItem(self->slots, old) < 0) return NULL;
    if (name != Py_None) {
        PyObject *s = PyLong_FromSsize_t(slot);
        int rc = s == NULL ? -1 : PyDict_SetItem(self->slots, name, s);
        Py_XDECREF(s);
        if (rc < 0) return NULL;
    }
    memset(&self->workers[slot], 0, sizeof(WorkerState));
    self->workers[slot].last_event_id = -1;
    Py_INCREF(name);
    PyList_SetItem(self->names, slot, name);
    Py_RETURN_NONE;
}

/* ---- block work on a resolved (slot, tier) ------------------------------------------- */

/* Mark the hashes of `obj` (ints, or the items' `attr`) held by `slot` in `tier`: the number
 * newly marked (repeats once), or -1 with nothing changed when that exceeds `max_new`; -2
 * with an error set. */
static Py_ssize_t add_core(HolderTable *self, Py_ssize_t slot, int tier, PyObject *obj,
                           PyObject *attr, Py_ssize_t max_new) {
    Py_ssize_t n;
    uint64_t stack[STACK_HASHES];
    uint64_t *hashes = read_hashes_of(obj, attr, &n, stack);
    if (hashes == NULL) return -2;
    Table *t = &self->tables[tier];
    Py_ssize_t nw = self->num_words;
    if (reserve(t, t->count + (size_t)n) < 0) {
        free_hashes(hashes, stack);
        return -2;
    }
    prefetch_homes(t, hashes, n);
    Py_ssize_t num_new = 0; /* the newly set hashes are moved to hashes[0..num_new) */
    for (Py_ssize_t i = 0; i < n; i++) {
        /* a new entry is inserted empty and takes its first holder inline: only an entry
         * that had INLINE_HOLDERS already may fail, and it is left as it was */
        int added = add_holder(t, nw, upsert(t, hashes[i]), slot);
        if (added < 0) {
            for (Py_ssize_t j = 0; j < num_new; j++) clear_bit(t, nw, hashes[j], slot);
            free_hashes(hashes, stack);
            return -2;
        }
        if (added) hashes[num_new++] = hashes[i];
    }
    if (num_new > max_new) {
        for (Py_ssize_t i = 0; i < num_new; i++) clear_bit(t, nw, hashes[i], slot);
        num_new = -1;
    } else {
        self->workers[slot].count[tier] += num_new;
    }
    free_hashes(hashes, stack);
    return num_new;
}

/* Unmark the hashes of `obj` for `slot` in `tier`: how many were marked; -1 on error. */
static Py_ssize_t remove_core(HolderTable *self, Py_ssize_t slot, int tier, PyObject *obj) {
    Py_ssize_t n;
    uint64_t stack[STACK_HASHES];
    uint64_t *hashes = read_hashes(obj, &n, stack);
    if (hashes == NULL) return -1;
    Py_ssize_t num_removed = 0;
    prefetch_homes(&self->tables[tier], hashes, n);
    for (Py_ssize_t i = 0; i < n; i++)
        num_removed += clear_bit(&self->tables[tier], self->num_words, hashes[i], slot);
    free_hashes(hashes, stack);
    self->workers[slot].count[tier] -= num_removed;
    return num_removed;
}

/* The keys of `t` whose entry has slot's bit (any bit for slot < 0), as a fresh array. */
static uint64_t *keys_of(const Table *t, Py_ssize_t nw, Py_ssize_t slot, Py_ssize_t *n) {
    uint64_t *out = PyMem_Malloc(t->count ? t->count * sizeof(uint64_t) : 1);
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *n = 0;
    for (size_t i = 0; i < t->capacity; i++) {
        const uint64_t *e = entry(t, i);
        int held = slot < 0 ? e[1] != 0 : holds(t, e[1], nw, slot);
        if (held) out[(*n)++] = e[0];
    }
    return out;
}

/* Unmark everything `slot` holds in `tier`: how many there were; -1 on error. */
static Py_ssize_t clear_core(HolderTable *self, Py_ssize_t slot, int tier) {
    Py_ssize_t n;
    Table *t = &self->tables[tier];
    if (self->workers[slot].count[tier] == 0) return 0;
    uint64_t *keys = keys_of(t, self->num_words, slot, &n);
    if (keys == NULL) return -1;
    for (Py_ssize_t i = 0; i < n; i++) clear_bit(t, self->num_words, keys[i], slot);
    PyMem_Free(keys);
    self->workers[slot].count[tier] -= n;
    return n;
}

/* ---- block methods ----------------------------------------------------------------------- */

/* add(worker, tier, seq_hashes, max_new) -> int: mark each hash held by worker in tier; the
 * number newly marked (repeats once), or -1 with nothing changed when that exceeds max_new.
 * add_blocks(worker, tier, blocks, max_new): the same for the blocks' `seq_hash`es. */
static PyObject *add_hashes(HolderTable *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *attr) {
    Py_ssize_t slot;
    int tier;
    if (check_nargs("add", nargs, 4) < 0 || resolve(self, args[0], args[1], &slot, &tier) < 0)
        return NULL;
    Py_ssize_t max_new = PyLong_AsSsize_t(args[3]);
    if (max_new == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t num_new = add_core(self, slot, tier, args[2], attr, max_new);
    return num_new == -2 ? NULL : PyLong_FromSsize_t(num_new);
}

static PyObject *HolderTable_add(HolderTable *self, PyObject *const *args, Py_ssize_t nargs) {
    return add_hashes(self, args, nargs, NULL);
}

static PyObject *HolderTable_add_blocks(HolderTable *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    return add_hashes(self, args, nargs, seq_hash_name);
}

/* remove(worker, tier, seq_hashes) -> int: unmark each hash; how many were marked. */
static PyObject *HolderTable_remove(HolderTable *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t slot;
    int tier;
    if (check_nargs("remove", nargs, 3) < 0 || resolve(self, args[0], args[1], &slot, &tier) < 0)
        return NULL;
    Py_ssize_t num_removed = remove_core(self, slot, tier, args[2]);
    return num_removed < 0 ? NULL : PyLong_FromSsize_t(num_removed);
}

/* get_hashes(worker, tier) -> set[int]: the hashes worker holds in tier (worker None:
 * those anyone holds). */
static PyObject *HolderTable_get_hashes(HolderTable *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    Py_ssize_t slot = -1, n;
    int tier;
    if (check_nargs("get_hashes", nargs, 2) < 0) return NULL;
    if (args[0] == Py_None) { /* anyone: only the tier to resolve */
        if (tier_of(self, args[1], &tier) < 0) return NULL;
    } else if (resolve(self, args[0], args[1], &slot, &tier) < 0) {
        return NULL;
    }
    uint64_t *keys = keys_of(&self->tables[tier], self->num_words, slot, &n);
    if (keys == NULL) return NULL;
    PyObject *out = PySet_New(NULL);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *item = PyLong_FromUnsignedLongLong(keys[i]);
        if (item == NULL || PySet_Add(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    PyMem_Free(keys);
    return out;
}

/* clear(worker, tier) -> int: unmark everything worker holds in tier; how many there were. */
static PyObject *HolderTable_clear(HolderTable *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t slot;
    int tier;
    if (check_nargs("clear", nargs, 2) < 0 || resolve(self, args[0], args[1], &slot, &tier) < 0)
        return NULL;
    Py_ssize_t n = clear_core(self, slot, tier);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

/* ---- worker state and events ------------------------------------------------------------ */

/* set_capacity(worker, tier, capacity_blocks): 0 stops indexing the tier (its blocks must
 * have been cleared). */
static PyObject *HolderTable_set_capacity(HolderTable *self, PyObject *const *args,
                                          Py_ssize_t nargs) {
    Py_ssize_t slot;
    int tier;
    if (check_nargs("set_capacity", nargs, 3) < 0 ||
        resolve(self, args[0], args[1], &slot, &tier) < 0)
        return NULL;
    Py_ssize_t capacity = PyLong_AsSsize_t(args[2]);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    if (capacity < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity_blocks must be >= 0");
        return NULL;
    }
    self->workers[slot].capacity[tier] = capacity;
    Py_RETURN_NONE;
}

/* get_capacity(worker, tier) -> int (0: not indexed); get_count(worker, tier) -> int. */
static PyObject *get_state_field(HolderTable *self, PyObject *const *args, Py_ssize_t nargs,
                                 int capacity) {
    Py_ssize_t slot;
    int tier;
    if (check_nargs(capacity ? "get_capacity" : "get_count", nargs, 2) < 0 ||
        resolve(self, args[0], args[1], &slot, &tier) < 0)
        return NULL;
    const WorkerState *w = &self->workers[slot];
    return PyLong_FromSsize_t(capacity ? w->capacity[tier] : w->count[tier]);
}

static PyObject *HolderTable_get_capacity(HolderTable *self, PyObject *const *args,
                                          Py_ssize_t nargs) {
    return get_state_field(self, args, nargs, 1);
}

static PyObject *HolderTable_get_count(HolderTable *self, PyObject *const *args,
                                       Py_ssize_t nargs) {
    return get_state_field(self, args, nargs, 0);
}

/* is_stale(worker) -> bool */
static PyObject *HolderTable_is_stale(HolderTable *self, PyObject *worker) {
    Py_ssize_t slot;
    if (slot_of(self, worker, &slot) < 0) return NULL;
    return PyBool_FromLong(self->workers[slot].stale);
}

/* set_synced(worker, last_event_id): the worker's blocks are now as of that event (a dump):
 * not stale, the next event expected is last_event_id + 1. */
static PyObject *HolderTable_set_synced(HolderTable *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    Py_ssize_t slot;
    if (check_nargs("set_synced", nargs, 2) < 0 || slot_of(self, args[0], &slot) < 0)
        return NULL;
    long long last_event_id = PyLong_AsLongLong(args[1]);
    if (last_event_id == -1 && PyErr_Occurred()) return NULL;
    self->workers[slot].last_event_id = last_event_id;
    self->workers[slot].stale = 0;
    Py_RETURN_NONE;
}

/* The tier number of `event`'s tier and its capacity for `slot` (0: not indexed); -1 on
 * error. */
static int event_tier(HolderTable *self, PyObject *event, Py_ssize_t slot, int *tier,
                      Py_ssize_t *capacity) {
    PyObject *tier_obj = PyObject_GetAttr(event, tier_name);
    if (tier_obj == NULL) return -1;
    int rc = tier_of(self, tier_obj, tier);
    Py_DECREF(tier_obj);
    if (rc == 0) *capacity = self->workers[slot].capacity[*tier];
    return rc;
}

/* apply(worker, event) -> bool: PyHolderStore.apply's rules. False when the worker is (now)
 * stale: a gap in its event ids, or a Stored event past a tier's capacity (nothing of it
 * kept); events of a stale worker are ignored. An id already seen is skipped (True). Events
 * of a tier not indexed for the worker advance its id and change nothing. */
static PyObject *HolderTable_apply(HolderTable *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t slot;
    if (check_nargs("apply", nargs, 2) < 0 || slot_of(self, args[0], &slot) < 0) return NULL;
    if (self->workers[slot].stale) Py_RETURN_FALSE;
    PyObject *event = args[1], *id_obj = PyObject_GetAttr(event, event_id_name);
    if (id_obj == NULL) return NULL;
    long long event_id = PyLong_AsLongLong(id_obj);
    Py_DECREF(id_obj);
    if (event_id == -1 && PyErr_Occurred()) return NULL;
    /* the state's address after the attribute reads (which may run Python code) */
    WorkerState *w = &self->workers[slot];
    if (event_id != w->last_event_id + 1) {
        if (event_id <= w->last_event_id) Py_RETURN_TRUE; /* covered by a later dump */
        w->stale = 1;
        Py_RETURN_FALSE;
    }
    w->last_event_id = event_id;
    PyObject *kind = (PyObject *)Py_TYPE(event);
    int tier;
    Py_ssize_t capacity;
    if (kind == self->event_types[EVENT_STORED]) {
        if (event_tier(self, event, slot, &tier, &capacity) < 0) return NULL;
        if (capacity == 0) Py_RETURN_TRUE;
        PyObject *blocks = PyObject_GetAttr(event, blocks_name);
        if (blocks == NULL) return NULL;
        Py_ssize_t num_new = add_core(self, slot, tier, blocks, seq_hash_name,
                                      capacity - self->workers[slot].count[tier]);
        Py_DECREF(blocks);
        if (num_new == -2) return NULL;
        if (num_new == -1) { /* more blocks than the tier holds: removals were missed */
            self->workers[slot].stale = 1; /* not `w`: reading the blocks ran Python code */
            Py_RETURN_FALSE;
        }
    } else if (kind == self->event_types[EVENT_REMOVED]) {
        if (event_tier(self, event, slot, &tier, &capacity) < 0) return NULL;
        if (capacity == 0) Py_RETURN_TRUE;
        PyObject *hashes = PyObject_GetAttr(event, seq_hashes_name);
        if (hashes == NULL) return NULL;
        Py_ssize_t num_removed = remove_core(self, slot, tier, hashes);
        Py_DECREF(hashes);
        if (num_removed < 0) return NULL;
    } else if (kind == self->event_types[EVENT_CLEARED]) {
        if (clear_core(self, slot, TIER_DEVICE) < 0) return NULL;
    }
    Py_RETURN_TRUE;
}

/* ---- walks ------------------------------------------------------------------------------ */

static int put_int(PyObject *dict, PyObject *names, Py_ssize_t slot, Py_ssize_t value) {
    PyObject *v = PyLong_FromSsize_t(value);
    if (v == NULL) return -1;
    int rc = PyDict_SetItem(dict, PyList_GET_ITEM(names, slot), v);
    Py_DECREF(v);
    return rc;
}

/* Put `value` under every slot set in `mask` (num_words words). */
static int put_all(PyObject *dict, PyObject *names, const uint64_t *mask, Py_ssize_t nw,
                   Py_ssize_t value) {
    for (Py_ssize_t w = 0; w < nw; w++)
        for (uint64_t m = mask[w]; m; m &= m - 1)
            if (put_int(dict, names, w * 64 + __builtin_ctzll(m), value) < 0) return -1;
    return 0;
}

/* Where a walk reads its keys: `items` are the block hashes (block_size 0), or token ids
 * hashed a block at a time as the walk reaches them (block_size tokens packed into `buf`,
 * XXH3 with `seed`, chained from the previous block's hash in `parent`): a walk that stops
 * early hashes no further. */
typedef struct {
    PyObject **items;
    Py_ssize_t block_size; /* 0: items are hashes */
    uint64_t seed, parent;
    uint8_t *buf;
} KeySource;

static int next_key(KeySource *src, Py_ssize_t depth, uint64_t *key) {
    if (src->block_size == 0) return to_hash(src->items[depth], key);
    PyObject **items = src->items + depth * src->block_size;
    for (Py_ssize_t i = 0; i < src->block_size; i++) {
        uint32_t t;
        if (read_token(items[i], &t) < 0) return -1;
        memcpy(src->buf + 4 * i, &t, 4);
    }
    uint64_t local = xxh3_64(src->buf, (size_t)src->block_size * 4, src->seed);
    *key = depth == 0 ? local : chain(src->parent, local, src->seed);
    src->parent = *key;
    return 0;
}

/* Keys this far ahead of the walk have their home entries loaded early (given hashes only: a
 * key made from tokens is not known before the walk reaches it). */
#define WALK_PREFETCH_AHEAD 8

static inline void prefetch_key(const Table *t, const KeySource *src, Py_ssize_t depth,
                                Py_ssize_t n) {
    uint64_t key;
    if (src->block_size || depth >= n || !t->capacity || !peek_u64(src->items[depth], &key))
        return;
    __builtin_prefetch(entry(t, home(key, t->capacity - 1)));
}

/* For each worker holding the first of `n` keys on its device, how many leading keys it holds
 * there (PrefixIndex.find_overlaps); keys are read only as far as some worker still matches. */
static PyObject *walk_device(HolderTable *self, KeySource *src, Py_ssize_t n) {
    Py_ssize_t nw = self->num_words;
    PyObject *out = PyDict_New();
    const Table *t = &self->tables[TIER_DEVICE];
    uint64_t active[MAX_WORDS], dropped[MAX_WORDS], key;
    if (out == NULL || n == 0) return out;
    if (next_key(src, 0, &key) < 0) goto fail;
    uint64_t buf[MAX_WORDS];
    const uint64_t *first = lookup_bits(t, nw, key, buf);
    if (first == NULL) return out;
    memcpy(active, first, (size_t)nw * sizeof(uint64_t));
    for (Py_ssize_t depth = 1; depth < n; depth++) {
        prefetch_key(t, src, depth + WALK_PREFETCH_AHEAD, n);
        if (next_key(src, depth, &key) < 0) goto fail;
        const uint64_t *bits = lookup_bits(t, nw, key, buf);
        uint64_t any_drop = 0, any_left = 0;
        for (Py_ssize_t w = 0; w < nw; w++) {
            uint64_t still = bits ? active[w] & bits[w] : 0;
            dropped[w] = active[w] & ~still;
            any_drop |= dropped[w];
            active[w] = still;
            any_left |= still;
        }
        if (any_drop && put_all(out, self->names, dropped, nw, depth) < 0) goto fail;
        if (!any_left) return out;
    }
    if (put_all(out, self->names, active, nw, n) < 0) goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* find_overlaps(seq_hashes) -> dict[worker, int]: for each worker holding the first block on
 * its device, how many leading blocks it holds there (PrefixIndex.find_overlaps). */
static PyObject *HolderTable_find_overlaps(HolderTable *self, PyObject *obj) {
    PyObject *seq = PySequence_Fast(obj, "seq_hashes must be a sequence of ints");
    if (seq == NULL) return NULL;
    KeySource src = {PySequence_Fast_ITEMS(seq), 0, 0, 0, NULL};
    PyObject *out = walk_device(self, &src, PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    return out;
}

#define STACK_BLOCK_TOKENS 256 /* a block's packed tokens fit on the stack up to this many */

/* find_token_overlaps(token_ids, block_size, seed) -> dict[worker, int]: find_overlaps of the
 * prompt's block hashes (armature.kv.hashing.compute_seq_hashes), each block hashed only when
 * the walk reaches it: a prompt whose cached prefix ends early is hashed no further (token ids
 * past that point are not read). */
static PyObject *HolderTable_find_token_overlaps(HolderTable *self, PyObject *const *args,
                                                 Py_ssize_t nargs) {
    if (check_nargs("find_token_overlaps", nargs, 3) < 0) return NULL;
    Py_ssize_t block_size = PyLong_AsSsize_t(args[1]);
    if (block_size == -1 && PyErr_Occurred()) return NULL;
    if (block_size <= 0) {
        PyErr_Format(PyExc_ValueError, "block_size must be positive, got %zd", block_size);
        return NULL;
    }
    unsigned long long seed = as_u64(args[2]);
    if (seed == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "seed must be an unsigned 64-bit integer");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "token_ids must be a sequence of ints");
    if (seq == NULL) return NULL;
    uint8_t stack[STACK_BLOCK_TOKENS * 4];
    uint8_t *buf = block_size <= STACK_BLOCK_TOKENS ? stack : PyMem_Malloc((size_t)block_size * 4);
    if (buf == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    KeySource src = {PySequence_Fast_ITEMS(seq), block_size, (uint64_t)seed, 0, buf};
    PyObject *out = walk_device(self, &src, PySequence_Fast_GET_SIZE(seq) / block_size);
    if (buf != stack) PyMem_Free(buf);
    Py_DECREF(seq);
    return out;
}

typedef struct {
    Py_ssize_t *depth;               /* by slot: where the worker's match ended (0: none) */
    Py_ssize_t *since;               /* by slot: the depth it entered its class at */
    Py_ssize_t (*lower)[3];          /* by slot: blocks from host, disk, external */
    uint64_t classes[3][MAX_WORDS];  /* workers now in the host, disk, external class */
} TierWalk;

/* Workers move from walk->classes to `now` at `depth`: one leaving a class adds the blocks
 * it spent there, one entering starts counting (every leaving first). */
static void settle(TierWalk *walk, uint64_t now[3][MAX_WORDS], Py_ssize_t nw, Py_ssize_t depth) {
    for (int c = 0; c < 3; c++)
        for (Py_ssize_t w = 0; w < nw; w++)
            for (uint64_t m = walk->classes[c][w] & ~now[c][w]; m; m &= m - 1) {
                Py_ssize_t s = w * 64 + __builtin_ctzll(m);
                walk->lower[s][c] += depth - walk->since[s];
            }
    for (int c = 0; c < 3; c++)
        for (Py_ssize_t w = 0; w < nw; w++) {
            for (uint64_t m = now[c][w] & ~walk->classes[c][w]; m; m &= m - 1)
                walk->since[w * 64 + __builtin_ctzll(m)] = depth;
            walk->classes[c][w] = now[c][w];
        }
}

/* One block of the tier walk: `active` keeps the workers that can get it; those leaving get
 * `depth`; the classes move to the tier each active worker gets it from. 0: none left. */
static int tier_step(HolderTable *self, TierWalk *walk, uint64_t *active, uint64_t key,
                     Py_ssize_t depth) {
    static const uint64_t none[MAX_WORDS];
    Py_ssize_t nw = self->num_words;
    uint64_t dev_buf[MAX_WORDS], host_buf[MAX_WORDS], disk_buf[MAX_WORDS];
    const uint64_t *dev = lookup_bits(&self->tables[TIER_DEVICE], nw, key, dev_buf);
    const uint64_t *host = lookup_bits(&self->tables[TIER_HOST], nw, key, host_buf);
    const uint64_t *disk = lookup_bits(&self->tables[TIER_DISK], nw, key, disk_buf);
    int external = lookup(&self->tables[TIER_EXTERNAL], key) != NULL;
    dev = dev ? dev : none;
    host = host ? host : none;
    disk = disk ? disk : none;
    uint64_t now[3][MAX_WORDS];
    uint64_t any_left = 0;
    for (Py_ssize_t w = 0; w < nw; w++) {
        uint64_t still = external ? active[w] : active[w] & (dev[w] | host[w] | disk[w]);
        for (uint64_t m = active[w] & ~still; m; m &= m - 1)
            if (depth) walk->depth[w * 64 + __builtin_ctzll(m)] = depth;
        active[w] = still;
        any_left |= still;
        uint64_t below = still & ~dev[w];
        now[0][w] = below & host[w];
        now[1][w] = below & ~host[w] & disk[w];
        now[2][w] = below & ~host[w] & ~disk[w];
    }
    settle(walk, now, nw, depth);
    return any_left != 0;
}

/* find_tier_overlaps(seq_hashes) -> dict[worker, (device, host, disk, external)]: for each
 * named worker that can get the first block from some tier, its matched prefix counted by
 * the fastest tier (PrefixIndex.find_tier_overlaps). */
static PyObject *HolderTable_find_tier_overlaps(HolderTable *self, PyObject *obj) {
    Py_ssize_t n, nw = self->num_words, num_slots = PyList_GET_SIZE(self->names);
    uint64_t stack[STACK_HASHES];
    uint64_t *hashes = read_hashes(obj, &n, stack);
    if (hashes == NULL) return NULL;
    TierWalk walk_state = {0}, *walk = &walk_state;
    Py_ssize_t *counts = PyMem_Calloc((size_t)nw * 64 * 5, sizeof(Py_ssize_t));
    PyObject *out = PyDict_New();
    if (counts == NULL || out == NULL) {
        free_hashes(hashes, stack);
        PyMem_Free(counts);
        Py_XDECREF(out);
        return counts == NULL ? PyErr_NoMemory() : NULL;
    }
    walk->depth = counts;
    walk->since = counts + nw * 64;
    walk->lower = (Py_ssize_t(*)[3])(counts + nw * 64 * 2);
    uint64_t active[MAX_WORDS] = {0};
    for (Py_ssize_t s = 0; s < num_slots; s++)
        if (PyList_GET_ITEM(self->names, s) != Py_None) active[s / 64] |= 1ULL << (s % 64);
    Py_ssize_t depth = 0;
    for (; depth < n; depth++)
        if (!tier_step(self, walk, active, hashes[depth], depth)) break;
    for (Py_ssize_t w = 0; w < nw; w++)
        for (uint64_t m = active[w]; m; m &= m - 1) walk->depth[w * 64 + __builtin_ctzll(m)] = depth;
    uint64_t empty[3][MAX_WORDS] = {{0}};
    settle(walk, empty, nw, depth);
    for (Py_ssize_t s = 0; s < num_slots; s++) {
        Py_ssize_t d = walk->depth[s], *lower = walk->lower[s];
        if (!d) continue;
        PyObject *v = Py_BuildValue("(nnnn)", d - lower[0] - lower[1] - lower[2], lower[0],
                                    lower[1], lower[2]);
        if (v == NULL || PyDict_SetItem(out, PyList_GET_ITEM(self->names, s), v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(v);
    }
    free_hashes(hashes, stack);
    PyMem_Free(counts);
    return out;
}

static PyMethodDef HolderTable_methods[] = {
    {"set_name", (PyCFunction)HolderTable_set_name, METH_VARARGS,
     "set_name(slot, name): the worker in slot (None: free; its bits must be clear)"},
    {"add", (PyCFunction)(void (*)(void))HolderTable_add, METH_FASTCALL,
     "add(worker, tier, seq_hashes, max_new) -> newly marked, or -1 (nothing changed)"},
    {"add_blocks", (PyCFunction)(void (*)(void))HolderTable_add_blocks, METH_FASTCALL,
     "add_blocks(worker, tier, blocks, max_new): add() of the blocks' seq_hash"},
    {"remove", (PyCFunction)(void (*)(void))HolderTable_remove, METH_FASTCALL,
     "remove(worker, tier, seq_hashes) -> how many were marked"},
    {"clear", (PyCFunction)(void (*)(void))HolderTable_clear, METH_FASTCALL,
     "clear(worker, tier) -> how many were marked"},
    {"get_hashes", (PyCFunction)(void (*)(void))HolderTable_get_hashes, METH_FASTCALL,
     "get_hashes(worker, tier) -> set of hashes (worker None: held by anyone)"},
    {"find_overlaps", (PyCFunction)HolderTable_find_overlaps, METH_O,
     "find_overlaps(seq_hashes) -> {worker: leading device blocks}"},
    {"find_token_overlaps", (PyCFunction)(void (*)(void))HolderTable_find_token_overlaps,
     METH_FASTCALL, "find_token_overlaps(token_ids, block_size, seed) -> dict[str, int]"},
    {"find_tier_overlaps", (PyCFunction)HolderTable_find_tier_overlaps, METH_O,
     "find_tier_overlaps(seq_hashes) -> {worker: (device, host, disk, external)}"},
    {"set_capacity", (PyCFunction)(void (*)(void))HolderTable_set_capacity, METH_FASTCALL,
     "set_capacity(worker, tier, capacity_blocks): 0 stops indexing the tier"},
    {"get_capacity", (PyCFunction)(void (*)(void))HolderTable_get_capacity, METH_FASTCALL,
     "get_capacity(worker, tier) -> blocks (0: not indexed)"},
    {"get_count", (PyCFunction)(void (*)(void))HolderTable_get_count, METH_FASTCALL,
     "get_count(worker, tier) -> blocks held"},
    {"is_stale", (PyCFunction)HolderTable_is_stale, METH_O, "is_stale(worker) -> bool"},
    {"set_synced", (PyCFunction)(void (*)(void))HolderTable_set_synced, METH_FASTCALL,
     "set_synced(worker, last_event_id): fresh as of that event"},
    {"apply", (PyCFunction)(void (*)(void))HolderTable_apply, METH_FASTCALL,
     "apply(worker, event) -> False if the worker is (now) stale"},
    {NULL, NULL, 0, NULL},
};

/* ---- the kv policy's cost -------------------------------------------------------------- */

static PyObject *active_prefill_tokens_name, *active_blocks_name; /* interned at import */

/* One worker's logit (armature.router.cost.cost_terms, then overlap_weight * prefill +
 * decode), in the reference's operation order. Exact ints (overlap, load) are below 2**53, so
 * their double arithmetic is the reference's integer arithmetic. */
static double cost_logit(double isl, double block_size, double total_blocks, double overlap,
                         double prefill_tokens, double active_blocks, double overlap_weight,
                         double decode_weight) {
    double prefill = (isl - overlap * block_size + prefill_tokens) / block_size;
    double active = decode_weight == 1.0 ? active_blocks : decode_weight * active_blocks;
    return overlap_weight * prefill + (active + total_blocks - overlap);
}

/* `mapping[key]` as a new reference, or NULL with no error set when `key` is absent (dicts
 * without an exception; other mappings through `in` first). */
static PyObject *mapping_get(PyObject *mapping, PyObject *key) {
    if (PyDict_CheckExact(mapping)) {
        PyObject *value = PyDict_GetItemWithError(mapping, key);
        Py_XINCREF(value);
        return value;
    }
    int has = PySequence_Contains(mapping, key);
    return has > 0 ? PyObject_GetItem(mapping, key) : NULL;
}

static int read_double(PyObject *obj, PyObject *attr, double *out) {
    if (attr == NULL && PyFloat_CheckExact(obj)) {
        *out = PyFloat_AS_DOUBLE(obj);
        return 0;
    }
    if (attr == NULL && PyLong_CheckExact(obj)) { /* an int: exactly as float(int) reads it */
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (!overflow && value > -(1LL << 53) && value < (1LL << 53)) {
            if (value == -1 && PyErr_Occurred()) return -1;
            *out = (double)value;
            return 0;
        }
    }
    PyObject *value = attr ? PyObject_GetAttr(obj, attr) : obj;
    if (value == NULL) return -1;
    *out = PyFloat_AsDouble(value);
    if (attr) Py_DECREF(value);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* ---- bounded shares and loads: capacities and fair near-ties ---------------------------- */

/* The ints of `seq` (a PySequence_Fast) into `out` (n of them); -1 with an error set. */
static int read_counts(PyObject *seq, long long *out, Py_ssize_t n) {
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(items[i]);
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* ceil(bound * (sum + 1) / n) in the reference's double operations (armature.router.cost.
 * within_capacity; ints below 2**53 are exact doubles) into *capacity, and whether some count
 * is at it into *reached; -1 with an error set when the sum leaves a long long or the
 * capacity is not finite (a NaN or infinite bound). */
static int capacity_of(const long long *counts, Py_ssize_t n, double bound, double *capacity,
                       int *reached) {
    long long sum = 1, high = 0; /* the new decision counted */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (__builtin_add_overflow(sum, counts[i], &sum)) {
            PyErr_SetString(PyExc_OverflowError, "the counts' sum is too large");
            return -1;
        }
        if (i == 0 || counts[i] > high) high = counts[i];
    }
    *capacity = ceil(bound * (double)sum / (double)n);
    if (!isfinite(*capacity)) { /* as math.ceil refuses it */
        PyErr_SetString(isnan(*capacity) ? PyExc_ValueError : PyExc_OverflowError,
                        "the capacity is not a finite number");
        return -1;
    }
    *reached = n > 0 && (double)high >= *capacity;
    return 0;
}

/* The indexes i with keep[i] as a list, or None when there are none. */
static PyObject *index_list(const char *keep, Py_ssize_t n) {
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < n; i++) kept += keep[i];
    if (kept == 0) Py_RETURN_NONE;
    PyObject *out = PyList_New(kept);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0, j = 0; i < n; i++) {
        if (!keep[i]) continue;
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j++, index);
    }
    return out;
}

/* Buffers for n counts and flags: on the stack up to 256, else on the heap. */
typedef struct {
    long long counts_stack[256];
    char keep_stack[256];
    long long *counts;
    char *keep;
} ShareBuffers;

static void buffers_close(ShareBuffers *b) {
    if (b->counts != b->counts_stack) PyMem_Free(b->counts); /* PyMem_Free(NULL) is a no-op */
    if (b->keep != b->keep_stack) PyMem_Free(b->keep);
}

/* 0, or -1 with MemoryError set and nothing left allocated. */
static int buffers_open(ShareBuffers *b, Py_ssize_t n) {
    int small = n <= 256;
    b->counts = small ? b->counts_stack : PyMem_Malloc((size_t)n * sizeof(long long));
    b->keep = small ? b->keep_stack : PyMem_Malloc((size_t)n);
    if (b->counts && b->keep) return 0;
    buffers_close(b);
    PyErr_NoMemory();
    return -1;
}

/* within_capacity(counts, bound) -> list[int] | None: armature.router.cost.within_capacity. */
static PyObject *within_capacity(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (check_nargs("within_capacity", nargs, 2) < 0) return NULL;
    double bound = PyFloat_AsDouble(args[1]);
    if (bound == -1.0 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Tuple(args[0]); /* its own: reading an int may run code */
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = NULL;
    ShareBuffers b;
    if (n == 0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "no counts to bound");
    } else if (buffers_open(&b, n) == 0) {
        int reached;
        double capacity;
        if (read_counts(seq, b.counts, n) == 0 &&
            capacity_of(b.counts, n, bound, &capacity, &reached) == 0) {
            if (!reached) {
                out = Py_NewRef(Py_None);
            } else {
                for (Py_ssize_t i = 0; i < n; i++) b.keep[i] = (double)b.counts[i] < capacity;
                out = index_list(b.keep, n);
            }
        }
        buffers_close(&b);
    }
    Py_DECREF(seq);
    return out;
}

/* ---- the kv policy's whole choice ------------------------------------------------------ */

static int read_ll(PyObject *obj, long long *out) {
    *out = PyLong_AsLongLong(obj);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *num_requests_name; /* interned at import */

/* A worker's load as (prefill tokens, blocks, requests): a WorkerLoad (a tuple of three) read
 * by position, anything else by attribute. -1 with an error set. */
static int read_load(PyObject *load, double *prefill, double *blocks, double *requests) {
    if (PyTuple_Check(load) && PyTuple_GET_SIZE(load) == 3) {
        return read_double(PyTuple_GET_ITEM(load, 0), NULL, prefill) < 0 ||
                       read_double(PyTuple_GET_ITEM(load, 1), NULL, blocks) < 0 ||
                       read_double(PyTuple_GET_ITEM(load, 2), NULL, requests) < 0
                   ? -1
                   : 0;
    }
    return read_double(load, active_prefill_tokens_name, prefill) < 0 ||
                   read_double(load, active_blocks_name, blocks) < 0 ||
                   read_double(load, num_requests_name, requests) < 0
               ? -1
               : 0;
}

typedef struct {
    double *logit;
    long long *count;
    Py_ssize_t *index; /* the candidates' positions in `workers` */
    char *idle;        /* nothing in flight */
} Candidates;

static void candidates_close(Candidates *c) {
    PyMem_Free(c->logit);
    PyMem_Free(c->count);
    PyMem_Free(c->index);
    PyMem_Free(c->idle);
}

/* Keep the candidates j < n with keep[j], in order; the number kept. */
static Py_ssize_t candidates_keep(Candidates *c, const char *keep, Py_ssize_t n) {
    Py_ssize_t m = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!keep[j]) continue;
        c->logit[m] = c->logit[j];
        c->count[m] = c->count[j];
        c->index[m] = c->index[j];
        c->idle[m] = c->idle[j];
        m++;
    }
    return m;
}

/* The logit, load and idleness of each of the n workers into `c` (worker_logits_py's
 * operations); -1 with an error set. */
static int read_candidates(Candidates *c, PyObject **workers, Py_ssize_t n, PyObject *overlaps,
                           PyObject *loads, int no_loads, double isl, double bs,
                           double total_blocks, double overlap_weight, double decode_weight) {
    double idle_logit = cost_logit(isl, bs, total_blocks, 0.0, 0.0, 0.0, overlap_weight, 1.0);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *overlap_obj = mapping_get(overlaps, workers[i]);
        if (overlap_obj == NULL && PyErr_Occurred()) return -1;
        PyObject *load = no_loads ? NULL : mapping_get(loads, workers[i]);
        if (load == NULL && PyErr_Occurred()) {
            Py_XDECREF(overlap_obj);
            return -1;
        }
        double overlap = 0.0, prefill = 0.0, blocks = 0.0, requests = 0.0;
        int bad = (overlap_obj && read_double(overlap_obj, NULL, &overlap) < 0) ||
                  (load && read_load(load, &prefill, &blocks, &requests) < 0);
        int has_load = load != NULL;
        Py_XDECREF(overlap_obj);
        Py_XDECREF(load);
        if (bad) return -1;
        c->logit[i] = !has_load && overlap == 0.0
                          ? idle_logit
                          : cost_logit(isl, bs, total_blocks, overlap, prefill, blocks,
                                       overlap_weight, decode_weight);
        c->index[i] = i;
        c->idle[i] = !has_load || requests == 0.0;
    }
    return 0;
}

/* The share cap (choose_py's first step) over the n candidates: those below the capacity at
 * `bound` when some is at it, where the cap may spill (one of them idle, not every worker
 * idle, something in flight). The number of candidates left; -1 with an error set. */
static Py_ssize_t cap_shares(Candidates *c, char *keep, Py_ssize_t n, double bound,
                             int no_loads) {
    double capacity;
    int reached;
    if (capacity_of(c->count, n, bound, &capacity, &reached) < 0) return -1;
    if (!reached || no_loads) return n;
    int kept_idle = 0, all_idle = 1, any_kept = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        keep[j] = (double)c->count[j] < capacity;
        any_kept |= keep[j];
        kept_idle |= keep[j] && c->idle[j];
        all_idle &= c->idle[j];
    }
    if (!any_kept || !kept_idle || all_idle) return n;
    return candidates_keep(c, keep, n);
}

/* The lowest and highest of the n candidates' logits, as min() and max() find them. */
static void logit_range(const Candidates *c, Py_ssize_t n, double *low, double *high) {
    *low = *high = c->logit[0];
    for (Py_ssize_t j = 1; j < n; j++) {
        if (c->logit[j] < *low) *low = c->logit[j];
        if (c->logit[j] > *high) *high = c->logit[j];
    }
}

/* The fair near-ties (fair_ties_py) among the n candidates; the number left, or -1. */
static Py_ssize_t keep_fair_ties(Candidates *c, char *keep, Py_ssize_t n, double temperature) {
    double capacity;
    int reached;
    if (capacity_of(c->count, n, 1.0, &capacity, &reached) < 0) return -1;
    if (!reached) return n;
    double low, high;
    logit_range(c, n, &low, &high);
    double near = low + temperature * (high - low);
    int any = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        keep[j] = c->logit[j] <= near && (double)c->count[j] < capacity;
        any |= keep[j];
    }
    return any ? candidates_keep(c, keep, n) : n;
}

/* softmax_pick_py over the n candidates' logits: the candidate `u` draws. */
static Py_ssize_t draw(Candidates *c, Py_ssize_t n, double temperature, double u) {
    double low, high;
    logit_range(c, n, &low, &high);
    double span = high - low, total = 0.0;
    for (Py_ssize_t j = 0; j < n; j++) { /* the logits become the running sums */
        total += span > 0 ? exp(-((c->logit[j] - low) / span) / temperature) : 1.0;
        c->logit[j] = total;
    }
    double x = u * (total + 0.0);
    for (Py_ssize_t j = 0; j < n - 1; j++)
        if (x < c->logit[j]) return j;
    return n - 1;
}

/* The positions in `workers` of the n candidates with the lowest logit. */
static PyObject *cheapest(const Candidates *c, Py_ssize_t n) {
    Py_ssize_t first = 0; /* where min() finds the lowest: with a NaN there, only it */
    for (Py_ssize_t j = 1; j < n; j++)
        if (c->logit[j] < c->logit[first]) first = j;
    double low = c->logit[first];
    PyObject *out = PyList_New(0);
    for (Py_ssize_t j = 0; out != NULL && j < n; j++) {
        if (c->logit[j] != low && j != first) continue;
        PyObject *position = PyLong_FromSsize_t(c->index[j]);
        if (position == NULL || PyList_Append(out, position) < 0) Py_CLEAR(out);
        Py_XDECREF(position);
    }
    return out;
}

/* choose(workers, isl_tokens, block_size, overlaps, loads, overlap_weight, decode_weight,
 * counts, share_bound, temperature, u) -> int | list[int]: armature.router.cost.choose (see
 * choose_py), the same float operations in the same order. */
static PyObject *choose(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (check_nargs("choose", nargs, 11) < 0) return NULL;
    PyObject *overlaps = args[3], *loads = args[4], *counts_obj = args[7];
    long long isl, block_size;
    double overlap_weight, decode_weight, share_bound, temperature, u;
    if (read_ll(args[1], &isl) < 0 || read_ll(args[2], &block_size) < 0 ||
        read_double(args[5], NULL, &overlap_weight) < 0 ||
        read_double(args[6], NULL, &decode_weight) < 0 ||
        read_double(args[8], NULL, &share_bound) < 0 ||
        read_double(args[9], NULL, &temperature) < 0 || read_double(args[10], NULL, &u) < 0)
        return NULL;
    if (block_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return NULL;
    }
    int no_loads = PyObject_IsTrue(loads);
    if (no_loads < 0) return NULL;
    no_loads = !no_loads;
    /* the workers as a tuple of their own (a tuple as it is): reading a mapping or a number
     * may run code (a key's __eq__, a value's __float__) that changes a list being read */
    PyObject *seq = PySequence_Tuple(args[0]);
    if (seq == NULL) return NULL;
    PyObject *counts_seq = NULL, *out = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    Candidates c = {NULL, NULL, NULL, NULL};
    char *keep = NULL;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "no workers to choose from");
        goto done;
    }
    if (counts_obj != Py_None) {
        counts_seq = PySequence_Tuple(counts_obj); /* its own, as the workers */
        if (counts_seq == NULL) goto done;
        if (PySequence_Fast_GET_SIZE(counts_seq) != n) {
            PyErr_SetString(PyExc_ValueError, "workers and counts differ in length");
            goto done;
        }
    }
    c.logit = PyMem_Malloc((size_t)n * sizeof(double));
    c.count = PyMem_Calloc((size_t)n, sizeof(long long));
    c.index = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    c.idle = PyMem_Malloc((size_t)n);
    keep = PyMem_Malloc((size_t)n);
    if (!c.logit || !c.count || !c.index || !c.idle || !keep) {
        PyErr_NoMemory();
        goto done;
    }
    if (counts_seq != NULL && read_counts(counts_seq, c.count, n) < 0) goto done;
    /* -(-isl // block_size), the ceiling (block_size > 0): C's division truncates towards
     * zero, so a positive remainder rounds it up; no sum or negation that could overflow */
    double total_blocks = (double)(isl / block_size + (isl % block_size > 0));
    if (read_candidates(&c, &PyTuple_GET_ITEM(seq, 0), n, overlaps, loads, no_loads,
                        (double)isl, (double)block_size, total_blocks, overlap_weight,
                        decode_weight) < 0)
        goto done;
    if (counts_seq != NULL) {
        n = cap_shares(&c, keep, n, share_bound, no_loads);
        if (n < 0) goto done;
        n = keep_fair_ties(&c, keep, n, temperature);
        if (n < 0) goto done;
    }
    out = temperature > 0 ? PyLong_FromSsize_t(c.index[draw(&c, n, temperature, u)])
                          : cheapest(&c, n);
done:
    candidates_close(&c);
    PyMem_Free(keep);
    Py_XDECREF(counts_seq);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef module_methods[] = {
    {"within_capacity", (PyCFunction)(void (*)(void))within_capacity, METH_FASTCALL,
     "within_capacity(counts, bound) -> indexes below the capacity, or None"},
    {"choose", (PyCFunction)(void (*)(void))choose, METH_FASTCALL,
     "choose(workers, isl_tokens, block_size, overlaps, loads, overlap_weight, decode_weight, "
     "counts, share_bound, temperature, u) -> the kv policy's choice"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HolderTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "armature.router._index.HolderTable",
    .tp_basicsize = sizeof(HolderTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-tier maps of block hash -> worker slots (see the module's comment).",
    .tp_new = HolderTable_new,
    .tp_init = (initproc)HolderTable_init,
    .tp_dealloc = (destructor)HolderTable_dealloc,
    .tp_methods = HolderTable_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "armature.router._index",
    "Native holder table of the prefix index, and the kv policy's choice.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__index(void) {
    seq_hash_name = PyUnicode_InternFromString("seq_hash");
    event_id_name = PyUnicode_InternFromString("event_id");
    tier_name = PyUnicode_InternFromString("tier");
    blocks_name = PyUnicode_InternFromString("blocks");
    seq_hashes_name = PyUnicode_InternFromString("seq_hashes");
    active_prefill_tokens_name = PyUnicode_InternFromString("active_prefill_tokens");
    active_blocks_name = PyUnicode_InternFromString("active_blocks");
    num_requests_name = PyUnicode_InternFromString("num_requests");
    if (!active_prefill_tokens_name || !active_blocks_name || !num_requests_name) return NULL;
    if (!seq_hash_name || !event_id_name || !tier_name || !blocks_name || !seq_hashes_name)
        return NULL;
    if (PyType_Ready(&HolderTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&HolderTableType);
    if (PyModule_AddObject(m, "HolderTable", (PyObject *)&HolderTableType) < 0) {
        Py_DECREF(&HolderTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
