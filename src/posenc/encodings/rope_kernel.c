/* One-pass RoPE on CPU for float32, bfloat16 and float16 queries and keys
 * (posenc.encodings.native builds and calls it).
 *
 * Each row of x (d channels; a 4-D view with any row strides and unit channel stride) is
 * widened to float32, rotated pairwise by the float32 cos/sin row of its position, rounded
 * once to the input type and written to the contiguous output; channels past the rotary ones
 * are copied. The arithmetic is RoFormer eq. 34 in float32,
 *     out1 = x1 * cos - x2 * sin,  out2 = x2 * cos + x1 * sin,
 * every product and sum rounded to float32 (built with -ffp-contract=off: no fma), so the
 * result is bit-identical to rotating in float32 with torch and casting once.
 *
 * Pairs: the half layout pairs (x[j], x[j + r/2]); the interleaved layout (x[2j], x[2j+1]).
 * With AVX-512 (-march=native on such a CPU) 16 channels go per instruction and a scalar loop
 * finishes the rest; elsewhere the scalar loop does everything (the compiler may vectorise it).
 * A caller splits the groups (batch x head) or the positions among threads; no state is kept.
 */
#include <stdint.h>
#include <string.h>

static inline float bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest, ties to even, as c10::BFloat16 does; any NaN becomes the quiet 0x7FC0. */
static inline uint16_t bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_load(_Float16 h) { return (float)h; }
static inline _Float16 f16_store(float f) { return (_Float16)f; }

static inline float f32_load(float f) { return f; }
static inline float f32_store(float f) { return f; }

/* Shapes: x is (s0, s1, s2, d) with strides (xs0, xs1, xs2, 1); the tables are broadcast to
 * (s0, s1, s2, half) with strides (ts0, ts1, ts2, 1); out is contiguous (s0, s1, s2, d).
 * Rows are numbered in that (s0, s1, s2) order. */
#define ROPE_ROW(T, LOAD, STORE)                                                               \
    static inline void rope_row_##T(const T *restrict xr, T *restrict o,                       \
                                    const float *restrict c, const float *restrict s,          \
                                    int64_t d, int64_t half, int interleaved) {                \
        const int64_t done = ROPE_VEC_CALL(T);                                                 \
        if (interleaved) {                                                                     \
            for (int64_t j = done; j < half; ++j) {                                            \
                const float a = LOAD(xr[2 * j]), b = LOAD(xr[2 * j + 1]);                      \
                o[2 * j] = STORE(a * c[j] - b * s[j]);                                         \
                o[2 * j + 1] = STORE(b * c[j] + a * s[j]);                                     \
            }                                                                                  \
        } else {                                                                               \
            for (int64_t j = done; j < half; ++j) {                                            \
                const float a = LOAD(xr[j]), b = LOAD(xr[j + half]);                           \
                o[j] = STORE(a * c[j] - b * s[j]);                                             \
                o[j + half] = STORE(b * c[j] + a * s[j]);                                      \
            }                                                                                  \
        }                                                                                      \
        if (2 * half < d) memcpy(o + 2 * half, xr + 2 * half, (size_t)(d - 2 * half) * sizeof(T)); \
    }

/* Rows (i0, i1, p) for groups g = i0 * s1 + i1 in [group_begin, group_end) and positions p in
 * [pos_begin, pos_end), in memory order. (Taking a few positions at a time across all groups,
 * to keep their cos/sin rows in L1, measured slower: 128 interleaved streams defeat the
 * prefetchers, while the whole table stays in L2 anyway.) */
#define ROPE_KERNEL(NAME, T)                                                                   \
    void NAME(const T *x, T *out, const float *cos_t, const float *sin_t, int64_t group_begin, \
              int64_t group_end, int64_t pos_begin, int64_t pos_end, int64_t s1, int64_t s2,   \
              int64_t xs0, int64_t xs1, int64_t xs2, int64_t ts0, int64_t ts1, int64_t ts2,    \
              int64_t d, int64_t half, int interleaved) {                                      \
        for (int64_t g = group_begin; g < group_end; ++g) {                                    \
            const int64_t i0 = g / s1, i1 = g % s1;                                            \
            for (int64_t p = pos_begin; p < pos_end; ++p) {                                    \
                const int64_t t = i0 * ts0 + i1 * ts1 + p * ts2;                               \
                rope_row_##T(x + i0 * xs0 + i1 * xs1 + p * xs2, out + (g * s2 + p) * d,        \
                             cos_t + t, sin_t + t, d, half, interleaved);                      \
            }                                                                                  \
        }                                                                                      \
    }

