/* float16 and group-wise int4 weight x float32 activation GEMM/GEMV:
 * C = act(A @ W + bias) + R, W = fp16_round(w) (stored as float16) or dequantize_int4(q, s)
 * (int4 values two a byte, a float32 scale per (group of rows along K, output column)).
 *
 * Why: a decode step reads every weight once, so its floor is the weights' bytes over the
 * memory's bandwidth: float16 is half float32's, int4 an eighth (plus its scales). The weight
 * stays narrow in memory and is widened in registers: float16 by vcvtph2ps (F16C; AVX-512F's
 * 16-lane form), int4 by a shift and a 16-entry table lookup (vpermps; AVX2: a mask and a
 * conversion); then FMA'd with the float activation. int4's scale leaves each group's K-sum:
 * a group's partial sums are multiplied by its 16 scales once (one FMA a group of rows).
 *
 * The instructions are chosen at run time (tg_lowp_isa_supported; the Python side reads
 * TG_LOWP_ISA): AVX-512 (16 lanes), AVX2 + FMA + F16C (8 lanes, a panel in two halves), or
 * portable C (a software float16 conversion); each path is compiled under its own target
 * attribute, so one library serves every x86 CPU.
 *
 * Packed ONCE at bind time (Python: quant_lowp.pack_*): a 64-byte header (magic, K, N,
 * panels) then ceil(N / 16) panels of K rows of 16 columns, zero past N: float16 a row 32
 * bytes; int4 in blocks of 8 rows (K padded with zeros to a multiple of 8), 64 bytes a block:
 * column c's 32-bit lane holds its 8 rows' values + 8, row j in bits 4j..4j+3, so a row is
 * one shift of the block and a 16-entry table lookup (vpermps reads an index's low 4 bits). One row (decode): four partial sums per group; more rows: blocks of
 * MR rows share each widened weight row. OpenMP over (panel, row block) tasks,
 * num_threads(tg_team()), one thread under 262,144 multiply-adds. No -ffast-math: NaN and
 * inf in A propagate. */
#include "tg_common.h"
#if defined(__x86_64__)
#include <immintrin.h>
#define LOWP_X86 1
#endif

#define LNR 16       /* columns per panel */
#define LMR 4        /* rows per block (M > 1) */
#define LHEADER 64   /* bytes before the panels */
#define F16MAGIC ((int64_t)0x7467663136706b31) /* "tgf16pk1" */
#define I4MAGIC ((int64_t)0x7467693470616b31)  /* "tgi4pak1" */

enum { LISA_PORTABLE = 0, LISA_AVX2 = 1, LISA_AVX512 = 2 };
enum { K_F16 = 0, K_I4 = 1 };
enum { LACT_NONE = 0, LACT_RELU = 1, LACT_GELU = 2, LACT_GELU_TANH = 3 };

static inline int64_t lmin(int64_t x, int64_t y) { return x < y ? x : y; }

/* 1 when the CPU (and the OS) run `isa` */
int tg_lowp_isa_supported(int isa) {
    if (isa == LISA_PORTABLE) return 1;
#if LOWP_X86
    __builtin_cpu_init();
    if (isa == LISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    if (isa == LISA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
#endif
    return 0;
}

/* ------------------------------------------------------------------------ portable */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = (float)m * (1.0f / 16777216.0f);  /* subnormal: m * 2^-24, exact */
        return sign ? -f : f;
    }
    bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* the bytes of row kk's block: float16 one row of 32 bytes; int4 a block of 8 rows */
#define LROW(b, kk, kind) ((kind) == K_F16 ? (b) + (kk) * 2 * LNR : (b) + ((kk) >> 3) * 64)

static inline float widen1(const uint8_t *b, int64_t kk, int c, int kind) {
    const uint8_t *row = LROW(b, kk, kind);
    if (kind == K_F16) return half_to_float(((const uint16_t *)row)[c]);
    int j = (int)(kk & 7), v = (row[4 * c + j / 2] >> (4 * (j & 1))) & 15;
    return (float)(v - 8);
}

/* t[r][0..16) = rows r < nr of A @ panel b (k rows), each group's sum times
 * its 16 scales (sc: ng rows, ss floats apart; NULL: one group, no scale) */
static void panel_portable(const float *const *ar, int nr, const uint8_t *b, int64_t k,
                           int64_t g, const float *sc, int64_t ss, int kind,
                           float t[LMR][LNR]) {
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < LNR; c++) t[r][c] = 0.0f;
    for (int64_t g0 = 0, gi = 0; g0 < k; g0 += g, gi++) {
        float s[LMR][LNR] = {{0}};
        for (int64_t kk = g0; kk < lmin(k, g0 + g); kk++)
            for (int c = 0; c < LNR; c++) {
                float w = widen1(b, kk, c, kind);
                for (int r = 0; r < nr; r++) s[r][c] += ar[r][kk] * w;
            }
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < LNR; c++) t[r][c] += sc ? s[r][c] * sc[gi * ss + c] : s[r][c];
    }
}

