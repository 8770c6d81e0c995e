/* The small steps of a decode's mask and positions, in C so that a decode program can be all C
 * (the native loop replays only C calls): iota, cast to float, sin/cos, and the broadcasting
 * elementwise ops add, mul, less and where.
 *
 * Broadcasting kernels take the result's C-order index space (nd axes, `shape`) and, per input,
 * a stride in elements for each of those axes (0 where the input is broadcast). The index space
 * is cut into tasks of at most TG_PW_BLOCK elements of one row (the last axis), which run in
 * parallel from TG_PAR_MIN elements; a task finds its input offsets by dividing its row number
 * down the axes, and its inner loop has a contiguous (stride 1) and a broadcast (stride 0)
 * case per input so that GCC vectorises the common ones.
 *
 * Semantics follow the numpy kernels bit for bit: one rounding per element (a float32 product
 * is the float32 product), sin and cos computed in double and rounded once (cos as the op
 * defines it, sin(pi/2 - x)), comparisons false on NaN, where copies bytes. */
#include "tg_common.h"

#define TG_PW_BLOCK 4096

/* the number of rows (every axis but the last) and the last axis' length */
TG_INLINE int64_t tg_pw_rows(int64_t nd, const int64_t *shape, int64_t *inner) {
    int64_t rows = 1;
    for (int64_t d = 0; d + 1 < nd; d++) rows *= shape[d];
    *inner = nd ? shape[nd - 1] : 1;
    return rows;
}

/* element offset of row r's first element in an input with strides st */
TG_INLINE int64_t tg_pw_offset(int64_t r, int64_t nd, const int64_t *shape, const int64_t *st) {
    int64_t off = 0;
    for (int64_t d = nd - 2; d >= 0; d--) {
        int64_t n = shape[d], i = r % n;
        r /= n;
        off += i * st[d];
    }
    return off;
}

/* Runs BODY for t in [0, tasks): on the team when PAR, else on the calling thread alone. The
 * branch is explicit: an OpenMP region whose `if` clause is false still enters libgomp
 * (~0.2 us a call: a 1,000-call chain of 8-element adds replayed by the native loop took 0.29
 * us a call, 0.07 without), which is most of a decode mask's time. */
#define TG_PW_TASKS(PAR, TASKS, BODY)                                                          \
    if (PAR) {                                                                                \
        _Pragma("omp parallel for schedule(static) num_threads(tg_team())")                  \
        for (int64_t t = 0; t < (TASKS); t++) BODY;                                           \
    } else {                                                                                  \
        for (int64_t t = 0; t < (TASKS); t++) BODY;                                           \
    }

