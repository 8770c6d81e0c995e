/* int8-dynamic GEMM: C = act(dynamic_quant(A) @ (Q * s) + bias) + R, int8 x int8 -> int32.
 *
 * Why: prefill on a CPU is compute-bound, and an int8 dot-product instruction does 4 (AVX2's
 * vpmaddubsw) to 16 (AVX-512 VNNI's vpdpbusd: 64 multiply-adds) times the work of a float FMA
 * per cycle. The activations are quantized per row here, at run time (dynamic_quant: symmetric
 * int8, s_a = max|a| / 127), so the weights (int8, a scale per output channel, packed once at
 * bind time) meet int8 rows and the K-sum is exact in int32; both scales leave the sum and
 * are applied once per output with the bias, the activation and the residual.
 *
 * The row quantization reproduces the graph's float64 reference exactly: max|a| is exact, the
 * scale is m / 127 in double and each q = round_half_even(a / s) in double (multiplied by
 * 1 / s, divided only where that lands within 1e-9 of a tie, where the two could differ),
 * clamped to [-127, 127]; a row holding NaN gets a NaN scale (its values 0) and a row holding
 * inf scale inf, so both rows' outputs are NaN, as the reference's scale (1 only where the max
 * is 0) gives: a NaN activation is not hidden by the quantization. So the only error is
 * the int32 sum's conversion and the scales' products in float32.
 *
 * The instructions are chosen at run time (`isa`, from the CPU or TG_INT8_ISA):
 * - AVX-512 VNNI: vpdpbusd (u8 x s8, 4 products into each int32 lane), the row stored as
 *   q + 128 (unsigned) and 128 * colsum(Q) subtracted once per output; 6 rows x 64 columns
 *   a tile (24 accumulators);
 * - AVX-VNNI: the same instruction on 256 bits (16 registers: 6 rows x 16 columns);
 * - AVX2: vpmaddubsw(|w|, sign(a, w)) then vpmaddwd with ones: |w| <= 128 and |a| <= 127, so
 *   the int16 pair sums (<= 32512) never saturate, even for a weight of -128;
 * - portable C: int32 sums.
 * Each path is compiled with its own target attribute, so one library serves every CPU.
 *
 * Q (K x N, int8, element strides) is packed ONCE (tg_q8d_pack): a 64-byte header (magic, K,
 * N, panels, Kp = K rounded up to 4), the column sums (int32, panels * 16), then per 16-column
 * panel Kp / 4 groups of 64 bytes: column c's 4 consecutive k values at 4c (zero past K and
 * N), then the column sums of each 32-row block of K (int32, ceil(K / 32) * panels * 16):
 * the grouped product's unsigned-row correction per block. OpenMP: the rows are quantized in
 * parallel, then (64 columns, 96 rows) tasks.
 *
 * Groups (dynamic_quant(a, group=ga), a weight scale per gw rows of K: s (K / gw, N)): a
 * row's scale per ga channels and the weight's per gw rows leave the K-sum only per block of
 * B = min(ga, gw) (a multiple of 32 dividing K): the tile's int32 sums of one block, less
 * 128 * the block's column sums on the unsigned paths, are scaled by sa[row, block] *
 * s[block, column] and summed in float; ga = gw = K is the ungrouped product. Why groups:
 * one scale a row spends the int8 range on a few outlier channels (MiniLM's FFN inputs: max
 * |x| / rms ~10), and one a column on a few large weights (docs/benchmarks.md, issue 23). */
#include "tg_common.h"
#if defined(__x86_64__)
#include <immintrin.h>
#define Q8D_X86 1
#endif

#define DNR 16       /* columns per panel */
#define DMR 6        /* rows per tile */
#define DCOLS 64     /* columns per task (4 panels) */
#define DROWS 96     /* rows per task */
#define DHEADER 64
#define DMAGIC ((int64_t)0x7467713864796e31) /* "tgq8dyn1" */
#define TIE 1e-9     /* |q - round(q)| above 0.5 - TIE: divide exactly */
#define DBLOCK 32    /* rows of K per stored column sum: the grouped product's finest block */

enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVXVNNI = 2, ISA_AVX512VNNI = 3 };
enum { DACT_NONE = 0, DACT_RELU = 1, DACT_GELU = 2, DACT_GELU_TANH = 3 };

static tg_workspace q8d_ws = {NULL, 0, 0, TG_KEEP(8 << 20)};

static inline int64_t dmin(int64_t x, int64_t y) { return x < y ? x : y; }

/* 1 when the CPU (and the OS) run `isa` */
int tg_q8d_isa_supported(int isa) {
    if (isa == ISA_PORTABLE) return 1;
#if Q8D_X86
    __builtin_cpu_init();
    if (isa == ISA_AVX2) return __builtin_cpu_supports("avx2");
    if (isa == ISA_AVXVNNI)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni");
    if (isa == ISA_AVX512VNNI)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
    return 0;
}

int64_t tg_q8d_packed_size(int64_t k, int64_t n) {
    int64_t panels = (n + DNR - 1) / DNR, kp = (k + 3) & ~(int64_t)3;
    return DHEADER + panels * DNR * 4 + panels * kp * DNR
           + (k + DBLOCK - 1) / DBLOCK * panels * DNR * 4;
}

void tg_q8d_pack(const int8_t *q, int64_t k, int64_t n, int64_t sk, int64_t sn, int8_t *out) {
    int64_t panels = (n + DNR - 1) / DNR, kp = (k + 3) & ~(int64_t)3;
    int64_t *h = (int64_t *)out;
    h[0] = DMAGIC;
    h[1] = k;
    h[2] = n;
    h[3] = panels;
    h[4] = kp;
    for (int i = 5; i < DHEADER / 8; i++) h[i] = 0;
    int32_t *colsum = (int32_t *)(out + DHEADER);
    int8_t *p = out + DHEADER + panels * DNR * 4;
    for (int64_t j = 0; j < panels; j++) {
        int8_t *dst = p + j * kp * DNR;
        for (int c = 0; c < DNR; c++) {
            int64_t col = j * DNR + c;
            int32_t sum = 0;
            for (int64_t kk = 0; kk < kp; kk++) {
                int8_t v = (col < n && kk < k) ? q[kk * sk + col * sn] : 0;
                dst[(kk / 4) * 64 + c * 4 + (kk % 4)] = v;
                sum += v;
            }
            colsum[col] = sum;
        }
    }
    int32_t *blocksum = (int32_t *)(p + panels * kp * DNR);
    int64_t blocks = (k + DBLOCK - 1) / DBLOCK;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t col = 0; col < panels * DNR; col++) {
            int32_t sum = 0;
            for (int64_t kk = b * DBLOCK; kk < dmin(k, (b + 1) * DBLOCK); kk++)
                sum += col < n ? q[kk * sk + col * sn] : 0;
            blocksum[b * panels * DNR + col] = sum;
        }
}

/* ---------------------------------------------------------------- the row quantization */
/* q[0..kp) of one row of a (k floats; the kp - k pad 0 or 128) and its scale, exactly as the
 * reference: see the top. `offset`: store q + 128 (the VNNI paths' unsigned rows). */
static void quant_row_exact(const float *a, int64_t k, int64_t kp, uint8_t *q, float *scale,
                            int offset) {
    double m = 0.0;
    int nan = 0;
    for (int64_t i = 0; i < k; i++) {
        double v = fabs((double)a[i]);
        if (v != v) nan = 1;
        else if (v > m) m = v;
    }
    double s = nan ? (double)NAN : m > 0.0 ? m / 127.0 : 1.0;
    double inv = 1.0 / s;
    for (int64_t i = 0; i < k; i++) {
        double t = (double)a[i] * inv, r = nearbyint(t);
        if (fabs(t - r) > 0.5 - TIE || isinf(s)) {
            t = (double)a[i] / s;
            r = nearbyint(t);
        }
        int v = r != r ? 0 : r > 127.0 ? 127 : r < -127.0 ? -127 : (int)r;
        q[i] = (uint8_t)(offset ? v + 128 : (int8_t)v);
    }
    for (int64_t i = k; i < kp; i++) q[i] = offset ? 128 : 0;
    *scale = (float)s;
}

