/* Matrix products that read their operands through their strides (scipy-openblas32, symbols
 * prefixed scipy_): c[p] = a[p] @ b[p] for every batch index p, c dense row-major, a (m, k)
 * and b (k, n) any 2-D views. A backward pass multiplies transposes (g @ W^T, x^T @ g), slices
 * (the q, k and v thirds of a fused projection) and head permutations; a kernel that wants
 * dense operands makes each a copy first, where BLAS reads a transpose or a row stride as it
 * is (its trans flag and leading dimension).
 *
 * Each operand is read as BLAS reads it: row-major (column stride 1, row stride >= its
 * columns) with ld = the row stride, or transposed (row stride 1, column stride >= its rows)
 * with ld = the column stride; an extent-1 axis fits either. Any other view (a broadcast
 * stride of 0, a negative stride, two strides above 1) is first packed densely into a buffer
 * of this call's own (malloc), so every call works from its arguments alone and the native
 * loop replays it.
 *
 * Batches: up to three batch axes (extents nb0..nb2, element strides per operand; 0 for one
 * broadcast). Threads are the C kernels' OpenMP team (tg_team, tg_common.h: it shrinks to the
 * calling thread while the cores are oversubscribed), each calling OpenBLAS on one thread:
 * small products (under TG_SMM_SERIAL_FLOPS each) with a team's worth of them run one per
 * thread; a product of TG_SMM_SPLIT_FLOPS or more is cut into one block of rows (or of
 * columns, when it has more columns than rows) per thread. Not OpenBLAS's own threads: they
 * sleep at once after a call (OPENBLAS_THREAD_TIMEOUT=4, see tensor_graphs.threads) and are
 * woken for the next, where the team's spin for ~0.2 ms between the back-to-back kernels of a
 * training step; a batched product woke them once per entry. */
#include "tg_common.h"
#include <cblas.h>

#define TG_SMM_SERIAL_FLOPS (16LL * 1024 * 1024)
#define TG_SMM_SPLIT_FLOPS (4LL * 1024 * 1024)

static inline void blas_follow(int threads) {
    if (scipy_openblas_get_num_threads() != threads) scipy_openblas_set_num_threads(threads);
}

/* How BLAS reads a rows x cols operand with element strides (rs, cs): 0 row-major, 1
 * transposed, -1 neither (pack it); *ld its leading dimension. */
static inline int tg_smm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *ld) {
    if ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) {
        *ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
        if (*ld < 1) *ld = 1;
        return 0;
    }
    if ((rs == 1 || rows == 1) && (cols == 1 || cs >= rows)) {
        *ld = cols == 1 ? (rows > 1 ? rows : 1) : cs;
        if (*ld < 1) *ld = 1;
        return 1;
    }
    return -1;
}

/* one product block: c (m x n, row stride ldc) = a (m x k) @ b (k x n) [+ c] */
#define TG_SMM(NAME, T, GEMM, ONE, ZERO)                                                       \
static void NAME##_one(const T *a, const T *b, T *c, int64_t m, int64_t n, int64_t k,         \
                       int64_t ars, int64_t acs, int64_t brs, int64_t bcs, int64_t ldc,       \
                       T beta, T *pa, T *pb) {                                                \
    if (m <= 0 || n <= 0) return;                                                             \
    if (k <= 0) {                                                                             \
        if (beta == ZERO)                                                                     \
            for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, sizeof(T) * (size_t)n);    \
        return;                                                                               \
    }                                                                                         \
    int64_t lda, ldb;                                                                         \
    int ta = tg_smm_layout(m, k, ars, acs, &lda), tb = tg_smm_layout(k, n, brs, bcs, &ldb);   \
    if (ta < 0) {                                                                             \
        for (int64_t i = 0; i < m; i++)                                                       \
            for (int64_t j = 0; j < k; j++) pa[i * k + j] = a[i * ars + j * acs];             \
        a = pa, ta = 0, lda = k;                                                              \
    }                                                                                         \
    if (tb < 0) {                                                                             \
        for (int64_t i = 0; i < k; i++)                                                       \
            for (int64_t j = 0; j < n; j++) pb[i * n + j] = b[i * brs + j * bcs];             \
        b = pb, tb = 0, ldb = n;                                                              \
    }                                                                                         \
    GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,       \
         (blasint)m, (blasint)n, (blasint)k, ONE, a, (blasint)lda, b, (blasint)ldb, beta, c,  \
         (blasint)ldc);                                                                       \
}                                                                                             \
                                                                                              \
