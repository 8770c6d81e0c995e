/* float32 GEMM on a weight packed once: C = act(A @ B + bias) + R, row-major A (M, K), C and
 * the residual R (M, N) (R optional: a transformer's residual add, read as each tile is stored
 * instead of a separate pass over C).
 *
 * B (the weight: K x N for a @ b, or N x K for torch's linear x @ W^T, read through any element
 * strides) is packed ONCE, at bind time (tg_gemm_pack_b), into the layout the micro-kernel
 * streams: a 64-byte header, then ceil(N / 16) panels of K rows x 16 columns (zero-padded
 * past N), each 64-byte aligned. A is packed per call into panels of MR rows x KC (zero-padded
 * rows) where the threads share it, else read in place (below). The micro-kernel (GCC vector
 * extensions: FMA under -march=native, builds on any target) is 6 x 16 in 12 eight-lane
 * accumulators, or, where AVX-512 is on, 8 x 32 in 16 sixteen-lane ones: two adjacent panels
 * per call, FMAs with an embedded broadcast of A. On Zen 5 (two 512-bit FMA pipes, 4-cycle
 * latency) the earlier 6 x 16 AVX-512 form (6 chains) ran GPT-2's layers at 323-337 GFLOP/s
 * and MiniLM's at 343-354; 8 x 32 at 437-469 and 470-487 (ONNX Runtime's MLAS: 400-470).
 * The last panel of an odd count runs alone. K blocking: the whole of K when
 * K <= KSINGLE = 768 (each C tile stored once: BERT's K = 384 was two blocks, 256 + 128;
 * GPT-2's K = 768 as one block instead of three ran its K = 768 products 2-5 % faster with
 * the 8 x 32 kernel, the two panels' 96 KiB of B then streaming from L2),
 * else equal blocks of at most KC = 768 rows where the threads split N (B streaming from L2
 * likewise: 2-4 % faster than blocks of 256, whose micro-panels stayed in L1, on (128, 3072,
 * 768), (128, 4096, 1024), (128, 2048, 2048), (256, 1536, 1536), (384, 8192, 512)), of at
 * most KCM = 512 where they split M (below). Threads:
 *  - M < MSPLIT = 512 (GPT-2's 128-token prompt): the threads share each packed MC = 144-row
 *    block of A (144 x 768, 432 KiB, in L2) and split N in chunks of up to 16 panels
 *    (the C chunk, 144 x 256 floats, stays in L2 across the K blocks), handed out
 *    dynamically so a thread sharing its core with other work takes fewer: guided (the last
 *    chunks a unit each) and taken one ahead, so a chunk's last unit prefetches the next
 *    chunk's first (in gemm_packed);
 *  - M >= 512 (BERT on 8 x 128 tokens): the threads take blocks of about MCP = 24 row panels
 *    (144 rows; as many blocks as a multiple of the thread count, equal to a panel),
 *    dynamically, each reading its rows of A in place (the micro-kernel broadcasts from six
 *    rows lda apart; packing them cost 1-4 %: (1024 x 384) @ (384 x 384) 207-210 -> 217-218
 *    GFLOP/s, (1024 x 1536) @ (1536 x 384) 213 -> 221, 1024^3 216 -> 220; where the threads
 *    share the packed block of A, reading it in place was 4 % slower on GPT-2's LM head) and
 *    running over all of N, in K blocks of up to KCM = 512 rows: no barrier per block of A,
 *    and both threads busy when N has few panels (N = 384 is 24). Measured on the 2-core EPYC
 *    VM: (1024 x 384) @ (384 x 384) 200 -> 211 GFLOP/s, 161 -> 166 with cold caches;
 *    (1024 x 1536) @ (1536 x 384), cold, 156 -> 189.
 * OpenMP, num_threads(tg_team()). Prefetches: the next B micro-panels into L2, and each C
 * tile (for writing) before its micro-kernel runs (the LM head's 26 MB output misses on every
 * first store: 207 -> 213-217 GFLOP/s measured). Where the threads split N, each row panel's
 * call fetches its share of the next pair, so the weight streams from memory at a steady
 * rate over the pair's 16 calls: the first call fetching all 96 KiB asked 64 GB/s of each
 * thread, and GPT-2's products, weights cold as in a model, ran 4-6 % slower (LM head 478 ->
 * 500 GFLOP/s). Where they split M, the first row panel's call fetches it (the weight is
 * re-read by every block of rows, so it is warm; spreading changed nothing there). Bias and
 * activation run on each C tile as its last K block is stored. No -ffast-math: NaN and inf
 * propagate (zero padding only meets padded rows and columns, which are never stored). */
#include "tg_common.h"
#include <stdlib.h>

/* Generated epilogues (kernels/c/gemm_epilogue.py) compile this text after their own code,
 * with TG_GEMM_GENERATED defined to 1 and a function
 *     tg_gemm_gen_row(const void *gen, float *t, int64_t row, int64_t col, int cols)
 * that applies the generated epilogue in place to one tile row's 16 lanes t (C's row `row`,
 * columns col .. col + cols - 1; lanes past cols are ignored), before its one store; `gen`
 * (tile_ep.gen, passed to gemm_packed) holds that epilogue's operands. The hand-written
 * kernels are compiled without it: gen_lanes is empty there and gen always NULL. */
#ifndef TG_GEMM_GENERATED
#define TG_GEMM_GENERATED 0
#endif

typedef float v8 __attribute__((vector_size(32)));            /* 32-byte aligned */
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* any alignment */

