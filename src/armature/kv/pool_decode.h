/* PoolCore.run_decodes: the stretch loop of a decode run (armature.engines.native.decode_run,
 * DecodeRun._run_python is the reference, tests hold the two equal), for a mocker on a virtual
 * clock, in C: included by _pool.c, whose pool state it changes directly.
 *
 * A stretch is steps of one length, from a step that may allocate to the next allocation. Per
 * stretch the Python loop made ~23 calls (the allocation and its Removed event, the step time,
 * the clock, the step record, each due block's mock tokens, hash, caching and Stored event);
 * here one: the step time (`step_ms_of`, the runner's timing model), plus the event log's for
 * the events. What it does, in the Python loop's order:
 *
 *     due allocations   one block each (the pool's allocate(1), its evictions Removed)
 *     the stretch       up to the next allocation, the finish or the first step ending at or
 *                       after the horizon: its step ends (one add each), the clock's seconds
 *                       (one add each), one entry (`entry_type`) of its step records
 *     due registrations each request caught up to the step (its mock tokens: XXH3-64(seed) of
 *                       "<request id>/<position>" modulo the vocabulary), its new full blocks
 *                       hashed, cached and Stored
 *
 * The run's heaps of (step, request) stay Python lists of tuples between calls (read into C
 * at the start, written back in heap order at the end).
 */

#include "token_blocks.h"
#include "xxh3.h"

enum { DECODE_SUSPENDED = 0, DECODE_DONE = 1, DECODE_PREEMPTED = 2, DECODE_NO_FIT = 3 };

typedef struct {
    int64_t step;
    Py_ssize_t j;
} Due;

typedef struct {
    Due *items;
    Py_ssize_t size;
} DueHeap;

static inline int due_less(Due a, Due b) {
    return a.step < b.step || (a.step == b.step && a.j < b.j);
}

static void heap_push(DueHeap *h, Due d) {
    Py_ssize_t i = h->size++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (!due_less(d, h->items[up])) break;
        h->items[i] = h->items[up];
        i = up;
    }
    h->items[i] = d;
}

/* Put `d` at slot `i` or below, where its children's subtrees are heaps. */
static void sift_down(DueHeap *h, Py_ssize_t i, Due d) {
    Py_ssize_t n = h->size;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && due_less(h->items[c + 1], h->items[c])) c++;
        if (!due_less(h->items[c], d)) break;
        h->items[i] = h->items[c];
        i = c;
    }
    h->items[i] = d;
}

static Due heap_pop(DueHeap *h) {
    Due top = h->items[0];
    Due last = h->items[--h->size];
    if (h->size > 0) sift_down(h, 0, last);
    return top;
}

/* A Python heap (list of (step, j) tuples) into `h` (capacity n); -1 on a bad item. */
static int heap_read(PyObject *list, DueHeap *h, Py_ssize_t n) {
    Py_ssize_t size = PyList_GET_SIZE(list);
    if (size != n) {
        PyErr_SetString(PyExc_ValueError, "a decode run's heap holds one entry per request");
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "a decode run's heap holds (step, request) tuples");
            return -1;
        }
        long long step = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0));
        Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
        if (PyErr_Occurred()) return -1;
        if (j < 0 || j >= n) {
            PyErr_SetString(PyExc_IndexError, "a decode run's heap names no such request");
            return -1;
        }
        h->items[i].step = step;
        h->items[i].j = j;
    }
    h->size = size;
    for (Py_ssize_t i = size / 2 - 1; i >= 0; i--) /* a heap whatever order it came in */
        sift_down(h, i, h->items[i]);
    return 0;
}

/* `h` back into the Python list, in its (heap) order. */
static int heap_write(PyObject *list, const DueHeap *h) {
    PyObject *items = PyList_New(h->size);
    if (items == NULL) return -1;
    for (Py_ssize_t i = 0; i < h->size; i++) {
        PyObject *t = Py_BuildValue("(Ln)", (long long)h->items[i].step, h->items[i].j);
        if (t == NULL) {
            Py_DECREF(items);
            return -1;
        }
        PyList_SET_ITEM(items, i, t);
    }
    int failed = PyList_SetSlice(list, 0, PyList_GET_SIZE(list), items);
    Py_DECREF(items);
    return failed;
}

/* ---- one request's state (a RequestState: attributes by name) ---------------------------- */

