/* torch.randn's values on the CPU for one fp32 tensor of n >= 16 elements from a generator seeded with
 * `seed`, computed faster. esgrpo.randn compiles and loads this file and checks it against torch.randn in
 * every process before using it; docs/references.md has the measurements.
 *
 * What torch computes (ATen/native/cpu/DistributionTemplates.h, `normal_fill`, on a CPU with AVX2; torch's
 * AVX-512 build gives the same values): n uniforms u = (w & (2^24 - 1)) * 2^-24 from consecutive 32-bit
 * words w of MT19937 (Matsumoto & Nishimura 1998) seeded with the seed's low 32 bits, then for every chunk
 * of 16 the Box-Muller transform of its 8 pairs (1 - u[j], u[j + 8]) with Cephes's single-precision log
 * and sin/cos polynomials in 8-lane AVX (the formulas of ATen/native/cpu/avx_mathfun.h): radius
 * sqrt(-2 log(1 - u[j])), angle 2 pi u[j + 8], out[j] = radius cos, out[j + 8] = radius sin. Where 16 does
 * not divide n, the last 16 outputs are made again from 16 further words.
 *
 * Torch draws every word with a scalar generator behind a lock into the output, then transforms it in a
 * second pass. Here the state is advanced 8 words at a time, and each chunk of 16 is transformed while its
 * words are in registers: one pass, the same operations in the same order on every lane (compiled with
 * -ffp-contract=off, so no multiply and add fuse unless written as one), hence the same floats. */
#include <immintrin.h>
#include <stdint.h>

#define MT_N 624
#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UPPER 0x80000000u
#define MT_LOWER 0x7fffffffu

typedef struct {
    uint32_t state[MT_N];
    int next; /* words of `state` handed out since the last twist */
} mt19937;

static void mt_seed(mt19937 *mt, uint32_t seed) {
    mt->state[0] = seed;
    for (uint32_t i = 1; i < MT_N; i++)
        mt->state[i] = 1812433253u * (mt->state[i - 1] ^ (mt->state[i - 1] >> 30)) + i;
    mt->next = MT_N; /* the first word comes after a twist */
}

static inline uint32_t twist_one(const uint32_t *s, int i, int ip1, int im) {
    uint32_t y = (s[i] & MT_UPPER) | (s[ip1] & MT_LOWER);
    return s[im] ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
}

static inline __m256i twist8(__m256i cur, __m256i nxt, __m256i far) {
    __m256i y = _mm256_or_si256(_mm256_and_si256(cur, _mm256_set1_epi32((int)MT_UPPER)),
                                _mm256_and_si256(nxt, _mm256_set1_epi32((int)MT_LOWER)));
    __m256i odd = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(y, _mm256_set1_epi32(1)));
    __m256i mag = _mm256_and_si256(odd, _mm256_set1_epi32((int)MT_MATRIX_A));
    return _mm256_xor_si256(_mm256_xor_si256(far, _mm256_srli_epi32(y, 1)), mag);
}

/* The state's next 624 words, in place. Word i reads words i + 1 (not yet replaced) and i + 397 mod 624
 * (replaced already where i >= 227): blocks of 8 keep both, save the two blocks that cross 624. */
static void mt_twist(mt19937 *mt) {
    uint32_t *s = mt->state;
    int i = 0;
    for (; i + 8 <= MT_N - MT_M; i += 8) /* i + 397 < 624: the old words */
        _mm256_storeu_si256((__m256i *)(s + i),
                            twist8(_mm256_loadu_si256((const __m256i *)(s + i)),
                                   _mm256_loadu_si256((const __m256i *)(s + i + 1)),
                                   _mm256_loadu_si256((const __m256i *)(s + i + MT_M))));
    for (; i < MT_N - MT_M + 8 - (MT_N - MT_M) % 8; i++) /* the block that wraps: one word at a time */
        s[i] = twist_one(s, i, i + 1, (i + MT_M) % MT_N);
    for (; i + 8 <= MT_N - 8; i += 8) /* i + 397 - 624 < i: the new words */
        _mm256_storeu_si256((__m256i *)(s + i),
                            twist8(_mm256_loadu_si256((const __m256i *)(s + i)),
                                   _mm256_loadu_si256((const __m256i *)(s + i + 1)),
                                   _mm256_loadu_si256((const __m256i *)(s + i + MT_M - MT_N))));
    for (; i < MT_N; i++) /* the last reads the new word 0 */
        s[i] = twist_one(s, i, (i + 1) % MT_N, (i + MT_M) % MT_N);
    mt->next = 0;
}

