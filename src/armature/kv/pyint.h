/* An int in [0, 2**64) read as unsigned 64 bits, for the extensions that take block hashes.
 *
 * PyLong_AsUnsignedLongLong packs any int of more than one 30-bit digit through
 * _PyLong_AsByteArray, a general byte-order routine that was the largest single cost of
 * reading hashes (a replay reads ~100M of them). On CPython 3.11 an exact int of up to 64 bits
 * is read from its digits inline; else one known to be non-negative and at most 64 bits wide
 * is read exactly by PyLong_AsUnsignedLongLongMask, which shifts its digits in directly;
 * anything else goes to PyLong_AsUnsignedLongLong, which raises as it always has.
 */
#ifndef ARMATURE_PYINT_H
#define ARMATURE_PYINT_H

#include <Python.h>
#include <stdint.h>

/* An exact int in [0, 2**64) straight from its digits (CPython 3.11's layout: a signed digit
 * count in ob_size, 30-bit digits; a 64-bit value has at most 3, the top one 4 bits wide):
 * 1 with the value in *out, else 0 for the general path (other types or layouts, negatives,
 * wider values). Three calls fewer per hash than the checks below. */
static inline int read_u64_digits(PyObject *v, uint64_t *out) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    if (PyLong_CheckExact(v)) {
        const digit *d = ((PyLongObject *)v)->ob_digit;
        switch (Py_SIZE(v)) {
        case 0:
            *out = 0;
            return 1;
        case 1:
            *out = d[0];
            return 1;
        case 2:
            *out = (uint64_t)d[0] | ((uint64_t)d[1] << 30);
            return 1;
        case 3:
            if (d[2] >> 4) return 0;
            *out = (uint64_t)d[0] | ((uint64_t)d[1] << 30) | ((uint64_t)d[2] << 60);
            return 1;
        default:
            return 0;
        }
    }
#endif
    (void)v;
    (void)out;
    return 0;
}

/* PyLong_AsUnsignedLongLong(v), faster: (unsigned long long)-1 with an exception set on a
 * non-int, a negative int or one of more than 64 bits. */
static inline unsigned long long as_u64(PyObject *v) {
    uint64_t x;
    if (read_u64_digits(v, &x)) return x;
    if (PyLong_Check(v) && _PyLong_Sign(v) >= 0 && _PyLong_NumBits(v) <= 64)
        return PyLong_AsUnsignedLongLongMask(v);
    return PyLong_AsUnsignedLongLong(v);
}

/* A hash to prefetch by, read without raising: 1 with its low 64 bits in *out when `v` is an
 * exact int, else 0 (the lookup that follows reads it properly and raises if it must). */
static inline int peek_u64(PyObject *v, uint64_t *out) {
    if (read_u64_digits(v, out)) return 1;
    if (!PyLong_CheckExact(v)) return 0;
    *out = (uint64_t)PyLong_AsUnsignedLongLongMask(v);
    return 1;
}

/* Whether `view` holds native unsigned 32-bit ints in one dimension (array('I'), a numpy
 * uint32 array): token ids the extensions read or write as they are. */
static inline int is_u32_buffer(const Py_buffer *view) {
    const char *f = view->format;
    if (f != NULL && (*f == '@' || *f == '=')) f++; /* native order */
    return view->itemsize == 4 && view->ndim == 1 && f != NULL && (f[0] == 'I' || f[0] == 'L') &&
           f[1] == '\0';
}

#endif
