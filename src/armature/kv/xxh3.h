/* XXH3-64 (XXH3_64bits_withSeed, scalar path) and the block-hash chain of DESIGN §3, shared
 * by the native extensions that hash token blocks (armature.kv._native, armature.router._index):
 * one implementation, included by both. Our own implementation of the published algorithm;
 * tests check it against the `xxhash` package for every input length up to several KiB.
 *
 * Include after <Python.h>.
 */
#ifndef ARMATURE_XXH3_H
#define ARMATURE_XXH3_H

#include <stdint.h>
#include <string.h>

#define SECRET_SIZE 192
#define STRIPE_LEN 64
#define ACC_NB 8

static const uint8_t kSecret[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static const uint64_t P32_1 = 0x9E3779B1U, P32_2 = 0x85EBCA77U, P32_3 = 0xC2B2AE3DU;
static const uint64_t P64_1 = 0x9E3779B185EBCA87ULL, P64_2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t P64_3 = 0x165667B19E3779F9ULL, P64_4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t P64_5 = 0x27D4EB2F165667C5ULL;
static const uint64_t PMX_1 = 0x165667919E3779F9ULL, PMX_2 = 0x9FB21C651E98DF25ULL;

static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline void wr64(uint8_t *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t swap32(uint64_t x) { return __builtin_bswap32((uint32_t)x); }

static inline uint64_t mul128_fold64(uint64_t a, uint64_t b) {
    __uint128_t product = (__uint128_t)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
}

static inline uint64_t xxh64_avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= P64_2;
    h ^= h >> 29;
    h *= P64_3;
    return h ^ (h >> 32);
}

static inline uint64_t xxh3_avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= PMX_1;
    return h ^ (h >> 32);
}

static inline uint64_t rrmxmx(uint64_t h, uint64_t len) {
    h ^= rotl64(h, 49) ^ rotl64(h, 24);
    h *= PMX_2;
    h ^= (h >> 35) + len;
    h *= PMX_2;
    return h ^ (h >> 28);
}

static inline uint64_t mix16(const uint8_t *in, const uint8_t *sec, uint64_t seed) {
    return mul128_fold64(rd64(in) ^ (rd64(sec) + seed), rd64(in + 8) ^ (rd64(sec + 8) - seed));
}

static uint64_t len_0to16(const uint8_t *in, size_t len, uint64_t seed) {
    if (len > 8) {
        uint64_t flip1 = (rd64(kSecret + 24) ^ rd64(kSecret + 32)) + seed;
        uint64_t flip2 = (rd64(kSecret + 40) ^ rd64(kSecret + 48)) - seed;
        uint64_t lo = rd64(in) ^ flip1;
        uint64_t hi = rd64(in + len - 8) ^ flip2;
        uint64_t acc = len + __builtin_bswap64(lo) + hi + mul128_fold64(lo, hi);
        return xxh3_avalanche(acc);
    }
    if (len >= 4) {
        uint64_t s = seed ^ (swap32(seed) << 32);
        uint64_t in1 = rd32(in), in2 = rd32(in + len - 4);
        uint64_t flip = (rd64(kSecret + 8) ^ rd64(kSecret + 16)) - s;
        return rrmxmx((in2 + (in1 << 32)) ^ flip, len);
    }
    if (len > 0) {
        uint32_t combined = ((uint32_t)in[0] << 16) | ((uint32_t)in[len >> 1] << 24) |
                            (uint32_t)in[len - 1] | ((uint32_t)len << 8);
        uint64_t flip = (uint64_t)(rd32(kSecret) ^ rd32(kSecret + 4)) + seed;
        return xxh64_avalanche((uint64_t)combined ^ flip);
    }
    return xxh64_avalanche(seed ^ (rd64(kSecret + 56) ^ rd64(kSecret + 64)));
}

static uint64_t len_17to128(const uint8_t *in, size_t len, uint64_t seed) {
    uint64_t acc = len * P64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += mix16(in + 48, kSecret + 96, seed);
                acc += mix16(in + len - 64, kSecret + 112, seed);
            }
            acc += mix16(in + 32, kSecret + 64, seed);
            acc += mix16(in + len - 48, kSecret + 80, seed);
        }
        acc += mix16(in + 16, kSecret + 32, seed);
        acc += mix16(in + len - 32, kSecret + 48, seed);
    }
    acc += mix16(in, kSecret, seed);
    acc += mix16(in + len - 16, kSecret + 16, seed);
    return xxh3_avalanche(acc);
}

static uint64_t len_129to240(const uint8_t *in, size_t len, uint64_t seed) {
    uint64_t acc = len * P64_1;
    size_t rounds = len / 16;
    for (size_t i = 0; i < 8; i++) acc += mix16(in + 16 * i, kSecret + 16 * i, seed);
    acc = xxh3_avalanche(acc);
    for (size_t i = 8; i < rounds; i++) acc += mix16(in + 16 * i, kSecret + 16 * (i - 8) + 3, seed);
    acc += mix16(in + len - 16, kSecret + 136 - 17, seed);
    return xxh3_avalanche(acc);
}

