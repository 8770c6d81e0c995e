/* Sums over one run of adjacent axes of a dense array, float32 or float64: the input seen as
 * (outer, r, inner), out[o, j] = sum_i x[o, i, j], accumulated in double and rounded once.
 * A backward pass sums a bias's gradient over the batch and sequence axes ((8, 128, 256) over
 * (0, 1): inner = 256) and a loss over its rows (inner = 1); without a C kernel for them a
 * training step ran torch's or numpy's sums and so the Python loop.
 *
 * inner == 1: each output is one row's sum (threads split the rows when there are enough,
 * else one thread per half of the single row is not worth it under TG_PAR_MIN elements).
 * inner > 1: threads split (outer x column blocks of TG_SUM_BLOCK); each block keeps its
 * partial sums in a double array on the stack, reading the rows in order (unit stride). */
#include "tg_common.h"

#define TG_SUM_BLOCK 256

#define TG_SUM(NAME, T)                                                                        \
void NAME(const T *restrict x, T *restrict out, int64_t outer, int64_t r, int64_t inner) {    \
    if (outer <= 0 || inner <= 0) return;                                                     \
    if (r <= 0) {                                                                             \
        memset(out, 0, sizeof(T) * (size_t)(outer * inner));                                  \
        return;                                                                               \
    }                                                                                         \
    const int par = outer * r * inner > TG_PAR_MIN;                                           \
    if (inner == 1) {                                                                         \
        _Pragma("omp parallel for schedule(static) num_threads(tg_team()) if(par && outer > 1)") \
        for (int64_t o = 0; o < outer; o++) {                                                 \
            const T *row = x + o * r;                                                         \
            double acc = 0.0;                                                                 \
            _Pragma("omp simd reduction(+:acc)")                                              \
            for (int64_t i = 0; i < r; i++) acc += (double)row[i];                            \
            out[o] = (T)acc;                                                                  \
        }                                                                                     \
        return;                                                                               \
    }                                                                                         \
    const int64_t blocks = (inner + TG_SUM_BLOCK - 1) / TG_SUM_BLOCK;                         \
    _Pragma("omp parallel for schedule(static) num_threads(tg_team()) if(par && outer * blocks > 1)") \
    for (int64_t t = 0; t < outer * blocks; t++) {                                            \
        const int64_t o = t / blocks, j0 = (t % blocks) * TG_SUM_BLOCK;                       \
        const int64_t w = inner - j0 < TG_SUM_BLOCK ? inner - j0 : TG_SUM_BLOCK;              \
        double acc[TG_SUM_BLOCK];                                                             \
        for (int64_t j = 0; j < w; j++) acc[j] = 0.0;                                         \
        const T *base = x + o * r * inner + j0;                                               \
        for (int64_t i = 0; i < r; i++) {                                                     \
            const T *row = base + i * inner;                                                  \
            _Pragma("omp simd")                                                               \
            for (int64_t j = 0; j < w; j++) acc[j] += (double)row[j];                         \
        }                                                                                     \
        T *dst = out + o * inner + j0;                                                        \
        for (int64_t j = 0; j < w; j++) dst[j] = (T)acc[j];                                   \
    }                                                                                         \
}

TG_SUM(tg_sum_f32, float)
TG_SUM(tg_sum_f64, double)