#if LOWP_X86
/* ---------------------------------------------------------------------- the SIMD paths
 * PANEL(name, target, vector, lanes, ...) defines one path's panel function: the columns
 * [half * lanes, half * lanes + lanes) of the panel (AVX-512: one half of 16; AVX2: two of
 * 8), the same loop as panel_portable with four partial sums for one row. */
#define PANEL(NAME, TARGET, VEC, V, ZERO, SET1, FMA, ADD, LOADU, STOREU, WIDEN)                \
    TARGET static void NAME(const float *const *ar, int nr, const uint8_t *b, int64_t k,       \
                            int64_t g, const float *sc, int64_t ss, int kind,      \
                            int half, float t[LMR][LNR]) {                                     \
        VEC acc[LMR];                                                                          \
        for (int r = 0; r < LMR; r++) acc[r] = ZERO;                                           \
        for (int64_t g0 = 0, gi = 0; g0 < k; g0 += g, gi++) {                                  \
            int64_t g1 = lmin(k, g0 + g), kk = g0;                                             \
            VEC s[LMR];                                                                        \
            if (nr == 1) {                                                                     \
                const float *a = ar[0];                                                        \
                VEC s0 = ZERO, s1 = ZERO, s2 = ZERO, s3 = ZERO;                                \
                for (; kk + 4 <= g1; kk += 4) {                                                \
                    s0 = FMA(SET1(a[kk]), WIDEN(b, kk, kind, half), s0);                       \
                    s1 = FMA(SET1(a[kk + 1]), WIDEN(b, kk + 1, kind, half), s1);               \
                    s2 = FMA(SET1(a[kk + 2]), WIDEN(b, kk + 2, kind, half), s2);               \
                    s3 = FMA(SET1(a[kk + 3]), WIDEN(b, kk + 3, kind, half), s3);               \
                }                                                                              \
                for (; kk < g1; kk++) s0 = FMA(SET1(a[kk]), WIDEN(b, kk, kind, half), s0);     \
                s[0] = ADD(ADD(s0, s1), ADD(s2, s3));                                          \
            } else {                                                                           \
                for (int r = 0; r < LMR; r++) s[r] = ZERO;                                     \
                for (; kk < g1; kk++) {                                                        \
                    VEC w = WIDEN(b, kk, kind, half);                                          \
                    for (int r = 0; r < LMR; r++) s[r] = FMA(SET1(ar[r][kk]), w, s[r]);        \
                }                                                                              \
            }                                                                                  \
            int used = nr == 1 ? 1 : LMR;                                                      \
            if (sc) {                                                                          \
                VEC sv = LOADU(sc + gi * ss + half * V);                                       \
                for (int r = 0; r < used; r++) acc[r] = FMA(s[r], sv, acc[r]);                 \
            } else {                                                                           \
                for (int r = 0; r < used; r++) acc[r] = ADD(acc[r], s[r]);                     \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < (nr == 1 ? 1 : LMR); r++) STOREU(t[r] + half * V, acc[r]);         \
    }

/* the 16 weights of panel row kk as floats: float16 by vcvtph2ps; int4 the block shifted to
 * row kk's nibble and looked up in the table of -8..7 */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static inline __m512 widen_512(const uint8_t *b, int64_t kk, int kind, int half) {
    (void)half;
    const uint8_t *p = LROW(b, kk, kind);
    if (kind == K_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512i x = _mm512_srli_epi32(_mm512_loadu_si512(p), (unsigned)(4 * (kk & 7)));
    return _mm512_permutexvar_ps(x, table);
}

/* columns [8 half, 8 half + 8) of panel row kk */
__attribute__((target("avx2,fma,f16c")))
static inline __m256 widen_256(const uint8_t *b, int64_t kk, int kind, int half) {
    const uint8_t *p = LROW(b, kk, kind);
    if (kind == K_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + half));
    __m256i x = _mm256_loadu_si256((const __m256i *)p + half);
    x = _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_set1_epi32((int)(4 * (kk & 7)))),
                         _mm256_set1_epi32(15));
    return _mm256_sub_ps(_mm256_cvtepi32_ps(x), _mm256_set1_ps(8.0f));
}