#ifdef __AVX512F__
#define MR 8     /* rows per micro-kernel: 8 x 32 with AVX-512 (16 accumulators, below) */
#else
#define MR 6     /* rows per micro-kernel: 6 x 16 in 8-lane halves (12 accumulators) */
#endif
#define NR 16    /* columns per panel (two 8-lane vectors) */
#define KC 768   /* rows of K per block at most where the threads split N */
#define MC 144   /* rows of A per block (a multiple of MR: 6 and 8) */
#define NCP 16   /* panels per thread chunk */
#define CHUNKS_PER_THREAD 4 /* chunks per thread at least (8: up to 7 % slower, A re-read) */
#define MAX_CHUNKS 1024 /* chunks of N per block of A at most (GPT-2's LM head: ~200) */
#define KSINGLE 768 /* K up to this is one K block (C stored once) */
#define KCM 512     /* rows of K per block at most where the threads split M */
#define MSPLIT 512  /* from this many rows of A, the threads split M instead of N */
#define MCP 24      /* row panels (of MR) per block of rows where the threads split M */
#define HEADER 16 /* floats before the panels: int64 magic, k, n, panels */
#define MAGIC ((int64_t)0x7467676d6d706b31) /* "tggmmpk1" */

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3 };

static inline int64_t imin(int64_t x, int64_t y) { return x < y ? x : y; }
static inline int64_t imax(int64_t x, int64_t y) { return x > y ? x : y; }

/* floats the packed form of a (k, n) operand takes, header included */
int64_t tg_gemm_packed_size(int64_t k, int64_t n) {
    return HEADER + ((n + NR - 1) / NR) * k * NR;
}

/* out[HEADER + (j * k + kk) * 16 + c] = b[kk * sk + (16 j + c) * sn] (0 past n); out must be
 * 64-byte aligned and hold tg_gemm_packed_size(k, n) floats. */
void tg_gemm_pack_b(const float *b, int64_t k, int64_t n, int64_t sk, int64_t sn, float *out) {
    int64_t panels = (n + NR - 1) / NR;
    int64_t *h = (int64_t *)out;
    h[0] = MAGIC;
    h[1] = k;
    h[2] = n;
    h[3] = panels;
    for (int i = 4; i < HEADER / 2; i++) h[i] = 0;
    float *p = out + HEADER;
    int nt = tg_team();
    (void)nt;
    #pragma omp parallel for schedule(static) num_threads(nt) if(k * n > 65536)
    for (int64_t j = 0; j < panels; j++) {
        float *dst = p + j * k * NR;
        int64_t c0 = j * NR, w = imin(NR, n - c0);
        if (sk == 1) { /* W (N, K): each column of the panel is a contiguous row of W */
            for (int64_t c = 0; c < NR; c++) {
                if (c < w) {
                    const float *src = b + (c0 + c) * sn;
                    for (int64_t kk = 0; kk < k; kk++) dst[kk * NR + c] = src[kk];
                } else {
                    for (int64_t kk = 0; kk < k; kk++) dst[kk * NR + c] = 0.0f;
                }
            }
        } else {
            for (int64_t kk = 0; kk < k; kk++) {
                const float *src = b + kk * sk + c0 * sn;
                for (int64_t c = 0; c < NR; c++) dst[kk * NR + c] = c < w ? src[c * sn] : 0.0f;
            }
        }
    }
}

/* k, n of a packed buffer, or -1 when it is not one */
int64_t tg_gemm_packed_dim(const float *packed, int which) {
    const int64_t *h = (const int64_t *)packed;
    if (h[0] != MAGIC) return -1;
    return which == 0 ? h[1] : h[2];
}

/* A rows [0, mc) x K columns, from a (lda), into blocks: for each K block pc (kc rows), the
 * row panels of MR, each kc x MR (padded rows are zero). Block pc starts at pc * mcp. */
static void pack_a_panel(const float *a, int64_t lda, int64_t rows, int64_t k0, int64_t kc,
                         float *dst) {
    if (rows == MR) {
        for (int64_t kk = 0; kk < kc; kk++)
            for (int r = 0; r < MR; r++) dst[kk * MR + r] = a[r * lda + k0 + kk];
    } else {
        for (int64_t kk = 0; kk < kc; kk++)
            for (int r = 0; r < MR; r++) dst[kk * MR + r] = r < rows ? a[r * lda + k0 + kk] : 0.0f;
    }
}

TG_INLINE float act_f(float x, int act) {
    if (act == ACT_RELU) return tg_reluf(x);
    if (act == ACT_GELU) return tg_gelu_erf(x);
    if (act == ACT_GELU_TANH) return tg_gelu_tanh(x);
    return x;
}

/* c[rows, cols] (ldc) of an epilogue tile: + bias, then the activation, then + res (ldc) */
static void epilogue(float *c, int64_t ldc, int rows, int cols, const float *bias, int act,
                     const float *res) {
    for (int r = 0; r < rows; r++) {
        float *cr = c + r * ldc;
        if (bias) {
            #pragma omp simd
            for (int j = 0; j < cols; j++) cr[j] += bias[j];
        }
        if (act == ACT_RELU) {
            #pragma omp simd
            for (int j = 0; j < cols; j++) cr[j] = tg_reluf(cr[j]);
        } else if (act == ACT_GELU) {
            #pragma omp simd
            for (int j = 0; j < cols; j++) cr[j] = tg_gelu_erf(cr[j]);
        } else if (act == ACT_GELU_TANH) {
            #pragma omp simd
            for (int j = 0; j < cols; j++) cr[j] = tg_gelu_tanh(cr[j]);
        }
        if (res) {
            #pragma omp simd
            for (int j = 0; j < cols; j++) cr[j] += res[r * ldc + j];
        }
    }
}

