/* The rotary arithmetic's interface between _rotary_rows.c (the rows turned, the scheduling of
 * runs) and _rotary_native.c (the Python interface and its checks). */
#ifndef POSENC_ROTARY_ROWS_H
#define POSENC_ROTARY_ROWS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The leading dimensions (everything but the channels) a call may have. */
#define MAX_LEAD 4

/* A rotation: its rows and how to reach them. */
typedef struct {
    char *x, *out;            /* the rows, in their dtype */
    const float *cos, *sin;   /* the tables, float32 */
    int bf16, interleaved;
    Py_ssize_t half;
    Py_ssize_t sizes[MAX_LEAD];
    Py_ssize_t xs[MAX_LEAD], os[MAX_LEAD], cs[MAX_LEAD], ss[MAX_LEAD];
    Py_ssize_t start, stop;   /* the flat rows turned: [start, stop) */
} Job;

/* Rotate rows [start, stop) of the leading index space (row-major over `sizes`), one call per
 * run along the innermost dimension. */
void rotary_run_rows(const Job *job);

/* Turn the rows of job: shared among the threads of the OpenMP runtime where the kernel is
 * built with it and the rotation is large (torch's runtime, whose workers wait for work after
 * each of torch's parallel operators), else on the calling thread. Called without the GIL. */
void rotary_run_job(const Job *job);

/* Merge neighbouring dimensions that every operand walks as one, so that runs are as long as
 * the memory allows; the dimensions stay right-aligned, padded with size 1. */
void rotary_coalesce(Job *job);

#endif
