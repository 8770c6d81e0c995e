/* Row kernels over the last axis (float32, contiguous rows of length n): softmax, layer_norm,
 * rms_norm; and rotary embedding (HF rotate_half). Rows run in parallel (OpenMP). */
#include "tg_common.h"

#define TG_ROWS_PAR "omp parallel for schedule(static) num_threads(tg_team()) if(rows * n > TG_PAR_MIN)"

/* exp(x - max) / sum: a NaN anywhere (or +inf) makes the row NaN, as the reference does. */
void tg_softmax_f32(const float *restrict x, float *restrict y, int64_t rows, int64_t n) {
    _Pragma(TG_ROWS_PAR)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float m = tg_row_max(xr, n);
        float s = 0.0f;
        _Pragma("omp simd reduction(+:s)")
        for (int64_t j = 0; j < n; j++) {
            float e = tg_expf(xr[j] - m);
            yr[j] = e;
            s += e;
        }
        float inv = 1.0f / s;
        _Pragma("omp simd")
        for (int64_t j = 0; j < n; j++) yr[j] *= inv;
    }
}

/* (x - mean) / sqrt(var + eps) * w + b (biased variance, two passes); w, b may be NULL. */
void tg_layer_norm_f32(const float *restrict x, const float *restrict w, const float *restrict b,
                       float *restrict y, int64_t rows, int64_t n, float eps) {
    _Pragma(TG_ROWS_PAR)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float mean = tg_row_sum(xr, n) / (float)n;
        float v = tg_row_sumsq(xr, n, mean);
        float rstd = 1.0f / sqrtf(v / (float)n + eps);
        if (w && b) {
            _Pragma("omp simd")
            for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mean) * rstd * w[j] + b[j];
        } else if (w) {
            _Pragma("omp simd")
            for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mean) * rstd * w[j];
        } else {
            _Pragma("omp simd")
            for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mean) * rstd;
        }
    }
}

/* layer_norm(a + b) with w and b: the residual add of a post-norm block (BERT) in the same
 * pass, so its sum never goes through memory (it is written to the row of y, read back from
 * L1, normalised in place). Same arithmetic as tg_layer_norm_f32 on the rounded sum. */
void tg_add_layer_norm_f32(const float *restrict a, const float *restrict b2,
                           const float *restrict w, const float *restrict b,
                           float *restrict y, int64_t rows, int64_t n, float eps) {
    _Pragma(TG_ROWS_PAR)
    for (int64_t r = 0; r < rows; r++) {
        const float *ar = a + r * n, *br = b2 + r * n;
        float *yr = y + r * n;
        _Pragma("omp simd")
        for (int64_t j = 0; j < n; j++) yr[j] = ar[j] + br[j];
        float mean = tg_row_sum(yr, n) / (float)n;
        float v = tg_row_sumsq(yr, n, mean);
        float rstd = 1.0f / sqrtf(v / (float)n + eps);
        _Pragma("omp simd")
        for (int64_t j = 0; j < n; j++) yr[j] = (yr[j] - mean) * rstd * w[j] + b[j];
    }
}

/* x / sqrt(mean(x^2) + eps) * w; w may be NULL. */
void tg_rms_norm_f32(const float *restrict x, const float *restrict w, float *restrict y,
                     int64_t rows, int64_t n, float eps) {
    _Pragma(TG_ROWS_PAR)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float s = tg_row_sumsq(xr, n, 0.0f);
        float rstd = 1.0f / sqrtf(s / (float)n + eps);
        if (w) {
            _Pragma("omp simd")
            for (int64_t j = 0; j < n; j++) yr[j] = xr[j] * rstd * w[j];
        } else {
            _Pragma("omp simd")
            for (int64_t j = 0; j < n; j++) yr[j] = xr[j] * rstd;
        }
    }
}

/* x: (outer, seq, d) contiguous; cos, sin: (seq, d) contiguous (HF layout, halves repeated).
 * y[i] = x[i] * cos[i] + rot[i] * sin[i], rot = concat(-x2, x1). */
/* c, s: (outer / per, seq, d) tables, each shared by ``per`` consecutive (seq, d) blocks of x
 * (per = outer: one table for all; per = heads: a table per batch row, a padded batch's own
 * positions). */
void tg_rotary_f32(const float *restrict x, const float *restrict c, const float *restrict s,
                   float *restrict y, int64_t outer, int64_t seq, int64_t d, int64_t per) {
    int64_t h = d / 2, rows = outer * seq, n = d;
    _Pragma(TG_ROWS_PAR)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        int64_t t = (r / seq / per) * seq + r % seq; /* the table row */
        const float *cr = c + t * d, *sr = s + t * d;
        float *yr = y + r * d;
        _Pragma("omp simd")
        for (int64_t j = 0; j < h; j++) {
            yr[j] = xr[j] * cr[j] - xr[j + h] * sr[j];
            yr[j + h] = xr[j + h] * cr[j + h] + xr[j] * sr[j + h];
        }
    }
}
