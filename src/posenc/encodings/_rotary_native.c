/* The rotary rotation (RoFormer eq. 34) as one pass over memory, for posenc/encodings/rotate.py.
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
 * What the kernel checks. Each buffer (x, out, cos, sin) comes as the address and the size in
 * bytes of the storage it lives in, its offset, sizes and strides (in elements); every pointer
 * (a run of rows, a row, the tables' row first_row) is computed here from those numbers. Before
 * anything is read or written, in O(1) per call (no loop over rows):
 *   - the lowest and the highest element that any row addresses lie inside the buffer's
 *     storage: the offset plus each dimension's (size - 1) * stride where that is negative, and
 *     the offset plus each where it is positive plus the channels read, less one; zero and
 *     negative strides included, the arithmetic checked for overflow;
 *   - the storage's address is a multiple of the element size and its bytes do not wrap around;
 *   - the channels read (2 * half of x and out, half of cos and sin) are contiguous; x has at
 *     least 2 * half of them; at most MAX_LEAD leading dimensions;
 *   - out has x's sizes and no zero stride along a dimension of more than one element; sin has
 *     cos's sizes; the tables broadcast against x, or, given first_row, rows first_row to
 *     first_row + n - 1 of their outermost dimension exist (n: x's size along it).
 * A failed check raises ValueError or IndexError naming the buffer and the numbers, and nothing
 * is written.
 *
 * What it still trusts its caller for (rotate.py: the numbers come from the tensors themselves):
 *   - that each address and size in bytes are those of one live storage, which stays allocated
 *     and is not resized while the call runs (the GIL is released during the arithmetic: no
 *     other thread may free or resize it meanwhile), and that out's storage may be written;
 *   - the dtype code: x and out hold bfloat16 where bf16 is set, else float32; cos and sin hold
 *     float32. A wrong code gives wrong values, but the bounds are checked in bytes of the
 *     elements read, so reads and writes stay inside the storages;
 *   - that out is x itself (in place) or shares no memory with x, cos and sin, and that no two
 *     of its rows overlap (a zero stride is refused; other overlaps are not looked for): else
 *     elements turn twice or are read after they are written, and threads race on them.
 * (The thread count needs no trust: any number is clamped to 1 to MAX_THREADS and to the rows.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_LEAD 4
#define MAX_THREADS 64

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

typedef struct {
    char *x, *out;            /* the rows, in their dtype */
    const float *cos, *sin;   /* the tables, float32 */
    int bf16, interleaved;
    Py_ssize_t half;
    Py_ssize_t sizes[MAX_LEAD];
    Py_ssize_t xs[MAX_LEAD], os[MAX_LEAD], cs[MAX_LEAD], ss[MAX_LEAD];
    Py_ssize_t start, stop;   /* flat row range of one thread */
} Job;

/* Rotate rows [start, stop) of the leading index space (row-major over `sizes`), one call per
 * run along the innermost dimension. */
static void run_rows(const Job *job)
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
static void coalesce(Job *job)
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

static void *run_rows_thread(void *arg)
{
    run_rows((const Job *)arg);
    return NULL;
}

/* ----------------------------------------------------------------- the interface and its checks */

#define MAX_DIMS (MAX_LEAD + 1) /* the leading dimensions and the channels */
#define LAST (MAX_DIMS - 1)     /* where the channels are */

/* One buffer as the caller describes it, (address, nbytes, offset, sizes, strides): its sizes
 * and strides right-aligned in MAX_DIMS slots, padded with size 1 and stride 0. */
typedef struct {
    const char *name;
    unsigned long long address; /* of the storage */
    Py_ssize_t nbytes;          /* of the storage */
    Py_ssize_t offset;          /* where the tensor starts in the storage, in elements */
    Py_ssize_t item;            /* bytes per element */
    PyObject *sizes, *strides;  /* as given (borrowed), for messages */
    int dims;
    Py_ssize_t size[MAX_DIMS], stride[MAX_DIMS];
} Buffer;

/* *r = a + b, or 0 where that overflows. */
static int add_ok(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *r)
{
    if ((b > 0 && a > PY_SSIZE_T_MAX - b) || (b < 0 && a < PY_SSIZE_T_MIN - b)) {
        return 0;
    }
    *r = a + b;
    return 1;
}