/* The epilogue on a tile's row held in registers as `lanes` floats (t, 64-byte aligned):
 * + bias, then the activation. In registers, before the one store of the tile, not as a pass
 * over the stored tile afterwards: that pass (a runtime-length loop per row and tile) cost
 * (1024 x 1536): +0.35 ms for the bias and +1.9 ms for erf-GELU over the plain product,
 * more than a separate GELU kernel; a constant-length simd loop here is one vector op per
 * step. `bias`: `lanes` floats, zero past the tile's columns, or NULL. */
TG_INLINE void act_lanes(float *t, const int lanes, const float *bias, int act) {
    if (bias) {
        #pragma omp simd aligned(t : 32)
        for (int j = 0; j < lanes; j++) t[j] += bias[j];
    }
    if (act == ACT_RELU) {
        #pragma omp simd aligned(t : 32)
        for (int j = 0; j < lanes; j++) t[j] = tg_reluf(t[j]);
    } else if (act == ACT_GELU) {
        #pragma omp simd aligned(t : 32)
        for (int j = 0; j < lanes; j++) t[j] = tg_gelu_erf(t[j]);
    } else if (act == ACT_GELU_TANH) {
        #pragma omp simd aligned(t : 32)
        for (int j = 0; j < lanes; j++) t[j] = tg_gelu_tanh(t[j]);
    }
}

/* What a micro-kernel does to the tile after its last K block: `bias` is the tile's first
 * column of the bias (or NULL), `act` the activation, then + the residual `res` (or NULL: the
 * whole (M, N) operand; `c` is C's origin, so a tile at c + o reads res + o); `on` is 0 before
 * the last K block. */
typedef struct {
    const float *bias;
    int act;
    int on;
    const float *res;
    const float *c;
    const void *gen; /* a generated epilogue's operands (NULL: none) */
} tile_ep;

/* the generated epilogue on the NR lanes t of C's row `row` from column `col` (cols valid) */
TG_INLINE void gen_lanes(const void *gen, float *t, int64_t row, int64_t col, int cols) {
#if TG_GEMM_GENERATED
    if (gen) tg_gemm_gen_row(gen, t, row, col, cols);
#else
    (void)gen; (void)t; (void)row; (void)col; (void)cols;
#endif
}

/* ... on row r of the tile at c (ldc): its row and column from its offset to C's origin */
TG_INLINE void gen_row(const tile_ep *ep, const float *c, int64_t ldc, int r, float *t,
                       int cols) {
#if TG_GEMM_GENERATED
    if (ep->gen) {
        int64_t off = c - ep->c, row = off / ldc;
        tg_gemm_gen_row(ep->gen, t, row + r, off - row * ldc, cols);
    }
#else
    (void)ep; (void)c; (void)ldc; (void)r; (void)t; (void)cols;
#endif
}

/* the residual's row r of the tile at c (ldc) */
TG_INLINE const float *tile_res(const tile_ep *ep, const float *c, int64_t ldc, int r) {
    return ep->res + (c - ep->c) + r * ldc;
}

/* the tile's bias (cols of it, zero past them) into b[NR] */
TG_INLINE void tile_bias(const tile_ep *ep, int cols, float *b) {
    for (int j = 0; j < NR; j++) b[j] = j < cols ? ep->bias[j] : 0.0f;
}

/* a partial tile (cols < NR) whose accumulators went through t: add the C already there
 * (accumulate), apply the epilogue, and store its columns */
TG_INLINE void store_cols(float t[MR][NR], int nr, int cols, float *c, int64_t ldc,
                          int accumulate, const tile_ep *ep) {
    float b[NR] __attribute__((aligned(64)));
    if (ep->on && ep->bias) tile_bias(ep, cols, b);
    for (int r = 0; r < nr; r++) {
        float *cr = c + r * ldc;
        if (accumulate)
            for (int j = 0; j < cols; j++) t[r][j] += cr[j];
        if (ep->on) {
            act_lanes(t[r], NR, ep->bias ? b : NULL, ep->act);
            gen_row(ep, c, ldc, r, t[r], cols);
            if (ep->res) {
                const float *rr = tile_res(ep, c, ldc, r);
                for (int j = 0; j < cols; j++) t[r][j] += rr[j];
            }
        }
        for (int j = 0; j < cols; j++) cr[j] = t[r][j];
    }
}

#ifdef __AVX512F__
/* AVX-512: a 16-lane accumulator per row. One 512-bit FMA per row and K step: half the
 * instructions and loads of two 8-lane halves. */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

/* the tile's nr accumulators x into C (cols of NR valid): + the C already there
 * (accumulate), then the epilogue when ep->on, then one store per row. Not inlined: it runs
 * once per tile, after the K loop, and inlined into every micro-kernel instance (8 row counts,
 * two panels, packed or in-place A, with and without prefetch) with the activations and a
 * generated epilogue it made gemm.c take 5.9 s to compile instead of 1.9 (each generated GEMM
 * epilogue compiles gemm.c's text again) */
