/* int8 weight x float32 activation GEMM/GEMV: C = act(A @ (Q * s) + bias) + R.
 *
 * Why: a decode step reads every weight once, so its time is the weights' bytes over the
 * memory's bandwidth; int8 weights are a quarter of float32's. The weight stays int8 in
 * memory and is widened in registers (int8 -> int32 -> float32, one vpmovsxbd and one
 * vcvtdq2ps per 16 lanes under AVX-512, two each under AVX2), then FMA'd with the float
 * activation; the per-output-channel scale s leaves the K-sum and is applied once per output
 * in the epilogue, with the bias, the activation and the residual.
 *
 * Q (K x N, int8, read through element strides) is packed ONCE at bind time (tg_q8_pack)
 * into a 64-byte header (magic, K, N, panels) and ceil(N / 16) panels of K rows x 16 int8
 * columns, zero-padded past N, 64-byte aligned: a panel's row is one 16-byte load.
 * One row (decode): four accumulators over K per panel; more rows: blocks of MR rows share
 * each widened weight row (MR FMAs per conversion). OpenMP over (panel, row block) tasks,
 * num_threads(tg_team()), one thread under 262,144 multiply-adds. No -ffast-math: NaN and
 * inf in A propagate (zero padding only meets padded columns, never stored). */
#include "tg_common.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define NR 16        /* columns per panel */
#define MR 4         /* rows per block (M > 1) */
#define QHEADER 64   /* bytes before the panels */
#define QMAGIC ((int64_t)0x7467713870616b31) /* "tgq8pak1" */

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3 };

static inline int64_t qmin(int64_t x, int64_t y) { return x < y ? x : y; }

/* bytes the packed form of a (k, n) int8 operand takes, header included */
int64_t tg_q8_packed_size(int64_t k, int64_t n) {
    return QHEADER + ((n + NR - 1) / NR) * k * NR;
}

/* out[QHEADER + (j * k + kk) * 16 + c] = q[kk * sk + (16 j + c) * sn] (0 past n) */
void tg_q8_pack(const int8_t *q, int64_t k, int64_t n, int64_t sk, int64_t sn, int8_t *out) {
    int64_t panels = (n + NR - 1) / NR;
    int64_t *h = (int64_t *)out;
    h[0] = QMAGIC;
    h[1] = k;
    h[2] = n;
    h[3] = panels;
    for (int i = 4; i < QHEADER / 8; i++) h[i] = 0;
    int8_t *p = out + QHEADER;
    for (int64_t j = 0; j < panels; j++) {
        int8_t *dst = p + j * k * NR;
        int64_t c0 = j * NR, w = qmin(NR, n - c0);
        for (int64_t kk = 0; kk < k; kk++) {
            const int8_t *src = q + kk * sk + c0 * sn;
            for (int64_t c = 0; c < NR; c++) dst[kk * NR + c] = c < w ? src[c * sn] : 0;
        }
    }
}

/* k or n of a packed buffer, or -1 when it is not one */
int64_t tg_q8_packed_dim(const int8_t *packed, int which) {
    const int64_t *h = (const int64_t *)packed;
    if (h[0] != QMAGIC) return -1;
    return which == 0 ? h[1] : h[2];
}

TG_INLINE float q_act(float x, int act) {
    if (act == ACT_RELU) return tg_reluf(x);
    if (act == ACT_GELU) return tg_gelu_erf(x);
    if (act == ACT_GELU_TANH) return tg_gelu_tanh(x);
    return x;
}

/* c[col .. col + cols) of one row = act(t * s + bias) + res */
static inline void store_row(const float *t, float *c, const float *s, const float *bias,
                             const float *res, int64_t col, int cols, int act) {
    for (int q = 0; q < cols; q++) {
        float v = t[q] * s[col + q];
        if (bias) v += bias[col + q];
        v = q_act(v, act);
        if (res) v += res[col + q];
        c[col + q] = v;
    }
}