/* *r = a * b for a >= 0, or 0 where that overflows. */
static int mul_ok(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *r)
{
    if (a > 0 && (b > PY_SSIZE_T_MAX / a || b < PY_SSIZE_T_MIN / a)) {
        return 0;
    }
    *r = a * b;
    return 1;
}

/* Read a sequence of ints into dst, right-aligned, padded with `pad`; its length, or -1. */
static int read_dims(PyObject *seq, Py_ssize_t *dst, Py_ssize_t pad, const char *name,
                     const char *what)
{
    PyObject *fast = seq; /* torch.Size and tuples are read where they are */
    if (PyTuple_Check(seq)) {
        Py_INCREF(fast);
    } else if ((fast = PySequence_Fast(seq, "sizes and strides must be sequences")) == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n < 1 || n > MAX_DIMS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError,
                     "%s: %zd %s, expected 1 to %d (at most %d leading dimensions and the "
                     "channels)", name, n, what, MAX_DIMS, MAX_LEAD);
        return -1;
    }
    for (int k = 0; k < MAX_DIMS; k++) {
        dst[k] = pad;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t v = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, k));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        dst[MAX_DIMS - n + k] = v;
    }
    Py_DECREF(fast);
    return (int)n;
}

/* Read the description of one buffer and check what can be checked of it alone. */
static int read_buffer(PyObject *desc, const char *name, Py_ssize_t item, Buffer *b)
{
    b->name = name;
    b->item = item;
    if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 5) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a tuple (address, nbytes, offset, sizes, strides)", name);
        return -1;
    }
    b->address = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(desc, 0));
    if (b->address == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    b->nbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 1));
    if (b->nbytes == -1 && PyErr_Occurred()) {
        return -1;
    }
    b->offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 2));
    if (b->offset == -1 && PyErr_Occurred()) {
        return -1;
    }
    b->sizes = PyTuple_GET_ITEM(desc, 3);
    b->strides = PyTuple_GET_ITEM(desc, 4);
    int n = read_dims(b->sizes, b->size, 1, name, "sizes");
    if (n < 0) {
        return -1;
    }
    if (read_dims(b->strides, b->stride, 0, name, "strides") != n) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "%s: sizes %R and strides %R differ in length", name,
                         b->sizes, b->strides);
        }
        return -1;
    }
    b->dims = n;
    for (int k = 0; k < MAX_DIMS; k++) {
        if (b->size[k] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: a negative size in %R", name, b->sizes);
            return -1;
        }
    }
    if (b->nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "%s: a storage of %zd bytes", name, b->nbytes);
        return -1;
    }
    if (b->address % (unsigned long long)item != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the storage's address %llu is not a multiple of the element size "
                     "(%zd bytes)", name, b->address, item);
        return -1;
    }
    if (b->address > (unsigned long long)UINTPTR_MAX
        || (unsigned long long)b->nbytes > (unsigned long long)UINTPTR_MAX - b->address) {
        PyErr_Format(PyExc_ValueError,
                     "%s: a storage of %zd bytes at address %llu wraps around the address space",
                     name, b->nbytes, b->address);
        return -1;
    }
    return 0;
}

static int same_sizes(const Buffer *a, const Buffer *b)
{
    if (a->dims != b->dims) {
        return 0;
    }
    for (int k = 0; k < MAX_DIMS; k++) {
        if (a->size[k] != b->size[k]) {
            return 0;
        }
    }
    return 1;
}

/* Check that every element addressed from element `start` of b's storage along the leading
 * sizes and strides (all sizes >= 1), `channels` contiguous channels each, lies inside the
 * storage: the lowest is start plus the negative (size - 1) * stride, the highest start plus
 * the positive ones plus channels - 1. */
static int check_extent(const Buffer *b, Py_ssize_t start, const Py_ssize_t *size,
                        const Py_ssize_t *stride, Py_ssize_t channels)
{
    Py_ssize_t lo = start, hi = 0, span = 0;
    int ok = add_ok(start, channels - 1, &hi);
    for (int k = 0; ok && k < MAX_LEAD; k++) {
        ok = mul_ok(size[k] - 1, stride[k], &span)
             && (span < 0 ? add_ok(lo, span, &lo) : add_ok(hi, span, &hi));
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError,
                     "%s (sizes %R, strides %R, offset %zd): its addresses overflow", b->name,
                     b->sizes, b->strides, b->offset);
        return -1;
    }
    Py_ssize_t elements = b->nbytes / b->item;
    if (lo < 0 || hi >= elements) {
        PyErr_Format(PyExc_IndexError,
                     "%s (sizes %R, strides %R, offset %zd) would address elements %zd to %zd "
                     "of a storage of %zd elements (%zd bytes)", b->name, b->sizes, b->strides,
                     b->offset, lo, hi, elements, b->nbytes);
        return -1;
    }
    return 0;
}