typedef struct {
    PyObject *num_computed_tokens, *block_ids, *token_ids, *block_hashes,
        *num_registered_blocks, *hash_seed, *request_id, *extend;
} Names;

static Names names;
static int names_ready;

static int names_init(void) {
    if (names_ready) return 0;
    names.num_computed_tokens = PyUnicode_InternFromString("num_computed_tokens");
    names.block_ids = PyUnicode_InternFromString("block_ids");
    names.token_ids = PyUnicode_InternFromString("token_ids");
    names.block_hashes = PyUnicode_InternFromString("block_hashes");
    names.num_registered_blocks = PyUnicode_InternFromString("num_registered_blocks");
    names.hash_seed = PyUnicode_InternFromString("hash_seed");
    names.request_id = PyUnicode_InternFromString("request_id");
    names.extend = PyUnicode_InternFromString("extend");
    names_ready = names.num_computed_tokens && names.block_ids && names.token_ids &&
                  names.block_hashes && names.num_registered_blocks && names.hash_seed &&
                  names.request_id && names.extend;
    return names_ready ? 0 : -1; /* a failed intern is tried again on the next call */
}

static int set_ssize(PyObject *obj, PyObject *name, Py_ssize_t value) {
    PyObject *v = PyLong_FromSsize_t(value);
    if (v == NULL) return -1;
    int failed = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return failed;
}

static Py_ssize_t get_ssize(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return n;
}

/* An attribute that must be a list (block_ids, block_hashes): a new reference. */
static PyObject *get_list(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v != NULL && !PyList_Check(v)) {
        PyErr_Format(PyExc_TypeError, "a request's %U must be a list", name);
        Py_CLEAR(v);
    }
    return v;
}

/* Extend `tokens` (a list or a sequence with `extend`) with the mock tokens of positions
 * len(tokens)..stop-1 of request `request_id`: what the mocker's get_tokens gives. */
static int append_mock_tokens(PyObject *tokens, PyObject *request_id, Py_ssize_t stop,
                              uint64_t seed, uint64_t vocab_size) {
    Py_ssize_t start = PySequence_Size(tokens);
    if (start < 0) return -1;
    if (start >= stop) return 0;
    Py_ssize_t id_len;
    const char *id = PyUnicode_AsUTF8AndSize(request_id, &id_len);
    if (id == NULL) return -1;
    char *buf = PyMem_Malloc((size_t)id_len + 32);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(buf, id, (size_t)id_len);
    buf[id_len] = '/';
    size_t head = (size_t)id_len + 1;
    PyObject *made = PyList_New(stop - start);
    if (made == NULL) {
        PyMem_Free(buf);
        return -1;
    }
    for (Py_ssize_t p = start; p < stop; p++) {
        PyObject *item = PyLong_FromUnsignedLongLong(mock_token(buf, head, p, seed, vocab_size));
        if (item == NULL) {
            PyMem_Free(buf);
            Py_DECREF(made);
            return -1;
        }
        PyList_SET_ITEM(made, p - start, item);
    }
    PyMem_Free(buf);
    int failed;
    if (PyList_CheckExact(tokens)) {
        failed = PyList_SetSlice(tokens, start, start, made);
    } else {
        PyObject *r = PyObject_CallMethodOneArg(tokens, names.extend, made);
        failed = r == NULL;
        Py_XDECREF(r);
    }
    Py_DECREF(made);
    return failed ? -1 : 0;
}

/* Extend `hashes` (the request's block_hashes) to every full block of `tokens`: the
 * (seq, local) pairs RequestState.update_block_hashes would add. */