static __attribute__((noinline)) void store_tile(const v16 *x, const int nr, float *c,
                                                 int64_t ldc, int cols, int accumulate,
                                                 const tile_ep *ep) {
    if (cols == NR) {
        if (ep->on) {
            float t[NR] __attribute__((aligned(64)));
            for (int r = 0; r < nr; r++) {
                v16u *cr = (v16u *)(c + r * ldc);
                *(v16 *)t = accumulate ? *cr + x[r] : x[r];
                act_lanes(t, NR, ep->bias, ep->act);
                gen_row(ep, c, ldc, r, t, NR);
                if (ep->res) *(v16 *)t += *(const v16u *)tile_res(ep, c, ldc, r);
                *cr = *(v16 *)t;
            }
            return;
        }
        for (int r = 0; r < nr; r++) {
            v16u *cr = (v16u *)(c + r * ldc);
            *cr = accumulate ? *cr + x[r] : x[r];
        }
        return;
    }
    float t[MR][NR] __attribute__((aligned(64)));
    for (int r = 0; r < nr; r++) *(v16 *)(t[r]) = x[r];
    store_cols(t, nr, cols, c, ldc, accumulate, ep);
}

/* the C tile's rows, for writing: hides the store misses */
TG_INLINE void prefetch_tile(const int nr, float *c, int64_t ldc, int cols) {
    for (int r = 0; r < nr; r++) {
        __builtin_prefetch(c + r * ldc, 1, 3);
        __builtin_prefetch(c + r * ldc + cols - 1, 1, 3);
    }
}

/* C[0:nr, 0:cols] (ldc) (+)= Ap (kc x MR, first nr rows) @ Bp (kc x NR); `accumulate`: add.
 * `pf` (when `prefetch`): the next B micro-panel (kc x NR), fetched into L2 meanwhile, a
 * 64-byte line per step (the weight streams from memory once per call). */
TG_INLINE void micro_k(const int prefetch, const int nr, int64_t kc, const float *restrict ap,
                       const int64_t ra, const int64_t ka, const float *restrict bp,
                       const float *pf, float *c, int64_t ldc, int cols, int accumulate,
                       const tile_ep *ep) {
    v16 x[MR];
    for (int r = 0; r < nr; r++) x[r] = (v16){0};
    prefetch_tile(nr, c, ldc, cols);
    #pragma GCC unroll 4
    for (int64_t kk = 0; kk < kc; kk++) {
        if (prefetch) __builtin_prefetch(pf + kk * NR, 0, 2);
        v16 b = *(const v16 *)(bp + kk * NR);
        const float *ak = ap + kk * ka;
        for (int r = 0; r < nr; r++) x[r] += ak[r * ra] * b;
    }
    store_tile(x, nr, c, ldc, cols, accumulate, ep);
}

/* Two adjacent panels at once (bp and bp + ldb, the second's columns from c + NR): 2 x MR
 * accumulators. A 512-bit FMA has two pipes and a 4-cycle latency on Zen 5: one panel's
 * chains keep at most MR of the 8 in flight ((128 x 768) @ (768 x 3072): 334 GFLOP/s with
 * 6 rows on one panel, 427 on two, ~440 with 8 rows on two). Each broadcast of A feeds two
 * FMAs. */
#define HAVE_MICRO2 1
TG_INLINE void micro2_k(const int prefetch, const int nr, int64_t kc, const float *restrict ap,
                        const int64_t ra, const int64_t ka, const float *restrict bp,
                        const int64_t ldb, const float *pf, int64_t pfn, float *c,
                        int64_t ldc, int cols1, int accumulate, const tile_ep *ep0,
                        const tile_ep *ep1) {
    v16 x0[MR], x1[MR];
    for (int r = 0; r < nr; r++) x0[r] = x1[r] = (v16){0};
    prefetch_tile(nr, c, ldc, NR + cols1);
    const float *bq = bp + ldb;
    /* pfn lines of each next panel, spread over the K loop: `per` lines every `step` K
     * steps (at least 4: the unrolled body) */
    int64_t step = kc, per = 0, line = 0;
    if (prefetch && pfn > 0) {
        step = kc / pfn >= 4 ? kc / pfn : 4;
        per = (pfn * step + kc - 1) / kc;
    }
    for (int64_t k0 = 0; k0 < kc; k0 += step) {
        for (int64_t i = 0; i < per && line < pfn; i++, line++) {
            __builtin_prefetch(pf + line * NR, 0, 2);
            __builtin_prefetch(pf + ldb + line * NR, 0, 2);
        }
        const int64_t k1 = imin(kc, k0 + step);
        #pragma GCC unroll 4
        for (int64_t kk = k0; kk < k1; kk++) {
            v16 b0 = *(const v16 *)(bp + kk * NR), b1 = *(const v16 *)(bq + kk * NR);
            const float *ak = ap + kk * ka;
            for (int r = 0; r < nr; r++) {
                float x = ak[r * ra];
                x0[r] += x * b0;
                x1[r] += x * b1;
            }
        }
    }
    store_tile(x0, nr, c, ldc, NR, accumulate, ep0);
    store_tile(x1, nr, c + NR, ldc, cols1, accumulate, ep1);
}
#else
TG_INLINE void micro_k(const int prefetch, const int nr, int64_t kc, const float *restrict ap,
                       const int64_t ra, const int64_t ka, const float *restrict bp,
                       const float *pf, float *c, int64_t ldc, int cols, int accumulate,
                       const tile_ep *ep) {
    v8 x0[MR], x1[MR];
    for (int r = 0; r < nr; r++) x0[r] = x1[r] = (v8){0};
    for (int r = 0; r < nr; r++) { /* the C tile, for writing: hides the store misses */
        __builtin_prefetch(c + r * ldc, 1, 3);
        __builtin_prefetch(c + r * ldc + cols - 1, 1, 3);
    }
    #pragma GCC unroll 4
    for (int64_t kk = 0; kk < kc; kk++) {
        if (prefetch) __builtin_prefetch(pf + kk * NR, 0, 2);
        v8 b0 = *(const v8 *)(bp + kk * NR), b1 = *(const v8 *)(bp + kk * NR + 8);
        const float *ak = ap + kk * ka;
        for (int r = 0; r < nr; r++) {
            float x = ak[r * ra];
            x0[r] += x * b0;
            x1[r] += x * b1;
        }
    }
    if (cols == NR) {
        for (int r = 0; r < nr; r++) {
            v8u *c0 = (v8u *)(c + r * ldc), *c1 = (v8u *)(c + r * ldc + 8);
            v8 y0 = accumulate ? *c0 + x0[r] : x0[r], y1 = accumulate ? *c1 + x1[r] : x1[r];
            if (ep->on) {
                float t[NR] __attribute__((aligned(32)));
                *(v8 *)t = y0;
                *(v8 *)(t + 8) = y1;
                act_lanes(t, NR, ep->bias, ep->act);
                gen_row(ep, c, ldc, r, t, NR);
                y0 = *(v8 *)t;
                y1 = *(v8 *)(t + 8);
                if (ep->res) {
                    const float *rr = tile_res(ep, c, ldc, r);
                    y0 += *(const v8u *)rr;
                    y1 += *(const v8u *)(rr + 8);
                }
            }
            *c0 = y0;
            *c1 = y1;
        }
        return;
    }
    float t[MR][NR] __attribute__((aligned(32)));
    for (int r = 0; r < nr; r++) {
        *(v8 *)(t[r]) = x0[r];
        *(v8 *)(t[r] + 8) = x1[r];
    }
    store_cols(t, nr, cols, c, ldc, accumulate, ep);
}
#endif