/* rotate(x, out, cos, sin, first_row, bf16, interleaved, threads): x, out, cos and sin each a
 * tuple (storage address, storage size in bytes, offset, sizes, strides) with the offset and
 * strides in elements, as a tensor t gives them: t.untyped_storage().data_ptr(),
 * .nbytes(), t.storage_offset(), t.shape, t.stride(). Turns the first 2 * half channels of
 * every row of x into out (x itself, or a tensor of x's sizes), half = cos's last size. The
 * tables' leading dimensions broadcast against x's (right-aligned; a size of 1 repeats); with
 * first_row (an int, not None), the tables' outermost leading dimension is read from row
 * first_row on, as cos[first_row : first_row + n] would view it (n: x's size along it).
 * Checks everything it can first (see the top of this file). Releases the GIL. */
static PyObject *rotate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *x_desc, *out_desc, *cos_desc, *sin_desc, *first_obj;
    int bf16, interleaved, threads;
    if (!PyArg_ParseTuple(args, "OOOOOppi", &x_desc, &out_desc, &cos_desc, &sin_desc,
                          &first_obj, &bf16, &interleaved, &threads)) {
        return NULL;
    }
    const Py_ssize_t item = bf16 ? 2 : 4;
    Buffer x, out, cos, sin;
    if (read_buffer(x_desc, "x", item, &x) < 0 || read_buffer(out_desc, "out", item, &out) < 0
        || read_buffer(cos_desc, "cos", sizeof(float), &cos) < 0
        || read_buffer(sin_desc, "sin", sizeof(float), &sin) < 0) {
        return NULL;
    }
    Py_ssize_t first_row = -1; /* none: the tables broadcast as they are */
    if (first_obj != Py_None) {
        first_row = PyLong_AsSsize_t(first_obj);
        if (first_row == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (first_row < 0) {
            PyErr_Format(PyExc_IndexError, "first_row %zd: rows count from 0", first_row);
            return NULL;
        }
    }

    /* the shapes */
    if (!same_sizes(&out, &x)) {
        PyErr_Format(PyExc_ValueError, "out has sizes %R, x %R", out.sizes, x.sizes);
        return NULL;
    }
    if (!same_sizes(&sin, &cos)) {
        PyErr_Format(PyExc_ValueError, "sin has sizes %R, cos %R", sin.sizes, cos.sizes);
        return NULL;
    }
    if (cos.dims > x.dims) {
        PyErr_Format(PyExc_ValueError, "the tables (sizes %R) have more dimensions than x (%R)",
                     cos.sizes, x.sizes);
        return NULL;
    }
    const Py_ssize_t half = cos.size[LAST];
    if (half > x.size[LAST] / 2) {
        PyErr_Format(PyExc_ValueError,
                     "tables of %zd pairs need 2 * %zd channels, x has %zd (sizes %R)", half, half,
                     x.size[LAST], x.sizes);
        return NULL;
    }
    const Buffer *each[4] = {&x, &out, &cos, &sin};
    for (int i = 0; i < 4; i++) { /* the channels read: 2 * half of x and out, half of the tables */
        Py_ssize_t channels = i < 2 ? 2 * half : half;
        if (channels > 1 && each[i]->stride[LAST] != 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: its channels must be contiguous (stride 1), got strides %R",
                         each[i]->name, each[i]->strides);
            return NULL;
        }
    }

    /* the leading dimensions, the tables' broadcast against x's, and where each buffer starts */
    Job job;
    Py_ssize_t cos_start = cos.offset, sin_start = sin.offset, rows = 1;
    const int outer = MAX_DIMS - cos.dims; /* the tables' outermost dimension */
    if (first_row >= 0 && outer == LAST) {
        PyErr_Format(PyExc_ValueError, "first_row needs tables with rows, got cos of sizes %R",
                     cos.sizes);
        return NULL;
    }
    for (int k = 0; k < MAX_LEAD; k++) {
        job.sizes[k] = x.size[k];
        job.xs[k] = x.stride[k];
        job.os[k] = out.stride[k];
        if (x.size[k] > 1 && out.stride[k] == 0) {
            PyErr_Format(PyExc_ValueError,
                         "out: stride 0 along a dimension of %zd elements (sizes %R, strides %R) "
                         "would write each element more than once", x.size[k], out.sizes,
                         out.strides);
            return NULL;
        }
        if (!mul_ok(rows, x.size[k], &rows)) {
            PyErr_Format(PyExc_ValueError, "x: %R rows overflow", x.sizes);
            return NULL;
        }
        if (first_row >= 0 && k == outer) { /* rows first_row to first_row + n - 1 */
            if (first_row > cos.size[k] - x.size[k]) {
                PyErr_Format(PyExc_IndexError,
                             "first_row %zd: x needs %zd rows from there, the tables have %zd "
                             "(cos sizes %R)", first_row, x.size[k], cos.size[k], cos.sizes);
                return NULL;
            }
            Py_ssize_t cos_skip, sin_skip;
            if (!mul_ok(first_row, cos.stride[k], &cos_skip)
                || !mul_ok(first_row, sin.stride[k], &sin_skip)
                || !add_ok(cos_start, cos_skip, &cos_start)
                || !add_ok(sin_start, sin_skip, &sin_start)) {
                PyErr_Format(PyExc_ValueError,
                             "first_row %zd: its address overflows (cos strides %R, sin %R)",
                             first_row, cos.strides, sin.strides);
                return NULL;
            }
            job.cs[k] = cos.stride[k];
            job.ss[k] = sin.stride[k];
        } else if (cos.size[k] == 1) { /* the tables repeat along it (or have no such dim) */
            job.cs[k] = job.ss[k] = 0;
        } else if (cos.size[k] == x.size[k]) {
            job.cs[k] = cos.stride[k];
            job.ss[k] = sin.stride[k];
        } else {
            PyErr_Format(PyExc_ValueError, "the tables (sizes %R) do not broadcast against x (%R)",
                         cos.sizes, x.sizes);
            return NULL;
        }
    }
    if (rows == 0 || half == 0) {
        Py_RETURN_NONE; /* nothing to read or write */
    }
    if (check_extent(&x, x.offset, job.sizes, job.xs, 2 * half) < 0
        || check_extent(&out, out.offset, job.sizes, job.os, 2 * half) < 0
        || check_extent(&cos, cos_start, job.sizes, job.cs, half) < 0
        || check_extent(&sin, sin_start, job.sizes, job.ss, half) < 0) {
        return NULL;
    }
    /* (each start lies between the lowest and the highest element checked) */
    job.x = (char *)(uintptr_t)x.address + x.offset * item;
    job.out = (char *)(uintptr_t)out.address + out.offset * item;
    job.cos = (const float *)(uintptr_t)cos.address + cos_start;
    job.sin = (const float *)(uintptr_t)sin.address + sin_start;
    job.bf16 = bf16;
    job.interleaved = interleaved;
    job.half = half;
    coalesce(&job);

    if (threads < 1) {
        threads = 1;
    }
    if (threads > MAX_THREADS) {
        threads = MAX_THREADS;
    }
    if ((Py_ssize_t)threads > rows) {
        threads = (int)rows;
    }
    Job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t share = rows / threads, extra = rows % threads; /* the first `extra` take one more */
    for (int t = 0; t < threads; t++) {
        jobs[t] = job;
        jobs[t].start = share * t + (t < extra ? t : extra);
        jobs[t].stop = jobs[t].start + share + (t < extra ? 1 : 0);
    }
    for (int t = 1; t < threads; t++) { /* this thread takes the first share */
        if (pthread_create(&ids[t], NULL, run_rows_thread, &jobs[t]) != 0) {
            break;
        }
        started = t;
    }
    run_rows(&jobs[0]);
    for (int t = 1; t <= started; t++) {
        pthread_join(ids[t], NULL);
    }
    for (int t = started + 1; t < threads; t++) { /* shares no thread could be started for */
        run_rows(&jobs[t]);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rotate", rotate, METH_VARARGS,
     "rotate(x, out, cos, sin, first_row, bf16, interleaved, threads): eq. 34 on the storages "
     "described by x, out, cos and sin, each (address, nbytes, offset, sizes, strides); checks "
     "that every element addressed lies inside them (see posenc.encodings.rotate)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rotary_native",
    "The rotary rotation as one pass over memory (built at install time; see rotate.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rotary_native(void)
{
    return PyModule_Create(&module);
}