#if Q8D_X86
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static void quant_row_512(const float *a, int64_t k, int64_t kp, uint8_t *q, float *scale,
                          int offset) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 x = _mm512_loadu_ps(a + i);
        bad |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(x));
    }
    float m = _mm512_reduce_max_ps(mx);
    for (; i < k; i++) {
        float v = fabsf(a[i]);
        if (v != v) bad = 1;
        else if (v > m) m = v;
    }
    if (bad || isinf(m) || !(m > 0.0f)) {  /* NaN, inf or a zero row: the scalar path */
        quant_row_exact(a, k, kp, q, scale, offset);
        return;
    }
    double s = (double)m / 127.0;
    __m512d inv = _mm512_set1_pd(1.0 / s), sv = _mm512_set1_pd(s);
    __m512d lim = _mm512_set1_pd(0.5 - TIE);
    __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m128i off = _mm_set1_epi8(offset ? (char)0x80 : 0);
    for (i = 0; i + 16 <= k; i += 16) {
        __m512i qi[2];
        for (int h = 0; h < 2; h++) {
            __m512d x = _mm512_cvtps_pd(_mm256_loadu_ps(a + i + 8 * h));
            __m512d t = _mm512_mul_pd(x, inv);
            __m512d r = _mm512_roundscale_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512d d = _mm512_abs_pd(_mm512_sub_pd(t, r));
            if (_mm512_cmp_pd_mask(d, lim, _CMP_GT_OQ)) {  /* near a tie: divide exactly */
                t = _mm512_div_pd(x, sv);
                r = _mm512_roundscale_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            }
            qi[h] = _mm512_castsi256_si512(_mm512_cvtpd_epi32(r));
        }
        __m512i v = _mm512_inserti64x4(qi[0], _mm512_castsi512_si256(qi[1]), 1);
        v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
        _mm_storeu_si128((__m128i *)(q + i), _mm_xor_si128(_mm512_cvtepi32_epi8(v), off));
    }
    double invs = 1.0 / s;
    for (; i < k; i++) {
        double t = (double)a[i] * invs, r = nearbyint(t);
        if (fabs(t - r) > 0.5 - TIE) r = nearbyint((double)a[i] / s);
        int v = r > 127.0 ? 127 : r < -127.0 ? -127 : (int)r;
        q[i] = (uint8_t)(offset ? v + 128 : (int8_t)v);
    }
    for (i = k; i < kp; i++) q[i] = offset ? 128 : 0;
    *scale = (float)s;
}
#endif

/* ---------------------------------------------------------------- tiles: int32 sums */
/* t[r][0 .. 16 * np) = row r of the quantized A (rows from `a`, `lda` bytes apart; rows past
 * `rows` repeat the last) . panels b, b + pstride, ... (np of them), over `groups` k groups */
static void tile_portable(const uint8_t *a, int64_t lda, int rows, const int8_t *b,
                          int64_t pstride, int np, int64_t groups, int32_t t[DMR][DCOLS]) {
    for (int r = 0; r < DMR; r++)
        for (int c = 0; c < DCOLS; c++) t[r][c] = 0;
    for (int r = 0; r < rows; r++) {
        const int8_t *ar = (const int8_t *)(a + r * lda);
        for (int p = 0; p < np; p++) {
            const int8_t *bp = b + p * pstride;
            for (int64_t g = 0; g < groups; g++)
                for (int c = 0; c < DNR; c++) {
                    const int8_t *w = bp + g * 64 + c * 4, *x = ar + 4 * g;
                    t[r][p * DNR + c] += x[0] * w[0] + x[1] * w[1] + x[2] * w[2] + x[3] * w[3];
                }
        }
    }
}

#if Q8D_X86
/* c[r][p] += row r's k groups [G0, G1) (4 unsigned bytes each, from ar[r]) . panel p's (NP
 * panels, b + p * pstride): one vpdpbusd a (row, panel, k group); the ungrouped tile runs
 * it over all of K, the grouped one per block of K */