/* FN(PF, rows, ...) for `rows` (1..MR) rows, each instance compiled with a constant row count
 * (an edge panel of 2 rows does 2 rows of work, not MR): one switch for every micro-kernel */
#if MR == 8
#define TG_ROWS_ABOVE_6(FN, PF, ...)                                                         \
    case 8: FN(PF, 8, __VA_ARGS__); break;                                                   \
    case 7: FN(PF, 7, __VA_ARGS__); break;
#else
#define TG_ROWS_ABOVE_6(FN, PF, ...)
#endif
#define BY_ROWS(FN, PF, ...)                                                                 \
    switch (rows) {                                                                          \
    TG_ROWS_ABOVE_6(FN, PF, __VA_ARGS__)                                                     \
    case 6: FN(PF, 6, __VA_ARGS__); break;                                                   \
    case 5: FN(PF, 5, __VA_ARGS__); break;                                                   \
    case 4: FN(PF, 4, __VA_ARGS__); break;                                                   \
    case 3: FN(PF, 3, __VA_ARGS__); break;                                                   \
    case 2: FN(PF, 2, __VA_ARGS__); break;                                                   \
    default: FN(PF, 1, __VA_ARGS__); break;                                                  \
    }

/* the one-panel micro-kernel; A's element (row r, step kk) at ap[r * RA + kk * KA] */
#define MICRO_ROWS(PF, PFP, RA, KA)                                                          \
    BY_ROWS(micro_k, PF, kc, ap, RA, KA, bp, PFP, c, ldc, cols, accumulate, ep)

/* on a packed A panel (kc x MR) */
static void micro(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                  int rows, int cols, int accumulate, const tile_ep *ep) {
    MICRO_ROWS(0, NULL, 1, MR)
}

static void micro_pf(int64_t kc, const float *ap, const float *bp, const float *pf, float *c,
                     int64_t ldc, int rows, int cols, int accumulate, const tile_ep *ep) {
    MICRO_ROWS(1, pf, 1, MR)
}

/* on A in place (rows lda apart); `pf`: the next B micro-panel to prefetch, or NULL */
static void micro_in_place(int64_t kc, const float *ap, int64_t lda, const float *bp,
                           const float *pf, float *c, int64_t ldc, int rows, int cols,
                           int accumulate, const tile_ep *ep) {
    if (pf) {
        MICRO_ROWS(1, pf, lda, 1)
    } else {
        MICRO_ROWS(0, NULL, lda, 1)
    }
}

#if HAVE_MICRO2
/* the two-panel micro-kernel, as MICRO_ROWS */
#define MICRO2_ROWS(PF, PFP, RA, KA)                                                         \
    BY_ROWS(micro2_k, PF, kc, ap, RA, KA, bp, ldb, PFP, pfn, c, ldc, cols1, accumulate, ep0,    \
            ep1)

/* two panels (ldb apart) on a packed A panel; `pf`: the next pair to prefetch, or NULL */
static void micro2(int64_t kc, const float *ap, const float *bp, int64_t ldb, const float *pf,
                   int64_t pfn, float *c, int64_t ldc, int rows, int cols1, int accumulate,
                   const tile_ep *ep0, const tile_ep *ep1) {
    if (pf) {
        MICRO2_ROWS(1, pf, 1, MR)
    } else {
        MICRO2_ROWS(0, NULL, 1, MR)
    }
}

/* two panels on A in place (rows lda apart) */
static void micro2_in_place(int64_t kc, const float *ap, int64_t lda, const float *bp,
                            int64_t ldb, const float *pf, int64_t pfn, float *c, int64_t ldc,
                            int rows, int cols1, int accumulate, const tile_ep *ep0,
                            const tile_ep *ep1) {
    if (pf) {
        MICRO2_ROWS(1, pf, lda, 1)
    } else {
        MICRO2_ROWS(0, NULL, lda, 1)
    }
}
#else
/* without AVX-512 the 12 eight-lane chains of one panel already fill the FMA pipes: the
 * pair is two single-panel calls (never taken: HAVE_MICRO2 is 0; defined so both builds
 * compile the same loops) */
