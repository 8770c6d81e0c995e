/* Scaled dot-product attention, float32: q (B, Hq, Sq, D), k (B, Hkv, Sk, D),
 * v (B, Hkv, Sk, Dv) -> out (B, Hq, Sq, Dv). Grouped-query heads (q head h reads kv head
 * h / (Hq / Hkv)), causal (key j <= query i, top-left), an optional additive float mask read
 * through four element strides (0 = broadcast) over (B, Hq, Sq, Sk). With a mask, a row with
 * nothing to attend to gives 0 (the reference's safe softmax).
 *
 * Both variants first copy K transposed (D x Skp) and V padded (Skp x Dvp) per kv head, so the
 * micro-kernels below read aligned, zero-padded rows (Skp, Dvp: multiples of 16):
 *  - tg_attention_f32: per block of 6 query rows, scores against all keys, an exact softmax,
 *    then P @ V (a 6 x Sk buffer per thread).
 *  - tg_flash_attention_f32: query blocks of 60 rows x key blocks of `bk` keys with an online
 *    softmax (running max, sum, rescaled accumulator): never more than 6 x bk scores, and
 *    each K/V block is reused by 60 query rows while it is in cache. */
#include "tg_common.h"
#include <stdlib.h>

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
#define TG_R 6
#define TG_BQ 60 /* a multiple of TG_R */

static inline int64_t round16(int64_t x) { return (x + 15) & ~(int64_t)15; }

/* 64-byte aligned, size rounded up to a multiple of 64 (as C11 aligned_alloc wants) */
static void *tg_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 127) & ~(size_t)63); }

/* s[r][j] = scale * sum_d q[r][d] * kt[d][j] for j in [0, n), n a multiple of 16.
 * TG_R x 16 outputs in 2 * TG_R vector accumulators (12 with TG_R = 6: enough independent
 * FMAs in flight to cover their latency). */
TG_INLINE void scores_block(const float *const q[TG_R], const float *kt, int64_t ldk, int64_t d_,
                            int64_t n, float scale, float *s, int64_t lds) {
    for (int64_t j = 0; j < n; j += 16) {
        v8 a0[TG_R], a1[TG_R];
        for (int r = 0; r < TG_R; r++) a0[r] = a1[r] = (v8){0};
        for (int64_t d = 0; d < d_; d++) {
            const float *kr = kt + d * ldk + j;
            v8 k0 = *(const v8u *)kr, k1 = *(const v8u *)(kr + 8);
            for (int r = 0; r < TG_R; r++) {
                float x = q[r][d];
                a0[r] += x * k0;
                a1[r] += x * k1;
            }
        }
        for (int r = 0; r < TG_R; r++) {
            *(v8u *)(s + r * lds + j) = a0[r] * scale;
            *(v8u *)(s + r * lds + j + 8) = a1[r] * scale;
        }
    }
}

/* acc[r][c] += sum_{j < n} p[r][j] * v[j][c] for c in [0, dvp), dvp a multiple of 16 */
TG_INLINE void pv_block(const float *p, int64_t ldp, const float *v, int64_t ldv, int64_t n,
                        int64_t dvp, float *acc, int64_t lda) {
    for (int64_t c = 0; c < dvp; c += 16) {
        v8 a0[TG_R], a1[TG_R];
        for (int r = 0; r < TG_R; r++) {
            a0[r] = *(v8u *)(acc + r * lda + c);
            a1[r] = *(v8u *)(acc + r * lda + c + 8);
        }
        for (int64_t j = 0; j < n; j++) {
            const float *vr = v + j * ldv + c;
            v8 v0 = *(const v8u *)vr, v1 = *(const v8u *)(vr + 8);
            for (int r = 0; r < TG_R; r++) {
                float x = p[r * ldp + j];
                a0[r] += x * v0;
                a1[r] += x * v1;
            }
        }
        for (int r = 0; r < TG_R; r++) {
            *(v8u *)(acc + r * lda + c) = a0[r];
            *(v8u *)(acc + r * lda + c + 8) = a1[r];
        }
    }
}