#define VNNI512_GROUPS(NP, G0, G1)                                                            \
    for (int64_t g = (G0); g < (G1); g++) {                                                   \
        __m512i w[NP];                                                                        \
        for (int p = 0; p < NP; p++)                                                          \
            w[p] = _mm512_load_si512((const void *)(b + p * pstride + g * 64));               \
        for (int r = 0; r < DMR; r++) {                                                       \
            int32_t x4;                                                                       \
            memcpy(&x4, ar[r] + 4 * g, 4);                                                    \
            __m512i x = _mm512_set1_epi32(x4);                                                \
            for (int p = 0; p < NP; p++) c[r][p] = _mm512_dpbusd_epi32(c[r][p], x, w[p]);     \
        }                                                                                     \
    }

/* AVX-512 VNNI: NP panels (16 columns each) x 6 rows, unsigned rows, one vpdpbusd a
 * (row, panel, k group) */
#define VNNI512_TILE(NP)                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))                          \
    static void tile_512_##NP(const uint8_t *a, int64_t lda, int rows, const int8_t *b,       \
                              int64_t pstride, int64_t groups, int32_t t[DMR][DCOLS]) {      \
        __m512i c[DMR][NP];                                                                   \
        const uint8_t *ar[DMR];                                                               \
        for (int r = 0; r < DMR; r++) {                                                       \
            ar[r] = a + (r < rows ? r : rows - 1) * lda;                                      \
            for (int p = 0; p < NP; p++) c[r][p] = _mm512_setzero_si512();                    \
        }                                                                                     \
        VNNI512_GROUPS(NP, 0, groups);                                                        \
        for (int r = 0; r < DMR; r++)                                                         \
            for (int p = 0; p < NP; p++) _mm512_storeu_si512((void *)(t[r] + 16 * p), c[r][p]); \
    }
VNNI512_TILE(1)
VNNI512_TILE(2)
VNNI512_TILE(3)
VNNI512_TILE(4)

/* The grouped product's tile on AVX-512 VNNI, NP <= 2 panels x 6 rows: each block's int32
 * sums (12 registers) scaled into float sums (12 more) in registers, where the portable
 * grouped tile stores and reloads the int32 tile per block (measured: MiniLM's int8 time
 * 1.8x the ungrouped one with it). acc[r][16p + c] = sum over blocks of float(sum - 128 *
 * the block's column sum) * (sa[r, block] * s[block, column]). */
#define VNNI512_GTILE(NP)                                                                     \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))                          \
    static void gtile_512_##NP(const uint8_t *a, int64_t lda, int rows, const int8_t *b,      \
                               int64_t pstride, const int32_t *blocksum, int64_t bstride,     \
                               const float *sa, int64_t nga, int64_t ga, const float *s,      \
                               int64_t gw, int64_t n, int64_t k, int64_t blk, int cols,       \
                               float acc[DMR][DCOLS]) {                                       \
        __m512 f[DMR][NP];                                                                    \
        const uint8_t *ar[DMR];                                                               \
        __mmask16 mask[NP];                                                                   \
        for (int p = 0; p < NP; p++) {                                                        \
            int left = cols - 16 * p;                                                         \
            mask[p] = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);        \
        }                                                                                     \
        for (int r = 0; r < DMR; r++) {                                                       \
            ar[r] = a + (r < rows ? r : rows - 1) * lda;                                      \
            for (int p = 0; p < NP; p++) f[r][p] = _mm512_setzero_ps();                       \
        }                                                                                     \
        for (int64_t k0 = 0; k0 < k; k0 += blk) {                                             \
            __m512i c[DMR][NP];                                                               \
            for (int r = 0; r < DMR; r++)                                                     \
                for (int p = 0; p < NP; p++) c[r][p] = _mm512_setzero_si512();                \
            VNNI512_GROUPS(NP, k0 / 4, (k0 + blk) / 4);                                       \
            __m512i corr[NP];                                                                 \
            __m512 sw[NP];                                                                    \
            for (int p = 0; p < NP; p++) {                                                    \
                corr[p] = _mm512_setzero_si512();                                             \
                for (int64_t j = k0 / DBLOCK; j < (k0 + blk) / DBLOCK; j++)                   \
                    corr[p] = _mm512_add_epi32(corr[p], _mm512_loadu_si512(                   \
                        (const void *)(blocksum + j * bstride + 16 * p)));                    \
                corr[p] = _mm512_slli_epi32(corr[p], 7);                                      \
                sw[p] = _mm512_maskz_loadu_ps(mask[p], s + (k0 / gw) * n + 16 * p);           \
            }                                                                                 \
            for (int r = 0; r < DMR; r++) {                                                   \
                __m512 ra = _mm512_set1_ps(sa[(r < rows ? r : rows - 1) * nga + k0 / ga]);    \
                for (int p = 0; p < NP; p++)                                                  \
                    f[r][p] = _mm512_fmadd_ps(                                                \
                        _mm512_cvtepi32_ps(_mm512_sub_epi32(c[r][p], corr[p])),               \
                        _mm512_mul_ps(ra, sw[p]), f[r][p]);                                   \
            }                                                                                 \
        }                                                                                     \
        for (int r = 0; r < DMR; r++)                                                         \
            for (int p = 0; p < NP; p++) _mm512_storeu_ps(acc[r] + 16 * p, f[r][p]);          \
    }