/* layout: shape[nd], then the strides of a (nd), then those of b (nd) */
#define TG_PW_BINARY(NAME, TA, TO, OP)                                                         \
static inline void NAME##_task(const TA *a, const TA *b, TO *out, int64_t nd,                 \
                               const int64_t *layout, int64_t inner, int64_t blocks,          \
                               int64_t t) {                                                   \
    const int64_t *shape = layout, *sa = layout + nd, *sb = layout + 2 * nd;                 \
    const int64_t ia = nd ? sa[nd - 1] : 0, ib = nd ? sb[nd - 1] : 0;                         \
    const int64_t r = t / blocks, j0 = (t - r * blocks) * TG_PW_BLOCK;                        \
    const int64_t j1 = j0 + TG_PW_BLOCK < inner ? j0 + TG_PW_BLOCK : inner;                   \
    const TA *pa = a + tg_pw_offset(r, nd, shape, sa);                                        \
    const TA *pb = b + tg_pw_offset(r, nd, shape, sb);                                        \
    TO *po = out + r * inner;                                                                 \
    if (ia == 1 && ib == 1) {                                                                 \
        for (int64_t j = j0; j < j1; j++) { TA x = pa[j], y = pb[j]; po[j] = (OP); }          \
    } else if (ia == 1 && ib == 0) {                                                          \
        const TA y = pb[0];                                                                   \
        for (int64_t j = j0; j < j1; j++) { TA x = pa[j]; po[j] = (OP); }                     \
    } else if (ia == 0 && ib == 1) {                                                          \
        const TA x = pa[0];                                                                   \
        for (int64_t j = j0; j < j1; j++) { TA y = pb[j]; po[j] = (OP); }                     \
    } else {                                                                                  \
        for (int64_t j = j0; j < j1; j++) { TA x = pa[j * ia], y = pb[j * ib]; po[j] = (OP); } \
    }                                                                                         \
}                                                                                             \
void NAME(const TA *a, const TA *b, TO *out, int64_t nd, const int64_t *layout) {            \
    int64_t inner, rows = tg_pw_rows(nd, layout, &inner);                                    \
    if (rows <= 0 || inner <= 0) return;                                                      \
    const int64_t blocks = (inner + TG_PW_BLOCK - 1) / TG_PW_BLOCK, tasks = rows * blocks;   \
    const int par = tasks > 1 && rows * inner >= TG_PAR_MIN;                                  \
    TG_PW_TASKS(par, tasks, NAME##_task(a, b, out, nd, layout, inner, blocks, t))            \
}

TG_PW_BINARY(tg_add_f32, float, float, x + y)
TG_PW_BINARY(tg_add_f64, double, double, x + y)
TG_PW_BINARY(tg_mul_f32, float, float, x * y)
TG_PW_BINARY(tg_mul_f64, double, double, x * y)
TG_PW_BINARY(tg_less_i32, int32_t, uint8_t, (uint8_t)(x < y))
TG_PW_BINARY(tg_less_i64, int64_t, uint8_t, (uint8_t)(x < y))
TG_PW_BINARY(tg_less_f32, float, uint8_t, (uint8_t)(x < y))
TG_PW_BINARY(tg_less_f64, double, uint8_t, (uint8_t)(x < y))

/* where(cond, a, b) for elements of 1, 2, 4 or 8 bytes (any dtype: bytes are copied);
 * layout: shape[nd], then the strides of cond, a and b (nd each) */
#define TG_PW_WHERE(NAME, T)                                                                   \
static inline void NAME##_task(const uint8_t *c, const T *a, const T *b, T *out, int64_t nd,  \
                               const int64_t *layout, int64_t inner, int64_t blocks,          \
                               int64_t t) {                                                   \
    const int64_t *shape = layout, *sc = layout + nd, *sa = layout + 2 * nd,                  \
                  *sb = layout + 3 * nd;                                                      \
    const int64_t ic = nd ? sc[nd - 1] : 0, ia = nd ? sa[nd - 1] : 0, ib = nd ? sb[nd - 1] : 0; \
    const int64_t r = t / blocks, j0 = (t - r * blocks) * TG_PW_BLOCK;                        \
    const int64_t j1 = j0 + TG_PW_BLOCK < inner ? j0 + TG_PW_BLOCK : inner;                   \
    const uint8_t *pc = c + tg_pw_offset(r, nd, shape, sc);                                   \
    const T *pa = a + tg_pw_offset(r, nd, shape, sa);                                         \
    const T *pb = b + tg_pw_offset(r, nd, shape, sb);                                         \
    T *po = out + r * inner;                                                                  \
    if (ic == 1 && ia == 0 && ib == 0) {  /* a mask from two scalars */                       \
        const T x = pa[0], y = pb[0];                                                         \
        for (int64_t j = j0; j < j1; j++) po[j] = pc[j] ? x : y;                              \
    } else if (ic == 1 && ia == 1 && ib == 1) {                                               \
        for (int64_t j = j0; j < j1; j++) po[j] = pc[j] ? pa[j] : pb[j];                      \
    } else {                                                                                  \
        for (int64_t j = j0; j < j1; j++) po[j] = pc[j * ic] ? pa[j * ia] : pb[j * ib];       \
    }                                                                                         \
}                                                                                             \
void NAME(const uint8_t *c, const T *a, const T *b, T *out, int64_t nd,                       \
          const int64_t *layout) {                                                            \
    int64_t inner, rows = tg_pw_rows(nd, layout, &inner);                                    \
    if (rows <= 0 || inner <= 0) return;                                                      \
    const int64_t blocks = (inner + TG_PW_BLOCK - 1) / TG_PW_BLOCK, tasks = rows * blocks;   \
    const int par = tasks > 1 && rows * inner >= TG_PAR_MIN;                                  \
    TG_PW_TASKS(par, tasks, NAME##_task(c, a, b, out, nd, layout, inner, blocks, t))         \
}

TG_PW_WHERE(tg_where_1, uint8_t)
TG_PW_WHERE(tg_where_2, uint16_t)
TG_PW_WHERE(tg_where_4, uint32_t)
TG_PW_WHERE(tg_where_8, uint64_t)

/* a contiguous loop of n elements: vectorised, on the team from TG_PAR_MIN elements (the
 * branch explicit, as TG_PW_TASKS) */
#define TG_PW_LOOP(N, BODY)                                                                    \
    if ((N) > TG_PAR_MIN) {                                                                   \
        _Pragma("omp parallel for simd schedule(static) num_threads(tg_team())")             \
        for (int64_t i = 0; i < (N); i++) { BODY; }                                           \
    } else {                                                                                  \
        _Pragma("omp simd")                                                                   \
        for (int64_t i = 0; i < (N); i++) { BODY; }                                           \
    }

/* 0, 1, ..., n - 1 (a float result is each int64 rounded once, as numpy's arange + astype) */
#define TG_PW_IOTA(NAME, T)                                                                    \
void NAME(T *out, int64_t n) { TG_PW_LOOP(n, out[i] = (T)i) }

TG_PW_IOTA(tg_iota_i32, int32_t)
TG_PW_IOTA(tg_iota_i64, int64_t)
TG_PW_IOTA(tg_iota_f32, float)
TG_PW_IOTA(tg_iota_f64, double)

/* contiguous unary maps of n elements */
#define TG_PW_MAP(NAME, TI, TO, EXPR)                                                          \
void NAME(const TI *restrict xs, TO *restrict ys, int64_t n) {                                \
    TG_PW_LOOP(n, TI x = xs[i]; ys[i] = (EXPR))                                               \
}

/* casts to float: one rounding to nearest (C's conversion, as numpy's astype) */
TG_PW_MAP(tg_cast_i32_f32, int32_t, float, (float)x)
TG_PW_MAP(tg_cast_i64_f32, int64_t, float, (float)x)
TG_PW_MAP(tg_cast_f32_f32, float, float, x)
TG_PW_MAP(tg_cast_f64_f32, double, float, (float)x)
TG_PW_MAP(tg_cast_i32_f64, int32_t, double, (double)x)
TG_PW_MAP(tg_cast_i64_f64, int64_t, double, (double)x)
TG_PW_MAP(tg_cast_f32_f64, float, double, (double)x)
TG_PW_MAP(tg_cast_f64_f64, double, double, x)

/* sin and cos (= sin(pi/2 - x), the op's definition) through double, rounded once */
TG_PW_MAP(tg_sin_f32, float, float, (float)sin((double)x))
TG_PW_MAP(tg_sin_f64, double, double, sin(x))
TG_PW_MAP(tg_cos_f32, float, float, (float)sin(1.5707963267948966 - (double)x))
TG_PW_MAP(tg_cos_f64, double, double, sin(1.5707963267948966 - x))

/* the pointwise families (ir/ops/pointwise.py, c/unary.py registers them): the special
 * functions through double, rounded once (as the numpy kernels); the rounding functions
 * exact, keeping -0.0, inf and nan (rint: half to even in the default rounding mode) */
#define TG_PW_SPECIAL(NAME, FN)                                                               \
    TG_PW_MAP(tg_##NAME##_f32, float, float, (float)FN((double)x))                            \
    TG_PW_MAP(tg_##NAME##_f64, double, double, FN(x))
TG_PW_SPECIAL(log1p, log1p)
TG_PW_SPECIAL(expm1, expm1)
TG_PW_SPECIAL(log2, log2)
TG_PW_SPECIAL(log10, log10)
TG_PW_SPECIAL(tan, tan)
TG_PW_SPECIAL(erfc, erfc)
TG_PW_SPECIAL(floor, floor)
TG_PW_SPECIAL(ceil, ceil)
TG_PW_SPECIAL(trunc, trunc)
TG_PW_SPECIAL(round, rint)

/* same-shape contiguous binary maps: atan2 through double, fmod exact */
#define TG_PW_ZIP(NAME, T, EXPR)                                                              \
void NAME(const T *restrict as, const T *restrict bs, T *restrict ys, int64_t n) {           \
    TG_PW_LOOP(n, T a = as[i]; T b = bs[i]; ys[i] = (EXPR))                                   \
}
TG_PW_ZIP(tg_atan2_f32, float, (float)atan2((double)a, (double)b))
TG_PW_ZIP(tg_atan2_f64, double, atan2(a, b))
TG_PW_ZIP(tg_fmod_f32, float, fmodf(a, b))
TG_PW_ZIP(tg_fmod_f64, double, fmod(a, b))

/* concat of k inputs along one axis, any dtype: input i is `outer` rows of row_bytes[i] bytes
 * (its part of the axis times the axes after it), the result `outer` rows of their sum */
static inline void tg_concat_row(int64_t k, char *const *xs, const int64_t *row_bytes,
                                 char *dst, int64_t o) {
    for (int64_t i = 0; i < k; i++) {
        memcpy(dst, xs[i] + o * row_bytes[i], (size_t)row_bytes[i]);
        dst += row_bytes[i];
    }
}

void tg_concat(int64_t k, char *const *xs, const int64_t *row_bytes, char *out, int64_t outer) {
    int64_t total = 0;
    for (int64_t i = 0; i < k; i++) total += row_bytes[i];
    if (total <= 0 || outer <= 0) return;
    const int par = outer > 1 && outer * total >= (int64_t)4 * TG_PAR_MIN;
    TG_PW_TASKS(par, outer, tg_concat_row(k, xs, row_bytes, out + t * total, t))
}