typedef struct {
    const float *q, *k, *v, *mask;
    float *out;
    int64_t b, hq, hkv, sq, sk, d, dv, skp, dvp;
    int64_t ms[4];
    float scale;
    int causal;
    float *kt, *vp; /* (B, Hkv, D, Skp) and (B, Hkv, Skp, Dvp) */
} attn_t;

/* copy K transposed and V padded, zeros in the padding */
static int prepare(attn_t *a) {
    int64_t nh = a->b * a->hkv;
    a->kt = tg_alloc(sizeof(float) * (size_t)(nh * a->d * a->skp));
    a->vp = tg_alloc(sizeof(float) * (size_t)(nh * a->skp * a->dvp));
    if (!a->kt || !a->vp) {
        free(a->kt);
        free(a->vp);
        return -1;
    }
    _Pragma("omp parallel for schedule(static) num_threads(tg_nthreads) if(nh * a->sk * a->d > TG_PAR_MIN)")
    for (int64_t h = 0; h < nh; h++) {
        const float *kh = a->k + h * a->sk * a->d, *vh = a->v + h * a->sk * a->dv;
        float *kt = a->kt + h * a->d * a->skp, *vp = a->vp + h * a->skp * a->dvp;
        for (int64_t d = 0; d < a->d; d++) {
            for (int64_t j = 0; j < a->sk; j++) kt[d * a->skp + j] = kh[j * a->d + d];
            for (int64_t j = a->sk; j < a->skp; j++) kt[d * a->skp + j] = 0.0f;
        }
        for (int64_t j = 0; j < a->skp; j++) {
            float *row = vp + j * a->dvp;
            if (j < a->sk) {
                memcpy(row, vh + j * a->dv, sizeof(float) * (size_t)a->dv);
                memset(row + a->dv, 0, sizeof(float) * (size_t)(a->dvp - a->dv));
            } else {
                memset(row, 0, sizeof(float) * (size_t)a->dvp);
            }
        }
    }
    return 0;
}

/* the keys query row i may see: [0, limit) */
static inline int64_t key_limit(const attn_t *a, int64_t i) {
    return a->causal ? (i + 1 < a->sk ? i + 1 : a->sk) : a->sk;
}

static inline const float *mask_row(const attn_t *a, int64_t b, int64_t h, int64_t i) {
    return a->mask ? a->mask + b * a->ms[0] + h * a->ms[1] + i * a->ms[2] : NULL;
}