VNNI512_GTILE(1)
VNNI512_GTILE(2)

/* AVX-VNNI (256 bits, 16 registers): one panel (two halves) x 6 rows */
__attribute__((target("avx2,avxvnni")))
static void tile_avxvnni(const uint8_t *a, int64_t lda, int rows, const int8_t *b,
                         int64_t pstride, int np, int64_t groups, int32_t t[DMR][DCOLS]) {
    const uint8_t *ar[DMR];
    for (int r = 0; r < DMR; r++) ar[r] = a + (r < rows ? r : rows - 1) * lda;
    for (int p = 0; p < np; p++) {
        const int8_t *bp = b + p * pstride;
        __m256i lo[DMR], hi[DMR];
        for (int r = 0; r < DMR; r++) lo[r] = hi[r] = _mm256_setzero_si256();
        for (int64_t g = 0; g < groups; g++) {
            __m256i w0 = _mm256_load_si256((const __m256i *)(bp + g * 64));
            __m256i w1 = _mm256_load_si256((const __m256i *)(bp + g * 64 + 32));
            for (int r = 0; r < DMR; r++) {
                int32_t x4;
                memcpy(&x4, ar[r] + 4 * g, 4);
                __m256i x = _mm256_set1_epi32(x4);
                lo[r] = _mm256_dpbusd_avx_epi32(lo[r], x, w0);
                hi[r] = _mm256_dpbusd_avx_epi32(hi[r], x, w1);
            }
        }
        for (int r = 0; r < DMR; r++) {
            _mm256_storeu_si256((__m256i *)(t[r] + 16 * p), lo[r]);
            _mm256_storeu_si256((__m256i *)(t[r] + 16 * p + 8), hi[r]);
        }
    }
}

/* AVX2: vpmaddubsw(|w|, sign(a, w)) (signed rows in [-127, 127]) then vpmaddwd with ones;
 * 4 rows x one panel (16 registers) */
