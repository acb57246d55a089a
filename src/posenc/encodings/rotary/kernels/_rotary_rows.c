/* The rotary rotation (RoFormer eq. 34) as one pass over memory, for posenc/encodings/kernels/rotate.py.
 *
 * Each pair (x1, x2) of a row turns by its angle:  x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin.
 * Pairs are (x[j], x[j + half]) (half layout) or (x[2j], x[2j + 1]) (interleaved). float32 and
 * bfloat16 rows; the arithmetic is float32 and a bfloat16 result is rounded once (to nearest
 * even, as torch rounds). Every element is read once and written once, in place or into another
 * row; the products are rounded before the sum (built with -ffp-contract=off), as torch's own
 * operations do, so the results equal posenc's pure-torch path.
 *
 * Built at install time (setup.py) for the baseline instruction set; on x86-64 Linux each row
 * function is also compiled for AVX2 and AVX-512 and the loader picks the widest the CPU has
 * (GCC's target_clones). Where the build fails the package falls back to pure torch.
 *
 * This file holds the arithmetic and the scheduling of rows (rotary_run_rows, rotary_coalesce,
 * rotary_run_job: on torch's OpenMP threads where built with OpenMP); the Python interface and
 * its bounds checks are in _rotary_native.c (both include rotary_rows.h).
 */

#include <stdint.h>
#include <string.h>

#include "rotary_rows.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define WIDEST __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDEST
#endif

static inline float bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc0; /* NaN (the one torch's scalar conversion writes) */
    }
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* One row each: `in` and `out` may be the same row (in place); every pair is read before it is
 * written. Inlined into the run functions below, so they are compiled for each instruction set. */
static inline void row_f32_half(float *out, const float *in, const float *restrict c,
                                const float *restrict s, Py_ssize_t half)
{
    if (out == in) {
        float *x = out;
        for (Py_ssize_t j = 0; j < half; j++) {
            float a = x[j], b = x[j + half];
            x[j] = a * c[j] - b * s[j];
            x[j + half] = b * c[j] + a * s[j];
        }
        return;
    }
    float *restrict o = out;
    const float *restrict x = in;
    for (Py_ssize_t j = 0; j < half; j++) {
        float a = x[j], b = x[j + half];
        o[j] = a * c[j] - b * s[j];
        o[j + half] = b * c[j] + a * s[j];
    }
}

static inline void row_f32_interleaved(float *out, const float *in, const float *restrict c,
                                       const float *restrict s, Py_ssize_t half)
{
    if (out == in) {
        float *x = out;
        for (Py_ssize_t j = 0; j < half; j++) {
            float a = x[2 * j], b = x[2 * j + 1];
            x[2 * j] = a * c[j] - b * s[j];
            x[2 * j + 1] = b * c[j] + a * s[j];
        }
        return;
    }
    float *restrict o = out;
    const float *restrict x = in;
    for (Py_ssize_t j = 0; j < half; j++) {
        float a = x[2 * j], b = x[2 * j + 1];
        o[2 * j] = a * c[j] - b * s[j];
        o[2 * j + 1] = b * c[j] + a * s[j];
    }
}

static inline void row_bf16_half(uint16_t *out, const uint16_t *in, const float *restrict c,
                                 const float *restrict s, Py_ssize_t half)
{
    if (out == in) {
        uint16_t *x = out;
        for (Py_ssize_t j = 0; j < half; j++) {
            float a = bf16_to_float(x[j]), b = bf16_to_float(x[j + half]);
            x[j] = float_to_bf16(a * c[j] - b * s[j]);
            x[j + half] = float_to_bf16(b * c[j] + a * s[j]);
        }
        return;
    }
    uint16_t *restrict o = out;
    const uint16_t *restrict x = in;
    for (Py_ssize_t j = 0; j < half; j++) {
        float a = bf16_to_float(x[j]), b = bf16_to_float(x[j + half]);
        o[j] = float_to_bf16(a * c[j] - b * s[j]);
        o[j + half] = float_to_bf16(b * c[j] + a * s[j]);
    }
}

