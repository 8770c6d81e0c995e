/* Matrix products through OpenBLAS (scipy-openblas32: symbols prefixed scipy_), with a fused
 * epilogue: C = act(A @ op(B) + bias), row-major. op(B) = B (K, N) or B^T for B (N, K) (torch's
 * linear weight). batch > 1 repeats with element strides sa, sb, sc (sb = 0: a shared B). */
#include "tg_common.h"
#include <cblas.h>

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3 };

#define TG_EPILOGUE(NAME, T, RELU, GELU, GELU_TANH)                                          \
    static void NAME(T *restrict c, const T *restrict bias, int64_t m, int64_t n, int act) { \
        int64_t rows = m;                                                                    \
        _Pragma("omp parallel for schedule(static) num_threads(tg_team()) if(rows * n > TG_PAR_MIN)") \
        for (int64_t i = 0; i < rows; i++) {                                                 \
            T *ci = c + i * n;                                                               \
            if (bias) {                                                                      \
                _Pragma("omp simd")                                                          \
                for (int64_t j = 0; j < n; j++) ci[j] += bias[j];                            \
            }                                                                                \
            if (act == ACT_RELU) {                                                           \
                _Pragma("omp simd")                                                          \
                for (int64_t j = 0; j < n; j++) ci[j] = RELU(ci[j]);                         \
            } else if (act == ACT_GELU) {                                                    \
                _Pragma("omp simd")                                                          \
                for (int64_t j = 0; j < n; j++) ci[j] = GELU(ci[j]);                         \
            } else if (act == ACT_GELU_TANH) {                                               \
                _Pragma("omp simd")                                                          \
                for (int64_t j = 0; j < n; j++) ci[j] = GELU_TANH(ci[j]);                    \
            }                                                                                \
        }                                                                                    \
    }

static inline double tg_relu_d(double x) { return x < 0.0 ? 0.0 : x; }
TG_EPILOGUE(epilogue_f32, float, tg_reluf, tg_gelu_erf, tg_gelu_tanh)
TG_EPILOGUE(epilogue_f64, double, tg_relu_d, tg_gelu_erf_d, tg_gelu_tanh_d)

/* OpenBLAS's threads follow the team (tg_common.h) too: its caller waits, yielding, for every
 * worker, so one that lost its core to another process holds up the call as a late thread
 * holds up an OpenMP region ((64 x 384) @ (384 x 1536) on 2 cores: 4 ms alone, 24 ms with 3
 * busy processes). Setting the count when the team changes costs nothing otherwise. */
static inline void blas_follow_team(void) {
    int team = tg_team();
    if (scipy_openblas_get_num_threads() != team) scipy_openblas_set_num_threads(team);
}

/* c[p] = a[p] @ b[p] (b transposed when trans_b), then bias and activation, for each batch p.
 * One row (decoding a token) is a matrix-vector product: gemv reads B once at memory speed,
 * where gemm's packing of a 1-row A costs several times more (measured: the 50257 x 768 LM head,
 * 19 ms through sgemm, 5.4 ms through sgemv on 2 cores). */
#define TG_GEMM(NAME, T, GEMM, GEMV, ONE, ZERO, EPILOGUE)                                     \
    void NAME(const T *a, const T *b, const T *bias, T *c, int64_t batch, int64_t m,          \
              int64_t n, int64_t k, int64_t sa, int64_t sb, int64_t sc, int trans_b, int act) { \
        blas_follow_team();                                                                   \
        for (int64_t p = 0; p < batch; p++) {                                                 \
            if (m > 0 && n > 0) {                                                             \
                if (k > 0 && m == 1)                                                          \
                    GEMV(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans,                  \
                         (blasint)(trans_b ? n : k), (blasint)(trans_b ? k : n), ONE,         \
                         b + p * sb, (blasint)(trans_b ? k : n), a + p * sa, 1, ZERO,         \
                         c + p * sc, 1);                                                      \
                else if (k > 0)                                                               \
                    GEMM(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,    \
                         (blasint)m, (blasint)n, (blasint)k, ONE, a + p * sa, (blasint)k,     \
                         b + p * sb, (blasint)(trans_b ? k : n), ZERO, c + p * sc,            \
                         (blasint)n);                                                         \
                else                                                                          \
                    memset(c + p * sc, 0, sizeof(T) * (size_t)(m * n));                       \
            }                                                                                 \
            if (bias || act) EPILOGUE(c + p * sc, bias, m, n, act);                           \
        }                                                                                     \
    }

TG_GEMM(tg_gemm_f32, float, scipy_cblas_sgemm, scipy_cblas_sgemv, 1.0f, 0.0f, epilogue_f32)
TG_GEMM(tg_gemm_f64, double, scipy_cblas_dgemm, scipy_cblas_dgemv, 1.0, 0.0, epilogue_f64)

/* the BLAS alone, for the benchmark's "raw sgemm" row */
void tg_raw_sgemm(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k) {
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n,
                      (blasint)k, 1.0f, a, (blasint)k, b, (blasint)n, 0.0f, c, (blasint)n);
}
