/* Scaled dot-product attention, float32: q (B, Hq, Sq, D), k (B, Hkv, Sk, D),
 * v (B, Hkv, Sk, Dv) -> out (B, Hq, Sq, Dv), or out written as (B, Sq, Hq, Dv) (the heads
 * transposed back next to their features, as a transformer's output projection reads them:
 * qkv_strides[9..11] are the output's batch, head and row strides). Grouped-query heads (q
 * head h reads kv head h / (Hq / Hkv)), causal (key j <= query i, top-left), an optional mask
 * read through four element strides (0 = broadcast) over (B, Hq, Sq, Sk): float32 added, or
 * bool (one byte per element; mask_strides[4] = 1): -inf where false, whatever the score (the
 * reference's where(mask, s, -inf): a NaN score there is masked out too).
 * With a mask, a row with nothing to attend to gives 0 (the reference's safe softmax).
 *
 * Layout (as a BLAS packs its operands): K and V are packed per kv head into panels 16 floats
 * wide, K^T as [Sk/16][D][16] (times the scale) and V as [Dv/16][Sk][16] (zero-padded), so
 * both micro-kernels stream one contiguous, 64-byte aligned panel; with AVX-512 and Dv a
 * multiple of 32, V is read in place instead. The work is split into tasks, run by the threads
 * with a dynamic schedule in one parallel region: with at least 8 kv heads per thread a task is
 * one kv head (its q heads and their blocks of <= TG_BQ query rows) with K packed into the
 * thread's own buffer, still in its L1/L2 for the next block (MiniLM's 8 x 12 heads of
 * 128 x 32 at 2 threads, interleaved runs: 2-8 % faster, e.g. median 1.53 -> 1.47 ms, best
 * 1.31 -> 1.30; with one shared buffer a head's second block often ran on the other core, and
 * 1.5 MB of panels were rewritten each call); otherwise (batch, q head, query block), and the
 * first task that needs a kv head packs it into a shared buffer (no barrier between packing
 * and computing). The workspace is kept between calls (no page faults each call). Within a
 * task the loops go panel by panel (a K panel is D x 16 floats: 4 KiB for D = 64, in L1) and,
 * for each panel, over all groups of TG_R query rows (not a group at a time through scores,
 * exp and P @ V: 6-12 % slower on MiniLM's shape, V's rows evicting the K panels), in
 * 6 x 16 register-blocked micro-kernels (12 vector accumulators, ~80-90% of the FMA peak from
 * L1); with AVX-512, 6 x 64 for the scores (four K panels a call) and 6 x 32 for P @ V.
 *  - tg_attention_f32: the task's scores against all the keys it needs (TG_BQ x Sk per
 *    thread), an exact softmax per row, then P @ V and one scaling by 1 / sum per row. With
 *    AVX-512 the mask and the row max are applied on the score tiles in registers, the exp
 *    is exp_row, and P @ V stores the scaled rows straight to the output: MiniLM's attention
 *    (8 x 12 heads, 128 x 128 x 32, bool mask, 2 threads, Zen 4) 1.55-1.61 -> 1.39-1.44 ms,
 *    GPT-2's (12 heads, 128 x 128 x 64, bool causal mask) 0.33-0.34 -> 0.30 ms.
 *  - tg_flash_attention_f32: the keys in blocks of `bk` with an online softmax (running max,
 *    sum, rescaled accumulator): never more than TG_BQ x bk scores per thread, for long
 *    sequences; seq x seq is never materialised.
 * Causal rows skip the panels past their last key (per group of TG_R rows), and so, in the
 * plain kernel, do rows whose bool mask ends in False keys (mask_limits). The softmax's exp
 * is tg_exp_nonpos (tg_common.h): ~1 ulp, vectorised, for arguments <= 0 (exp_row, 1.7e-7,
 * in the plain kernel with AVX-512).
 *
 * Why not OpenBLAS sgemm per tile: the scipy-openblas32 build is threaded with pthreads; called
 * from inside an OpenMP region it still starts its own threads (oversubscribing the cores)
 * and warns "Detect OpenMP Loop and this application may hang". */
#include "tg_common.h"
#include <stdlib.h>
#ifdef __AVX__
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));            /* 32-byte aligned */
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* any alignment */
#define TG_R 6   /* query rows per micro-kernel call */
#ifndef TG_BQ
#define TG_BQ 66 /* query rows per task at most (11 groups of TG_R) */
#endif
#define TG_W 16  /* panel width (two 8-lane vectors) */

static inline int64_t round16(int64_t x) { return (x + 15) & ~(int64_t)15; }
static inline int64_t imin(int64_t x, int64_t y) { return x < y ? x : y; }
static inline int64_t imax(int64_t x, int64_t y) { return x > y ? x : y; }

/* the packed K/V panels' buffer (tg_common.h: kept between calls) */
static tg_workspace kv_ws = {NULL, 0, 0, TG_KEEP((size_t)64 << 20)};

typedef struct {
    const float *q, *k, *v;
    const void *mask; /* float32 added, or bool (one byte: 0 adds -inf) when mask_u8 */
    float *out;
    int64_t b, hq, hkv, sq, sk, d, dv, skp, dvp;
    int64_t ms[4];
    int64_t qs[3], ks[3], vs[3]; /* element strides of batch, head and row (last axis dense) */
    int64_t os[3];               /* the output's: (B, Hq, Sq, Dv) dense, or (B, Sq, Hq, Dv) */
    float scale;
    int causal, mask_u8;
    int vdirect;    /* V read in place, not packed (AVX-512, Dv a multiple of 32) */
    float *kp, *vp; /* per kv head: K^T panels [Skp/16][D][16], V panels [Dvp/16][Sk][16] */
    /* the bool mask's key limits (mask_limits), or NULL: (batch, head, row) at
     * lims[b * lb + h * lh + i * li] (a stride is 0 where the mask broadcasts) */
    const int64_t *lims;
    int64_t lb, lh, li;
} attn_t;

/* What the plain kernel's AVX-512 scores kernel does to each score tile in registers, before
 * storing it (not passes over the stored scores): the mask added, keys past the row's limit
 * set to -inf (so exp gives 0 there: padding and causal alike), and a running max per row and
 * lane in mv (TG_W per row, NaN ignored as row_max does). mr: each task row's mask row (at
 * key 0) or NULL; lim: its limit. */
typedef struct {
    const attn_t *a;
    const void *mr[TG_BQ];
    int64_t lim[TG_BQ];
    float *mv;
} fuse_t;

/* score s at key j of mask row m: -inf where a bool mask is false, + a float mask's value */
static inline float mask_at(const attn_t *a, const void *m, int64_t j, float s) {
    if (a->mask_u8) return ((const uint8_t *)m)[j * a->ms[3]] ? s : -INFINITY;
    return s + ((const float *)m)[j * a->ms[3]];
}

/* max of x[0:n] ignoring NaN (a NaN row still comes out NaN through exp(x - max)); -inf when
 * n == 0. maxps(x, m) keeps m when x is NaN, so the vectorised reduction ignores NaN too. */
TG_INLINE float row_max(const float *restrict x, int64_t n) {
    float m = -INFINITY;
    _Pragma("omp simd reduction(max:m)")
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

#ifdef __AVX512F__
/* AVX-512 (Zen 4): one 16-lane accumulator per row, the FMA taking its row's value as an
 * embedded broadcast: half the instructions of the two 8-lane halves below (the peak is the
 * same on Zen 4, but the loop issued near half of it: PV ~50 % of attention's time). The
 * plain kernel's mask, row max and exp are AVX-512 code here too (fuse_v, exp_row); without
 * AVX-512 they are passes over the stored scores (add_mask_row, row_max, tg_exp_nonpos). */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4))); /* any alignment */

