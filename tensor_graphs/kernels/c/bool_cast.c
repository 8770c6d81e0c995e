/* bool to float32/float64 (0 or 1, exact): cross entropy's mask of counted targets
 * (`cast(targets != ignore_index)`) is the one cast a training step's graph makes from bool;
 * with numpy's kernel alone for it the step ran in the Python loop. numpy's bools are one
 * byte, 0 or 1. */
#include "tg_common.h"

#define TG_BOOL_CAST(NAME, T)                                                                  \
void NAME(const uint8_t *restrict xs, T *restrict ys, int64_t n) {                            \
    _Pragma("omp parallel for simd schedule(static) num_threads(tg_team()) if(n > 8 * TG_PAR_MIN)") \
    for (int64_t i = 0; i < n; i++) ys[i] = xs[i] ? (T)1 : (T)0;                              \
}

TG_BOOL_CAST(tg_cast_bool_f32, float)
TG_BOOL_CAST(tg_cast_bool_f64, double)