__attribute__((target("avx2")))
static void tile_avx2(const uint8_t *a, int64_t lda, int rows, const int8_t *b,
                      int64_t pstride, int np, int64_t groups, int32_t t[DMR][DCOLS]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r0 = 0; r0 < DMR; r0 += 3) {
        const uint8_t *ar[3];
        for (int r = 0; r < 3; r++) {
            int rr = r0 + r < rows ? r0 + r : rows - 1;
            ar[r] = a + rr * lda;
        }
        for (int p = 0; p < np; p++) {
            const int8_t *bp = b + p * pstride;
            __m256i lo[3], hi[3];
            for (int r = 0; r < 3; r++) lo[r] = hi[r] = _mm256_setzero_si256();
            for (int64_t g = 0; g < groups; g++) {
                __m256i w0 = _mm256_load_si256((const __m256i *)(bp + g * 64));
                __m256i w1 = _mm256_load_si256((const __m256i *)(bp + g * 64 + 32));
                __m256i u0 = _mm256_abs_epi8(w0), u1 = _mm256_abs_epi8(w1);
                for (int r = 0; r < 3; r++) {
                    int32_t x4;
                    memcpy(&x4, ar[r] + 4 * g, 4);
                    __m256i x = _mm256_set1_epi32(x4);
                    __m256i p0 = _mm256_maddubs_epi16(u0, _mm256_sign_epi8(x, w0));
                    __m256i p1 = _mm256_maddubs_epi16(u1, _mm256_sign_epi8(x, w1));
                    lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(p0, ones));
                    hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(p1, ones));
                }
            }
            for (int r = 0; r < 3; r++) {
                _mm256_storeu_si256((__m256i *)(t[r0 + r] + 16 * p), lo[r]);
                _mm256_storeu_si256((__m256i *)(t[r0 + r] + 16 * p + 8), hi[r]);
            }
        }
    }
}
#endif

static void tile(int isa, const uint8_t *a, int64_t lda, int rows, const int8_t *b,
                 int64_t pstride, int np, int64_t groups, int32_t t[DMR][DCOLS]) {
#if Q8D_X86
    if (isa == ISA_AVX512VNNI) {
        switch (np) {
        case 1: tile_512_1(a, lda, rows, b, pstride, groups, t); return;
        case 2: tile_512_2(a, lda, rows, b, pstride, groups, t); return;
        case 3: tile_512_3(a, lda, rows, b, pstride, groups, t); return;
        default: tile_512_4(a, lda, rows, b, pstride, groups, t); return;
        }
    }
    if (isa == ISA_AVXVNNI) { tile_avxvnni(a, lda, rows, b, pstride, np, groups, t); return; }
    if (isa == ISA_AVX2) { tile_avx2(a, lda, rows, b, pstride, np, groups, t); return; }
#endif
    tile_portable(a, lda, rows, b, pstride, np, groups, t);
}

/* ---------------------------------------------------------------- the epilogue */
/* tanh-GELU below x = -5 as the graph's decomposition computes it in float64: (x / 2)(1 +
 * tanh(..)), exactly 0 from x ~ -6.9, where tg_gelu_tanh keeps the true tail (1e-16 ..
 * 1e-39), so a one-element verification case landing there compared a tiny value with 0 (the
 * erf form's reference, x/2 erfc(-x / sqrt 2), keeps its tail as tg_gelu_erf does). */
static inline float gelu_tanh_tail(float x) {
    double d = x;
    return (float)((d * 0.5) * (tanh((d + d * d * d * 0.044715) * 0.7978845608028654) + 1.0));
}

/* c[0..cols) = act(float(t - corr) * (sa * s) + bias) + res, in loops GCC vectorises */
static void epilogue(const int32_t *t, const int32_t *corr, float sa, const float *s,
                     const float *bias, const float *res, float *c, int cols, int act) {
    float v[DCOLS];
    if (corr)
        for (int q = 0; q < cols; q++) v[q] = (float)(t[q] - corr[q]) * (sa * s[q]);
    else
        for (int q = 0; q < cols; q++) v[q] = (float)t[q] * (sa * s[q]);
    if (bias)
        for (int q = 0; q < cols; q++) v[q] += bias[q];
    if (act == DACT_RELU)
        for (int q = 0; q < cols; q++) v[q] = tg_reluf(v[q]);
    else if (act == DACT_GELU)
        for (int q = 0; q < cols; q++) v[q] = tg_gelu_erf(v[q]);
    else if (act == DACT_GELU_TANH) {
        float x[DCOLS];
        int tail = 0;
        memcpy(x, v, sizeof(float) * (size_t)cols);
        for (int q = 0; q < cols; q++) v[q] = tg_gelu_tanh(v[q]);
        for (int q = 0; q < cols; q++) tail |= x[q] < -5.0f;
        if (tail)
            for (int q = 0; q < cols; q++)
                if (x[q] < -5.0f) v[q] = gelu_tanh_tail(x[q]);
    }
    if (res)
        for (int q = 0; q < cols; q++) v[q] += res[q];
    memcpy(c, v, sizeof(float) * (size_t)cols);
}