#define HAVE_MICRO2 0
static void micro2(int64_t kc, const float *ap, const float *bp, int64_t ldb, const float *pf,
                   int64_t pfn, float *c, int64_t ldc, int rows, int cols1, int accumulate,
                   const tile_ep *ep0, const tile_ep *ep1) {
    (void)pf;
    (void)pfn;
    micro(kc, ap, bp, c, ldc, rows, NR, accumulate, ep0);
    micro(kc, ap, bp + ldb, c + NR, ldc, rows, cols1, accumulate, ep1);
}

static void micro2_in_place(int64_t kc, const float *ap, int64_t lda, const float *bp,
                            int64_t ldb, const float *pf, int64_t pfn, float *c, int64_t ldc,
                            int rows, int cols1, int accumulate, const tile_ep *ep0,
                            const tile_ep *ep1) {
    (void)pf;
    (void)pfn;
    micro_in_place(kc, ap, lda, bp, NULL, c, ldc, rows, NR, accumulate, ep0);
    micro_in_place(kc, ap, lda, bp + ldb, NULL, c + NR, ldc, rows, cols1, accumulate, ep1);
}
#endif

/* One row (decoding a token): c[0:n] = a[0:k] @ B, memory-bound, so no packing of A, no K
 * blocking (a stays in L1) and four interleaved partial sums per vector to hide the FMA
 * latency (with AVX-512 one 16-lane vector is a panel's row: half the loads and FMAs of two
 * 8-lane halves). The threads take equal contiguous runs of panels (schedule(static)): each
 * streams one run of the packed weight from memory, which the prefetchers follow better than
 * chunks of 8 panels handed out dynamically. GPT-2 124M's 49 decode GEMVs, weights cycled
 * through memory, 2 threads, interleaved: 67.8 -> 76.1 GB/s on the blocks' GEMVs and 72.7
 * -> 78.4 on the LM head's while the VM's host left it its memory bandwidth, 1-3 % while
 * other tenants held it at 35-45 GB/s; v16 alone gave under half of the gain. */
static void gemv_packed(const float *a, const float *bp, const float *bias, const float *res,
                        float *c, int64_t n, int64_t k, int64_t panels, int nt, int act,
                        const void *gen) {
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t j = 0; j < panels; j++) {
        const float *b = bp + j * k * NR;
        float t[NR] __attribute__((aligned(64)));
        int64_t kk = 0;
#ifdef __AVX512F__
        v16 s[4] = {{0}};
        for (; kk + 4 <= k; kk += 4)
            for (int u = 0; u < 4; u++) s[u] += a[kk + u] * *(const v16 *)(b + (kk + u) * NR);
        for (; kk < k; kk++) s[0] += a[kk] * *(const v16 *)(b + kk * NR);
        *(v16 *)t = (s[0] + s[1]) + (s[2] + s[3]);
#else
        v8 s0[4] = {{0}}, s1[4] = {{0}};
        for (; kk + 4 <= k; kk += 4) {
            for (int u = 0; u < 4; u++) {
                float x = a[kk + u];
                s0[u] += x * *(const v8 *)(b + (kk + u) * NR);
                s1[u] += x * *(const v8 *)(b + (kk + u) * NR + 8);
            }
        }
        for (; kk < k; kk++) {
            float x = a[kk];
            s0[0] += x * *(const v8 *)(b + kk * NR);
            s1[0] += x * *(const v8 *)(b + kk * NR + 8);
        }
        *(v8 *)t = (s0[0] + s0[1]) + (s0[2] + s0[3]);
        *(v8 *)(t + 8) = (s1[0] + s1[1]) + (s1[2] + s1[3]);
#endif
        int64_t col = j * NR;
        int cols = (int)imin(NR, n - col);
        gen_lanes(gen, t, 0, col, cols);
        for (int q = 0; q < cols; q++) c[col + q] = t[q];
        if (bias || act || res)
            epilogue(c + col, n, 1, cols, bias ? bias + col : NULL, act, res ? res + col : NULL);
    }
}

/* the packed A workspace (tg_common.h: kept between calls) */
static tg_workspace a_ws = {NULL, 0, 0, TG_KEEP((size_t)32 << 20)};

/* rows of K per block: the whole of K when it is short (C is stored once), else equal blocks
 * of at most kc_max rows (a multiple of 8) */
static int64_t k_block(int64_t k, int64_t kc_max) {
    if (k <= KSINGLE) return k;
    int64_t blocks = (k + kc_max - 1) / kc_max, kc = (k + blocks - 1) / blocks;
    return (kc + 7) & ~(int64_t)7;
}

/* One block of rows [i0, i0 + mc) against all N panels, A read in place: the large-M path,
 * where the threads split M. */