/* task row r's tile x (keys j .. j + 15) with the mask added and lanes past the row's limit
 * -inf (fuse_t); the caller updates the lane maxima (maxps(x, m) keeps m where x is NaN). As
 * passes over the stored scores the mask add and row max took ~0.12 of 1.57 ms on MiniLM's
 * attention (8 x 12 heads of 128 x 128 x 32, bool mask, 2 threads). */
TG_INLINE __m512 fuse_v(const attn_t *a, const fuse_t *fz, int64_t r, int64_t j, v16 x) {
    const void *m = fz->mr[r];
    const int64_t w = fz->lim[r] - j;
    __m512 v = (__m512)x;
    if (w >= TG_W && (!m || a->ms[3] == 1)) {
        if (m && a->mask_u8) { /* -inf where false, as the reference's where() */
#if defined(__AVX512BW__) && defined(__AVX512VL__)
            __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)m + j));
            __mmask16 k = _mm_test_epi8_mask(b, b);
#else
            __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                (const __m128i *)((const uint8_t *)m + j)));
            __mmask16 k = _mm512_test_epi32_mask(b, b);
#endif
            v = _mm512_mask_mov_ps(v, (__mmask16)~k, _mm512_set1_ps(-INFINITY));
        } else if (m) {
            v = _mm512_add_ps(v, _mm512_loadu_ps((const float *)m + j));
        }
    } else { /* the last keys, or a mask strided along them */
        float t[TG_W];
        _mm512_storeu_ps(t, v);
        for (int c = 0; m && c < TG_W && c < w; c++) t[c] = mask_at(a, m, j + c, t[c]);
        v = _mm512_loadu_ps(t);
        __mmask16 ok = w <= 0 ? 0 : (w >= TG_W ? 0xFFFF : (__mmask16)((1u << w) - 1));
        v = _mm512_mask_blend_ps(ok, _mm512_set1_ps(-INFINITY), v);
    }
    return v;
}

/* x[j] = exp(x[j] - shift) for j < n (a multiple of 16, x aligned); returns their sum. As
 * 2^y, y = (x - shift) log2(e) (not one FMA with shift log2(e): a row of HF's finfo.min mask
 * has shift ~ -3.4e38, and that product overflows), 2^(y - round(y)) by Cephes' exp2f
 * polynomial (1.7e-7) and vscalefps: 14 vector operations against tg_exp_nonpos's 20
 * (MiniLM's attention: the pass 0.28 -> 0.17 ms). y < -126 gives 0 exactly (a fully masked
 * row gives 0; no subnormal reaches P @ V); NaN stays NaN. */
TG_INLINE float exp_row(float *x, int64_t n, float shift) {
    const __m512 l2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 sh = _mm512_set1_ps(shift), lo = _mm512_set1_ps(-126.0f);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += TG_W) {
        __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(x + j), sh), l2e);
        __m512 r = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 f = _mm512_sub_ps(y, r);
        __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
        __mmask16 keep = _mm512_cmp_ps_mask(y, lo, _CMP_NLT_UQ); /* y >= -126 or NaN */
        __m512 e = _mm512_maskz_scalef_ps(keep, p, r);
        _mm512_store_ps(x + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* s[r][16 c : 16 c + 16] = sum_d q[r][d] * panel_c[d][0:16] for r < NR, c < NP: NP adjacent
 * K panels ([D][16] each, aligned; the scale is in the packed K), up to 24 accumulators, each
 * q value loaded once for NP FMAs. With fz, each tile goes through fuse_v (rows from r0, keys
 * from j) and the row's lane maxima are updated. Up to four panels a call: with D = 32 a call
 * is only 32 steps, and one panel a call left the scores at ~80 % of the FMA peak. */
TG_INLINE void scores_k(const int nr, const int np, const float *const *q, const float *panel,
                        int64_t d_, float *s, int64_t lds, const fuse_t *fz, int64_t r0,
                        int64_t j) {
    v16 a[TG_R][4];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < np; c++) a[r][c] = (v16){0};
    for (int64_t d = 0; d < d_; d++) {
        v16 k[4];
        for (int c = 0; c < np; c++) k[c] = *(const v16 *)(panel + (c * d_ + d) * TG_W);
        for (int r = 0; r < nr; r++) {
            float x = q[r][d];
            for (int c = 0; c < np; c++) a[r][c] += x * k[c];
        }
    }
    for (int r = 0; r < nr; r++) {
        if (!fz) {
            for (int c = 0; c < np; c++) *(v16 *)(s + r * lds + c * TG_W) = a[r][c];
            continue;
        }
        float *mv = fz->mv + (r0 + r) * TG_W;
        __m512 m = _mm512_load_ps(mv);
        for (int c = 0; c < np; c++) {
            __m512 x = fuse_v(fz->a, fz, r0 + r, j + c * TG_W, a[r][c]);
            _mm512_store_ps(s + r * lds + c * TG_W, x);
            m = _mm512_max_ps(x, m);
        }
        _mm512_store_ps(mv, m);
    }
}

#define TG_SCORES_NP(NP)                                                                       \
    switch (nr) {                                                                              \
    case 6: scores_k(6, NP, q, panel, d, s, lds, fz, r0, j); break;                            \
    case 5: scores_k(5, NP, q, panel, d, s, lds, fz, r0, j); break;                            \
    case 4: scores_k(4, NP, q, panel, d, s, lds, fz, r0, j); break;                            \
    case 3: scores_k(3, NP, q, panel, d, s, lds, fz, r0, j); break;                            \
    case 2: scores_k(2, NP, q, panel, d, s, lds, fz, r0, j); break;                            \
    default: scores_k(1, NP, q, panel, d, s, lds, fz, r0, j); break;                           \
    }

/* scores_k for nr rows and np (1 to 4) panels */
static void scores_tile(int nr, int np, const float *const *q, const float *panel, int64_t d,
                        float *s, int64_t lds, const fuse_t *fz, int64_t r0, int64_t j) {
    switch (np) {
    case 4: TG_SCORES_NP(4) break;
    case 3: TG_SCORES_NP(3) break;
    case 2: TG_SCORES_NP(2) break;
    default: TG_SCORES_NP(1) break;
    }
}
#define TG_NP 4 /* K panels per scores call at most */

/* acc[r][0:16] (+)= sum_{j < n} p[r][j] * panel[j][0:16] for r < NR (panel: [n][16],
 * aligned); `=` when `fresh` */
TG_INLINE void pv_k(const int nr, const float *p, int64_t ldp, const float *panel, int64_t n,
                    float *acc, int64_t lda, int fresh) {
    v16 a[TG_R];
    for (int r = 0; r < nr; r++) a[r] = fresh ? (v16){0} : *(v16 *)(acc + r * lda);
    for (int64_t j = 0; j < n; j++) {
        v16 v = *(const v16 *)(panel + j * TG_W);
        for (int r = 0; r < nr; r++) a[r] += p[r * ldp + j] * v;
    }
    for (int r = 0; r < nr; r++) *(v16 *)(acc + r * lda) = a[r];
}