/* 8 words tempered and made uniforms (w & (2^24 - 1)) * 2^-24 (exact in fp32). */
static inline __m256 uniform8(const uint32_t *words) {
    __m256i y = _mm256_loadu_si256((const __m256i *)words);
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 11));
    y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32(y, 7), _mm256_set1_epi32((int)0x9d2c5680u)));
    y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32(y, 15), _mm256_set1_epi32((int)0xefc60000u)));
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 18));
    y = _mm256_and_si256(y, _mm256_set1_epi32((1 << 24) - 1));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(y), _mm256_set1_ps(1.0f / 16777216.0f));
}

/* The next 16 words as 16 uniforms: [0:8] and [8:16]. 624 = 39 x 16, so a chunk never straddles a twist. */
static inline void next_chunk(mt19937 *mt, __m256 *a, __m256 *b) {
    if (mt->next == MT_N) mt_twist(mt);
    *a = uniform8(mt->state + mt->next);
    *b = uniform8(mt->state + mt->next + 8);
    mt->next += 16;
}

/* One word, untempered (uniform8 tempers), one at a time. */
static inline uint32_t next_word(mt19937 *mt) {
    if (mt->next == MT_N) mt_twist(mt);
    return mt->state[mt->next++];
}

#define PS(v) _mm256_set1_ps(v)

/* Cephes logf for x in (0, 1]: x = m 2^e, m in [sqrt(1/2), sqrt(2)), a degree-8 polynomial in m - 1. */
static inline __m256 cephes_log(__m256 x) {
    __m256 invalid = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LE_OS);
    x = _mm256_max_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x00800000)));
    __m256i exponent = _mm256_srli_epi32(_mm256_castps_si256(x), 23);
    x = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(~0x7f800000))), PS(0.5f));
    __m256 e = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(exponent, _mm256_set1_epi32(0x7f))), PS(1.0f));
    __m256 low = _mm256_cmp_ps(x, PS(0.707106781186547524f), _CMP_LT_OS);
    __m256 keep = _mm256_and_ps(x, low);
    x = _mm256_sub_ps(x, PS(1.0f));
    e = _mm256_sub_ps(e, _mm256_and_ps(PS(1.0f), low));
    x = _mm256_add_ps(x, keep);
    __m256 z = _mm256_mul_ps(x, x);
    static const float p[9] = {7.0376836292E-2f, -1.1514610310E-1f, 1.1676998740E-1f, -1.2420140846E-1f,
                               1.4249322787E-1f, -1.6668057665E-1f, 2.0000714765E-1f, -2.4999993993E-1f,
                               3.3333331174E-1f};
    __m256 y = PS(p[0]);
    for (int k = 1; k < 9; k++) y = _mm256_fmadd_ps(y, x, PS(p[k]));
    y = _mm256_fmadd_ps(_mm256_mul_ps(y, x), z, _mm256_mul_ps(e, PS(-2.12194440e-4f)));
    y = _mm256_fnmadd_ps(z, PS(0.5f), y);
    x = _mm256_fmadd_ps(e, PS(0.693359375f), _mm256_add_ps(x, y));
    return _mm256_or_ps(x, invalid);
}

/* Cephes sinf and cosf together for x >= 0: reduced by multiples of pi/4 in three parts, then the sine
 * and cosine polynomials on [-pi/4, pi/4], chosen and signed by the octant. */