static int update_block_hashes(PyObject *hashes, PyObject *tokens, Py_ssize_t block_size,
                               uint64_t seed) {
    Py_ssize_t num_tokens = PySequence_Size(tokens);
    if (num_tokens < 0) return -1;
    Py_ssize_t have = PyList_GET_SIZE(hashes), num_full = num_tokens / block_size;
    if (num_full <= have) return 0;
    uint64_t parent = 0;
    int has_parent = have > 0;
    if (has_parent) {
        PyObject *last = PyList_GET_ITEM(hashes, have - 1);
        if (!PyTuple_Check(last) || PyTuple_GET_SIZE(last) != 2 ||
            read_u64(PyTuple_GET_ITEM(last, 0), &parent) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "block hashes must be (seq, local) tuples");
            return -1;
        }
    }
    Py_ssize_t num_blocks;
    uint8_t *buf = pack_tokens(tokens, block_size, have * block_size, &num_blocks);
    if (buf == NULL) return -1;
    const size_t step = (size_t)block_size * 4;
    for (Py_ssize_t i = 0; i < num_blocks; i++) {
        uint64_t local;
        uint64_t seq = hash_block(buf + (size_t)i * step, step, seed, &has_parent, &parent, &local);
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)seq, (unsigned long long)local);
        if (pair == NULL || PyList_Append(hashes, pair) < 0) {
            Py_XDECREF(pair);
            PyMem_Free(buf);
            return -1;
        }
        Py_DECREF(pair);
    }
    PyMem_Free(buf);
    return 0;
}

