/* Gather along one axis (numpy.take) and embedding, for any element type: x viewed as
 * (outer, size, inner) with the gathered axis in the middle, indices (n of them, int32 or
 * int64), out (outer, n, inner). Each picked slice is `inner_bytes` contiguous bytes, copied
 * as is (the element type does not matter: no arithmetic, bit-exact). Embedding is outer = 1:
 * a row of the table per id. tg_embedding_add_*: embedding + x in the same pass (below).
 *
 * Every index is checked before anything is written: one outside [0, size) makes the call
 * return 1 with `out` untouched (the Python wrapper names the index; the native loop reruns
 * the call in Python for that). Rows are copied in parallel (OpenMP) from TG_GATHER_PAR bytes. */
#include "tg_common.h"

/* bytes copied before the rows go parallel. Measured at 2 threads with spinning workers (rows of
 * 768 floats from a 50257-row table): 48 KiB 3.6 us vs 3.8 on one thread, 192 KiB 5.4 vs 7.3,
 * 384 KiB (GPT-2's 128-token prefill) 7.5 vs 12.4; workers that sleep cost microseconds to wake,
 * so the small copies stay on the calling thread. */
#define TG_GATHER_PAR (128 * 1024)

/* copy `bytes` from s to d; the common small element sizes as one load and store */
TG_INLINE void tg_copy_slice(char *restrict d, const char *restrict s, int64_t bytes) {
    switch (bytes) {
    case 1: *d = *s; return;
    case 2: memcpy(d, s, 2); return;
    case 4: memcpy(d, s, 4); return;
    case 8: memcpy(d, s, 8); return;
    default: memcpy(d, s, (size_t)bytes); return;
    }
}

#define TG_GATHER(SUFFIX, ITYPE)                                                               \
int tg_gather_##SUFFIX(const ITYPE *restrict idx, int64_t n, const char *restrict x,           \
                       char *restrict out, int64_t outer, int64_t size, int64_t inner_bytes) { \
    int bad = 0;                                                                               \
    for (int64_t i = 0; i < n; i++)                                                            \
        bad |= (idx[i] < 0) | ((int64_t)idx[i] >= size);                                       \
    if (bad)                                                                                   \
        return 1;                                                                              \
    if (inner_bytes <= 0 || outer <= 0)                                                        \
        return 0;                                                                              \
    const int64_t slices = outer * n;                                                          \
    const size_t x_outer = (size_t)size * (size_t)inner_bytes;                                 \
    const size_t o_outer = (size_t)n * (size_t)inner_bytes;                                    \
    const int par = slices > 1 && slices * inner_bytes >= TG_GATHER_PAR;                       \
    _Pragma("omp parallel for schedule(static) num_threads(tg_team()) if(par)")              \
    for (int64_t s = 0; s < slices; s++) {                                                     \
        const int64_t a = s / n, j = s - a * n;                                                \
        tg_copy_slice(out + a * o_outer + (size_t)j * (size_t)inner_bytes,                     \
                      x + a * x_outer + (size_t)idx[j] * (size_t)inner_bytes, inner_bytes);    \
    }                                                                                          \
    return 0;                                                                                  \
}

TG_GATHER(i32, int32_t)
TG_GATHER(i64, int64_t)

/* embedding(ids, table) + x: out[i, :] = table[ids[i], :] + x[i % x_rows, :] (x repeats over
 * the leading rows: a position embedding added to a batch of token embeddings), float32 or
 * float64, one rounding per element as the reference. Same index check as above. */
#define TG_EMBEDDING_ADD(SUFFIX, ITYPE, FTYPE)                                                  \
int tg_embedding_add_##SUFFIX(const ITYPE *restrict idx, int64_t n, const FTYPE *restrict t,   \
                              const FTYPE *restrict x, int64_t x_rows, FTYPE *restrict out,    \
                              int64_t rows, int64_t dim) {                                     \
    int bad = 0;                                                                               \
    for (int64_t i = 0; i < n; i++)                                                            \
        bad |= (idx[i] < 0) | ((int64_t)idx[i] >= rows);                                       \
    if (bad)                                                                                   \
        return 1;                                                                              \
    if (dim <= 0 || x_rows <= 0)                                                               \
        return 0;                                                                              \
    const int par = n > 1 && n * dim * (int64_t)sizeof(FTYPE) >= TG_GATHER_PAR;               \
    _Pragma("omp parallel for schedule(static) num_threads(tg_team()) if(par)")              \
    for (int64_t i = 0; i < n; i++) {                                                          \
        const FTYPE *tr = t + (size_t)idx[i] * (size_t)dim, *xr = x + (i % x_rows) * dim;      \
        FTYPE *o = out + i * dim;                                                              \
        _Pragma("omp simd")                                                                    \
        for (int64_t j = 0; j < dim; j++) o[j] = tr[j] + xr[j];                                \
    }                                                                                          \
    return 0;                                                                                  \
}

TG_EMBEDDING_ADD(i32_f32, int32_t, float)
TG_EMBEDDING_ADD(i64_f32, int64_t, float)
TG_EMBEDDING_ADD(i32_f64, int32_t, double)
TG_EMBEDDING_ADD(i64_f64, int64_t, double)