int tg_attention_f32(const float *q, const float *k, const float *v, const float *mask,
                     const int64_t *mask_strides, float *out, int64_t b, int64_t hq, int64_t hkv,
                     int64_t sq, int64_t sk, int64_t d, int64_t dv, float scale, int causal) {
    attn_t a = {q, k, v, mask, out, b, hq, hkv, sq, sk, d, dv, round16(sk), round16(dv),
                {0, 0, 0, 0}, scale, causal, NULL, NULL};
    if (mask)
        for (int t = 0; t < 4; t++) a.ms[t] = mask_strides[t];
    if (prepare(&a)) return -1;
    int64_t nblk = (sq + TG_R - 1) / TG_R, tasks = b * hq * nblk, group = hq / hkv;
    int failed = 0;
    _Pragma("omp parallel num_threads(tg_nthreads) if(tasks * sk * d > TG_PAR_MIN)")
    {
        float *s = tg_alloc(sizeof(float) * (size_t)(TG_R * a.skp + TG_R * a.dvp));
        if (!s) {
            _Pragma("omp atomic write")
            failed = 1;
        } else {
            float *acc = s + TG_R * a.skp;
            _Pragma("omp for schedule(static)")
            for (int64_t t = 0; t < tasks; t++) {
                int64_t bh = t / nblk, i0 = (t % nblk) * TG_R;
                int64_t bi = bh / hq, h = bh % hq, kvh = bi * hkv + h / group;
                const float *qrows[TG_R];
                for (int r = 0; r < TG_R; r++) {
                    int64_t i = i0 + r < sq ? i0 + r : sq - 1;
                    qrows[r] = q + (bh * sq + i) * d;
                }
                int64_t n = key_limit(&a, i0 + TG_R - 1 < sq ? i0 + TG_R - 1 : sq - 1);
                int64_t np = round16(n);
                scores_block(qrows, a.kt + kvh * d * a.skp, a.skp, d, np, scale, s, a.skp);
                for (int r = 0; r < TG_R; r++) {
                    float *sr = s + r * a.skp;
                    int64_t i = i0 + r, lim = i < sq ? key_limit(&a, i) : 0;
                    const float *mr = i < sq ? mask_row(&a, bi, h, i) : NULL;
                    if (mr)
                        for (int64_t j = 0; j < lim; j++) sr[j] += mr[j * a.ms[3]];
                    float m = tg_row_max(sr, lim);
                    float shift = (mask && m == -INFINITY) ? 0.0f : m;
                    float sum = 0.0f;
                    _Pragma("omp simd reduction(+:sum)")
                    for (int64_t j = 0; j < lim; j++) {
                        float e = tg_expf(sr[j] - shift);
                        sr[j] = e;
                        sum += e;
                    }
                    /* safe softmax with a mask: divide by max(sum, 1), NaN stays NaN */
                    float inv = (mask && sum < 1.0f) ? 1.0f : 1.0f / sum;
                    for (int64_t j = 0; j < lim; j++) sr[j] *= inv;
                    for (int64_t j = lim; j < np; j++) sr[j] = 0.0f;
                    memset(acc + r * a.dvp, 0, sizeof(float) * (size_t)a.dvp);
                }
                pv_block(s, a.skp, a.vp + kvh * a.skp * a.dvp, a.dvp, n, a.dvp, acc, a.dvp);
                for (int r = 0; r < TG_R && i0 + r < sq; r++)
                    memcpy(out + (bh * sq + i0 + r) * dv, acc + r * a.dvp,
                           sizeof(float) * (size_t)dv);
            }
            free(s);
        }
    }
    free(a.kt);
    free(a.vp);
    return failed ? -1 : 0;
}