static PyObject *PoolCore_cache_blocks(PoolCore *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *PoolCore_allocate(PoolCore *self, PyObject *arg);

static int read_ll(PyObject *obj, long long *out) {
    *out = PyLong_AsLongLong(obj);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int read_double(PyObject *obj, double *out) {
    *out = PyFloat_AsDouble(obj);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* Call fn(a, b[, c]) and drop the result. */
static int call_drop(PyObject *fn, PyObject *a, PyObject *b, PyObject *c) {
    PyObject *args[3] = {a, b, c};
    PyObject *r = PyObject_Vectorcall(fn, args, c == NULL ? 2 : 3, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

typedef struct {
    PyObject *stored, *removed, *tier, *block_type;
    Py_ssize_t block_size;
    uint64_t token_seed, vocab_size;
} DecodeEnv;

/* KvCacheManager.register_full_blocks of request `r` after it is caught up to `num_computed`
 * tokens (`_sync`): its mock tokens, new full blocks hashed, cached, Stored. */
static int register_due(PoolCore *self, const DecodeEnv *env, PyObject *r,
                        Py_ssize_t num_computed) {
    if (set_ssize(r, names.num_computed_tokens, num_computed) < 0) return -1;
    PyObject *tokens = PyObject_GetAttr(r, names.token_ids);
    if (tokens == NULL) return -1;
    PyObject *request_id = NULL, *hashes = NULL, *ids = NULL, *slice = NULL, *parent = NULL,
             *runs = NULL, *block_ids = NULL;
    int status = -1;
    Py_ssize_t bs = env->block_size;
    request_id = PyObject_GetAttr(r, names.request_id);
    if (request_id == NULL ||
        append_mock_tokens(tokens, request_id, num_computed, env->token_seed, env->vocab_size) < 0)
        goto done;
    Py_ssize_t num_full = num_computed / bs;
    Py_ssize_t start = get_ssize(r, names.num_registered_blocks);
    if (start == -1 && PyErr_Occurred()) goto done;
    if (num_full <= start) {
        status = 0;
        goto done;
    }
    hashes = get_list(r, names.block_hashes);
    if (hashes == NULL) goto done;
    PyObject *seed_obj = PyObject_GetAttr(r, names.hash_seed);
    if (seed_obj == NULL) goto done;
    uint64_t seed;
    int bad_seed = read_u64(seed_obj, &seed) < 0;
    Py_DECREF(seed_obj);
    if (bad_seed || update_block_hashes(hashes, tokens, bs, seed) < 0) goto done;
    if (num_full > PyList_GET_SIZE(hashes)) {
        PyErr_SetString(PyExc_IndexError, "fewer block hashes than full blocks");
        goto done;
    }
    if (start > 0) {
        PyObject *before = PyList_GET_ITEM(hashes, start - 1);
        if (!PyTuple_Check(before) || PyTuple_GET_SIZE(before) != 2) {
            PyErr_SetString(PyExc_TypeError, "block hashes must be (seq, local) tuples");
            goto done;
        }
        parent = Py_NewRef(PyTuple_GET_ITEM(before, 0));
    } else {
        parent = Py_NewRef(Py_None);
    }
    block_ids = get_list(r, names.block_ids);
    if (block_ids == NULL) goto done;
    ids = PyList_GetSlice(block_ids, start, num_full);
    slice = PyList_GetSlice(hashes, start, num_full);
    if (ids == NULL || slice == NULL) goto done;
    PyObject *args[4] = {ids, slice, parent, env->block_type};
    runs = PoolCore_cache_blocks(self, args, 4);
    if (runs == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(runs); i++) {
        PyObject *run = PyList_GET_ITEM(runs, i);
        if (call_drop(env->stored, PyTuple_GET_ITEM(run, 0), PyTuple_GET_ITEM(run, 1),
                      env->tier) < 0)
            goto done;
    }
    if (set_ssize(r, names.num_registered_blocks, num_full) < 0) goto done;
    status = 0;
done:
    Py_DECREF(tokens);
    Py_XDECREF(request_id);
    Py_XDECREF(hashes);
    Py_XDECREF(block_ids);
    Py_XDECREF(ids);
    Py_XDECREF(slice);
    Py_XDECREF(parent);
    Py_XDECREF(runs);
    return status;
}

/* One more block for request `r` at `num_computed` computed tokens (its blocks hold exactly
 * them), as _allocate_due gives it: allocate(1), the evicted hashes Removed. */
static int allocate_due(PoolCore *self, const DecodeEnv *env, PyObject *r,
                        Py_ssize_t num_computed, PyObject *one) {
    if (set_ssize(r, names.num_computed_tokens, num_computed) < 0) return -1;
    PyObject *block_ids = get_list(r, names.block_ids);
    if (block_ids == NULL) return -1;
    int status = -1;
    PyObject *got = NULL;
    if (PyList_GET_SIZE(block_ids) * env->block_size != num_computed) {
        PyErr_SetString(PyExc_AssertionError, "a due request's blocks hold more than its tokens");
        goto done;
    }
    got = PoolCore_allocate(self, one);
    if (got == NULL) goto done;
    PyObject *ids = PyTuple_GET_ITEM(got, 0), *evicted = PyTuple_GET_ITEM(got, 1);
    if (PyList_SetSlice(block_ids, PyList_GET_SIZE(block_ids), PyList_GET_SIZE(block_ids), ids) < 0)
        goto done;
    if (PyList_GET_SIZE(evicted) > 0 && call_drop(env->removed, evicted, env->tier, NULL) < 0)
        goto done;
    status = 0;
done:
    Py_DECREF(block_ids);
    Py_XDECREF(got);
    return status;
}

/* run_decodes(running, start_computed, allocations, registrations, step, kv_tokens, last_step,
 *             step_end_ms, now_ms, horizon_ms, step_ms_of, now_s, token_seed, vocab_size,
 *             block_size, block_type, stored, removed, tier, entries, entry_type,
 *             queued_requests, queued_tokens, decode_poly, progress)
 *   -> (status, step, kv_tokens); `progress` set to [now_s, last_step_ms, num_steps] of the
 *   steps that ran, also when the call raises
 * status: 0 suspended at the horizon (step: the next to run), 1 done at the finish (step: the
 * last), 2 the allocations due at `step` do not fit after steps ran (the run ends at step - 1),
 * 3 they do not fit before any step ran. decode_poly: None, or (a, b, c, min_ms, speedup): a
 * step takes max(min_ms, a u^2 + b u + c) / speedup ms at u = this pool's blocks in use over
 * its blocks (PolynomialTiming's decode, evaluated in its order: no fused multiply-adds,
 * _pool.c is built with -ffp-contract=off), instead of calling step_ms_of. */
static PyObject *PoolCore_run_decodes(PoolCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (ready(self) < 0 || names_init() < 0) return NULL;
    if (nargs != 25) {
        PyErr_SetString(PyExc_TypeError, "run_decodes takes 25 arguments");
        return NULL;
    }
    double poly[5] = {0.0, 0.0, 0.0, 0.0, 1.0};
    int has_poly = args[23] != Py_None;
    if (has_poly) {
        if (!PyTuple_Check(args[23]) || PyTuple_GET_SIZE(args[23]) != 5) {
            PyErr_SetString(PyExc_TypeError, "decode_poly: None or (a, b, c, min_ms, speedup)");
            return NULL;
        }
        for (int i = 0; i < 5; i++) {
            poly[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[23], i));
            if (poly[i] == -1.0 && PyErr_Occurred()) return NULL;
        }
    }
    PyObject *running = args[0], *start_computed = args[1], *allocations = args[2],
             *registrations = args[3], *step_end_ms = args[7], *step_ms_of = args[10],
             *entries = args[19], *entry_type = args[20];
    if (!PyList_Check(running) || !PyList_Check(start_computed) || !PyList_Check(allocations) ||
        !PyList_Check(registrations) || !PyList_Check(step_end_ms) || !PyList_Check(entries) ||
        !PyType_Check(entry_type) || !PyType_IsSubtype((PyTypeObject *)entry_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "run_decodes: lists of the run's state, a tuple type");
        return NULL;
    }
    long long step, kv_tokens, last_step;
    double now_ms, horizon_ms, now_s;
    DecodeEnv env = {.stored = args[16], .removed = args[17], .tier = args[18],
                     .block_type = args[15]};
    if (read_ll(args[4], &step) < 0 || read_ll(args[5], &kv_tokens) < 0 ||
        read_ll(args[6], &last_step) < 0 || read_double(args[8], &now_ms) < 0 ||
        read_double(args[9], &horizon_ms) < 0 || read_double(args[11], &now_s) < 0)
        return NULL;
    env.block_size = PyLong_AsSsize_t(args[14]);
    if (env.block_size == -1 && PyErr_Occurred()) return NULL;
    unsigned long long seed = PyLong_AsUnsignedLongLong(args[12]);
    if (seed == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    unsigned long long vocab = PyLong_AsUnsignedLongLong(args[13]);
    if (vocab == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    env.token_seed = (uint64_t)seed;
    env.vocab_size = (uint64_t)vocab;
    if (env.block_size <= 0 || env.vocab_size == 0) {
        PyErr_SetString(PyExc_ValueError, "block_size and vocab_size must be positive");
        return NULL;
    }
    PyObject *progress = args[24];
    if (!PyList_Check(progress)) {
        PyErr_SetString(PyExc_TypeError, "progress must be a list");
        return NULL;
    }
    /* the batch held for the call: the requests stay alive whatever a callback does */
    PyObject *batch = PySequence_Tuple(args[0]);
    if (batch == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(batch);
    if (n == 0 || PyList_GET_SIZE(start_computed) != n) {
        Py_DECREF(batch);
        PyErr_SetString(PyExc_ValueError, "a decode run needs requests and their start");
        return NULL;
    }
    Py_ssize_t *start = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    Due *alloc_items = PyMem_Malloc((size_t)n * sizeof(Due));
    Due *reg_items = PyMem_Malloc((size_t)n * sizeof(Due));
    Py_ssize_t *due = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    PyObject *one = PyLong_FromLong(1), *result = NULL;
    DueHeap allocs = {alloc_items, 0}, regs = {reg_items, 0};
    PyObject *queued_requests = args[21], *queued_tokens = args[22];
    int status = -1;
    long long num_steps = 0;
    double last_step_ms = 0.0;
    const Py_ssize_t bs = env.block_size;
    if (start == NULL || alloc_items == NULL || reg_items == NULL || due == NULL || one == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        start[j] = PyLong_AsSsize_t(PyList_GET_ITEM(start_computed, j));
        if (start[j] == -1 && PyErr_Occurred()) goto out;
    }
    if (heap_read(allocations, &allocs, n) < 0 || heap_read(registrations, &regs, n) < 0)
        goto out;
    for (;;) {
        if (allocs.items[0].step == step) {
            Py_ssize_t num_due = 0;
            while (allocs.size > 0 && allocs.items[0].step == step) due[num_due++] = heap_pop(&allocs).j;
            if (num_due > num_free(self)) {
                status = PyList_GET_SIZE(step_end_ms) == 0 ? DECODE_NO_FIT : DECODE_PREEMPTED;
                break;
            }
            for (Py_ssize_t k = 0; k < num_due; k++) {
                Py_ssize_t j = due[k];
                if (allocate_due(self, &env, PyTuple_GET_ITEM(batch, j), start[j] + step, one) <
                    0)
                    goto fail;
                heap_push(&allocs, (Due){step + bs, j});
            }
        }
        long long last = allocs.items[0].step - 1;
        if (last_step < last) last = last_step;
        long long kv_used = (long long)(self->next_fresh - self->num_listed) * bs;
        double step_ms;
        if (has_poly) {
            double u = (double)(self->next_fresh - self->num_listed) / (double)self->num_blocks;
            double v = poly[0] * u * u + poly[1] * u + poly[2];
            step_ms = (poly[3] >= v ? poly[3] : v) / poly[4];
        } else {
            PyObject *call_args[2] = {PyLong_FromSsize_t(n), PyLong_FromLongLong(kv_tokens)};
            PyObject *ms_obj = NULL;
            if (call_args[0] != NULL && call_args[1] != NULL)
                ms_obj = PyObject_Vectorcall(step_ms_of, call_args, 2, NULL);
            Py_XDECREF(call_args[0]);
            Py_XDECREF(call_args[1]);
            if (ms_obj == NULL) goto fail;
            step_ms = PyFloat_AsDouble(ms_obj);
            Py_DECREF(ms_obj);
            if (step_ms == -1.0 && PyErr_Occurred()) goto fail;
        }
        Py_ssize_t num_ends = PyList_GET_SIZE(step_end_ms);
        double t_ms = now_ms;
        if (num_ends) {
            t_ms = PyFloat_AsDouble(PyList_GET_ITEM(step_end_ms, num_ends - 1));
            if (t_ms == -1.0 && PyErr_Occurred()) goto fail;
        }
        long long count = 0;
        for (long long s = step; s <= last; s++) {
            t_ms += step_ms;
            PyObject *end = PyFloat_FromDouble(t_ms);
            if (end == NULL || PyList_Append(step_end_ms, end) < 0) {
                Py_XDECREF(end);
                goto fail;
            }
            Py_DECREF(end);
            count++;
            if (t_ms >= horizon_ms) break;
        }
        if (count == 0) {
            PyErr_SetString(PyExc_AssertionError, "a stretch of no steps");
            goto fail;
        }
        double seconds = step_ms / 1000.0, start_s = now_s;
        for (long long s = 0; s < count; s++) now_s += seconds;
        PyObject *fields = Py_BuildValue("(nLLOOddL)", n, kv_tokens, kv_used, queued_requests,
                                         queued_tokens, start_s, seconds, count);
        if (fields == NULL) goto fail;
        PyObject *packed = PyTuple_Pack(1, fields);
        Py_DECREF(fields);
        if (packed == NULL) goto fail;
        PyObject *entry = PyTuple_Type.tp_new((PyTypeObject *)entry_type, packed, NULL);
        Py_DECREF(packed);
        if (entry == NULL) goto fail;
        int failed = PyList_Append(entries, entry);
        Py_DECREF(entry);
        if (failed < 0) goto fail;
        num_steps += count;
        last_step_ms = step_ms;
        step += count - 1;
        kv_tokens += (long long)n * count;
        while (regs.size > 0 && regs.items[0].step <= step) {
            Due d = heap_pop(&regs);
            if (register_due(self, &env, PyTuple_GET_ITEM(batch, d.j),
                             start[d.j] + (Py_ssize_t)d.step + 1) < 0)
                goto fail;
            heap_push(&regs, (Due){d.step + bs, d.j});
        }
        if (step == last_step) {
            status = DECODE_DONE;
            break;
        }
        if (t_ms >= horizon_ms) {
            step += 1;
            status = DECODE_SUSPENDED;
            break;
        }
        step += 1;
    }
    if (heap_write(allocations, &allocs) < 0 || heap_write(registrations, &regs) < 0) goto fail;
    result = Py_BuildValue("(iLL)", status, step, kv_tokens);
    if (result == NULL) goto fail;
    goto out;
fail: {
    /* the heaps as far as they got: the run is broken either way, its state stays readable */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (heap_write(allocations, &allocs) < 0 || heap_write(registrations, &regs) < 0)
        PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}
out: {
    /* what ran, whether or not the call got to the end: the caller catches the clock up */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *done = Py_BuildValue("[ddL]", now_s, last_step_ms, num_steps);
    if (done == NULL || PyList_SetSlice(progress, 0, PyList_GET_SIZE(progress), done) < 0) {
        Py_CLEAR(result);
        if (type == NULL) PyErr_Fetch(&type, &value, &traceback);
        else PyErr_Clear();
    }
    Py_XDECREF(done);
    PyErr_Restore(type, value, traceback);
}
    PyMem_Free(start);
    PyMem_Free(alloc_items);
    PyMem_Free(reg_items);
    PyMem_Free(due);
    Py_XDECREF(one);
    Py_DECREF(batch);
    return result;
}