typedef uint16_t bf16_t;
typedef _Float16 f16_t;
typedef float f32_t;

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
/* 16 channels at a time; the scalar loop of ROPE_ROW finishes any remainder. */
static inline __m512 bf16_t_load16(const bf16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline void bf16_t_store16(bf16_t *p, __m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                    _mm512_set1_epi32(0x7FFF));
    u = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    u = _mm512_mask_mov_epi32(u, nan, _mm512_set1_epi32(0x7FC0));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(u));
}
static inline __m512 f16_t_load16(const f16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void f16_t_store16(f16_t *p, __m512 v) {
    _mm256_storeu_si256((__m256i *)p,
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/* Both rotate the channel pairs [0, 16 * k) of one row, k as large as fits, and return 16 * k.
 * Interleaved: a vector of 16 channels holds 8 pairs (a0 b0 a1 b1 ...) and becomes
 * v * (c0 c0 c1 c1 ...) + swap(v) * (-s0 s0 -s1 s1 ...), which rounds exactly like
 * a*c - b*s and b*c + a*s. */
static inline void rope_pairs16(__m512 v0, __m512 v1, const float *c, const float *s, __m512 *o0,
                                __m512 *o1) {
    const __m512i lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    const __m512i flip = _mm512_set1_epi64(0x80000000LL);  /* the sign of every even lane */
    __m512 c16 = _mm512_loadu_ps(c), s16 = _mm512_loadu_ps(s);
    __m512 c0 = _mm512_permutexvar_ps(lo, c16), c1 = _mm512_permutexvar_ps(hi, c16);
    __m512 s0 = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(_mm512_permutexvar_ps(lo, s16)), flip));
    __m512 s1 = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(_mm512_permutexvar_ps(hi, s16)), flip));
    *o0 = _mm512_add_ps(_mm512_mul_ps(v0, c0), _mm512_mul_ps(_mm512_permute_ps(v0, 0xB1), s0));
    *o1 = _mm512_add_ps(_mm512_mul_ps(v1, c1), _mm512_mul_ps(_mm512_permute_ps(v1, 0xB1), s1));
}

#define ROPE_VEC(T)                                                                            \
    static inline int64_t rope_vec_##T(const T *restrict xr, T *restrict o,                    \
                                       const float *restrict c, const float *restrict s,       \
                                       int64_t half, int interleaved) {                        \
        int64_t j = 0;                                                                         \
        if (interleaved) {                                                                     \
            for (; j + 16 <= half; j += 16) {                                                  \
                __m512 o0, o1;                                                                 \
                rope_pairs16(T##_load16(xr + 2 * j), T##_load16(xr + 2 * j + 16), c + j, s + j, \
                             &o0, &o1);                                                        \
                T##_store32(o + 2 * j, o0, o1);                                                \
            }                                                                                  \
        } else {                                                                               \
            for (; j + 32 <= half; j += 32) { /* 32 pairs: whole 64-byte half-precision stores */ \
                __m512 a0 = T##_load16(xr + j), b0 = T##_load16(xr + j + half);                \
                __m512 a1 = T##_load16(xr + j + 16), b1 = T##_load16(xr + j + half + 16);      \
                __m512 c0 = _mm512_loadu_ps(c + j), s0 = _mm512_loadu_ps(s + j);               \
                __m512 c1 = _mm512_loadu_ps(c + j + 16), s1 = _mm512_loadu_ps(s + j + 16);     \
                T##_store32(o + j, _mm512_sub_ps(_mm512_mul_ps(a0, c0), _mm512_mul_ps(b0, s0)), \
                            _mm512_sub_ps(_mm512_mul_ps(a1, c1), _mm512_mul_ps(b1, s1)));      \
                T##_store32(o + j + half,                                                      \
                            _mm512_add_ps(_mm512_mul_ps(b0, c0), _mm512_mul_ps(a0, s0)),       \
                            _mm512_add_ps(_mm512_mul_ps(b1, c1), _mm512_mul_ps(a1, s1)));      \
            }                                                                                  \
            for (; j + 16 <= half; j += 16) {                                                  \
                __m512 a = T##_load16(xr + j), b = T##_load16(xr + j + half);                  \
                __m512 cc = _mm512_loadu_ps(c + j), ss = _mm512_loadu_ps(s + j);               \
                T##_store16(o + j, _mm512_sub_ps(_mm512_mul_ps(a, cc), _mm512_mul_ps(b, ss)));  \
                T##_store16(o + j + half, _mm512_add_ps(_mm512_mul_ps(b, cc), _mm512_mul_ps(a, ss))); \
            }                                                                                  \
        }                                                                                      \
        return j;                                                                              \
    }
static inline void bf16_t_store32(bf16_t *p, __m512 v0, __m512 v1) {
#if defined(__AVX512BF16__)
    _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
#else
    bf16_t_store16(p, v0);
    bf16_t_store16(p + 16, v1);
#endif
}
static inline void f16_t_store32(f16_t *p, __m512 v0, __m512 v1) {
    f16_t_store16(p, v0);
    f16_t_store16(p + 16, v1);
}
static inline __m512 f32_t_load16(const f32_t *p) { return _mm512_loadu_ps(p); }
static inline void f32_t_store16(f32_t *p, __m512 v) { _mm512_storeu_ps(p, v); }
static inline void f32_t_store32(f32_t *p, __m512 v0, __m512 v1) {
    _mm512_storeu_ps(p, v0);
    _mm512_storeu_ps(p + 16, v1);
}
ROPE_VEC(bf16_t)
ROPE_VEC(f16_t)
ROPE_VEC(f32_t)
#define ROPE_VEC_CALL(T) rope_vec_##T(xr, o, c, s, half, interleaved)
#else
#define ROPE_VEC_CALL(T) 0
#endif

ROPE_ROW(bf16_t, bf16_load, bf16_store)
ROPE_ROW(f16_t, f16_load, f16_store)
ROPE_ROW(f32_t, f32_load, f32_store)

ROPE_KERNEL(posenc_rope_bf16, bf16_t)
ROPE_KERNEL(posenc_rope_f16, f16_t)
ROPE_KERNEL(posenc_rope_f32, f32_t)