/* int4, one row of A (decode), AVX-512: a block of 8 rows is one load; each row one shift and
 * one lookup (vpermps reads the low 4 bits of each lane), four partial sums; rows of a group
 * outside whole blocks (a group not a multiple of 8) one at a time */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void i4_row_512(const float *a, const uint8_t *b, int64_t k, int64_t g, const float *sc,
                       int64_t ss, float t[LMR][LNR]) {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g0 = 0, gi = 0; g0 < k; g0 += g, gi++) {
        int64_t g1 = lmin(k, g0 + g), kk = g0;
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (; kk < g1 && (kk & 7); kk++)
            s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk]), widen_512(b, kk, K_I4, 0), s0);
        for (; kk + 8 <= g1; kk += 8) {
            __m512i x = _mm512_loadu_si512(b + (kk >> 3) * 64);
#define I4W(j) _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4 * (j)), table)
            s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk]), _mm512_permutexvar_ps(x, table), s0);
            s1 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 1]), I4W(1), s1);
            s2 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 2]), I4W(2), s2);
            s3 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 3]), I4W(3), s3);
            s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 4]), I4W(4), s0);
            s1 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 5]), I4W(5), s1);
            s2 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 6]), I4W(6), s2);
            s3 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk + 7]), I4W(7), s3);
#undef I4W
        }
        for (; kk < g1; kk++)
            s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[kk]), widen_512(b, kk, K_I4, 0), s0);
        __m512 sum = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
        acc = _mm512_fmadd_ps(sum, _mm512_loadu_ps(sc + gi * ss), acc);
    }
    _mm512_storeu_ps(t[0], acc);
}

PANEL(panel_512, __attribute__((target("avx512f,avx512bw,avx512vl"))), __m512, 16,
      _mm512_setzero_ps(), _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_loadu_ps,
      _mm512_storeu_ps, widen_512)
PANEL(panel_256, __attribute__((target("avx2,fma,f16c"))), __m256, 8, _mm256_setzero_ps(),
      _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_loadu_ps, _mm256_storeu_ps,
      widen_256)
#endif

TG_INLINE float l_act(float x, int act) {
    if (act == LACT_RELU) return tg_reluf(x);
    if (act == LACT_GELU) return tg_gelu_erf(x);
    if (act == LACT_GELU_TANH) {
        if (x < -5.0f) {  /* the graph's float64 tanh tail: exactly 0 far out (see quant.c) */
            double d = x;
            return (float)((d * 0.5) *
                           (tanh((d + d * d * d * 0.044715) * 0.7978845608028654) + 1.0));
        }
        return tg_gelu_tanh(x);
    }
    return x;
}

/* C (m, n) = act(A (m, k) @ W + bias) + res; W packed (kind, magic checked), s the (ng, n)
 * int4 scales (NULL for float16). Returns 0, -1 for a buffer that is not a packed operand
 * of (k, n), -2 out of memory. */