/* returns 1 when a packing buffer could not be allocated (nothing written), else 0 */        \
int NAME(const T *a, const T *b, T *c, int64_t m, int64_t n, int64_t k, int64_t ars,          \
         int64_t acs, int64_t brs, int64_t bcs, int64_t nb0, int64_t nb1, int64_t nb2,        \
         int64_t as0, int64_t as1, int64_t as2, int64_t bs0, int64_t bs1, int64_t bs2,        \
         int64_t accumulate) {                                                                \
    const int64_t batch = nb0 * nb1 * nb2;                                                    \
    if (batch <= 0 || m <= 0 || n <= 0) return 0;                                             \
    int64_t ld;                                                                               \
    const int pack_a = tg_smm_layout(m, k, ars, acs, &ld) < 0 && k > 0;                       \
    const int pack_b = tg_smm_layout(k, n, brs, bcs, &ld) < 0 && k > 0;                       \
    const int team = tg_team();                                                               \
    const double flops = 2.0 * (double)m * (double)n * (double)k;                             \
    const int by_batch = team > 1 && batch >= team && flops < TG_SMM_SERIAL_FLOPS;            \
    const int split = team > 1 && !by_batch && flops >= TG_SMM_SPLIT_FLOPS;                   \
    const int workers = by_batch || split ? team : 1;                                         \
    const int64_t tiles = split ? team : 1;                                                   \
    const int rows = m >= n; /* split the rows, else the columns */                           \
    const int64_t extent = rows ? m : n;                                                      \
    const int64_t chunk = (((extent + tiles - 1) / tiles) + 15) / 16 * 16;                    \
    T *scratch = NULL;                                                                        \
    const size_t per = (size_t)(pack_a ? m * k : 0) + (size_t)(pack_b ? k * n : 0);           \
    if (per) {                                                                                \
        scratch = (T *)malloc(sizeof(T) * per * (size_t)workers);                             \
        if (!scratch) return 1;                                                               \
    }                                                                                         \
    const T beta = accumulate ? ONE : ZERO;                                                   \
    blas_follow(1);                                                                           \
    _Pragma("omp parallel for schedule(static) num_threads(workers) if(workers > 1)")         \
    for (int64_t t = 0; t < batch * tiles; t++) {                                             \
        const int64_t p = t / tiles, lo = (t % tiles) * chunk;                                \
        const int64_t hi = lo + chunk < extent ? lo + chunk : extent;                         \
        if (lo < hi) {                                                                        \
            const int64_t i0 = p / (nb1 * nb2), i1 = (p / nb2) % nb1, i2 = p % nb2;           \
            const T *ap = a + i0 * as0 + i1 * as1 + i2 * as2;                                 \
            const T *bp = b + i0 * bs0 + i1 * bs1 + i2 * bs2;                                 \
            T *cp = c + p * m * n;                                                            \
            T *mine = scratch ? scratch + per * (size_t)(workers > 1 ? omp_get_thread_num() : 0) \
                              : NULL;                                                         \
            T *pb = mine ? mine + (pack_a ? m * k : 0) : NULL;                                \
            if (rows)                                                                         \
                NAME##_one(ap + lo * ars, bp, cp + lo * n, hi - lo, n, k, ars, acs, brs, bcs, \
                           n, beta, mine, pb);                                                \
            else                                                                              \
                NAME##_one(ap, bp + lo * bcs, cp + lo, m, hi - lo, k, ars, acs, brs, bcs, n,  \
                           beta, mine, pb);                                                   \
        }                                                                                     \
    }                                                                                         \
    free(scratch);                                                                            \
    return 0;                                                                                 \
}

TG_SMM(tg_smm_f32, float, scipy_cblas_sgemm, 1.0f, 0.0f)
TG_SMM(tg_smm_f64, double, scipy_cblas_dgemm, 1.0, 0.0)