static void rows_block(const float *a, int64_t lda, const float *bp, const float *bias,
                       const float *res, float *c, int64_t i0, int64_t mc, int64_t n, int64_t k,
                       int64_t kcb, int64_t panels, int act, const void *gen) {
    int64_t mpanels = (mc + MR - 1) / MR;
    for (int64_t pc = 0; pc < k; pc += kcb) {
        int64_t kc = imin(kcb, k - pc);
        int last = pc + kc >= k;
        int on = last && (bias || act || res || gen);
        for (int64_t j = 0; j < panels; j++) {
            int64_t col = j * NR;
            int cols = (int)imin(NR, n - col);
            const float *bj = bp + j * k * NR + pc * NR;
            tile_ep ep = {bias ? bias + col : NULL, act, on, res, c, gen};
            if (HAVE_MICRO2 && j + 1 < panels) { /* two panels at once */
                int cols1 = (int)imin(NR, n - col - NR);
                const float *next = j + 2 < panels ? bj + 2 * k * NR : NULL;
                tile_ep ep1 = {bias ? bias + col + NR : NULL, act, on, res, c, gen};
                for (int64_t r = 0; r < mpanels; r++) {
                    int rows = (int)imin(MR, mc - r * MR);
                    float *ct = c + (i0 + r * MR) * n + col;
                    micro2_in_place(kc, a + (i0 + r * MR) * lda + pc, lda, bj, k * NR,
                                    r == 0 ? next : NULL, kc, ct, n, rows, cols1, pc > 0, &ep,
                                    &ep1);
                }
                j++;
                continue;
            }
            const float *next = j + 1 < panels ? bj + k * NR : NULL;
            for (int64_t r = 0; r < mpanels; r++) {
                int rows = (int)imin(MR, mc - r * MR);
                float *ct = c + (i0 + r * MR) * n + col;
                micro_in_place(kc, a + (i0 + r * MR) * lda + pc, lda, bj, r == 0 ? next : NULL,
                               ct, n, rows, cols, pc > 0, &ep);
            }
        }
    }
}

/* C (m, n) = act(A (m, k), row stride lda, @ packed B + bias) + res (m, n), bias and res
 * optional (NULL), then the generated epilogue `gen` (NULL: none; see TG_GEMM_GENERATED);
 * C must not overlap res. Returns 0, -1 for a buffer that is not a packed operand of (k, n),
 * -2 when out of memory. */