/* One 6-row tile of the grouped product (see the top): the int32 sums of each block of `blk`
 * rows of K scaled by the row's and the column's scales of that block and summed in float,
 * then the epilogue, given those sums as the per-column scale of a unit int32 sum (1 * (1 *
 * v) is v exactly), so bias, activation and residual are the ungrouped path's own code. */
static void grouped_tile(int isa, const uint8_t *qa, int64_t lq, int rows, const int8_t *b,
                         int64_t pstride, int np, const int32_t *blocksum, int64_t bstride,
                         const float *sa, int64_t nga, int64_t ga, const float *s, int64_t gw,
                         int64_t n, int64_t k, int64_t blk, int offset, const float *bias,
                         const float *res, float *c, int cols, int act) {
    int32_t t[DMR][DCOLS] __attribute__((aligned(64)));
    float acc[DMR][DCOLS];
    int32_t corr[DCOLS], ones[DCOLS];
    for (int q = 0; q < DCOLS; q++) ones[q] = 1;
    for (int r = 0; r < DMR; r++)
        for (int q = 0; q < DCOLS; q++) acc[r][q] = 0.0f;
#if Q8D_X86
    if (isa == ISA_AVX512VNNI) {
        for (int p0 = 0; p0 < np; p0 += 2) {
            float part[DMR][DCOLS] __attribute__((aligned(64)));
            int pc = cols - 16 * p0;
            if (np - p0 >= 2)
                gtile_512_2(qa, lq, rows, b + p0 * pstride, pstride, blocksum + 16 * p0,
                            bstride, sa, nga, ga, s + 16 * p0, gw, n, k, blk, pc, part);
            else
                gtile_512_1(qa, lq, rows, b + p0 * pstride, pstride, blocksum + 16 * p0,
                            bstride, sa, nga, ga, s + 16 * p0, gw, n, k, blk, pc, part);
            for (int r = 0; r < rows; r++)
                for (int q = 16 * p0; q < cols && q < 16 * p0 + 32; q++)
                    acc[r][q] = part[r][q - 16 * p0];
        }
        goto done;
    }
#endif
    for (int64_t k0 = 0; k0 < k; k0 += blk) {
        tile(isa, qa + k0, lq, rows, b + (k0 / 4) * 64, pstride, np, blk / 4, t);
        const float *sw = s + (k0 / gw) * n;
        for (int q = 0; q < cols; q++) corr[q] = 0;
        if (offset)
            for (int64_t j = k0 / DBLOCK; j < (k0 + blk) / DBLOCK; j++)
                for (int q = 0; q < cols; q++) corr[q] += 128 * blocksum[j * bstride + q];
        for (int r = 0; r < rows; r++) {
            float ra = sa[r * nga + k0 / ga];
            for (int q = 0; q < cols; q++) acc[r][q] += (float)(t[r][q] - corr[q]) * (ra * sw[q]);
        }
    }
done:
    for (int r = 0; r < rows; r++)
        epilogue(ones, NULL, 1.0f, acc[r], bias, res ? res + r * n : NULL, c + r * n, cols, act);
}

/* C (m, n) = act(dynamic_quant(A (m, k), row stride lda floats, group=ga) @ (Q * s) + bias)
 * + res, s (k / gw, n): a weight scale per gw rows of K (ga = gw = k, or <= 0: ungrouped).
 * Returns 0; -1 for a buffer that is not a packed (k, n) operand; -2 out of memory; -3 groups
 * the kernel does not take (see the top). */