static int lowp_gemm(const float *a, const uint8_t *packed, const float *s, int64_t ng,
                     const float *bias, const float *res, float *c, int64_t m, int64_t n,
                     int64_t k, int act, int kind, int isa) {
    const int64_t *h = (const int64_t *)packed;
    if (h[0] != (kind == K_F16 ? F16MAGIC : I4MAGIC) || h[1] != k || h[2] != n) return -1;
    if (m <= 0 || n <= 0) return 0;
    const uint8_t *bp = packed + LHEADER;
    /* bytes a panel: float16 32 a row; int4 64 a block of 8 rows */
    int64_t pb = kind == K_F16 ? k * 2 * LNR : ((k + 7) >> 3) * 64;
    int64_t panels = (n + LNR - 1) / LNR;
    int64_t g = kind == K_I4 ? (k + ng - 1) / ng : (k > 0 ? k : 1);
    int64_t mblocks = m == 1 ? 1 : (m + LMR - 1) / LMR;
    int64_t tasks = panels * mblocks;
    /* the last panel's scales, padded to 16 columns (the others read s in place) */
    float *edge = NULL;
    int64_t tail = n % LNR;
    if (s && tail) {
        edge = calloc((size_t)(ng * LNR), sizeof(float));
        if (!edge) return -2;
        for (int64_t gi = 0; gi < ng; gi++)
            memcpy(edge + gi * LNR, s + gi * n + (panels - 1) * LNR, (size_t)tail * 4);
    }
    int nt = tg_team();
    if ((double)m * (double)n * (double)k < 262144.0) nt = 1;
    (void)nt;
    #pragma omp parallel for schedule(dynamic, 4) num_threads(nt)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t j = task / mblocks, blk = task % mblocks;
        const uint8_t *b = bp + j * pb;
        int64_t col = j * LNR, i0 = blk * LMR;
        int cols = (int)lmin(LNR, n - col);
        int rows = m == 1 ? 1 : (int)lmin(LMR, m - i0);
        const float *sc = NULL;
        int64_t ss = 0;
        if (s) {
            int last = tail && j == panels - 1;
            sc = last ? edge : s + col;
            ss = last ? LNR : n;
        }
        const float *ar[LMR];
        for (int r = 0; r < LMR; r++) ar[r] = a + (i0 + lmin(r, rows - 1)) * k;
        float t[LMR][LNR] __attribute__((aligned(64)));
        memset(t, 0, sizeof t);
        if (k > 0) {
#if LOWP_X86
            if (isa == LISA_AVX512 && kind == K_I4 && rows == 1)
                i4_row_512(ar[0], b, k, g, sc, ss, t);
            else if (isa == LISA_AVX512)
                panel_512(ar, rows, b, k, g, sc, ss, kind, 0, t);
            else if (isa == LISA_AVX2) {
                panel_256(ar, rows, b, k, g, sc, ss, kind, 0, t);
                panel_256(ar, rows, b, k, g, sc, ss, kind, 1, t);
            } else
#endif
                panel_portable(ar, rows, b, k, g, sc, ss, kind, t);
        }
        for (int r = 0; r < rows; r++) {
            float *crow = c + (i0 + r) * n;
            const float *rrow = res ? res + (i0 + r) * n : NULL;
            for (int q = 0; q < cols; q++) {
                float v = t[r][q];
                if (bias) v += bias[col + q];
                v = l_act(v, act);
                if (rrow) v += rrow[col + q];
                crow[col + q] = v;
            }
        }
    }
    free(edge);
    return 0;
}

int tg_f16_gemm(const float *a, const uint8_t *packed, const float *bias, const float *res,
                float *c, int64_t m, int64_t n, int64_t k, int act, int isa) {
    return lowp_gemm(a, packed, NULL, 0, bias, res, c, m, n, k, act, K_F16, isa);
}

int tg_i4_gemm(const float *a, const uint8_t *packed, const float *s, int64_t ng,
               const float *bias, const float *res, float *c, int64_t m, int64_t n, int64_t k,
               int act, int isa) {
    return lowp_gemm(a, packed, s, ng, bias, res, c, m, n, k, act, K_I4, isa);
}