static int gemm_packed(const float *a, int64_t lda, const float *packed, const float *bias,
                       const float *res, float *c, int64_t m, int64_t n, int64_t k, int act,
                       const void *gen) {
    const int64_t *h = (const int64_t *)packed;
    if (h[0] != MAGIC || h[1] != k || h[2] != n) return -1;
    if (m <= 0 || n <= 0) return 0;
    const float *bp = packed + HEADER;
    int64_t panels = (n + NR - 1) / NR;
    if (k == 0) {
        for (int64_t i = 0; i < m; i++) {
            memset(c + i * n, 0, sizeof(float) * (size_t)n);
            if (bias || act || res) epilogue(c + i * n, n, 1, (int)n, bias, act,
                                             res ? res + i * n : NULL);
            for (int64_t j = 0; gen && j < n; j += NR) {
                float t[NR] __attribute__((aligned(64))) = {0};
                int cols = (int)imin(NR, n - j);
                gen_lanes(gen, t, i, j, cols);
                memcpy(c + i * n + j, t, sizeof(float) * (size_t)cols);
            }
        }
        return 0;
    }
    int64_t mp_all = (m + MR - 1) / MR;
    if (m >= MSPLIT) {
        /* K blocks of up to KCM = 512 rows here: C (a block of rows x all of N) is re-read
         * once per K block ((1024 x 1536) @ (1536 x 384): 2-4 % faster than 256) */
        int64_t kcb = k_block(k, KCM);
        /* large M: the threads take blocks of rows, A read in place, all N panels;
         * about MCP row panels a block, as many blocks as a multiple of the thread
         * count, handed out dynamically */
        int nt = tg_team();
        int64_t blocks = (mp_all + MCP - 1) / MCP;
        blocks = (blocks + nt - 1) / nt * nt;
        if (blocks > mp_all) blocks = mp_all;
        int64_t base = mp_all / blocks, extra = mp_all % blocks;
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t p0 = b * base + imin(b, extra), np = base + (b < extra);
            int64_t i0 = p0 * MR, mc = imin(np * MR, m - i0);
            rows_block(a, lda, bp, bias, res, c, i0, mc, n, k, kcb, panels, act, gen);
        }
        return 0;
    }
    int64_t kcb = k_block(k, KC);
    int nt = tg_team();
    if (nt > panels) nt = (int)panels;
    if ((double)m * (double)n * (double)k < 262144.0) nt = 1;
    if (m == 1) {
        gemv_packed(a, bp, bias, res, c, n, k, panels, nt, act, gen);
        return 0;
    }
    int64_t mc_max = imin(MC, mp_all * MR);
    int owned;
    float *ap = tg_ws_take(&a_ws, sizeof(float) * (size_t)(mc_max * k), &owned);
    if (!ap) return -2;
    /* the chunks of each block of A taken so far (m < MSPLIT: at most this many blocks) */
    int64_t taken[(MSPLIT + MC - 1) / MC] = {0};
    #pragma omp parallel num_threads(nt)
    {
        int64_t tcount = 1;
#ifdef _OPENMP
        tcount = omp_get_num_threads();
#endif
        /* chunks of N panels, handed out dynamically (a thread that shares its core with
         * other work takes fewer): whole units (the panels one micro-kernel call takes), at
         * most NCP panels and at most 1 / (CHUNKS_PER_THREAD x threads) of them (big), and
         * guided: a chunk takes at most 1 / (2 x threads) of the units left, so the last ones
         * are a unit each and the threads finish together ((128, 768, 2304) 4 % faster than
         * equal chunks) */
        int64_t per = (panels + NCP * tcount - 1) / (NCP * tcount);
        per = per < CHUNKS_PER_THREAD ? CHUNKS_PER_THREAD : per;
        int64_t unit = HAVE_MICRO2 ? 2 : 1, units = (panels + unit - 1) / unit;
        int64_t big = (units + per * tcount - 1) / (per * tcount);
        big = imax(big, (units + MAX_CHUNKS / 2 - 1) / (MAX_CHUNKS / 2));
        int64_t first[MAX_CHUNKS + 1]; /* chunk q: units [first[q], first[q + 1]) */
        int64_t chunks = 0;
        for (int64_t u = 0; u < units && chunks < MAX_CHUNKS; chunks++) {
            first[chunks] = u;
            u += imax(1, imin(big, (units - u + 2 * tcount - 1) / (2 * tcount)));
        }
        first[chunks] = units; /* (big keeps the count well under MAX_CHUNKS) */
        for (int64_t ic = 0, blk = 0; ic < m; ic += MC, blk++) {
            int64_t mc = imin(MC, m - ic);
            int64_t mpanels = (mc + MR - 1) / MR, mcp = mpanels * MR;
            int64_t kblocks = (k + kcb - 1) / kcb;
            #pragma omp for schedule(static)
            for (int64_t t = 0; t < kblocks * mpanels; t++) {
                int64_t pc = (t / mpanels) * kcb, r = t % mpanels;
                int64_t kc = imin(kcb, k - pc);
                pack_a_panel(a + (ic + r * MR) * lda, lda, imin(MR, mc - r * MR), pc, kc,
                             ap + pc * mcp + r * MR * kc);
            }  /* implicit barrier: the block is packed */
            /* A thread takes its next chunk as it starts the last unit of its current one,
             * so that unit's calls prefetch the next chunk's first (OpenMP's dynamic
             * schedule hands the next chunk out only when asked for it, and each chunk's
             * first unit started cold: (128, 768, 2304) 5 % slower than one static half a
             * thread, 1 % with this) */
            int64_t q = __atomic_fetch_add(&taken[blk], 1, __ATOMIC_RELAXED);
            while (q < chunks) {
                int64_t j0 = imin(panels, first[q] * unit);
                int64_t j1 = imin(panels, first[q + 1] * unit);
                int64_t qn = chunks; /* the next chunk, once taken */
                for (int64_t pc = 0; pc < k; pc += kcb) {
                    int64_t kc = imin(kcb, k - pc);
                    int last = pc + kc >= k;
                    int on = last && (bias || act || res || gen);
                    for (int64_t j = j0; j < j1; j++) {
                        int64_t col = j * NR;
                        int cols = (int)imin(NR, n - col);
                        const float *bj = bp + j * k * NR + pc * NR;
                        int pair = HAVE_MICRO2 && j + 1 < j1, w = pair ? 2 : 1;
                        /* the B micro-panels after these: the next ones, else the chunk's
                         * first at the next K block, else the next chunk's first */
                        const float *next = NULL;
                        int64_t nkc = 0;
                        if (j + w < j1) {
                            next = bj + w * k * NR;
                            nkc = kc;
                        } else if (!last) {
                            next = bp + j0 * k * NR + (pc + kcb) * NR;
                            nkc = imin(kcb, k - pc - kcb);
                        } else {
                            qn = __atomic_fetch_add(&taken[blk], 1, __ATOMIC_RELAXED);
                            if (qn < chunks) {
                                next = bp + imin(panels, first[qn] * unit) * k * NR;
                                nkc = imin(kcb, k);
                            }
                        }
                        tile_ep ep = {bias ? bias + col : NULL, act, on, res, c, gen};
                        if (pair) { /* two panels at once */
                            int cols1 = (int)imin(NR, n - col - NR);
                            tile_ep ep1 = {bias ? bias + col + NR : NULL, act, on, res, c, gen};
                            /* each row panel's call prefetches its share of the next
                             * pair's nkc lines: spread over the pair's calls, the weight
                             * streams from memory at a steady rate, where the first call
                             * fetching all of it asked for 64 GB/s a thread */
                            int64_t share = nkc > 0 ? (nkc + mpanels - 1) / mpanels : 0;
                            for (int64_t r = 0; r < mpanels; r++) {
                                int rows = (int)imin(MR, mc - r * MR);
                                float *ct = c + (ic + r * MR) * n + col;
                                int64_t pfn = imin(share, nkc - r * share);
                                micro2(kc, ap + pc * mcp + r * MR * kc, bj, k * NR,
                                       pfn > 0 ? next + r * share * NR : NULL, pfn, ct, n, rows,
                                       cols1, pc > 0, &ep, &ep1);
                            }
                            j++;
                            continue;
                        }
                        for (int64_t r = 0; r < mpanels; r++) {
                            int rows = (int)imin(MR, mc - r * MR);
                            float *ct = c + (ic + r * MR) * n + col;
                            if (r == 0 && next && nkc == kc)
                                micro_pf(kc, ap + pc * mcp + r * MR * kc, bj, next, ct, n, rows,
                                         cols, pc > 0, &ep);
                            else
                                micro(kc, ap + pc * mcp + r * MR * kc, bj, ct, n, rows, cols,
                                      pc > 0, &ep);
                        }
                    }
                }
                q = qn;
            }
            #pragma omp barrier /* the next block may overwrite the packed A */
        }
    }
    tg_ws_give(&a_ws, ap, owned);
    return 0;
}

int tg_gemm_packed_f32(const float *a, int64_t lda, const float *packed, const float *bias,
                       const float *res, float *c, int64_t m, int64_t n, int64_t k, int act) {
    return gemm_packed(a, lda, packed, bias, res, c, m, n, k, act, NULL);
}