static inline void cephes_sincos(__m256 x, __m256 *sine, __m256 *cosine) {
    __m256 sign_sin = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
    x = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    __m256i j = _mm256_cvttps_epi32(_mm256_mul_ps(x, PS(1.27323954473516f)));
    j = _mm256_and_si256(_mm256_add_epi32(j, _mm256_set1_epi32(1)), _mm256_set1_epi32(~1));
    __m256 y = _mm256_cvtepi32_ps(j);
    __m256 swap_sin = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(j, _mm256_set1_epi32(4)), 29));
    __m256 poly = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(j, _mm256_set1_epi32(2)),
                                                         _mm256_setzero_si256()));
    x = _mm256_fmadd_ps(y, PS(-0.78515625f), x);
    x = _mm256_fmadd_ps(y, PS(-2.4187564849853515625e-4f), x);
    x = _mm256_fmadd_ps(y, PS(-3.77489497744594108e-8f), x);
    __m256i jc = _mm256_andnot_si256(_mm256_sub_epi32(j, _mm256_set1_epi32(2)), _mm256_set1_epi32(4));
    __m256 sign_cos = _mm256_castsi256_ps(_mm256_slli_epi32(jc, 29));
    sign_sin = _mm256_xor_ps(sign_sin, swap_sin);

    __m256 z = _mm256_mul_ps(x, x);
    __m256 c = _mm256_fmadd_ps(PS(2.443315711809948E-005f), z, PS(-1.388731625493765E-003f));
    c = _mm256_fmadd_ps(c, z, PS(4.166664568298827E-002f));
    c = _mm256_add_ps(_mm256_fmsub_ps(_mm256_mul_ps(c, z), z, _mm256_mul_ps(z, PS(0.5f))), PS(1.0f));
    __m256 s = _mm256_fmadd_ps(PS(-1.9515295891E-4f), z, PS(8.3321608736E-3f));
    s = _mm256_fmadd_ps(s, z, PS(-1.6666654611E-1f));
    s = _mm256_fmadd_ps(_mm256_mul_ps(s, z), x, x);

    __m256 s_pick = _mm256_and_ps(poly, s), c_pick = _mm256_andnot_ps(poly, c);
    s = _mm256_sub_ps(s, s_pick);
    c = _mm256_sub_ps(c, c_pick);
    *sine = _mm256_xor_ps(_mm256_add_ps(c_pick, s_pick), sign_sin);
    *cosine = _mm256_xor_ps(_mm256_add_ps(c, s), sign_cos);
}

/* out[0:8], out[8:16] from the chunk's uniforms a (the radii's) and b (the angles'). */
static inline void box_muller16(__m256 a, __m256 b, float *out) {
    __m256 radius = _mm256_sqrt_ps(_mm256_mul_ps(PS(-2.0f), cephes_log(_mm256_sub_ps(PS(1.0f), a))));
    __m256 sine, cosine;
    cephes_sincos(_mm256_mul_ps(PS((float)(2.0 * 3.14159265358979323846)), b), &sine, &cosine);
    /* torch's fmadd(n, std, mean) with std 1 and mean 0: n + 0, which only turns -0 into +0 */
    _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_mul_ps(radius, cosine), PS(1.0f), _mm256_setzero_ps()));
    _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(_mm256_mul_ps(radius, sine), PS(1.0f), _mm256_setzero_ps()));
}

/* out[0:n] = torch.randn(n) from a CPU generator after manual_seed(s) with s & (2^32 - 1) == seed; n >= 16. */
void esgrpo_randn(uint32_t seed, float *out, long n) {
    mt19937 mt;
    mt_seed(&mt, seed);
    __m256 a, b;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        next_chunk(&mt, &a, &b);
        box_muller16(a, b, out + i);
    }
    if (i < n) { /* torch drew words for out[i:n] too, then 16 more to make the last 16 outputs again */
        uint32_t words[16];
        for (long k = 0; k < n - i; k++) next_word(&mt);
        for (int k = 0; k < 16; k++) words[k] = next_word(&mt);
        box_muller16(uniform8(words), uniform8(words + 8), out + n - 16);
    }
}
