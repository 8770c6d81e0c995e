/* Philox-4x32-10 (Salmon et al., SC 2011; Random123's philox.h) and dropout fused with it:
 * the mask is drawn in the pass that scales, so nothing but x and the result is touched.
 *
 * Element i is word i % 4 of the block with counter (i / 4, stream, step lo, step hi) under
 * key (seed lo, seed hi), key = [seed, step] read through its pointer at call time (the
 * program advances it in place; the native loop replays the call with the same pointer).
 * These are the words of tensor_graphs/ir/ops/random.py's reference, bit for bit.
 *
 * Blocks go TG_PHILOX_LANES at a time through the ten rounds, lane by lane, so GCC vectorises
 * the 32x32->64 multiplies (vpmuludq); each thread takes whole chunks of blocks, and a whole
 * chunk is written word by word in element order. Single thread, float32 in cache: 16 lanes
 * 2.2 ns an element, 64 lanes and the element-order writes 1.2 ns (load ~10). */
#include "tg_common.h"

#define TG_PHILOX_M0 0xD2511F53u
#define TG_PHILOX_M1 0xCD9E8D57u
#define TG_PHILOX_W0 0x9E3779B9u
#define TG_PHILOX_W1 0xBB67AE85u
#define TG_PHILOX_LANES 64
#define TG_RANDOM_PAR (1 << 15) /* elements from which the pass goes parallel */

/* The four words of TG_PHILOX_LANES consecutive blocks from `block`, into w[word][lane]. */
static inline void tg_philox_lanes(uint64_t block, uint32_t stream, uint64_t step,
                                   uint64_t seed, uint32_t w[4][TG_PHILOX_LANES]) {
    uint32_t c0[TG_PHILOX_LANES], c1[TG_PHILOX_LANES], c2[TG_PHILOX_LANES], c3[TG_PHILOX_LANES];
    for (int l = 0; l < TG_PHILOX_LANES; l++) {
        c0[l] = (uint32_t)(block + (uint64_t)l);
        c1[l] = stream;
        c2[l] = (uint32_t)step;
        c3[l] = (uint32_t)(step >> 32);
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
#pragma omp simd
        for (int l = 0; l < TG_PHILOX_LANES; l++) {
            const uint64_t p0 = (uint64_t)TG_PHILOX_M0 * c0[l];
            const uint64_t p1 = (uint64_t)TG_PHILOX_M1 * c2[l];
            const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
            const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1;
            c3[l] = (uint32_t)p0;
            c0[l] = n0;
            c2[l] = n2;
        }
        k0 += TG_PHILOX_W0;
        k1 += TG_PHILOX_W1;
    }
    for (int l = 0; l < TG_PHILOX_LANES; l++) {
        w[0][l] = c0[l];
        w[1][l] = c1[l];
        w[2][l] = c2[l];
        w[3][l] = c3[l];
    }
}

/* out[i] = the word of element i (int64 in [0, 2**32)). */
void tg_random_bits(const int64_t *key, int64_t stream, int64_t *out, int64_t n) {
    const uint64_t seed = (uint64_t)key[0], step = (uint64_t)key[1];
    const int64_t per = 4 * TG_PHILOX_LANES, chunks = (n + per - 1) / per;
    const int par = n >= TG_RANDOM_PAR;
#pragma omp parallel for num_threads(tg_team()) if(par) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        uint32_t w[4][TG_PHILOX_LANES];
        tg_philox_lanes((uint64_t)c * TG_PHILOX_LANES, (uint32_t)stream, step, seed, w);
        const int64_t base = c * per;
        const int64_t len = n - base < per ? n - base : per;
        for (int64_t j = 0; j < len; j++) out[base + j] = (int64_t)w[j & 3][j >> 2];
    }
}

/* out[i] = word(i) < threshold ? 0 : x[i] * scale: inverted dropout in one pass. */
#define TG_DROPOUT(SUFFIX, FTYPE)                                                              \
void tg_dropout_##SUFFIX(const FTYPE *restrict x, const int64_t *key, int64_t stream,         \
                         uint64_t threshold, FTYPE scale, FTYPE *restrict out, int64_t n) {   \
    const uint64_t seed = (uint64_t)key[0], step = (uint64_t)key[1];                          \
    const int64_t per = 4 * TG_PHILOX_LANES, chunks = (n + per - 1) / per;                            \
    const int par = n >= TG_RANDOM_PAR;                                                        \
    _Pragma("omp parallel for num_threads(tg_team()) if(par) schedule(static)")               \
    for (int64_t c = 0; c < chunks; c++) {                                                     \
        uint32_t w[4][TG_PHILOX_LANES];                                                               \
        tg_philox_lanes((uint64_t)c * TG_PHILOX_LANES, (uint32_t)stream, step, seed, w);              \
        const int64_t base = c * per;                                                          \
        const int64_t len = n - base < per ? n - base : per;                                   \
        if (len == per) { /* whole chunk: element 4l + k is word k of lane l */                \
            const FTYPE *restrict xs = x + base;                                               \
            FTYPE *restrict os = out + base;                                                   \
            for (int l = 0; l < TG_PHILOX_LANES; l++)                                          \
                for (int k = 0; k < 4; k++)                                                    \
                    os[4 * l + k] = (uint64_t)w[k][l] < threshold ? (FTYPE)0                   \
                                                                  : xs[4 * l + k] * scale;     \
            continue;                                                                          \
        }                                                                                      \
        for (int64_t j = 0; j < len; j++) {                                                    \
            const FTYPE v = x[base + j] * scale;                                               \
            out[base + j] = (uint64_t)w[j & 3][j >> 2] < threshold ? (FTYPE)0 : v;             \
        }                                                                                      \
    }                                                                                          \
}

TG_DROPOUT(f32, float)
TG_DROPOUT(f64, double)

/* out = a + b over int64 (wrapping, as numpy): the generator's step advance ([seed, step] +
 * [0, 1]), so a program with dropout keeps every step in C (and in the native loop). */
void tg_add_i64(const int64_t *a, const int64_t *b, int64_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
}