int tg_q8d_gemm(const float *a, int64_t lda, const int8_t *packed, const float *s,
                const float *bias, const float *res, float *c, int64_t m, int64_t n, int64_t k,
                int act, int isa, int64_t ga, int64_t gw) {
    const int64_t *h = (const int64_t *)packed;
    if (h[0] != DMAGIC || h[1] != k || h[2] != n) return -1;
    if (ga <= 0) ga = k;
    if (gw <= 0) gw = k;
    int64_t blk = ga < gw ? ga : gw;
    int grouped = ga < k || gw < k;
    if (grouped && (blk % DBLOCK || k % ga || k % gw || ga % blk || gw % blk)) return -3;
    if (m <= 0 || n <= 0) return 0;
    if (!tg_q8d_isa_supported(isa)) isa = ISA_PORTABLE;
    int64_t panels = h[3], kp = h[4], groups = kp / 4, nga = k / ga;
    const int32_t *colsum = (const int32_t *)(packed + DHEADER);
    const int8_t *bp = packed + DHEADER + panels * DNR * 4;
    const int32_t *blocksum = (const int32_t *)(bp + panels * kp * DNR);
    int64_t pstride = kp * DNR;
    int offset = isa == ISA_AVX512VNNI || isa == ISA_AVXVNNI;
    int64_t lq = (kp + 63) & ~(int64_t)63;  /* bytes a quantized row */
    size_t bytes = (size_t)(m * lq) + (size_t)(m * nga) * sizeof(float);
    int owned;
    uint8_t *qa = (uint8_t *)tg_ws_take(&q8d_ws, bytes, &owned);
    if (!qa) return -2;
    float *sa = (float *)(qa + m * lq);
    int64_t cblocks = (n + DCOLS - 1) / DCOLS, rblocks = (m + DROWS - 1) / DROWS;
    int64_t tasks = cblocks * rblocks;
    int nt = tg_team();
    if ((double)m * (double)n * (double)k < 262144.0) nt = 1;
    (void)nt;
    #pragma omp parallel num_threads(nt)
    {
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++)
            for (int64_t g = 0; g < nga; g++) {  /* a scale per ga channels; the last pads */
                int64_t len = g == nga - 1 ? ga + kp - k : ga;
#if Q8D_X86
                if (isa == ISA_AVX512VNNI)
                    quant_row_512(a + i * lda + g * ga, ga, len, qa + i * lq + g * ga,
                                  sa + i * nga + g, offset);
                else
#endif
                    quant_row_exact(a + i * lda + g * ga, ga, len, qa + i * lq + g * ga,
                                    sa + i * nga + g, offset);
            }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t cb = task % cblocks, rb = task / cblocks;
            int64_t col0 = cb * DCOLS, row0 = rb * DROWS;
            int np = (int)dmin(DCOLS / DNR, panels - col0 / DNR);
            int cols = (int)dmin(DCOLS, n - col0);
            int64_t rend = dmin(m, row0 + DROWS);
            if (grouped) {
                for (int64_t i0 = row0; i0 < rend; i0 += DMR)
                    grouped_tile(isa, qa + i0 * lq, lq, (int)dmin(DMR, rend - i0),
                                 bp + (col0 / DNR) * pstride, pstride, np, blocksum + col0,
                                 panels * DNR, sa + i0 * nga, nga, ga, s + col0, gw, n, k, blk,
                                 offset, bias ? bias + col0 : NULL,
                                 res ? res + i0 * n + col0 : NULL, c + i0 * n + col0, cols,
                                 act);
                continue;
            }
            int32_t t[DMR][DCOLS] __attribute__((aligned(64)));
            int32_t corr[DCOLS];
            if (offset)
                for (int q = 0; q < cols; q++) corr[q] = 128 * colsum[col0 + q];
            for (int64_t i0 = row0; i0 < rend; i0 += DMR) {
                int rows = (int)dmin(DMR, rend - i0);
                tile(isa, qa + i0 * lq, lq, rows, bp + (col0 / DNR) * pstride, pstride, np,
                     groups, t);
                for (int r = 0; r < rows; r++) {
                    int64_t i = i0 + r;
                    epilogue(t[r], offset ? corr : NULL, sa[i], s + col0,
                             bias ? bias + col0 : NULL, res ? res + i * n + col0 : NULL,
                             c + i * n + col0, cols, act);
                }
            }
        }
    }
    tg_ws_give(&q8d_ws, (float *)qa, owned);
    return 0;
}
