/* An int in [0, 2**64) read as unsigned 64 bits, for the extensions that take block hashes.
 *
 * PyLong_AsUnsignedLongLong packs any int of more than one 30-bit digit through
 * _PyLong_AsByteArray, a general byte-order routine that was the largest single cost of
 * reading hashes (a replay reads ~100M of them). An int known to be non-negative and at most
 * 64 bits wide is read exactly by PyLong_AsUnsignedLongLongMask, which shifts its digits in
 * directly; anything else goes to PyLong_AsUnsignedLongLong, which raises as it always has.
 */
#ifndef ARMATURE_PYINT_H
#define ARMATURE_PYINT_H

#include <Python.h>
#include <stdint.h>

/* PyLong_AsUnsignedLongLong(v), faster: (unsigned long long)-1 with an exception set on a
 * non-int, a negative int or one of more than 64 bits. */
static inline unsigned long long as_u64(PyObject *v) {
    if (PyLong_Check(v) && _PyLong_Sign(v) >= 0 && _PyLong_NumBits(v) <= 64)
        return PyLong_AsUnsignedLongLongMask(v);
    return PyLong_AsUnsignedLongLong(v);
}

/* A hash to prefetch by, read without raising: 1 with its low 64 bits in *out when `v` is an
 * exact int, else 0 (the lookup that follows reads it properly and raises if it must). */
static inline int peek_u64(PyObject *v, uint64_t *out) {
    if (!PyLong_CheckExact(v)) return 0;
    *out = (uint64_t)PyLong_AsUnsignedLongLongMask(v);
    return 1;
}

#endif