/* An interleaved bfloat16 pair is one 32-bit word, so both channels turn in one 32-bit vector
 * lane, with no shuffles. FIRST is where x[2j] sits in the word: its low half on little-endian
 * machines. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define FIRST 16
#else
#define FIRST 0
#endif

static inline uint32_t turn_bf16_pair(const uint16_t *in, float c, float s)
{
    uint32_t w;
    memcpy(&w, in, sizeof w);
    uint32_t a_bits = ((w >> FIRST) & 0xffffu) << 16, b_bits = ((w >> (16 - FIRST)) & 0xffffu) << 16;
    float a, b;
    memcpy(&a, &a_bits, sizeof a);
    memcpy(&b, &b_bits, sizeof b);
    uint32_t r1 = float_to_bf16(a * c - b * s), r2 = float_to_bf16(b * c + a * s);
    return (r1 << FIRST) | (r2 << (16 - FIRST));
}

static inline void row_bf16_interleaved(uint16_t *out, const uint16_t *in,
                                        const float *restrict c, const float *restrict s,
                                        Py_ssize_t half)
{
    if (out == in) {
        for (Py_ssize_t j = 0; j < half; j++) {
            uint32_t w = turn_bf16_pair(out + 2 * j, c[j], s[j]);
            memcpy(out + 2 * j, &w, sizeof w);
        }
        return;
    }
    uint16_t *restrict o = out;
    const uint16_t *restrict x = in;
    for (Py_ssize_t j = 0; j < half; j++) {
        uint32_t w = turn_bf16_pair(x + 2 * j, c[j], s[j]);
        memcpy(o + 2 * j, &w, sizeof w);
    }
}

/* A run of `rows` rows `stride` elements apart (x, out: in their dtype; tables: floats): one call
 * per run, compiled for the baseline and for AVX2/AVX-512, picked once at load. */
typedef void (*RunFn)(char *out, const char *in, const float *c, const float *s, Py_ssize_t half,
                      Py_ssize_t rows, Py_ssize_t os, Py_ssize_t xs, Py_ssize_t cs, Py_ssize_t ss);

WIDEST static void run_f32_half(char *out, const char *in, const float *c, const float *s,
                                Py_ssize_t half, Py_ssize_t rows, Py_ssize_t os, Py_ssize_t xs,
                                Py_ssize_t cs, Py_ssize_t ss)
{
    for (Py_ssize_t i = 0; i < rows; i++) {
        row_f32_half((float *)out + i * os, (const float *)in + i * xs, c + i * cs, s + i * ss,
                     half);
    }
}

WIDEST static void run_f32_interleaved(char *out, const char *in, const float *c, const float *s,
                                       Py_ssize_t half, Py_ssize_t rows, Py_ssize_t os,
                                       Py_ssize_t xs, Py_ssize_t cs, Py_ssize_t ss)
{
    for (Py_ssize_t i = 0; i < rows; i++) {
        row_f32_interleaved((float *)out + i * os, (const float *)in + i * xs, c + i * cs,
                            s + i * ss, half);
    }
}

WIDEST static void run_bf16_half(char *out, const char *in, const float *c, const float *s,
                                 Py_ssize_t half, Py_ssize_t rows, Py_ssize_t os, Py_ssize_t xs,
                                 Py_ssize_t cs, Py_ssize_t ss)
{
    for (Py_ssize_t i = 0; i < rows; i++) {
        row_bf16_half((uint16_t *)out + i * os, (const uint16_t *)in + i * xs, c + i * cs,
                      s + i * ss, half);
    }
}

WIDEST static void run_bf16_interleaved(char *out, const char *in, const float *c,
                                        const float *s, Py_ssize_t half, Py_ssize_t rows,
                                        Py_ssize_t os, Py_ssize_t xs, Py_ssize_t cs, Py_ssize_t ss)
{
    for (Py_ssize_t i = 0; i < rows; i++) {
        row_bf16_interleaved((uint16_t *)out + i * os, (const uint16_t *)in + i * xs, c + i * cs,
                             s + i * ss, half);
    }
}



/* Rotate rows [start, stop) of the leading index space (row-major over `sizes`), one call per
 * run along the innermost dimension. */