int tg_flash_attention_f32(const float *q, const float *k, const float *v, const float *mask,
                           const int64_t *mask_strides, float *out, int64_t b, int64_t hq,
                           int64_t hkv, int64_t sq, int64_t sk, int64_t d, int64_t dv,
                           float scale, int causal, int64_t bk) {
    attn_t a = {q, k, v, mask, out, b, hq, hkv, sq, sk, d, dv, round16(sk), round16(dv),
                {0, 0, 0, 0}, scale, causal, NULL, NULL};
    if (mask)
        for (int t = 0; t < 4; t++) a.ms[t] = mask_strides[t];
    bk = round16(bk < 16 ? 16 : bk);
    if (prepare(&a)) return -1;
    int64_t nqb = (sq + TG_BQ - 1) / TG_BQ, tasks = b * hq * nqb, group = hq / hkv;
    int failed = 0;
    _Pragma("omp parallel num_threads(tg_nthreads) if(tasks * sk * d > TG_PAR_MIN)")
    {
        /* scores (R x bk), state m, l (BQ), accumulator (BQ x Dvp) */
        float *s = tg_alloc(sizeof(float) * (size_t)(TG_R * bk + 2 * TG_BQ + TG_BQ * a.dvp));
        if (!s) {
            _Pragma("omp atomic write")
            failed = 1;
        } else {
            float *ms = s + TG_R * bk, *ls = ms + TG_BQ, *acc = ls + TG_BQ;
            _Pragma("omp for schedule(static)")
            for (int64_t t = 0; t < tasks; t++) {
                int64_t bh = t / nqb, q0 = (t % nqb) * TG_BQ;
                int64_t q1 = q0 + TG_BQ < sq ? q0 + TG_BQ : sq;
                int64_t bi = bh / hq, h = bh % hq, kvh = bi * hkv + h / group;
                const float *kt = a.kt + kvh * d * a.skp, *vp = a.vp + kvh * a.skp * a.dvp;
                for (int64_t r = 0; r < TG_BQ; r++) {
                    ms[r] = -INFINITY;
                    ls[r] = 0.0f;
                }
                memset(acc, 0, sizeof(float) * (size_t)(TG_BQ * a.dvp));
                int64_t kend = key_limit(&a, q1 - 1);
                for (int64_t j0 = 0; j0 < kend; j0 += bk) {
                    int64_t jn = j0 + bk < kend ? bk : kend - j0;
                    for (int64_t i0 = q0; i0 < q1; i0 += TG_R) {
                        const float *qrows[TG_R];
                        for (int r = 0; r < TG_R; r++) {
                            int64_t i = i0 + r < q1 ? i0 + r : q1 - 1;
                            qrows[r] = q + (bh * sq + i) * d;
                        }
                        if (key_limit(&a, i0 + TG_R - 1 < q1 ? i0 + TG_R - 1 : q1 - 1) <= j0)
                            continue; /* causal: this block is past every row here */
                        scores_block(qrows, kt + j0, a.skp, d, round16(jn), scale, s, bk);
                        for (int r = 0; r < TG_R; r++) {
                            float *sr = s + r * bk;
                            int64_t i = i0 + r, lr = i - q0;
                            int64_t lim = i < q1 ? key_limit(&a, i) - j0 : 0;
                            lim = lim < 0 ? 0 : (lim > jn ? jn : lim);
                            const float *mr = (i < q1 && lim) ? mask_row(&a, bi, h, i) : NULL;
                            if (mr)
                                for (int64_t j = 0; j < lim; j++) sr[j] += mr[(j0 + j) * a.ms[3]];
                            float m = i < q1 ? ms[lr] : -INFINITY;
                            float bm = tg_row_max(sr, lim);
                            m = bm > m ? bm : m;
                            if (m == -INFINITY) { /* nothing to attend to yet */
                                for (int64_t j = 0; j < jn; j++) sr[j] = 0.0f;
                                continue;
                            }
                            float corr = ms[lr] == -INFINITY ? 0.0f : tg_expf(ms[lr] - m);
                            float sum = 0.0f;
                            _Pragma("omp simd reduction(+:sum)")
                            for (int64_t j = 0; j < lim; j++) {
                                float e = tg_expf(sr[j] - m);
                                sr[j] = e;
                                sum += e;
                            }
                            for (int64_t j = lim; j < jn; j++) sr[j] = 0.0f;
                            ms[lr] = m;
                            ls[lr] = ls[lr] * corr + sum;
                            if (corr != 1.0f) {
                                float *ar = acc + lr * a.dvp;
                                _Pragma("omp simd")
                                for (int64_t c = 0; c < a.dvp; c++) ar[c] *= corr;
                            }
                        }
                        /* rows past q1 have zero probabilities: their accumulator rows
                         * (still inside the TG_BQ-row buffer) stay unused */
                        pv_block(s, bk, vp + j0 * a.dvp, a.dvp, jn, a.dvp,
                                 acc + (i0 - q0) * a.dvp, a.dvp);
                    }
                }
                for (int64_t i = q0; i < q1; i++) {
                    int64_t lr = i - q0;
                    float l = ls[lr];
                    /* safe softmax with a mask: a row that saw nothing gives 0 */
                    float inv = (mask && ms[lr] == -INFINITY) ? 0.0f : 1.0f / l;
                    float *o = out + (bh * sq + i) * dv;
                    for (int64_t c = 0; c < dv; c++) o[c] = acc[lr * a.dvp + c] * inv;
                }
            }
            free(s);
        }
    }
    free(a.kt);
    free(a.vp);
    return failed ? -1 : 0;
}
