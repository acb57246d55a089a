/* The Python interface of posenc's rotary kernel (posenc.encodings.rotary.kernels._rotary_native.rotate): the
 * arguments read, checked against the buffers they describe, and the rows handed to the
 * arithmetic in _rotary_rows.c (rotary_rows.h). The arithmetic itself, and how it is built,
 * is described there.
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
 *     elements turn twice or are read after they are written.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "rotary_rows.h"

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

/* Fill b from the numbers that describe one buffer and check what can be checked of it alone;
 * sizes and strides are kept (borrowed) for messages. */
static int fill_buffer(Buffer *b, const char *name, Py_ssize_t item, unsigned long long address,
                       Py_ssize_t nbytes, Py_ssize_t offset, PyObject *sizes, PyObject *strides)
{
    b->name = name;
    b->item = item;
    b->address = address;
    b->nbytes = nbytes;
    b->offset = offset;
    b->sizes = sizes;
    b->strides = strides;
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

/* Read the description (address, nbytes, offset, sizes, strides) of one buffer. */
static int read_buffer(PyObject *desc, const char *name, Py_ssize_t item, Buffer *b)
{
    if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 5) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a tuple (address, nbytes, offset, sizes, strides)", name);
        return -1;
    }
    unsigned long long address = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(desc, 0));
    if (address == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 1));
    if (nbytes == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 2));
    if (offset == -1 && PyErr_Occurred()) {
        return -1;
    }
    return fill_buffer(b, name, item, address, nbytes, offset, PyTuple_GET_ITEM(desc, 3),
                       PyTuple_GET_ITEM(desc, 4));
}

/* The interned names of the tensor methods and attributes read here. */
static PyObject *s_untyped_storage, *s_data_ptr, *s_nbytes, *s_storage_offset, *s_shape,
    *s_stride, *s_is_cpu, *s_dtype;

/* An int that a method of obj returns, or -1 with an exception set. */
static long long call_int(PyObject *obj, PyObject *method)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, method);
    if (r == NULL) {
        return -1;
    }
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

/* What a torch tensor t says of itself, read as rotate.py's descriptions are: the address and
 * size of t.untyped_storage(), t.storage_offset(), t.shape, t.stride(). The sizes and strides
 * are new references in owned[0] and owned[1], which the caller releases. */
