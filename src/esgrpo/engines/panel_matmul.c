/* y = x W^T for fp32 x [M, I] and W [O, I], W stored as column panels: panel p holds W[24p : 24p+24, :]^T,
 * i.e. [I][24] contiguous, zero-padded past O. esgrpo.engines.panel_matmul compiles and loads this file;
 * it explains why (member weights streamed by 8-16-row matmuls) and what it measured.
 *
 * The micro-kernel is the register-blocked outer product of BLAS kernels (Goto & van de Geijn, "Anatomy of
 * High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008): a 4 x 24 tile of y in 12 AVX2 registers,
 * per k one broadcast of x per row and three loads of the panel, 12 FMAs. With few rows the kernel is
 * bound by reading W from memory, so while one panel is used the next one is prefetched, spread evenly
 * over all the tiles of the panel: without it the later 4-row passes over a panel (from cache) left memory
 * idle. One thread of the 2-core EPYC: 8 rows 11 -> 13.5-15.6 GB/s, 16 rows 63 -> 86 GFLOP/s (measured). */
#include <immintrin.h>
#include <string.h>

#define NR 24 /* columns of a panel: three 8-float vectors */
#define MR 4  /* rows of a tile */
#define MC 64 /* rows of x kept in cache while the panels stream past */

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

/* Columns of panels [p0, p1) of y [M, O] (row stride O) = x [M, I] (contiguous) @ W^T. */
void esgrpo_panel_matmul(const float *x, long M, int I, const float *panels, int O, int p0, int p1, float *y) {
    const long panel_size = (long)I * NR;
    for (long m0 = 0; m0 < M; m0 += MC) {
        int mc = M - m0 < MC ? (int)(M - m0) : MC;
        for (int p = p0; p < p1; p++) {
            const float *panel = panels + p * panel_size;
            int ncols = O - p * NR < NR ? O - p * NR : NR;
            /* the tiles of this panel sweep the next one into cache between them, 24 / tiles floats a step */
            const int tiles = (mc + MR - 1) / MR;
            const float *next = p + 1 < p1 ? panel + panel_size : NULL;
            const long step = ((long)NR << 16) / tiles;
            for (int r = 0; r < mc; r += MR) {
                tile(mc - r < MR ? mc - r : MR, x + (m0 + r) * I, I, panel, y + (m0 + r) * O + (long)p * NR, O,
                     ncols, next, (long)(r / MR) * I, step);
            }
        }
    }
}

/* panels [ceil(O / 24)][I][24] from W [O, I] (contiguous), zero past O. */
void esgrpo_panel_pack(const float *w, int O, int I, float *panels) {
    int P = (O + NR - 1) / NR;
    for (int p = 0; p < P; p++) {
        float *panel = panels + (long)p * I * NR;
        int ncols = O - p * NR < NR ? O - p * NR : NR;
        if (ncols < NR) memset(panel, 0, sizeof(float) * I * NR);
        for (int j = 0; j < ncols; j++) {
            const float *row = w + (long)(p * NR + j) * I;
            for (int k = 0; k < I; k++) panel[(long)k * NR + j] = row[k];
        }
    }
}