static inline void accumulate_512(uint64_t *acc, const uint8_t *in, const uint8_t *sec) {
    for (int i = 0; i < ACC_NB; i++) {
        uint64_t value = rd64(in + 8 * i);
        uint64_t key = value ^ rd64(sec + 8 * i);
        acc[i ^ 1] += value;
        acc[i] += (uint64_t)(uint32_t)key * (key >> 32);
    }
}

static inline void scramble(uint64_t *acc, const uint8_t *sec) {
    for (int i = 0; i < ACC_NB; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= rd64(sec + 8 * i);
        acc[i] = a * P32_1;
    }
}

static uint64_t len_long(const uint8_t *in, size_t len, uint64_t seed) {
    uint8_t secret[SECRET_SIZE];
    for (int i = 0; i < SECRET_SIZE / 16; i++) {
        wr64(secret + 16 * i, rd64(kSecret + 16 * i) + seed);
        wr64(secret + 16 * i + 8, rd64(kSecret + 16 * i + 8) - seed);
    }
    uint64_t acc[ACC_NB] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    const size_t stripes_per_block = (SECRET_SIZE - STRIPE_LEN) / 8;
    const size_t block_len = STRIPE_LEN * stripes_per_block;
    const size_t num_blocks = (len - 1) / block_len;
    for (size_t b = 0; b < num_blocks; b++) {
        for (size_t s = 0; s < stripes_per_block; s++)
            accumulate_512(acc, in + b * block_len + s * STRIPE_LEN, secret + 8 * s);
        scramble(acc, secret + SECRET_SIZE - STRIPE_LEN);
    }
    const size_t last_stripes = ((len - 1) - block_len * num_blocks) / STRIPE_LEN;
    for (size_t s = 0; s < last_stripes; s++)
        accumulate_512(acc, in + num_blocks * block_len + s * STRIPE_LEN, secret + 8 * s);
    accumulate_512(acc, in + len - STRIPE_LEN, secret + SECRET_SIZE - STRIPE_LEN - 7);
    uint64_t result = len * P64_1;
    for (int i = 0; i < 4; i++)
        result += mul128_fold64(acc[2 * i] ^ rd64(secret + 11 + 16 * i),
                                acc[2 * i + 1] ^ rd64(secret + 11 + 16 * i + 8));
    return xxh3_avalanche(result);
}

static uint64_t xxh3_64(const uint8_t *in, size_t len, uint64_t seed) {
    if (len <= 16) return len_0to16(in, len, seed);
    if (len <= 128) return len_17to128(in, len, seed);
    if (len <= 240) return len_129to240(in, len, seed);
    return len_long(in, len, seed);
}

static uint64_t chain(uint64_t parent, uint64_t local, uint64_t seed) {
    uint8_t pair[16];
    wr64(pair, parent);
    wr64(pair + 8, local);
    return len_0to16(pair, 16, seed);
}

/* The mocker's token at `position` of a request: XXH3-64(seed) of "<request id>/<position>"
 * modulo vocab_size, where `buf` holds "<request id>/" in its first `head` bytes and has 24
 * bytes free after them (the position's decimal digits are written there). */
static inline uint64_t mock_token(char *buf, size_t head, Py_ssize_t position, uint64_t seed,
                                  uint64_t vocab_size) {
    char reversed[24];
    int n = 0;
    do {
        reversed[n++] = (char)('0' + position % 10);
        position /= 10;
    } while (position);
    for (int i = 0; i < n; i++) buf[head + (size_t)i] = reversed[n - 1 - i];
    return xxh3_64((const uint8_t *)buf, head + (size_t)n, seed) % vocab_size;
}

/* A token id straight from an exact int's digits (CPython 3.11 layout: a signed digit count in
 * ob_size, 30-bit digits), about 4x faster than PyLong_AsUnsignedLong over a 4k-token prompt.
 * Returns 0 where the general path must decide (other types, negatives, >2 digits). */
static inline int read_small_int(PyObject *obj, unsigned long *out) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    if (PyLong_CheckExact(obj)) {
        Py_ssize_t size = Py_SIZE(obj);
        const digit *d = ((PyLongObject *)obj)->ob_digit;
        if (size == 0) { *out = 0; return 1; }
        if (size == 1) { *out = d[0]; return 1; }
        if (size == 2) { *out = (unsigned long)d[0] | ((unsigned long)d[1] << 30); return 1; }
    }
#endif
    (void)obj;
    (void)out;
    return 0;
}

/* One token id as the little-endian u32 a block's hash reads; -1 with a ValueError when it is
 * not an int in [0, 2**32). */
static inline int read_token(PyObject *obj, uint32_t *out) {
    unsigned long v;
    if (!read_small_int(obj, &v)) v = PyLong_AsUnsignedLong(obj);
    if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > 0xFFFFFFFFUL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "token ids must fit in an unsigned 32-bit integer");
        return -1;
    }
    uint32_t t = (uint32_t)v;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    t = __builtin_bswap32(t);
#endif
    *out = t;
    return 0;
}

#endif /* ARMATURE_XXH3_H */