static int read_tensor(PyObject *t, const char *name, Py_ssize_t item, Buffer *b,
                       PyObject **owned)
{
    PyObject *storage = PyObject_CallMethodNoArgs(t, s_untyped_storage);
    if (storage == NULL) {
        return -1;
    }
    unsigned long long address = (unsigned long long)-1;
    PyObject *at = PyObject_CallMethodNoArgs(storage, s_data_ptr);
    if (at != NULL) {
        address = PyLong_AsUnsignedLongLong(at);
        Py_DECREF(at);
    }
    long long nbytes = PyErr_Occurred() ? -1 : call_int(storage, s_nbytes);
    Py_DECREF(storage);
    if (nbytes == -1 && PyErr_Occurred()) {
        return -1;
    }
    long long offset = call_int(t, s_storage_offset);
    if (offset == -1 && PyErr_Occurred()) {
        return -1;
    }
    if ((owned[0] = PyObject_GetAttr(t, s_shape)) == NULL
        || (owned[1] = PyObject_CallMethodNoArgs(t, s_stride)) == NULL) {
        return -1;
    }
    return fill_buffer(b, name, item, address, (Py_ssize_t)nbytes, (Py_ssize_t)offset, owned[0],
                       owned[1]);
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

/* Check x, out, cos and sin against each other (the top of this file) and fill job with the
 * rows to turn, all of them (start 0, stop the number of rows: 0 where nothing is to be read
 * or written, and then nothing else of job is set); -1 with an exception set, and job unusable, where a check fails. */
static int plan_job(const Buffer *x, const Buffer *out, const Buffer *cos, const Buffer *sin,
                    Py_ssize_t first_row, int bf16, int interleaved, Job *job)
{
    job->start = job->stop = 0;
    /* the shapes */
    if (!same_sizes(out, x)) {
        PyErr_Format(PyExc_ValueError, "out has sizes %R, x %R", out->sizes, x->sizes);
        return -1;
    }
    if (!same_sizes(sin, cos)) {
        PyErr_Format(PyExc_ValueError, "sin has sizes %R, cos %R", sin->sizes, cos->sizes);
        return -1;
    }
    if (cos->dims > x->dims) {
        PyErr_Format(PyExc_ValueError, "the tables (sizes %R) have more dimensions than x (%R)",
                     cos->sizes, x->sizes);
        return -1;
    }
    const Py_ssize_t half = cos->size[LAST];
    if (half > x->size[LAST] / 2) {
        PyErr_Format(PyExc_ValueError,
                     "tables of %zd pairs need 2 * %zd channels, x has %zd (sizes %R)", half, half,
                     x->size[LAST], x->sizes);
        return -1;
    }
    const Buffer *each[4] = {x, out, cos, sin};
    for (int i = 0; i < 4; i++) { /* the channels read: 2 * half of x and out, half of the tables */
        Py_ssize_t channels = i < 2 ? 2 * half : half;
        if (channels > 1 && each[i]->stride[LAST] != 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: its channels must be contiguous (stride 1), got strides %R",
                         each[i]->name, each[i]->strides);
            return -1;
        }
    }

    /* the leading dimensions, the tables' broadcast against x's, and where each buffer starts */
    Py_ssize_t cos_start = cos->offset, sin_start = sin->offset, rows = 1;
    const int outer = MAX_DIMS - cos->dims; /* the tables' outermost dimension */
    if (first_row >= 0 && outer == LAST) {
        PyErr_Format(PyExc_ValueError, "first_row needs tables with rows, got cos of sizes %R",
                     cos->sizes);
        return -1;
    }
    for (int k = 0; k < MAX_LEAD; k++) {
        job->sizes[k] = x->size[k];
        job->xs[k] = x->stride[k];
        job->os[k] = out->stride[k];
        if (x->size[k] > 1 && out->stride[k] == 0) {
            PyErr_Format(PyExc_ValueError,
                         "out: stride 0 along a dimension of %zd elements (sizes %R, strides %R) "
                         "would write each element more than once", x->size[k], out->sizes,
                         out->strides);
            return -1;
        }
        if (!mul_ok(rows, x->size[k], &rows)) {
            PyErr_Format(PyExc_ValueError, "x: %R rows overflow", x->sizes);
            return -1;
        }
        if (first_row >= 0 && k == outer) { /* rows first_row to first_row + n - 1 */
            if (first_row > cos->size[k] - x->size[k]) {
                PyErr_Format(PyExc_IndexError,
                             "first_row %zd: x needs %zd rows from there, the tables have %zd "
                             "(cos sizes %R)", first_row, x->size[k], cos->size[k], cos->sizes);
                return -1;
            }
            Py_ssize_t cos_skip, sin_skip;
            if (!mul_ok(first_row, cos->stride[k], &cos_skip)
                || !mul_ok(first_row, sin->stride[k], &sin_skip)
                || !add_ok(cos_start, cos_skip, &cos_start)
                || !add_ok(sin_start, sin_skip, &sin_start)) {
                PyErr_Format(PyExc_ValueError,
                             "first_row %zd: its address overflows (cos strides %R, sin %R)",
                             first_row, cos->strides, sin->strides);
                return -1;
            }
            job->cs[k] = cos->stride[k];
            job->ss[k] = sin->stride[k];
        } else if (cos->size[k] == 1) { /* the tables repeat along it (or have no such dim) */
            job->cs[k] = job->ss[k] = 0;
        } else if (cos->size[k] == x->size[k]) {
            job->cs[k] = cos->stride[k];
            job->ss[k] = sin->stride[k];
        } else {
            PyErr_Format(PyExc_ValueError, "the tables (sizes %R) do not broadcast against x (%R)",
                         cos->sizes, x->sizes);
            return -1;
        }
    }
    if (rows == 0 || half == 0) {
        return 0; /* nothing to read or write */
    }
    if (check_extent(x, x->offset, job->sizes, job->xs, 2 * half) < 0
        || check_extent(out, out->offset, job->sizes, job->os, 2 * half) < 0
        || check_extent(cos, cos_start, job->sizes, job->cs, half) < 0
        || check_extent(sin, sin_start, job->sizes, job->ss, half) < 0) {
        return -1;
    }
    /* (each start lies between the lowest and the highest element checked) */
    job->x = (char *)(uintptr_t)x->address + x->offset * x->item;
    job->out = (char *)(uintptr_t)out->address + out->offset * out->item;
    job->cos = (const float *)(uintptr_t)cos->address + cos_start;
    job->sin = (const float *)(uintptr_t)sin->address + sin_start;
    job->bf16 = bf16;
    job->interleaved = interleaved;
    job->half = half;
    rotary_coalesce(job);
    job->start = 0;
    job->stop = rows;
    return 0;
}

