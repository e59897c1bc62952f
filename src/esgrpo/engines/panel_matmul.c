/* y = x W^T for fp32 x [M, I] and W [O, I], W stored as column panels: panel p holds W[24p : 24p+24, :]^T,
 * i.e. [I][24] contiguous, zero-padded past O. esgrpo.engines.panel_matmul compiles and loads this file;
 * it explains why (member weights streamed by 8-16-row matmuls); docs/references.md has the measurements.
 *
 * The micro-kernel is the register-blocked outer product of BLAS kernels (Goto & van de Geijn, "Anatomy of
 * High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008): a 4 x 24 tile of y in 12 AVX2 registers,
 * per k one broadcast of x per row and three loads of the panel, 12 FMAs. With few rows the kernel is
 * bound by reading W from memory, so while one panel is used the next one is prefetched, spread evenly
 * over all the tiles of the panel: without it the later 4-row passes over a panel (from cache) left memory
 * idle.
 *
 * Where the CPU has AVX-512 (F and VL) a tile is 8 x 24 instead: per k one broadcast per row, a 16-float and
 * an 8-float load of the panel, 16 FMAs covering twice the rows of the 4 x 24 tile (16 accumulators of the
 * 32 registers), so 8-row decode steps take one pass over each panel instead of two. Every output is the
 * same fused multiply-add chain over k in the same order in both tiles: the two give the same floats. */
#include <immintrin.h>
#include <string.h>

#define NR 24 /* columns of a panel: three 8-float vectors */
#define MR 4  /* rows of a tile */
#define MC 64 /* rows of x kept in cache while the panels stream past */

typedef void (*tile_fn)(int mr, const float *x, int I, const float *panel, float *y, long ldy, int ncols,
                        const float *next, long first, long step);

/* y[0:mr, 0:ncols] = x[0:mr, :] @ panel; at step k the line at next + ((first + k) * step >> 16) floats is
 * prefetched (next = NULL: none). */
static void tile(int mr, const float *x, int I, const float *panel, float *y, long ldy, int ncols,
                 const float *next, long first, long step) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    /* rows past mr read row 0 again (their sums are dropped): one loop for every tile height */
    const float *x0 = x, *x1 = x + (long)I * (mr > 1), *x2 = x + 2L * I * (mr > 2), *x3 = x + 3L * I * (mr > 3);
    for (int k = 0; k < I; k++) {
        const float *w = panel + (long)k * NR;
        if (next) _mm_prefetch((const char *)(next + (((first + k) * step) >> 16)), _MM_HINT_T0);
        __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8), w2 = _mm256_loadu_ps(w + 16), b;
        b = _mm256_broadcast_ss(x0 + k);
        c00 = _mm256_fmadd_ps(b, w0, c00); c01 = _mm256_fmadd_ps(b, w1, c01); c02 = _mm256_fmadd_ps(b, w2, c02);
        b = _mm256_broadcast_ss(x1 + k);
        c10 = _mm256_fmadd_ps(b, w0, c10); c11 = _mm256_fmadd_ps(b, w1, c11); c12 = _mm256_fmadd_ps(b, w2, c12);
        b = _mm256_broadcast_ss(x2 + k);
        c20 = _mm256_fmadd_ps(b, w0, c20); c21 = _mm256_fmadd_ps(b, w1, c21); c22 = _mm256_fmadd_ps(b, w2, c22);
        b = _mm256_broadcast_ss(x3 + k);
        c30 = _mm256_fmadd_ps(b, w0, c30); c31 = _mm256_fmadd_ps(b, w1, c31); c32 = _mm256_fmadd_ps(b, w2, c32);
    }
    /* through a buffer: named registers, not an array, keep the accumulators out of memory in the loop */
    float t[MR * NR] __attribute__((aligned(32)));
    _mm256_store_ps(t, c00); _mm256_store_ps(t + 8, c01); _mm256_store_ps(t + 16, c02);
    _mm256_store_ps(t + 24, c10); _mm256_store_ps(t + 32, c11); _mm256_store_ps(t + 40, c12);
    _mm256_store_ps(t + 48, c20); _mm256_store_ps(t + 56, c21); _mm256_store_ps(t + 64, c22);
    _mm256_store_ps(t + 72, c30); _mm256_store_ps(t + 80, c31); _mm256_store_ps(t + 88, c32);
    for (int r = 0; r < mr; r++) memcpy(y + r * ldy, t + r * NR, sizeof(float) * ncols);
}