/* pv_k over two adjacent 16-column panels of V at once (p0, and p1 = the next one, rows ldv
 * floats apart: 16 packed, or V's own rows, any alignment): twelve
 * accumulators, each probability loaded once for 32 columns (a head of 32 is one call): PV
 * ran at ~60 % of the FMA peak one panel at a time. With sc (and fresh), row r is stored
 * times sc[r] (1 / its sum) to acc + r * lda, any alignment: the output itself. */
TG_INLINE void pv2_k(const int nr, const float *p, int64_t ldp, const float *p0,
                     const float *p1, int64_t ldv, int64_t n, float *acc, int64_t lda,
                     int fresh, const float *sc) {
    v16 a[TG_R], b[TG_R];
    for (int r = 0; r < nr; r++) {
        a[r] = fresh ? (v16){0} : *(v16 *)(acc + r * lda);
        b[r] = fresh ? (v16){0} : *(v16 *)(acc + r * lda + TG_W);
    }
    for (int64_t j = 0; j < n; j++) {
        v16 v = *(const v16u *)(p0 + j * ldv), w = *(const v16u *)(p1 + j * ldv);
        for (int r = 0; r < nr; r++) {
            float x = p[r * ldp + j];
            a[r] += x * v;
            b[r] += x * w;
        }
    }
    for (int r = 0; r < nr; r++) {
        if (sc) {
            *(v16u *)(acc + r * lda) = a[r] * sc[r];
            *(v16u *)(acc + r * lda + TG_W) = b[r] * sc[r];
        } else {
            *(v16 *)(acc + r * lda) = a[r];
            *(v16 *)(acc + r * lda + TG_W) = b[r];
        }
    }
}

static void pv2_tile(int nr, const float *p, int64_t ldp, const float *p0, const float *p1,
                     int64_t ldv, int64_t n, float *acc, int64_t lda, int fresh,
                     const float *sc) {
    switch (nr) {
    case 6: pv2_k(6, p, ldp, p0, p1, ldv, n, acc, lda, fresh, sc); break;
    case 5: pv2_k(5, p, ldp, p0, p1, ldv, n, acc, lda, fresh, sc); break;
    case 4: pv2_k(4, p, ldp, p0, p1, ldv, n, acc, lda, fresh, sc); break;
    case 3: pv2_k(3, p, ldp, p0, p1, ldv, n, acc, lda, fresh, sc); break;
    case 2: pv2_k(2, p, ldp, p0, p1, ldv, n, acc, lda, fresh, sc); break;
    default: pv2_k(1, p, ldp, p0, p1, ldv, n, acc, lda, fresh, sc); break;
    }
}
#else
/* s[r][0:16] = sum_d q[r][d] * panel[d][0:16] for r < NR (panel: [D][16], aligned; the scale
 * is in the packed K) */
TG_INLINE void scores_k(const int nr, const float *const *q, const float *panel, int64_t d_,
                        float *s, int64_t lds) {
    v8 a0[TG_R], a1[TG_R];
    for (int r = 0; r < nr; r++) a0[r] = a1[r] = (v8){0};
    for (int64_t d = 0; d < d_; d++) {
        v8 k0 = *(const v8 *)(panel + d * TG_W), k1 = *(const v8 *)(panel + d * TG_W + 8);
        for (int r = 0; r < nr; r++) {
            float x = q[r][d];
            a0[r] += x * k0;
            a1[r] += x * k1;
        }
    }
    for (int r = 0; r < nr; r++) {
        *(v8 *)(s + r * lds) = a0[r];
        *(v8 *)(s + r * lds + 8) = a1[r];
    }
}

/* acc[r][0:16] (+)= sum_{j < n} p[r][j] * panel[j][0:16] for r < NR (panel: [n][16],
 * aligned); `=` when `fresh` */
TG_INLINE void pv_k(const int nr, const float *p, int64_t ldp, const float *panel, int64_t n,
                    float *acc, int64_t lda, int fresh) {
    v8 a0[TG_R], a1[TG_R];
    for (int r = 0; r < nr; r++) {
        a0[r] = fresh ? (v8){0} : *(v8 *)(acc + r * lda);
        a1[r] = fresh ? (v8){0} : *(v8 *)(acc + r * lda + 8);
    }
    for (int64_t j = 0; j < n; j++) {
        v8 v0 = *(const v8 *)(panel + j * TG_W), v1 = *(const v8 *)(panel + j * TG_W + 8);
        for (int r = 0; r < nr; r++) {
            float x = p[r * ldp + j];
            a0[r] += x * v0;
            a1[r] += x * v1;
        }
    }
    for (int r = 0; r < nr; r++) {
        *(v8 *)(acc + r * lda) = a0[r];
        *(v8 *)(acc + r * lda + 8) = a1[r];
    }
}

/* scores_k for 1..TG_R rows, each compiled with a constant row count; one panel a call, never
 * fused (fz is NULL: the plain kernel adds the mask and takes the max in passes here) */
static void scores_tile(int nr, int np, const float *const *q, const float *panel, int64_t d,
                        float *s, int64_t lds, const fuse_t *fz, int64_t r0, int64_t j) {
    (void)np, (void)fz, (void)r0, (void)j;
    switch (nr) {
    case 6: scores_k(6, q, panel, d, s, lds); break;
    case 5: scores_k(5, q, panel, d, s, lds); break;
    case 4: scores_k(4, q, panel, d, s, lds); break;
    case 3: scores_k(3, q, panel, d, s, lds); break;
    case 2: scores_k(2, q, panel, d, s, lds); break;
    default: scores_k(1, q, panel, d, s, lds); break;
    }
}

#define TG_NP 1

#endif

/* the micro-kernels for 1..TG_R rows, each compiled with a constant row count */
static void pv_tile(int nr, const float *p, int64_t ldp, const float *panel, int64_t n,
                    float *acc, int64_t lda, int fresh) {
    switch (nr) {
    case 6: pv_k(6, p, ldp, panel, n, acc, lda, fresh); break;
    case 5: pv_k(5, p, ldp, panel, n, acc, lda, fresh); break;
    case 4: pv_k(4, p, ldp, panel, n, acc, lda, fresh); break;
    case 3: pv_k(3, p, ldp, panel, n, acc, lda, fresh); break;
    case 2: pv_k(2, p, ldp, panel, n, acc, lda, fresh); break;
    default: pv_k(1, p, ldp, panel, n, acc, lda, fresh); break;
    }
}