/* Read the first_row argument: -1 for None (the tables broadcast as they are). */
static int read_first_row(PyObject *first_obj, Py_ssize_t *first_row)
{
    *first_row = -1;
    if (first_obj == Py_None) {
        return 0;
    }
    *first_row = PyLong_AsSsize_t(first_obj);
    if (*first_row == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*first_row < 0) {
        PyErr_Format(PyExc_IndexError, "first_row %zd: rows count from 0", *first_row);
        return -1;
    }
    return 0;
}

/* rotate(x, out, cos, sin, first_row, bf16, interleaved): x, out, cos and sin each a tuple
 * (storage address, storage size in bytes, offset, sizes, strides) with the offset and strides
 * in elements, as a tensor t gives them: t.untyped_storage().data_ptr(), .nbytes(),
 * t.storage_offset(), t.shape, t.stride(). Turns the first 2 * half channels of every row of
 * x into out (x itself, or a tensor of x's sizes), half = cos's last size. The tables' leading
 * dimensions broadcast against x's (right-aligned; a size of 1 repeats); with first_row (an
 * int, not None), the tables' outermost leading dimension is read from row first_row on, as
 * cos[first_row : first_row + n] would view it (n: x's size along it). Checks everything it
 * can first (see the top of this file), then turns the rows on the calling thread with the GIL
 * released. */