#define AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define ROW512(r)                                                                                           \
    b = _mm512_set1_ps(x##r[k]);                                                                            \
    a##r = _mm512_fmadd_ps(b, w0, a##r);                                                                    \
    c##r = _mm256_fmadd_ps(_mm512_castps512_ps256(b), w1, c##r);

/* The 8 x 24 tile: columns 0-15 in a zmm and 16-23 in a ymm per row; otherwise as tile(). */
static AVX512 void tile8(int mr, const float *x, int I, const float *panel, float *y, long ldy, int ncols,
                         const float *next, long first, long step) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    const float *x0 = x, *x1 = x + (long)I * (mr > 1), *x2 = x + 2L * I * (mr > 2), *x3 = x + 3L * I * (mr > 3);
    const float *x4 = x + 4L * I * (mr > 4), *x5 = x + 5L * I * (mr > 5), *x6 = x + 6L * I * (mr > 6);
    const float *x7 = x + 7L * I * (mr > 7);
    for (int k = 0; k < I; k++) {
        const float *w = panel + (long)k * NR;
        if (next) _mm_prefetch((const char *)(next + (((first + k) * step) >> 16)), _MM_HINT_T0);
        __m512 w0 = _mm512_loadu_ps(w), b;
        __m256 w1 = _mm256_loadu_ps(w + 16);
        ROW512(0) ROW512(1) ROW512(2) ROW512(3) ROW512(4) ROW512(5) ROW512(6) ROW512(7)
    }
    float t[8 * NR] __attribute__((aligned(64)));
    _mm512_store_ps(t, a0); _mm256_store_ps(t + 16, c0); _mm512_storeu_ps(t + 24, a1); _mm256_store_ps(t + 40, c1);
    _mm512_store_ps(t + 48, a2); _mm256_store_ps(t + 64, c2); _mm512_storeu_ps(t + 72, a3); _mm256_store_ps(t + 88, c3);
    _mm512_store_ps(t + 96, a4); _mm256_store_ps(t + 112, c4); _mm512_storeu_ps(t + 120, a5); _mm256_store_ps(t + 136, c5);
    _mm512_store_ps(t + 144, a6); _mm256_store_ps(t + 160, c6); _mm512_storeu_ps(t + 168, a7); _mm256_store_ps(t + 184, c7);
    for (int r = 0; r < mr; r++) memcpy(y + r * ldy, t + r * NR, sizeof(float) * ncols);
}

/* 1: the 8-row AVX-512 tile, 0: the 4-row AVX2 tile; -1 until the first call asks the CPU. */
static int wide = -1;

/* Which tile the matmul uses: want 1 asks for AVX-512 (taken only where the CPU has it), 0 for AVX2, -1
 * changes nothing. Returns the tile now in use (1 or 0). */
int esgrpo_panel_set_wide(int want) {
    if (want < 0) return wide > 0;
    __builtin_cpu_init();
    wide = want && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
    return wide;
}

/* Columns of panels [p0, p1) of y [M, O] (row stride O) = x [M, I] (contiguous) @ W^T. */
void esgrpo_panel_matmul(const float *x, long M, int I, const float *panels, int O, int p0, int p1, float *y) {
    const long panel_size = (long)I * NR;
    if (wide < 0) esgrpo_panel_set_wide(1);
    const int mr_max = wide ? 8 : MR;
    const tile_fn fn = wide ? tile8 : tile;
    for (long m0 = 0; m0 < M; m0 += MC) {
        int mc = M - m0 < MC ? (int)(M - m0) : MC;
        for (int p = p0; p < p1; p++) {
            const float *panel = panels + p * panel_size;
            int ncols = O - p * NR < NR ? O - p * NR : NR;
            /* the tiles of this panel sweep the next one into cache between them, 24 / tiles floats a step */
            const int tiles = (mc + mr_max - 1) / mr_max;
            const float *next = p + 1 < p1 ? panel + panel_size : NULL;
            const long step = ((long)NR << 16) / tiles;
            for (int r = 0; r < mc; r += mr_max) {
                fn(mc - r < mr_max ? mc - r : mr_max, x + (m0 + r) * I, I, panel, y + (m0 + r) * O + (long)p * NR,
                   O, ncols, next, (long)(r / mr_max) * I, step);
            }
        }
    }
}

/* 8 x 8 transpose of r[0..7] in registers (unpack, shuffle, then swap 128-bit halves). */
static inline void transpose8(__m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20); r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20); r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31); r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31); r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* panels [ceil(O / 24)][I][24] of (W[j][k] * col[k]) * row[j] from W [O, I] (contiguous), zero past O;
 * col [I] / row [O] NULL: not scaled. The scales are the RMSNorm weights and the attention scale the
 * population engine folds in, multiplied in torch's order (the same floats), here instead of in two more
 * passes over the matrix. 8 x 8 blocks transposed in registers: about twice the element-by-element copy's
 * speed. */
void esgrpo_panel_pack(const float *w, int O, int I, const float *col, const float *row, float *panels) {
    int P = (O + NR - 1) / NR;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int p = 0; p < P; p++) {
        float *panel = panels + (long)p * I * NR;
        const float *rows = w + (long)p * NR * I;
        int ncols = O - p * NR < NR ? O - p * NR : NR;
        int blocked = ncols == NR ? I & ~7 : 0; /* a full panel's k up to the last multiple of 8 */
        if (ncols < NR) memset(panel, 0, sizeof(float) * I * NR);
        for (int k0 = 0; k0 < blocked; k0 += 8) {
            __m256 c = col ? _mm256_loadu_ps(col + k0) : one;
            for (int j0 = 0; j0 < NR; j0 += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(rows + (long)(j0 + i) * I + k0);
                if (col)
                    for (int i = 0; i < 8; i++) r[i] = _mm256_mul_ps(r[i], c);
                transpose8(r);
                if (row) {
                    __m256 s = _mm256_loadu_ps(row + p * NR + j0);
                    for (int i = 0; i < 8; i++) r[i] = _mm256_mul_ps(r[i], s);
                }
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(panel + (long)(k0 + i) * NR + j0, r[i]);
            }
        }
        for (int j = 0; j < ncols; j++)
            for (int k = blocked; k < I; k++) {
                float v = rows[(long)j * I + k];
                if (col) v *= col[k];
                if (row) v *= row[p * NR + j];
                panel[(long)k * NR + j] = v;
            }
    }
}