#ifdef __AVX__
/* dst[c * ldd + r] = sc * src[r * lds + c] for an 8 x 8 block (unaligned rows) */
TG_INLINE void transpose8(const float *src, int64_t lds, float *dst, int64_t ldd, float sc) {
    const __m256 f = _mm256_set1_ps(sc);
    __m256 r0 = _mm256_loadu_ps(src) * f, r1 = _mm256_loadu_ps(src + lds) * f;
    __m256 r2 = _mm256_loadu_ps(src + 2 * lds) * f, r3 = _mm256_loadu_ps(src + 3 * lds) * f;
    __m256 r4 = _mm256_loadu_ps(src + 4 * lds) * f, r5 = _mm256_loadu_ps(src + 5 * lds) * f;
    __m256 r6 = _mm256_loadu_ps(src + 6 * lds) * f, r7 = _mm256_loadu_ps(src + 7 * lds) * f;
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

/* pack kv head h (of B * Hkv): K^T (times the scale: no multiply per score, and the
 * transposing copy is made anyway) and V into 16-wide panels, zeros in the padding */
static void pack_head(const attn_t *a, int64_t h, float *kp, float *vp) {
    const int64_t bi = h / a->hkv, hh = h % a->hkv, lk = a->ks[2], lv = a->vs[2];
    const float *kh = a->k + bi * a->ks[0] + hh * a->ks[1];
    const float *vh = a->v + bi * a->vs[0] + hh * a->vs[1];
    for (int64_t jb = 0; jb < a->skp; jb += TG_W) {
        float *panel = kp + jb * a->d;
        int64_t d0 = 0;
#ifdef __AVX__
        if (jb + TG_W <= a->sk) /* 8 x 8 blocks of 8 keys x 8 dims, transposed */
            for (; d0 + 8 <= a->d; d0 += 8) {
                transpose8(kh + jb * lk + d0, lk, panel + d0 * TG_W, TG_W, a->scale);
                transpose8(kh + (jb + 8) * lk + d0, lk, panel + d0 * TG_W + 8, TG_W, a->scale);
            }
#endif
        for (int64_t j = jb; j < jb + TG_W; j++) {
            if (j < a->sk) {
                const float *row = kh + j * lk;
                for (int64_t d = d0; d < a->d; d++)
                    panel[d * TG_W + (j - jb)] = row[d] * a->scale;
            } else {
                for (int64_t d = d0; d < a->d; d++) panel[d * TG_W + (j - jb)] = 0.0f;
            }
        }
    }
    if (a->vdirect) return;
    for (int64_t cb = 0; cb < a->dvp; cb += TG_W) {
        float *panel = vp + cb * a->sk;
        int64_t w = imin(TG_W, a->dv - cb);
        if (w == TG_W) {
            for (int64_t j = 0; j < a->sk; j++) {
                const float *src = vh + j * lv + cb;
                *(v8 *)(panel + j * TG_W) = *(const v8u *)src;
                *(v8 *)(panel + j * TG_W + 8) = *(const v8u *)(src + 8);
            }
        } else {
            for (int64_t j = 0; j < a->sk; j++)
                for (int64_t c = 0; c < TG_W; c++)
                    panel[j * TG_W + c] = c < w ? vh[j * lv + cb + c] : 0.0f;
        }
    }
}

/* Pack kv head h into the shared panels unless done: the first task that needs it packs it
 * (state 0 -> 1 -> 2). Returns 1 when they are ready, 0 when another thread is packing them
 * (rare: consecutive tasks are different q heads): the caller packs its own copy instead of
 * waiting, since that thread may have lost its core to another process for a scheduler slice
 * (it used to sched_yield until it was done). No barrier between packing and computing, so a
 * descheduled thread holds up no other. */
static int ensure_packed(const attn_t *a, int *state, int64_t h) {
    if (__atomic_load_n(&state[h], __ATOMIC_ACQUIRE) == 2) return 1;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&state[h], &expected, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return expected == 2;
    pack_head(a, h, a->kp + h * a->skp * a->d, a->vp + h * a->dvp * a->sk);
    __atomic_store_n(&state[h], 2, __ATOMIC_RELEASE);
    return 1;
}

/* the keys query row i may see: [0, limit); rl: the task's row limits from the mask (the
 * table's (batch, head) row, mask_limits) or NULL */
static inline int64_t key_limit(const attn_t *a, const int64_t *rl, int64_t i) {
    int64_t n = a->causal ? (i + 1 < a->sk ? i + 1 : a->sk) : a->sk;
    return rl && rl[i * a->li] < n ? rl[i * a->li] : n;
}

static inline const void *mask_row(const attn_t *a, int64_t b, int64_t h, int64_t i) {
    if (!a->mask) return NULL;
    int64_t at = b * a->ms[0] + h * a->ms[1] + i * a->ms[2];
    return a->mask_u8 ? (const void *)((const uint8_t *)a->mask + at)
                      : (const void *)((const float *)a->mask + at);
}

/* s[0:n] with mask[j0 + j] (element stride `stride`) applied: a float mask added, a bool one
 * setting -inf where false (the reference's where(); done here, not as a float copy of the
 * mask per call). A dense key axis (stride 1, the usual padding mask) is one vectorised
 * loop. */
static inline void add_mask_row(const attn_t *a, float *restrict s, const void *m, int64_t j0,
                                int64_t n) {
    const int64_t st = a->ms[3];
    if (a->mask_u8) {
        const uint8_t *mb = (const uint8_t *)m + j0 * st;
        if (st == 1) {
            _Pragma("omp simd")
            for (int64_t j = 0; j < n; j++) s[j] = mb[j] ? s[j] : -INFINITY;
        } else {
            for (int64_t j = 0; j < n; j++) s[j] = mb[j * st] ? s[j] : -INFINITY;
        }
        return;
    }
    const float *mf = (const float *)m + j0 * st;
    if (st == 1) {
        _Pragma("omp simd")
        for (int64_t j = 0; j < n; j++) s[j] += mf[j];
    } else {
        for (int64_t j = 0; j < n; j++) s[j] += mf[j * st];
    }
}

/* the task's query rows: blocks of equal size (a multiple of TG_R), at most TG_BQ rows */
static inline int64_t block_rows(int64_t sq) {
    int64_t nqb = (sq + TG_BQ - 1) / TG_BQ;
    int64_t rows = (sq + nqb - 1) / nqb;
    return (rows + TG_R - 1) / TG_R * TG_R;
}

/* scores of query rows [q0, q1) (of head bh) against keys [j0, j0 + jn), scaled, into
 * s[(i - q0) * lds + (j - j0)]: TG_NP panels at a time, each against all groups of TG_R rows
 * that can see some key in them (a group stops at the last panel it needs). j0 is a multiple
 * of TG_W. fz (AVX-512 only; rows from q0): the mask and the lane maxima fused in. */
static void task_scores(const attn_t *a, const int64_t *rl, const float *q, const float *kp,
                        int64_t q0, int64_t q1, int64_t j0, int64_t jn, float *s, int64_t lds,
                        const fuse_t *fz) {
    const int64_t d = a->d;
    for (int64_t jb = 0; jb < jn; jb += TG_NP * TG_W) {
        const float *panel = kp + (j0 + jb) * d;
        for (int64_t i0 = q0; i0 < q1; i0 += TG_R) {
            int nr = (int)imin(TG_R, q1 - i0);
            /* the panels the group needs (causal: none past its last row's keys) */
            int64_t need = imin(key_limit(a, rl, i0 + nr - 1) - j0, jn) - jb;
            if (need <= 0) continue;
            int np = (int)imin(TG_NP, (need + TG_W - 1) / TG_W);
            const float *qr[TG_R];
            for (int r = 0; r < nr; r++) qr[r] = q + (i0 + r) * a->qs[2];
            scores_tile(nr, np, qr, panel, d, s + (i0 - q0) * lds + jb, lds, fz, i0 - q0,
                        j0 + jb);
        }
    }
}

/* acc[(i - q0)][0:dvp] (+)= p[(i - q0)][0:n_i] @ V[j0 : j0 + n_i] with n_i the keys the row's
 * group needs in this block (the rows' probabilities past their own limit are 0); `=` when
 * `fresh` (then every group must need some key: n_i >= 1). With inv (AVX-512, fresh, Dv a
 * multiple of 32), row i goes straight to the output (oh + i * os[2]) times inv[i - q0]: no
 * pass over an accumulator. */
static void task_pv(const attn_t *a, const int64_t *rl, const float *vp, int64_t q0,
                    int64_t q1, int64_t j0, int64_t jn, const float *p, int64_t ldp, float *acc,
                    int fresh, float *oh, const float *inv) {
    for (int64_t cb = 0; cb < a->dvp;) {
        const float *panel = vp + cb * a->sk + j0 * TG_W;
#ifdef __AVX512F__
        int two = cb + 2 * TG_W <= a->dvp; /* two panels per call (always when vdirect) */
        const float *next = panel + TG_W * a->sk;
        int64_t ldv = TG_W;
        if (a->vdirect) {
            panel = vp + j0 * a->vs[2] + cb;
            next = panel + TG_W;
            ldv = a->vs[2];
        }
#else
        int two = 0;
#endif
        for (int64_t i0 = q0; i0 < q1; i0 += TG_R) {
            int nr = (int)imin(TG_R, q1 - i0);
            int64_t n = imin(key_limit(a, rl, i0 + nr - 1) - j0, jn);
            if (n <= 0) continue;
            float *at = acc + (i0 - q0) * a->dvp + cb;
#ifdef __AVX512F__
            if (two) {
                if (inv)
                    pv2_tile(nr, p + (i0 - q0) * ldp, ldp, panel, next, ldv, n,
                             oh + i0 * a->os[2] + cb, a->os[2], 1, inv + (i0 - q0));
                else
                    pv2_tile(nr, p + (i0 - q0) * ldp, ldp, panel, next, ldv, n, at, a->dvp,
                             fresh, NULL);
                continue;
            }
#endif
            pv_tile(nr, p + (i0 - q0) * ldp, ldp, panel, n, at, a->dvp, fresh);
        }
        cb += two ? 2 * TG_W : TG_W;
    }
}

/* the number of keys row i's group (of TG_R rows from q0) needs in the block [j0, j0 + jn) */
static inline int64_t group_keys(const attn_t *a, const int64_t *rl, int64_t q0, int64_t q1,
                                 int64_t i, int64_t j0, int64_t jn) {
    int64_t last = imin(q0 + ((i - q0) / TG_R + 1) * TG_R, q1) - 1;
    return imax(0, imin(key_limit(a, rl, last) - j0, jn));
}

#ifdef _OPENMP
#define TG_THREAD_NUM() omp_get_thread_num()
#else
#define TG_THREAD_NUM() 0
#endif

/* V is read in place by pv2_k when every column panel pair is whole: its packed copy cost
 * ~0.05 ms of MiniLM's 1.38 (96 heads of 128 x 32) */
#ifdef __AVX512F__
#define TG_V_DIRECT(dv) ((dv) % (2 * TG_W) == 0)
#else
#define TG_V_DIRECT(dv) 0
#endif

/* Which work a task is. With enough kv heads (B * Hkv >= 8 threads: MiniLM's 96) a task is one
 * kv head, its q heads and their query blocks (nsub sub-tasks in a row), with K (and V unless
 * read in place) packed once into the thread's own buffer. Otherwise (GPT-2's 12 heads, for
 * balance) one (batch, q head, query block), block-major: t -> block t / (B * Hq), head
 * t % (B * Hq), so the first tasks pack different kv heads into the shared panels. */
typedef struct {
    int64_t nbh, nqb, bq, group, nsub, tasks;
} sched_t;

static inline sched_t make_sched(const attn_t *a, int nthr) {
    sched_t sc;
    sc.bq = block_rows(a->sq);
    sc.nqb = (a->sq + sc.bq - 1) / sc.bq;
    sc.nbh = a->b * a->hq;
    sc.group = a->hq / a->hkv;
    sc.nsub = 1;
    sc.tasks = sc.nbh * sc.nqb;
    if (a->b * a->hkv >= 8 * (int64_t)nthr) {
        sc.nsub = sc.group * sc.nqb;
        sc.tasks = a->b * a->hkv;
    }
    return sc;
}

/* sub-task u of task t: its (batch * Hq + q head) and first query row */
static inline void task_sub(const attn_t *a, const sched_t *sc, int64_t t, int64_t u,
                            int64_t *bh, int64_t *q0) {
    if (sc->nsub == 1) {
        *bh = t % sc->nbh;
        *q0 = (t / sc->nbh) * sc->bq;
    } else {
        *bh = (t / a->hkv) * a->hq + (t % a->hkv) * sc->group + u / sc->nqb;
        *q0 = (u % sc->nqb) * sc->bq;
    }
}

/* Runs every task with the body (__VA_ARGS__) in one parallel region, dynamically scheduled
 * (prefetching the next kv head's K, V and Q rows during a task, claimed one ahead, measured
 * within the noise on MiniLM's shape: not kept).
 * One workspace: the shared packed K and V (task per query block; the first sub-task that
 * needs a kv head packs it, no barrier), PER_THREAD floats and one kv head's K and V panels
 * for each thread (where a task that is a kv head packs it, and a task that finds its kv head
 * being packed by another thread packs a copy), the packing states. Returns 0, or -1 when out
 * of memory. */
#define TG_ATTENTION_DRIVER(A, PER_THREAD, ...)                                                \
    do {                                                                                       \
        const int nthr_ = tg_team();                                                           \
        const sched_t sc_ = make_sched(&(A), nthr_);                                           \
        const int64_t group_ = sc_.group, own_ = sc_.nsub > 1;                                 \
        (A).vdirect = TG_V_DIRECT((A).dv);                                                     \
        int64_t nh_ = (A).b * (A).hkv, kfl_ = (A).skp * (A).d;                                 \
        int64_t vfl_ = (A).vdirect ? 0 : (A).dvp * (A).sk;                                     \
        int64_t per_ = round16(PER_THREAD) + kfl_ + vfl_;                                      \
        if (!own_) {                                                                           \
            kfl_ *= nh_;                                                                       \
            vfl_ *= nh_;                                                                       \
        } else {                                                                               \
            kfl_ = vfl_ = 0;                                                                   \
        }                                                                                      \
        int owned_;                                                                            \
        int64_t total_ = kfl_ + vfl_ + nthr_ * per_ + round16(nh_);                            \
        float *ws_ = tg_ws_take(&kv_ws, sizeof(float) * (size_t)total_, &owned_);              \
        if (!ws_) return -1;                                                                   \
        (A).kp = ws_;                                                                          \
        (A).vp = ws_ + kfl_; /* multiples of 16 floats: all 64-byte aligned */                 \
        int *state_ = (int *)(ws_ + kfl_ + vfl_ + nthr_ * per_);                               \
        memset(state_, 0, sizeof(int) * (size_t)nh_);                                          \
        int64_t work_ = (A).b * (A).hq * (A).sq * (A).sk * (A).d;                              \
        _Pragma("omp parallel num_threads(nthr_) if(work_ > 8 * TG_PAR_MIN)")                  \
        {                                                                                      \
            float *buf = ws_ + kfl_ + vfl_ + TG_THREAD_NUM() * per_;                           \
            float *kown_ = buf + round16(PER_THREAD), *vown_ = kown_ + (A).skp * (A).d;        \
            _Pragma("omp for schedule(dynamic)")                                               \
            for (int64_t t_ = 0; t_ < sc_.tasks; t_++)                                         \
            for (int64_t u_ = 0; u_ < sc_.nsub; u_++) {                                        \
                int64_t bh, q0;                                                                \
                task_sub(&(A), &sc_, t_, u_, &bh, &q0);                                        \
                int64_t q1 = imin(q0 + sc_.bq, (A).sq);                                        \
                int64_t bi = bh / (A).hq, h = bh % (A).hq;                                     \
                int64_t kvh = bi * (A).hkv + h / group_;                                       \
                const float *kp = kown_, *vp;                                                  \
                if (own_) {                                                                    \
                    if (u_ == 0)                                                               \
                        pack_head(&(A), kvh, kown_, vown_);                                    \
                    vp = vown_;                                                                \
                } else if (ensure_packed(&(A), state_, kvh)) {                                 \
                    kp = (A).kp + kvh * (A).skp * (A).d;                                       \
                    vp = (A).vp + kvh * (A).dvp * (A).sk;                                      \
                } else {                                                                       \
                    pack_head(&(A), kvh, kown_, vown_);                                        \
                    vp = vown_;                                                                \
                }                                                                              \
                if ((A).vdirect)                                                               \
                    vp = (A).v + bi * (A).vs[0] + (h / group_) * (A).vs[1];                    \
                const float *qh = (A).q + bi * (A).qs[0] + h * (A).qs[1];                      \
                float *oh = (A).out + bi * (A).os[0] + h * (A).os[1];                          \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        }                                                                                      \
        tg_ws_give(&kv_ws, ws_, owned_);                                                       \
        return 0;                                                                              \
    } while (0)

/* s[0:n] -> exp(s - shift) (arguments <= 0); returns their sum */
static inline float exp_sum(float *restrict s, int64_t n, float shift) {
    float sum = 0.0f;
    _Pragma("omp simd reduction(+:sum)")
    for (int64_t j = 0; j < n; j++) {
        float e = tg_exp_nonpos(s[j] - shift);
        s[j] = e;
        sum += e;
    }
    return sum;
}

/* s[0:lim] (scaled scores) -> exp(s - max) with the mask row mr (or NULL) added first;
 * returns 1 / sum, or 1 when a mask left nothing to attend to (the reference's safe softmax:
 * the row comes out 0). NaN stays NaN. */
static inline float softmax_row(const attn_t *a, float *restrict s, const void *mr,
                                int64_t lim) {
    if (mr)
        add_mask_row(a, s, mr, 0, lim);
    float m = row_max(s, lim);
    float shift = (a->mask && m == -INFINITY) ? 0.0f : m;
    float sum = exp_sum(s, lim, shift);
    return (a->mask && sum < 1.0f) ? 1.0f : 1.0f / sum;
}

#define TG_FEW_ROWS 4
TG_INLINE float hsum8(v8 x) {
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

/* rows a thread interleaves: each row's K and V are a stream of their own (the memory
 * prefetchers follow a few at once), and one after another they came too slowly from memory
 * after a GEMV. GPT-2's decode attention (12 heads of 64, 145 keys) after a GEMV, 2 threads,
 * interleaved in one process: row by row 78 us, three rows at a time 62 (two 73, four 72, six
 * 91 against the rows' 89 in a busier run) */
#define TG_FEW_GROUP 3

/* one query row of attention_few_rows: its q, K, V, output, key limit and mask row */
typedef struct {
    const float *q, *k, *v;
    float *o, *s; /* s: the row's scores, then its probabilities */
    const void *mr;
    int64_t lim;
} few_row_t;

static inline few_row_t few_row(const attn_t *a, int64_t t, float *s) {
    const int64_t i = t % a->sq, h = (t / a->sq) % a->hq, bi = t / (a->sq * a->hq);
    const int64_t kvh = h / (a->hq / a->hkv);
    few_row_t r = {a->q + bi * a->qs[0] + h * a->qs[1] + i * a->qs[2],
                   a->k + bi * a->ks[0] + kvh * a->ks[1],
                   a->v + bi * a->vs[0] + kvh * a->vs[1],
                   a->out + bi * a->os[0] + h * a->os[1] + i * a->os[2], s,
                   mask_row(a, bi, h, i), key_limit(a, NULL, i)};
    return r;
}

/* r->s[j0:j0+n] = scaled dots of q with keys j0.. (four keys: four vector sums where the
 * head dim is a multiple of 8) */
static inline void few_dots(const attn_t *a, const few_row_t *r, int64_t j0, int64_t n) {
    const int64_t d = a->d, ks = a->ks[2];
    if (n == 4 && d % 8 == 0) {
        const float *k0 = r->k + j0 * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
        v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int64_t x = 0; x < d; x += 8) {
            v8 qv = *(const v8u *)(r->q + x);
            s0 += qv * *(const v8u *)(k0 + x);
            s1 += qv * *(const v8u *)(k1 + x);
            s2 += qv * *(const v8u *)(k2 + x);
            s3 += qv * *(const v8u *)(k3 + x);
        }
        r->s[j0] = hsum8(s0) * a->scale;
        r->s[j0 + 1] = hsum8(s1) * a->scale;
        r->s[j0 + 2] = hsum8(s2) * a->scale;
        r->s[j0 + 3] = hsum8(s3) * a->scale;
        return;
    }
    for (int64_t j = j0; j < j0 + n; j++) {
        const float *kj = r->k + j * ks;
        float dot = 0.0f;
        _Pragma("omp simd reduction(+:dot)")
        for (int64_t x = 0; x < d; x++) dot += r->q[x] * kj[x];
        r->s[j] = dot * a->scale;
    }
}

/* r->o += P[j0:j0+n] @ V[j0:j0+n] (four keys in one pass where the value dim is a multiple
 * of 8) */
static inline void few_pv(const attn_t *a, const few_row_t *r, int64_t j0, int64_t n) {
    const int64_t dv = a->dv, vs = a->vs[2];
    float *o = r->o;
    if (n == 4 && dv % 8 == 0) {
        const float *v0 = r->v + j0 * vs, *v1 = v0 + vs, *v2 = v1 + vs, *v3 = v2 + vs;
        const float p0 = r->s[j0], p1 = r->s[j0 + 1], p2 = r->s[j0 + 2], p3 = r->s[j0 + 3];
        for (int64_t x = 0; x < dv; x += 8)
            *(v8u *)(o + x) += (p0 * *(const v8u *)(v0 + x) + p1 * *(const v8u *)(v1 + x))
                             + (p2 * *(const v8u *)(v2 + x) + p3 * *(const v8u *)(v3 + x));
        return;
    }
    for (int64_t j = j0; j < j0 + n; j++) {
        const float *vj = r->v + j * vs;
        const float p = r->s[j];
        _Pragma("omp simd")
        for (int64_t x = 0; x < dv; x++) o[x] += p * vj[x];
    }
}

/* how many of the keys [j, j + 4) the row sees */
static inline int64_t few_step(const few_row_t *r, int64_t j) {
    return imax(0, imin(4, r->lim - j));
}

/* Few query rows (decoding: one token against a KV cache): K and V read in place, no
 * packing, TG_FEW_GROUP rows at a time. Packing K and V per call (O(Sk * D) per kv head) is all of the work when one query
 * row uses them: (1, 12, 1, 64) against 136 cached keys took 68 us packed, numpy's 41 us. Same
 * arithmetic as the packed path's non-AVX-512 branch: scaled dots, mask added, max, exp, 1/sum
 * (safe softmax with a mask), then P @ V, four keys at a time. Both the plain and the flash
 * kernel take it for Sq <= TG_FEW_ROWS. Returns 0, or -1 when out of memory. */
static int attention_few_rows(const attn_t *a) {
    const int64_t rows = a->b * a->hq * a->sq;
    const int64_t work = rows * a->sk * a->d;
    int failed = 0;
    /* both threads from TG_PAR_MIN: a decode step's attention comes right after a GEMV, its K
     * and V from memory (the weights streamed through the caches since the last token), and
     * the team is still spinning: GPT-2's (1, 12, 1, 64) against 144 keys after a GEMV took
     * 85-98 us on one thread, 45-55 on two (from 8 x TG_PAR_MIN it stayed on one below 341
     * keys) */
    _Pragma("omp parallel num_threads(tg_team()) if(work > TG_PAR_MIN)")
    {
        /* each thread a run of consecutive rows (a kv head's query heads stay together) */
        const int64_t nt = omp_get_num_threads(), per = (rows + nt - 1) / nt;
        const int64_t t0 = imin(rows, omp_get_thread_num() * per), t1 = imin(rows, t0 + per);
        const int64_t sk = a->sk > 0 ? a->sk : 1;
        float *s = t1 > t0 ? malloc(sizeof(float) * TG_FEW_GROUP * (size_t)sk) : NULL;
        if (t1 > t0 && !s) {
            _Pragma("omp atomic write")
            failed = 1;
        }
        for (int64_t t = t0; s && t < t1; t += TG_FEW_GROUP) {
            const int nr = (int)imin(TG_FEW_GROUP, t1 - t);
            few_row_t r[TG_FEW_GROUP];
            float inv[TG_FEW_GROUP];
            int64_t lim = 0;
            for (int u = 0; u < nr; u++) {
                r[u] = few_row(a, t + u, s + u * sk);
                lim = imax(lim, r[u].lim);
            }
            for (int64_t j = 0; j < lim; j += 4) /* the rows' keys in turn, 4 at a time */
                for (int u = 0; u < nr; u++)
                    few_dots(a, &r[u], j, few_step(&r[u], j));
            for (int u = 0; u < nr; u++) {
                inv[u] = softmax_row(a, r[u].s, r[u].mr, r[u].lim);
                for (int64_t x = 0; x < a->dv; x++) r[u].o[x] = 0.0f;
            }
            for (int64_t j = 0; j < lim; j += 4) /* their values in turn */
                for (int u = 0; u < nr; u++)
                    few_pv(a, &r[u], j, few_step(&r[u], j));
            for (int u = 0; u < nr; u++) {
                float *o = r[u].o;
                _Pragma("omp simd")
                for (int64_t x = 0; x < a->dv; x++) o[x] *= inv[u];
            }
        }
        free(s);
    }
    return failed ? -1 : 0;
}

/* rows x keys of a bool mask mask_limits reads at most (a per-head mask of long sequences
 * is left alone: reading it would cost more than the scores it could skip) */
#define TG_MASK_SCAN_MAX ((int64_t)1 << 22)

/* 1 when V's keys [j0, Sk) hold only finite values (the reference's 0 x inf is NaN) */
static int v_finite_from(const attn_t *a, int64_t j0) {
    int bad = 0;
    const int64_t heads = a->b * a->hkv, dv = a->dv;
    #pragma omp parallel for reduction(|:bad) num_threads(tg_team()) \
        if(heads * (a->sk - j0) * dv > 65536)
    for (int64_t t = 0; t < heads; t++) {
        const float *vh = a->v + (t / a->hkv) * a->vs[0] + (t % a->hkv) * a->vs[1];
        float z = 0.0f; /* x * 0 is NaN exactly where x is inf or NaN */
        for (int64_t j = j0; j < a->sk; j++) {
            const float *row = vh + j * a->vs[2];
            _Pragma("omp simd reduction(+:z)")
            for (int64_t x = 0; x < dv; x++) z += row[x] * 0.0f;
        }
        bad |= z != z;
    }
    return !bad;
}

/* Where a bool mask leaves the tail of a row's keys all false (a causal mask, right padding),
 * the plain kernel skips those keys: the reference gives them probability 0 whatever their
 * scores (where(mask, s, -inf)), so neither their scores nor P @ V's work on them change the
 * result. A row's limit is 1 + its last true key (at least 1: a row with nothing to attend to
 * still takes the safe softmax's path), raised to the largest limit of the rows before it
 * (a group of rows computes the keys of its last row's limit, which must cover them all).
 * Not where V has a non-finite value among the keys some row skips: the reference's 0 x inf
 * is NaN there. Sets a->lims to the table (malloc'd: the caller frees it) and returns it, or
 * returns NULL when nothing would be skipped. GPT-2's causal (1, 1, 128, 128) bool mask, 12
 * heads of 64, 2 threads: 0.152 -> 0.118 ms (is_causal: 0.095; of the difference, ~0.01 ms is
 * the check of V). */
static int64_t *mask_limits(attn_t *a) {
    const int64_t nb = a->ms[0] ? a->b : 1, nh = a->ms[1] ? a->hq : 1, ni = a->ms[2] ? a->sq : 1;
    if (!a->mask || !a->mask_u8 || nb * nh * ni * a->sk > TG_MASK_SCAN_MAX) return NULL;
    int64_t *t = malloc(sizeof(int64_t) * (size_t)(nb * nh * ni));
    if (!t) return NULL;
    const int64_t st = a->ms[3];
    int64_t least = a->sk;
    for (int64_t bh = 0; bh < nb * nh; bh++) {
        int64_t run = 1;
        for (int64_t i = 0; i < ni; i++) {
            const uint8_t *m = (const uint8_t *)a->mask + (bh / nh) * a->ms[0] +
                               (bh % nh) * a->ms[1] + i * a->ms[2];
            int64_t j = a->sk;
            while (j > run && !m[(j - 1) * st]) j--;
            run = j;
            t[bh * ni + i] = run;
            least = imin(least, run);
        }
    }
    if (least >= a->sk || !v_finite_from(a, least)) {
        free(t);
        return NULL;
    }
    a->lims = t;
    a->lb = a->ms[0] ? nh * ni : 0;
    a->lh = a->ms[1] ? ni : 0;
    a->li = a->ms[2] ? 1 : 0;
    return t;
}

static int attention_rows(const attn_t *ap);

int tg_attention_f32(const float *q, const float *k, const float *v, const void *mask,
                     const int64_t *mask_strides, const int64_t *qkv_strides, float *out,
                     int64_t b, int64_t hq, int64_t hkv,
                     int64_t sq, int64_t sk, int64_t d, int64_t dv, float scale, int causal) {
    attn_t a = {q, k, v, mask, out, b, hq, hkv, sq, sk, d, dv, round16(sk), round16(dv),
                {0, 0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, scale, causal, 0, 0,
                NULL, NULL};
    if (mask) {
        for (int t = 0; t < 4; t++) a.ms[t] = mask_strides[t];
        a.mask_u8 = (int)mask_strides[4];
    }
    for (int t = 0; t < 3; t++) {
        a.qs[t] = qkv_strides[t];
        a.ks[t] = qkv_strides[3 + t];
        a.vs[t] = qkv_strides[6 + t];
        a.os[t] = qkv_strides[9 + t];
    }
    if (sq <= TG_FEW_ROWS)
        return attention_few_rows(&a);
    int64_t *lims = mask_limits(&a);
    int rc = attention_rows(&a);
    free(lims);
    return rc;
}

/* the plain kernel's rows (more than TG_FEW_ROWS): 0, or -1 when out of memory. A function
 * of its own because TG_ATTENTION_DRIVER returns from where it runs, and the caller frees the
 * mask limits after it; the driver fills in a copy of the kernel's description. */
static int attention_rows(const attn_t *ap) {
    attn_t a = *ap;
    const void *mask = a.mask;
    const int64_t dv = a.dv;
    /* per thread: scores (TG_BQ x Skp), accumulator (TG_BQ x Dvp), lane maxima (TG_BQ x TG_W),
     * 1/sum (TG_BQ) */
    TG_ATTENTION_DRIVER(a, TG_BQ * (a.skp + a.dvp + TG_W + 1), {
        float *s = buf, *acc = s + TG_BQ * a.skp, *mv = acc + TG_BQ * a.dvp;
        float *inv = mv + TG_BQ * TG_W;
        const int64_t *rl = a.lims ? a.lims + bi * a.lb + h * a.lh : NULL;
        int64_t kend = key_limit(&a, rl, q1 - 1);
#ifdef __AVX512F__
        fuse_t fz;
        fz.a = &a;
        fz.mv = mv;
        for (int64_t i = q0; i < q1; i++) {
            fz.mr[i - q0] = mask_row(&a, bi, h, i);
            fz.lim[i - q0] = key_limit(&a, rl, i);
        }
        for (int64_t x = 0; x < (q1 - q0) * TG_W; x++) mv[x] = -INFINITY;
        task_scores(&a, rl, qh, kp, q0, q1, 0, kend, s, a.skp, &fz);
        for (int64_t i = q0; i < q1; i++) {
            /* the panels the row's group computed; keys past the row's limit are -inf */
            int64_t n = round16(group_keys(&a, rl, q0, q1, i, 0, kend));
            float m = row_max(mv + (i - q0) * TG_W, TG_W);
            float shift = (mask && m == -INFINITY) ? 0.0f : m;
            float sum = exp_row(s + (i - q0) * a.skp, n, shift);
            /* safe softmax with a mask: divide by max(sum, 1), NaN stays NaN */
            inv[i - q0] = (mask && sum < 1.0f) ? 1.0f : 1.0f / sum;
        }
#else
        task_scores(&a, rl, qh, kp, q0, q1, 0, kend, s, a.skp, NULL);
        for (int64_t i = q0; i < q1; i++) {
            float *sr = s + (i - q0) * a.skp;
            int64_t lim = key_limit(&a, rl, i), n = group_keys(&a, rl, q0, q1, i, 0, kend);
            const void *mr = mask_row(&a, bi, h, i);
            inv[i - q0] = softmax_row(&a, sr, mr, lim);
            for (int64_t j = lim; j < n; j++) sr[j] = 0.0f;
        }
#endif
#ifdef __AVX512F__
        int direct = dv % (2 * TG_W) == 0; /* task_pv writes the output */
#else
        int direct = 0;
#endif
        /* every row sees >= 1 key */
        task_pv(&a, rl, vp, q0, q1, 0, kend, s, a.skp, acc, 1, oh, direct ? inv : NULL);
        for (int64_t i = q0; i < q1 && !direct; i++) {
            const float *ar = acc + (i - q0) * a.dvp;
            float *o = oh + i * a.os[2], c = inv[i - q0];
            for (int64_t x = 0; x < dv; x++) o[x] = ar[x] * c;
        }
    });
}

int tg_flash_attention_f32(const float *q, const float *k, const float *v, const void *mask,
                           const int64_t *mask_strides, const int64_t *qkv_strides, float *out,
                           int64_t b, int64_t hq,
                           int64_t hkv, int64_t sq, int64_t sk, int64_t d, int64_t dv,
                           float scale, int causal, int64_t bk) {
    attn_t a = {q, k, v, mask, out, b, hq, hkv, sq, sk, d, dv, round16(sk), round16(dv),
                {0, 0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, scale, causal, 0, 0,
                NULL, NULL};
    if (mask) {
        for (int t = 0; t < 4; t++) a.ms[t] = mask_strides[t];
        a.mask_u8 = (int)mask_strides[4];
    }
    for (int t = 0; t < 3; t++) {
        a.qs[t] = qkv_strides[t];
        a.ks[t] = qkv_strides[3 + t];
        a.vs[t] = qkv_strides[6 + t];
        a.os[t] = qkv_strides[9 + t];
    }
    if (sq <= TG_FEW_ROWS) /* one row of scores per thread: bounded as the blocks are */
        return attention_few_rows(&a);
    bk = round16(bk < TG_W ? TG_W : bk);
    /* per thread: scores (TG_BQ x bk), accumulator (TG_BQ x Dvp), running max and sum
     * (TG_BQ each); the first two 64-byte aligned */
    TG_ATTENTION_DRIVER(a, TG_BQ * (bk + a.dvp + 2), {
        float *s = buf, *acc = s + TG_BQ * bk, *ms = acc + TG_BQ * a.dvp, *ls = ms + TG_BQ;
        for (int64_t r = 0; r < TG_BQ; r++) {
            ms[r] = -INFINITY;
            ls[r] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * (size_t)((q1 - q0) * a.dvp));
        int64_t kend = key_limit(&a, NULL, q1 - 1);
        for (int64_t j0 = 0; j0 < kend; j0 += bk) {
            int64_t jn = imin(bk, kend - j0);
            task_scores(&a, NULL, qh, kp, q0, q1, j0, jn, s, bk, NULL);
            for (int64_t i = q0; i < q1; i++) {
                int64_t lr = i - q0, n = group_keys(&a, NULL, q0, q1, i, j0, jn);
                if (n == 0) continue; /* causal: the row's group needs no key here */
                float *sr = s + lr * bk;
                int64_t lim = imax(0, imin(key_limit(&a, NULL, i) - j0, jn));
                const void *mr = lim ? mask_row(&a, bi, h, i) : NULL;
                if (mr)
                    add_mask_row(&a, sr, mr, j0, lim);
                float mold = ms[lr], bm = row_max(sr, lim);
                float m = bm > mold ? bm : mold;
                if (m == -INFINITY) { /* nothing to attend to yet (NaN scores: NaN out) */
                    int nan = 0;
                    for (int64_t j = 0; j < lim; j++) nan |= sr[j] != sr[j];
                    if (nan) ls[lr] = NAN;
                    for (int64_t j = 0; j < n; j++) sr[j] = 0.0f;
                    continue;
                }
                float corr = mold == -INFINITY ? 0.0f : tg_exp_nonpos(mold - m);
                float sum = exp_sum(sr, lim, m);
                for (int64_t j = lim; j < n; j++) sr[j] = 0.0f;
                ms[lr] = m;
                ls[lr] = ls[lr] * corr + sum;
                if (corr != 1.0f) {
                    float *ar = acc + lr * a.dvp;
                    _Pragma("omp simd")
                    for (int64_t c = 0; c < a.dvp; c++) ar[c] *= corr;
                }
            }
            task_pv(&a, NULL, vp, q0, q1, j0, jn, s, bk, acc, 0, NULL, NULL);
        }
        for (int64_t i = q0; i < q1; i++) {
            int64_t lr = i - q0;
            /* safe softmax with a mask: a row that saw nothing gives 0 (a NaN sum stays) */
            float l = ls[lr];
            float inv = (mask && ms[lr] == -INFINITY && l == 0.0f) ? 0.0f : 1.0f / l;
            const float *ar = acc + lr * a.dvp;
            float *o = oh + i * a.os[2];
            for (int64_t x = 0; x < dv; x++) o[x] = ar[x] * inv;
        }
    });
}