static PyObject *rotate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *x_desc, *out_desc, *cos_desc, *sin_desc, *first_obj;
    int bf16, interleaved;
    if (!PyArg_ParseTuple(args, "OOOOOpp", &x_desc, &out_desc, &cos_desc, &sin_desc,
                          &first_obj, &bf16, &interleaved)) {
        return NULL;
    }
    const Py_ssize_t item = bf16 ? 2 : 4;
    Buffer x, out, cos, sin;
    Py_ssize_t first_row;
    Job job;
    if (read_buffer(x_desc, "x", item, &x) < 0 || read_buffer(out_desc, "out", item, &out) < 0
        || read_buffer(cos_desc, "cos", sizeof(float), &cos) < 0
        || read_buffer(sin_desc, "sin", sizeof(float), &sin) < 0
        || read_first_row(first_obj, &first_row) < 0
        || plan_job(&x, &out, &cos, &sin, first_row, bf16, interleaved, &job) < 0) {
        return NULL;
    }
    if (job.stop > 0) {
        Py_BEGIN_ALLOW_THREADS
        rotary_run_job(&job);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

/* Which dtype the torch tensor t holds where the kernel takes it: 0 for float32 (f32), 1 for
 * bfloat16 (bf16), both on the CPU; 2 where it does not take it (another dtype or device); -1
 * with an exception set where t does not answer. */
static int tensor_dtype(PyObject *t, PyObject *f32, PyObject *bf16)
{
    PyObject *is_cpu = PyObject_GetAttr(t, s_is_cpu);
    if (is_cpu == NULL) {
        return -1;
    }
    int cpu = is_cpu == Py_True;
    Py_DECREF(is_cpu);
    PyObject *dtype = PyObject_GetAttr(t, s_dtype);
    if (dtype == NULL) {
        return -1;
    }
    int code = !cpu ? 2 : dtype == f32 ? 0 : dtype == bf16 ? 1 : 2;
    Py_DECREF(dtype);
    return code;
}

/* rotate_pair(q, k, cos, sin, interleaved, float32, bfloat16): the torch tensors q and k
 * turned in place by the tables cos and sin, described as rotate takes them, broadcast
 * against each; float32 and bfloat16 are torch's dtype objects. False, with nothing done,
 * where q and k are not both CPU tensors of one of those dtypes, the same one; else each is
 * described from its own methods (read_tensor) and both are checked before either is written:
 * a failed check raises with nothing written; q and k in one storage are refused (whether
 * they overlap is not looked for). True once both are turned. */
static PyObject *rotate_pair(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *q_obj, *k_obj, *cos_desc, *sin_desc, *f32, *bf16_dtype;
    int interleaved;
    if (!PyArg_ParseTuple(args, "OOOOpOO", &q_obj, &k_obj, &cos_desc, &sin_desc, &interleaved,
                          &f32, &bf16_dtype)) {
        return NULL;
    }
    int bf16 = tensor_dtype(q_obj, f32, bf16_dtype);
    if (bf16 < 0) {
        return NULL;
    }
    int k_dtype = tensor_dtype(k_obj, f32, bf16_dtype);
    if (k_dtype < 0) {
        return NULL;
    }
    if (bf16 == 2 || k_dtype != bf16) {
        Py_RETURN_FALSE;
    }
    const Py_ssize_t item = bf16 ? 2 : 4;
    Buffer q, k, cos, sin;
    PyObject *owned[4] = {NULL, NULL, NULL, NULL};
    Job jobs[2];
    int ok = read_buffer(cos_desc, "cos", sizeof(float), &cos) == 0
             && read_buffer(sin_desc, "sin", sizeof(float), &sin) == 0
             && read_tensor(q_obj, "q", item, &q, owned) == 0
             && read_tensor(k_obj, "k", item, &k, owned + 2) == 0;
    if (ok && q.address == k.address) {
        PyErr_SetString(PyExc_ValueError, "q and k share one storage");
        ok = 0;
    }
    ok = ok && plan_job(&q, &q, &cos, &sin, -1, bf16, interleaved, &jobs[0]) == 0
         && plan_job(&k, &k, &cos, &sin, -1, bf16, interleaved, &jobs[1]) == 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        for (int i = 0; i < 2; i++) {
            if (jobs[i].stop > 0) {
                rotary_run_job(&jobs[i]);
            }
        }
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(owned[i]);
    }
    if (!ok) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"rotate", rotate, METH_VARARGS,
     "rotate(x, out, cos, sin, first_row, bf16, interleaved): eq. 34 on the storages described "
     "by x, out, cos and sin, each (address, nbytes, offset, sizes, strides); checks that every "
     "element addressed lies inside them (see posenc.encodings.rotary.kernels.rotate)."},
    {"rotate_pair", rotate_pair, METH_VARARGS,
     "rotate_pair(q, k, cos, sin, interleaved, float32, bfloat16): the CPU tensors q and k "
     "turned in place by the tables described by cos and sin, both checked before either is "
     "written; False where their device or dtype is not the kernel's."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rotary_native",
    "The rotary rotation as one pass over memory (built at install time; see native.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rotary_native(void)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&s_untyped_storage, "untyped_storage"}, {&s_data_ptr, "data_ptr"},
                 {&s_nbytes, "nbytes"}, {&s_storage_offset, "storage_offset"},
                 {&s_shape, "shape"}, {&s_stride, "stride"}, {&s_is_cpu, "is_cpu"},
                 {&s_dtype, "dtype"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if ((*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&module);
}