/* t[0..16) = a[0..k) @ panel b (k x 16 int8): one row, four partial sums over K */
static void dot_row(const float *a, const int8_t *b, int64_t k, float *t) {
    int64_t kk = 0;
#if defined(__AVX512F__)
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; kk + 4 <= k; kk += 4) {
        const int8_t *p = b + kk * NR;
        s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk]),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)p))), s0);
        s1 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 1]),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(p + 16)))), s1);
        s2 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 2]),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(p + 32)))), s2);
        s3 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 3]),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(p + 48)))), s3);
    }
    for (; kk < k; kk++)
        s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk]),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(b + kk * NR)))), s0);
    _mm512_storeu_ps(t, _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
#elif defined(__AVX2__)
    __m256 l0 = _mm256_setzero_ps(), l1 = l0, h0 = l0, h1 = l0;
    for (; kk + 2 <= k; kk += 2) {
        const int8_t *p = b + kk * NR;
        __m256 x0 = _mm256_set1_ps(a[kk]), x1 = _mm256_set1_ps(a[kk + 1]);
        l0 = _mm256_fmadd_ps(x0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))), l0);
        h0 = _mm256_fmadd_ps(x0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)))), h0);
        l1 = _mm256_fmadd_ps(x1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16)))), l1);
        h1 = _mm256_fmadd_ps(x1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 24)))), h1);
    }
    for (; kk < k; kk++) {
        const int8_t *p = b + kk * NR;
        __m256 x0 = _mm256_set1_ps(a[kk]);
        l0 = _mm256_fmadd_ps(x0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))), l0);
        h0 = _mm256_fmadd_ps(x0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)))), h0);
    }
    _mm256_storeu_ps(t, _mm256_add_ps(l0, l1));
    _mm256_storeu_ps(t + 8, _mm256_add_ps(h0, h1));
#else
    float s[NR] = {0};
    for (; kk < k; kk++)
        for (int c = 0; c < NR; c++) s[c] += a[kk] * (float)b[kk * NR + c];
    for (int c = 0; c < NR; c++) t[c] = s[c];
#endif
}

/* t[r][0..16) = row r of A (MR rows from a, lda apart; rows past `rows` repeat the last,
 * their sums unused) @ panel b: each widened weight row serves MR FMAs */
static void dot_rows(const float *a, int64_t lda, int rows, const int8_t *b, int64_t k,
                     float t[MR][NR]) {
    const float *ar[MR];
    for (int r = 0; r < MR; r++) ar[r] = a + qmin(r, rows - 1) * lda;
#if defined(__AVX512F__)
    __m512 s[MR];
    for (int r = 0; r < MR; r++) s[r] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(b + kk * NR))));
        for (int r = 0; r < MR; r++) s[r] = _mm512_fmadd_ps(_mm512_set1_ps(ar[r][kk]), w, s[r]);
    }
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(t[r], s[r]);
#elif defined(__AVX2__)
    __m256 lo[MR], hi[MR];
    for (int r = 0; r < MR; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        const int8_t *p = b + kk * NR;
        __m256 wl = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
        __m256 wh = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))));
        for (int r = 0; r < MR; r++) {
            __m256 x = _mm256_set1_ps(ar[r][kk]);
            lo[r] = _mm256_fmadd_ps(x, wl, lo[r]);
            hi[r] = _mm256_fmadd_ps(x, wh, hi[r]);
        }
    }
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_ps(t[r], lo[r]);
        _mm256_storeu_ps(t[r] + 8, hi[r]);
    }
#else
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) t[r][c] = 0.0f;
    for (int64_t kk = 0; kk < k; kk++)
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < NR; c++) t[r][c] += ar[r][kk] * (float)b[kk * NR + c];
#endif
}

/* C (m, n) = act(A (m, k), row stride lda, @ (Q * s) + bias) + res; bias, res optional
 * (NULL); s (n,). Returns 0, or -1 for a buffer that is not a packed operand of (k, n). */
int tg_q8_gemm_f32(const float *a, int64_t lda, const int8_t *packed, const float *s,
                   const float *bias, const float *res, float *c, int64_t m, int64_t n,
                   int64_t k, int act) {
    const int64_t *h = (const int64_t *)packed;
    if (h[0] != QMAGIC || h[1] != k || h[2] != n) return -1;
    if (m <= 0 || n <= 0) return 0;
    const int8_t *bp = packed + QHEADER;
    int64_t panels = (n + NR - 1) / NR;
    int64_t mblocks = m == 1 ? 1 : (m + MR - 1) / MR;
    int64_t tasks = panels * mblocks;
    int nt = tg_team();
    if ((double)m * (double)n * (double)k < 262144.0) nt = 1;
    (void)nt;
    #pragma omp parallel for schedule(dynamic, 4) num_threads(nt)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t j = task / mblocks, rb = task % mblocks;
        const int8_t *b = bp + j * k * NR;
        int64_t col = j * NR;
        int cols = (int)qmin(NR, n - col);
        float t[MR][NR] __attribute__((aligned(64)));
        if (m == 1) {
            if (k == 0) memset(t[0], 0, sizeof t[0]);
            else dot_row(a, b, k, t[0]);
            store_row(t[0], c, s, bias, res, col, cols, act);
            continue;
        }
        int64_t i0 = rb * MR;
        int rows = (int)qmin(MR, m - i0);
        if (k == 0) memset(t, 0, sizeof t);
        else dot_rows(a + i0 * lda, lda, rows, b, k, t);
        for (int r = 0; r < rows; r++)
            store_row(t[r], c + (i0 + r) * n, s, bias, res ? res + (i0 + r) * n : NULL, col,
                      cols, act);
    }
    return 0;
}