void rotary_run_rows(const Job *job)
{
    const int in = MAX_LEAD - 1;
    Py_ssize_t idx[MAX_LEAD];
    Py_ssize_t rest = job->start;
    Py_ssize_t xo = 0, oo = 0, co = 0, so = 0;
    for (int k = in; k >= 0; k--) {
        idx[k] = rest % job->sizes[k];
        rest /= job->sizes[k];
        xo += idx[k] * job->xs[k];
        oo += idx[k] * job->os[k];
        co += idx[k] * job->cs[k];
        so += idx[k] * job->ss[k];
    }
    RunFn run = job->bf16 ? (job->interleaved ? run_bf16_interleaved : run_bf16_half)
                          : (job->interleaved ? run_f32_interleaved : run_f32_half);
    const Py_ssize_t item = job->bf16 ? 2 : 4;
    Py_ssize_t row = job->start;
    while (row < job->stop) {
        Py_ssize_t count = job->sizes[in] - idx[in];
        if (count > job->stop - row) {
            count = job->stop - row;
        }
        run(job->out + oo * item, job->x + xo * item, job->cos + co, job->sin + so, job->half, count,
            job->os[in], job->xs[in], job->cs[in], job->ss[in]);
        row += count;
        idx[in] += count;
        xo += count * job->xs[in];
        oo += count * job->os[in];
        co += count * job->cs[in];
        so += count * job->ss[in];
        for (int k = in; k > 0 && idx[k] == job->sizes[k]; k--) { /* carry outwards */
            xo += job->xs[k - 1] - job->xs[k] * job->sizes[k];
            oo += job->os[k - 1] - job->os[k] * job->sizes[k];
            co += job->cs[k - 1] - job->cs[k] * job->sizes[k];
            so += job->ss[k - 1] - job->ss[k] * job->sizes[k];
            idx[k] = 0;
            idx[k - 1]++;
        }
    }
}

/* Merge neighbouring dimensions that every operand walks as one (drop size-1 dimensions first),
 * so that runs are as long as the memory allows: a decode step's (batch, heads, 1) rows become
 * one run. Keeps the dimensions right-aligned, padded with size 1. */
void rotary_coalesce(Job *job)
{
    Py_ssize_t sz[MAX_LEAD], xs[MAX_LEAD], os[MAX_LEAD], cs[MAX_LEAD], ss[MAX_LEAD];
    int m = 0;
    for (int k = 0; k < MAX_LEAD; k++) {
        if (job->sizes[k] == 1) {
            continue;
        }
        if (m > 0 && xs[m - 1] == job->xs[k] * job->sizes[k]
            && os[m - 1] == job->os[k] * job->sizes[k] && cs[m - 1] == job->cs[k] * job->sizes[k]
            && ss[m - 1] == job->ss[k] * job->sizes[k]) {
            sz[m - 1] *= job->sizes[k]; /* the outer one continues into this one */
            xs[m - 1] = job->xs[k];
            os[m - 1] = job->os[k];
            cs[m - 1] = job->cs[k];
            ss[m - 1] = job->ss[k];
            continue;
        }
        sz[m] = job->sizes[k];
        xs[m] = job->xs[k];
        os[m] = job->os[k];
        cs[m] = job->cs[k];
        ss[m] = job->ss[k];
        m++;
    }
    for (int k = 0; k < MAX_LEAD; k++) {
        int j = k - (MAX_LEAD - m);
        job->sizes[k] = j < 0 ? 1 : sz[j];
        job->xs[k] = j < 0 ? 0 : xs[j];
        job->os[k] = j < 0 ? 0 : os[j];
        job->cs[k] = j < 0 ? 0 : cs[j];
        job->ss[k] = j < 0 ? 0 : ss[j];
    }
}

/* From this many values turned (rows times pairs), a rotation is shared among the threads of
 * the OpenMP runtime the process already runs (torch's, whose workers wait on it after each of
 * torch's parallel operators). */
#define PARALLEL_MIN (1 << 15)

void rotary_run_job(const Job *job)
{
#ifdef _OPENMP
    const Py_ssize_t rows = job->stop - job->start;
    const int threads = omp_get_max_threads();
    if (threads > 1 && rows > 1 && rows * job->half >= PARALLEL_MIN) {
#pragma omp parallel num_threads(threads)
        {
            const Py_ssize_t t = omp_get_thread_num(), n = omp_get_num_threads();
            const Py_ssize_t share = rows / n, extra = rows % n; /* the first `extra` take one more */
            Job mine = *job;
            mine.start = job->start + share * t + (t < extra ? t : extra);
            mine.stop = mine.start + share + (t < extra ? 1 : 0);
            if (mine.stop > mine.start) {
                rotary_run_rows(&mine);
            }
        }
        return;
    }
#endif
    rotary_run_rows(job);
}
