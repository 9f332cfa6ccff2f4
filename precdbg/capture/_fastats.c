/* One-pass statistics of a host memory buffer: min, max (over non-NaN values), sum and sum of
 * squares of the finite values (float64 partials), NaN count and Inf count, and the
 * order-sensitive sum of the finite values weighted by a hash of their row-major index
 * (`ws` below; a record stores it as `pos_mean`, see `row`).
 *
 * Framework-neutral: it reads (address, count, dtype code) so any adapter can hand it the memory
 * of a CPU tensor. The GIL is released while it runs. Buffers of 1 M elements or more are
 * split in two, the second half summarised by one persistent worker thread (run_split below);
 * adapters use it for host tensors up to a size where it beats the framework's multi-threaded
 * reductions; accelerator tensors use the device's own kernels.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

enum { DT_F32 = 0, DT_F64 = 1, DT_F16 = 2, DT_BF16 = 3 };

/* The position weight of element i (its row-major index): s(i) = i * HASH_K modulo 2^32, read
 * as a signed 32-bit integer. HASH_K is odd, so i -> s(i) is a bijection of [0, 2^32): any two
 * elements have different weights, and neighbours' weights are far apart (HASH_K / 2^32 is
 * the golden ratio's fraction, a Weyl sequence), so a local permutation (a flip of one
 * image's rows) moves the weighted sum as much as a global one. Exact in every pass (32-bit
 * integer products wrap alike in C, Triton and torch). `ws` = sum of x_i * s(i) over the
 * finite values; pos_mean is derived from it (`pos_mean` below). */
#define HASH_K 0x9E3779B9u

/* element k of a run has hash `first + k * step` (mod 2^32): `step` is HASH_K times the
 * distance in row-major index between neighbours in memory (1 for a contiguous buffer) */
typedef struct {
    uint32_t first, step;
} hash_t;

static inline hash_t hash_at(hash_t h, size_t k) {
    hash_t out = {h.first + (uint32_t)k * h.step, h.step};
    return out;
}

typedef struct {
    double mn, mx, sum, sq, ws;
    long long nonfinite;
} acc_t;

static void acc_init(acc_t *a) {
    a->mn = INFINITY; a->mx = -INFINITY; a->sum = 0.0; a->sq = 0.0; a->ws = 0.0;
    a->nonfinite = 0;
}
static float half_to_float(uint16_t h);

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

/* Compiled with -ffinite-math-only so min/max vectorise: non-finite values are therefore
 * recognised through their bits, never through float compares. The float32 (and float16,
 * bfloat16) pass sums every value as it is, so a NaN or Inf leaves the float64 sum non-finite;
 * the float64 pass counts them. Either way a buffer holding any is summarised again by the
 * exact scalar pass `careful` below. Sums and sums of squares accumulate in float64 (so
 * squares of large float32 values cannot overflow). */
#define BLK 1024
#define F32_EXP 0x7f800000u
#define F64_EXP 0x7ff0000000000000ull

/* One block's partial results, folded into the buffer's once the block is done. */
typedef struct {
    double s, sq;
    float mn, mx;
    double w;                    /* sum of x * s(index) */
} block_t;

/* q[k] .. q[m - 1]; `h`: the hash of q[0] */
static inline void f32_values(const float *q, size_t k, size_t m, hash_t h, block_t *b) {
    uint32_t at = h.first + (uint32_t)k * h.step;
    for (; k < m; k++, at += h.step) {
        float x = q[k];
        double d = (double)x;
        b->s += d; b->sq += d * d; b->w += d * (double)(int32_t)at;
        b->mn = x < b->mn ? x : b->mn;
        b->mx = x > b->mx ? x : b->mx;
    }
}

static inline void block_done(const block_t *b, acc_t *a) {
    a->sum += b->s; a->sq += b->sq; a->ws += b->w;
    if (b->mn < a->mn) a->mn = b->mn;
    if (b->mx > a->mx) a->mx = b->mx;
}

static void run_f32_plain(const float *p, size_t n, hash_t h, acc_t *a) {
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        block_t b = {0.0, 0.0, INFINITY, -INFINITY, 0.0};
        f32_values(p + i, 0, m, hash_at(h, i), &b);
        block_done(&b, a);
    }
}

/* A block's partial results from the lanes of the SIMD accumulators (`lanes` float64 sums and
 * sums of squares, added pairwise; 2 x `lanes` float32 minima and maxima), ready for the values
 * the vector loop left over. */
static inline block_t lanes_done(double *s, double *t, const float *mn, const float *mx,
                                 int lanes) {
    for (int width = lanes / 2; width > 0; width /= 2) {
        for (int j = 0; j < width; j++) {
            s[j] = s[2 * j] + s[2 * j + 1];
            t[j] = t[2 * j] + t[2 * j + 1];
        }
    }
    block_t b = {s[0], t[0], mn[0], mx[0], 0.0};
    for (int j = 1; j < 2 * lanes; j++) {
        b.mn = mn[j] < b.mn ? mn[j] : b.mn;
        b.mx = mx[j] > b.mx ? mx[j] : b.mx;
    }
    return b;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
/* The hashes of 8 consecutive values from `h` on, and the sum of four float64 lanes. */
__attribute__((target("avx2,fma")))
static inline __m256i hashes8(hash_t h) {
    uint32_t lane[8];
    for (int j = 0; j < 8; j++) lane[j] = h.first + (uint32_t)j * h.step;
    return _mm256_loadu_si256((const __m256i *)lane);
}

__attribute__((target("avx2,fma")))
static inline double lanes4(__m256d v) {
    double lane[4];
    _mm256_storeu_pd(lane, v);
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

/* 16 values per round into four independent float64 sums and sums of squares, so the adds
 * of one round do not wait for the previous round's; the hash-weighted sums likewise (the
 * hashes advance by one 32-bit integer add per 8 values, widened to float64 exactly). */
__attribute__((target("avx2,fma")))
static void run_f32_avx2(const float *p, size_t n, hash_t h, acc_t *a) {
    const __m128i advance = _mm_set1_epi32((int)(16u * h.step));
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        const float *q = p + i;
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
        __m256d t0 = s0, t1 = s0, t2 = s0, t3 = s0;
        __m256d w0 = s0, w1 = s0, w2 = s0, w3 = s0;
        hash_t hb = hash_at(h, i);
        __m256i first = hashes8(hb), second = hashes8(hash_at(hb, 8));
        /* four 128-bit hash vectors, one per float64 accumulator: no extraction per round */
        __m128i h0 = _mm256_castsi256_si128(first), h1 = _mm256_extracti128_si256(first, 1);
        __m128i h2 = _mm256_castsi256_si128(second), h3 = _mm256_extracti128_si256(second, 1);
        __m256 mn0 = _mm256_set1_ps(INFINITY), mn1 = mn0;
        __m256 mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0;
        size_t k = 0;
        for (; k + 16 <= m; k += 16) {
            __m256 x0 = _mm256_loadu_ps(q + k), x1 = _mm256_loadu_ps(q + k + 8);
            mn0 = _mm256_min_ps(mn0, x0); mx0 = _mm256_max_ps(mx0, x0);
            mn1 = _mm256_min_ps(mn1, x1); mx1 = _mm256_max_ps(mx1, x1);
            __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
            __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
            __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
            __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
            s0 = _mm256_add_pd(s0, d0); t0 = _mm256_add_pd(t0, _mm256_mul_pd(d0, d0));
            s1 = _mm256_add_pd(s1, d1); t1 = _mm256_add_pd(t1, _mm256_mul_pd(d1, d1));
            s2 = _mm256_add_pd(s2, d2); t2 = _mm256_add_pd(t2, _mm256_mul_pd(d2, d2));
            s3 = _mm256_add_pd(s3, d3); t3 = _mm256_add_pd(t3, _mm256_mul_pd(d3, d3));
            w0 = _mm256_fmadd_pd(d0, _mm256_cvtepi32_pd(h0), w0);
            w1 = _mm256_fmadd_pd(d1, _mm256_cvtepi32_pd(h1), w1);
            w2 = _mm256_fmadd_pd(d2, _mm256_cvtepi32_pd(h2), w2);
            w3 = _mm256_fmadd_pd(d3, _mm256_cvtepi32_pd(h3), w3);
            h0 = _mm_add_epi32(h0, advance); h1 = _mm_add_epi32(h1, advance);
            h2 = _mm_add_epi32(h2, advance); h3 = _mm_add_epi32(h3, advance);
        }
        double wsum = lanes4(_mm256_add_pd(_mm256_add_pd(w0, w1), _mm256_add_pd(w2, w3)));
        double sv[4], tv[4];
        float nv[8], xv[8];
        _mm256_storeu_pd(sv, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
        _mm256_storeu_pd(tv, _mm256_add_pd(_mm256_add_pd(t0, t1), _mm256_add_pd(t2, t3)));
        _mm256_storeu_ps(nv, _mm256_min_ps(mn0, mn1));
        _mm256_storeu_ps(xv, _mm256_max_ps(mx0, mx1));
        block_t b = lanes_done(sv, tv, nv, xv, 4);
        b.w = wsum;
        f32_values(q, k, m, hb, &b);         /* the last values of the block, one by one */
        block_done(&b, a);
    }
}

/* The same pass in 512-bit registers where the CPU has them (Xeon since Skylake-SP, AMD since
 * Zen 4): 32 values per round in about half the instructions of the AVX2 pass. The widening to
 * float64 bounds both; here it reads its 8 values straight from memory (no extraction), and
 * each square is added by a fused multiply-add (rounded once: at least as accurate as the AVX2
 * pass, whose sums differ from these in the last bits anyway, by their order). */
__attribute__((target("avx512f,fma")))
static inline __m512i hashes16(hash_t h) {
    uint32_t lane[16];
    for (int j = 0; j < 16; j++) lane[j] = h.first + (uint32_t)j * h.step;
    return _mm512_loadu_si512((const void *)lane);
}

__attribute__((target("avx512f,fma")))
static void run_f32_avx512(const float *p, size_t n, hash_t h, acc_t *a) {
    const __m512i advance = _mm512_set1_epi32((int)(32u * h.step));
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        const float *q = p + i;
        __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
        __m512d t0 = s0, t1 = s0, t2 = s0, t3 = s0;
        __m512d w0 = s0, w1 = s0, w2 = s0, w3 = s0;
        hash_t hb = hash_at(h, i);
        __m512i h0 = hashes16(hb), h1 = hashes16(hash_at(hb, 16));
        __m512 mn0 = _mm512_set1_ps(INFINITY), mn1 = mn0;
        __m512 mx0 = _mm512_set1_ps(-INFINITY), mx1 = mx0;
        size_t k = 0;
        for (; k + 32 <= m; k += 32) {
            __m512 x0 = _mm512_loadu_ps(q + k), x1 = _mm512_loadu_ps(q + k + 16);
            mn0 = _mm512_min_ps(mn0, x0); mx0 = _mm512_max_ps(mx0, x0);
            mn1 = _mm512_min_ps(mn1, x1); mx1 = _mm512_max_ps(mx1, x1);
            __m512d d0 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k));
            __m512d d1 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k + 8));
            __m512d d2 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k + 16));
            __m512d d3 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k + 24));
            s0 = _mm512_add_pd(s0, d0); t0 = _mm512_fmadd_pd(d0, d0, t0);
            s1 = _mm512_add_pd(s1, d1); t1 = _mm512_fmadd_pd(d1, d1, t1);
            s2 = _mm512_add_pd(s2, d2); t2 = _mm512_fmadd_pd(d2, d2, t2);
            s3 = _mm512_add_pd(s3, d3); t3 = _mm512_fmadd_pd(d3, d3, t3);
            w0 = _mm512_fmadd_pd(d0, _mm512_cvtepi32_pd(_mm512_castsi512_si256(h0)), w0);
            w1 = _mm512_fmadd_pd(d1, _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(h0, 1)), w1);
            w2 = _mm512_fmadd_pd(d2, _mm512_cvtepi32_pd(_mm512_castsi512_si256(h1)), w2);
            w3 = _mm512_fmadd_pd(d3, _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(h1, 1)), w3);
            h0 = _mm512_add_epi32(h0, advance); h1 = _mm512_add_epi32(h1, advance);
        }
        double wv[8];
        _mm512_storeu_pd(wv, _mm512_add_pd(_mm512_add_pd(w0, w1), _mm512_add_pd(w2, w3)));
        double wsum = ((wv[0] + wv[1]) + (wv[2] + wv[3])) + ((wv[4] + wv[5]) + (wv[6] + wv[7]));
        double sv[8], tv[8];
        float nv[16], xv[16];
        _mm512_storeu_pd(sv, _mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
        _mm512_storeu_pd(tv, _mm512_add_pd(_mm512_add_pd(t0, t1), _mm512_add_pd(t2, t3)));
        _mm512_storeu_ps(nv, _mm512_min_ps(mn0, mn1));
        _mm512_storeu_ps(xv, _mm512_max_ps(mx0, mx1));
        block_t b = lanes_done(sv, tv, nv, xv, 8);
        b.w = wsum;
        f32_values(q, k, m, hb, &b);         /* the last values of the block, one by one */
        block_done(&b, a);
    }
}
#endif

/* The widest pass this CPU runs (2: AVX-512, 1: AVX2 and FMA, 0: plain C), asked once; `simd()` in
 * Python reads it, and lowers it for tests of the narrower passes. */
static int simd_level = -1;

static int simd_best(void) {
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

static inline int simd(void) {
    if (simd_level < 0) simd_level = simd_best();
    return simd_level;
}

/* `h`: the hashes of p's elements (hash_t) */
static void run_f32(const float *p, size_t n, hash_t h, acc_t *a) {
#ifdef HAVE_AVX2_PATH
    int level = simd();
    if (level == 2) { run_f32_avx512(p, n, h, a); return; }
    if (level == 1) { run_f32_avx2(p, n, h, a); return; }
#endif
    run_f32_plain(p, n, h, a);
}

MULTIVERSION
static void run_f64(const double *p, size_t n, hash_t h, acc_t *a) {
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        const double *q = p + i;
        double s = 0.0, sq = 0.0, w = 0.0, mn = INFINITY, mx = -INFINITY;
        long long bad = 0;
        uint32_t at = hash_at(h, i).first;
        for (size_t k = 0; k < m; k++) {
            double x = q[k];
            uint64_t u; memcpy(&u, &x, sizeof u);
            int fin = (u & F64_EXP) != F64_EXP;
            uint64_t vu = fin ? u : 0u;
            double v; memcpy(&v, &vu, sizeof v);
            s += v; sq += v * v; bad += !fin;
            w += v * (double)(int32_t)(at + (uint32_t)k * h.step);
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        a->sum += s; a->sq += sq; a->ws += w; a->nonfinite += bad;
        if (mn < a->mn) a->mn = mn;
        if (mx > a->mx) a->mx = mx;
    }
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) { bits = sign; }
        else {                                    /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f; memcpy(&f, &bits, sizeof f); return f;
}

#define BLOCK 2048
static void run_half(const uint16_t *p, size_t n, int bf16, hash_t h, acc_t *a) {
    float buf[BLOCK];
    for (size_t i = 0; i < n; i += BLOCK) {
        size_t m = n - i < BLOCK ? n - i : BLOCK;
        if (bf16) {
            for (size_t k = 0; k < m; k++) {
                uint32_t bits = (uint32_t)p[i + k] << 16;
                memcpy(&buf[k], &bits, sizeof(float));
            }
        } else {
            for (size_t k = 0; k < m; k++) buf[k] = half_to_float(p[i + k]);
        }
        run_f32(buf, m, hash_at(h, i), a);
    }
}

static int finite_bits(double x) {
    uint64_t u; memcpy(&u, &x, sizeof u);
    return (u & F64_EXP) != F64_EXP;
}

static void run(const char *base, size_t n, int dtype, hash_t h, acc_t *acc) {
    acc_init(acc);
    switch (dtype) {
    case DT_F32: run_f32((const float *)base, n, h, acc); break;
    case DT_F64: run_f64((const double *)base, n, h, acc); break;
    case DT_F16: run_half((const uint16_t *)base, n, 0, h, acc); break;
    case DT_BF16: run_half((const uint16_t *)base, n, 1, h, acc); break;
    }
    if (dtype != DT_F64 && (!finite_bits(acc->sum) || !finite_bits(acc->sq))) acc->nonfinite = 1;
}

/* Exact pass for a buffer holding NaN or Inf (rare): min/max over non-NaN values (so +-Inf
 * shows), sum and sum of squares of the finite values, NaN count, Inf count. Bits only: the
 * file is compiled with -ffinite-math-only. */
static double load(const char *base, size_t i, int dtype) {
    switch (dtype) {
    case DT_F32: return ((const float *)base)[i];
    case DT_F64: return ((const double *)base)[i];
    case DT_F16: return half_to_float(((const uint16_t *)base)[i]);
    default: { uint32_t b = (uint32_t)((const uint16_t *)base)[i] << 16; float f;
               memcpy(&f, &b, sizeof f); return f; }
    }
}

/* The exact pass of float32 values (and of float16/bfloat16 ones widened to float32): the same
 * results as `careful`, without a branch per value. NaN and Inf are told apart through their bits;
 * the sums take the finite values (non-finite ones are zeroed), min and max every value but NaN
 * (a NaN becomes +Inf for the min and -Inf for the max). A masked attention score (half -Inf)
 * goes through here, once per captured tensor. */
typedef struct {
    double sum, sq, ws;
    float mn, mx;
    long long nan, inf;
} exact_t;

/* q[k] .. q[m - 1]; `h`: the hash of q[0] */
static inline void f32_exact_values(const float *q, size_t k, size_t m, hash_t h, exact_t *e) {
    uint32_t at = h.first + (uint32_t)k * h.step;
    for (; k < m; k++, at += h.step) {
        uint32_t u; memcpy(&u, &q[k], sizeof u);
        if ((u & F32_EXP) == F32_EXP) {
            if (u & 0x007fffffu) { e->nan++; continue; }
            e->inf++;
            float x = q[k];
            e->mn = x < e->mn ? x : e->mn;
            e->mx = x > e->mx ? x : e->mx;
            continue;
        }
        float x = q[k];
        double d = (double)x;
        e->sum += d; e->sq += d * d; e->ws += d * (double)(int32_t)at;
        e->mn = x < e->mn ? x : e->mn;
        e->mx = x > e->mx ? x : e->mx;
    }
}

#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2,fma")))
static void exact_f32_avx2(const float *p, size_t n, hash_t h, exact_t *e) {
    const __m256i advance = _mm256_set1_epi32((int)(8u * h.step));
    const __m256i expo = _mm256_set1_epi32((int)F32_EXP), mant = _mm256_set1_epi32(0x007fffff);
    const __m256i zero = _mm256_setzero_si256();
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    __m256 mn = pinf, mx = ninf;
    size_t k = 0;
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        const float *q = p + i;
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, t0 = s0, t1 = s0, w0 = s0, w1 = s0;
        hash_t hb = hash_at(h, i);
        __m256i hv = hashes8(hb);
        for (k = 0; k + 8 <= m; k += 8) {
            __m256 x = _mm256_loadu_ps(q + k);
            __m256i bits = _mm256_castps_si256(x);
            __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(bits, expo), expo);
            __m256i nonzero = _mm256_xor_si256(
                _mm256_cmpeq_epi32(_mm256_and_si256(bits, mant), zero), _mm256_set1_epi32(-1));
            __m256i nan = _mm256_and_si256(special, nonzero);
            __m256i inf = _mm256_andnot_si256(nonzero, special);
            e->nan += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(nan)));
            e->inf += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(inf)));
            __m256 nanmask = _mm256_castsi256_ps(nan);
            mn = _mm256_min_ps(mn, _mm256_blendv_ps(x, pinf, nanmask));
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(x, ninf, nanmask));
            __m256 f = _mm256_andnot_ps(_mm256_castsi256_ps(special), x);   /* finite or 0 */
            __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
            __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
            s0 = _mm256_add_pd(s0, d0); t0 = _mm256_add_pd(t0, _mm256_mul_pd(d0, d0));
            s1 = _mm256_add_pd(s1, d1); t1 = _mm256_add_pd(t1, _mm256_mul_pd(d1, d1));
            w0 = _mm256_fmadd_pd(d0, _mm256_cvtepi32_pd(_mm256_castsi256_si128(hv)), w0);
            w1 = _mm256_fmadd_pd(d1, _mm256_cvtepi32_pd(_mm256_extracti128_si256(hv, 1)), w1);
            hv = _mm256_add_epi32(hv, advance);
        }
        double sv[4], tv[4];
        _mm256_storeu_pd(sv, _mm256_add_pd(s0, s1));
        _mm256_storeu_pd(tv, _mm256_add_pd(t0, t1));
        e->sum += (sv[0] + sv[1]) + (sv[2] + sv[3]);
        e->sq += (tv[0] + tv[1]) + (tv[2] + tv[3]);
        e->ws += lanes4(_mm256_add_pd(w0, w1));
        f32_exact_values(q, k, m, hb, e);     /* the block's last values, one by one */
    }
    float nv[8], xv[8];
    _mm256_storeu_ps(nv, mn);
    _mm256_storeu_ps(xv, mx);
    for (int j = 0; j < 8; j++) {
        e->mn = nv[j] < e->mn ? nv[j] : e->mn;
        e->mx = xv[j] > e->mx ? xv[j] : e->mx;
    }
}
#endif

static void exact_f32(const float *p, size_t n, hash_t h, exact_t *e) {
#ifdef HAVE_AVX2_PATH
    if (simd() >= 1) { exact_f32_avx2(p, n, h, e); return; }
#endif
    f32_exact_values(p, 0, n, h, e);
}

static void careful_f32(const char *base, size_t n, int dtype, hash_t h, acc_t *acc,
                        long long *nan_out, long long *inf_out) {
    exact_t e = {0.0, 0.0, 0.0, INFINITY, -INFINITY, 0, 0};
    if (dtype == DT_F32) {
        exact_f32((const float *)base, n, h, &e);
    } else {                                  /* float16 / bfloat16: widened per block */
        const uint16_t *p = (const uint16_t *)base;
        float buf[BLOCK];
        for (size_t i = 0; i < n; i += BLOCK) {
            size_t m = n - i < BLOCK ? n - i : BLOCK;
            for (size_t k = 0; k < m; k++) {
                if (dtype == DT_BF16) {
                    uint32_t bits = (uint32_t)p[i + k] << 16;
                    memcpy(&buf[k], &bits, sizeof(float));
                } else {
                    buf[k] = half_to_float(p[i + k]);
                }
            }
            exact_f32(buf, m, hash_at(h, i), &e);
        }
    }
    int any = (long long)n > e.nan;           /* a value that is not NaN */
    acc->mn = any ? (double)e.mn : NAN;
    acc->mx = any ? (double)e.mx : NAN;
    acc->sum = e.sum; acc->sq = e.sq; acc->ws = e.ws;
    *nan_out = e.nan; *inf_out = e.inf;
}

static void careful(const char *base, size_t n, int dtype, hash_t h, acc_t *acc,
                    long long *nan_out, long long *inf_out) {
    if (dtype != DT_F64) {
        careful_f32(base, n, dtype, h, acc, nan_out, inf_out);
        return;
    }
    long long nan = 0, inf = 0;
    int pos_inf = 0, neg_inf = 0, any = 0;
    double mn = 0.0, mx = 0.0, sum = 0.0, sq = 0.0, ws = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = load(base, i, dtype);
        uint64_t u; memcpy(&u, &x, sizeof u);
        if ((u & F64_EXP) == F64_EXP) {
            if (u & 0x000fffffffffffffull) { nan++; continue; }
            inf++;
            if (u >> 63) neg_inf = 1; else pos_inf = 1;
            continue;
        }
        sum += x; sq += x * x; ws += x * (double)(int32_t)(h.first + (uint32_t)i * h.step);
        if (!any) { mn = mx = x; any = 1; }
        else { if (x < mn) mn = x; if (x > mx) mx = x; }
    }
    acc->mn = neg_inf ? -INFINITY : any ? mn : (pos_inf ? INFINITY : NAN);
    acc->mx = pos_inf ? INFINITY : any ? mx : (neg_inf ? -INFINITY : NAN);
    acc->sum = sum; acc->sq = sq; acc->ws = ws;
    *nan_out = nan; *inf_out = inf;
}

/* Two-way split for large buffers: a persistent worker thread (started on first use, again
 * in a forked child) summarises the second half while the caller does the first. Training
 * keeps the cores busy only inside its own kernels; a hook runs between them, when torch's
 * intra-op threads are idle, so the second core is free. A caller finding the worker busy
 * (another thread's hook) runs alone. */
/* Elements: below this, waking the worker (~30 us) costs more than it saves. Right after a
 * kernel the other core is often still held by torch's intra-op threads, which spin a while
 * before they sleep: on the bundled GPT (2 cores, 2 torch threads) splitting from 2^18 took
 * 14.7-16.0 ms of statistics per step, splitting from 2^20 13.9-14.7 ms. */
#define PAR_MIN (1u << 20)
#define PAR_ALIGN 2048u

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, busy, has_job, done;
    const char *base;
    size_t n;
    int dtype;
    hash_t hash;
    acc_t acc;
} worker_t;

static worker_t W = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0,
                     NULL, 0, 0, {0u, 0u}, {0.0, 0.0, 0.0, 0.0, 0.0, 0}};

static void *worker_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&W.mu);
    for (;;) {
        while (!W.has_job) pthread_cond_wait(&W.cv, &W.mu);
        const char *base = W.base;
        size_t n = W.n;
        int dtype = W.dtype;
        hash_t hash = W.hash;
        W.has_job = 0;
        pthread_mutex_unlock(&W.mu);
        acc_t a;
        run(base, n, dtype, hash, &a);
        pthread_mutex_lock(&W.mu);
        W.acc = a;
        W.done = 1;
        pthread_cond_broadcast(&W.cv);
    }
    return NULL;
}

/* fork: the child has no worker thread; hold the lock across fork so its state is whole */
static void fork_prepare(void) { pthread_mutex_lock(&W.mu); }
static void fork_parent(void) { pthread_mutex_unlock(&W.mu); }
static void fork_child(void) {
    pthread_mutex_init(&W.mu, NULL);
    pthread_cond_init(&W.cv, NULL);
    W.started = W.busy = W.has_job = W.done = 0;
}

/* Post the second half to the worker; 0 when it cannot take it (busy, or no thread). */
static int post_half(const char *base, size_t n, int dtype, hash_t hash) {
    pthread_mutex_lock(&W.mu);
    if (W.busy) { pthread_mutex_unlock(&W.mu); return 0; }
    if (!W.started) {
        pthread_t thread;
        pthread_attr_t attr;
        sigset_t all, old;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sigfillset(&all);                      /* signals stay with the program's threads */
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int failed = pthread_create(&thread, &attr, worker_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (failed) { pthread_mutex_unlock(&W.mu); return 0; }
        W.started = 1;
    }
    W.busy = 1; W.done = 0; W.has_job = 1;
    W.base = base; W.n = n; W.dtype = dtype; W.hash = hash;
    pthread_cond_broadcast(&W.cv);
    pthread_mutex_unlock(&W.mu);
    return 1;
}

static void take_half(acc_t *out) {
    pthread_mutex_lock(&W.mu);
    while (!W.done) pthread_cond_wait(&W.cv, &W.mu);
    *out = W.acc;
    W.done = 0; W.busy = 0;
    pthread_mutex_unlock(&W.mu);
}

static void run_split(const char *base, size_t n, int dtype, hash_t h, acc_t *acc) {
    size_t item = dtype == DT_F64 ? 8 : dtype == DT_F32 ? 4 : 2;
    size_t half = (n / 2) / PAR_ALIGN * PAR_ALIGN;
    if (n < PAR_MIN || half == 0 ||
            !post_half(base + half * item, n - half, dtype, hash_at(h, half))) {
        run(base, n, dtype, h, acc);
        return;
    }
    acc_t other;
    run(base, half, dtype, h, acc);
    take_half(&other);
    if (other.mn < acc->mn) acc->mn = other.mn;
    if (other.mx > acc->mx) acc->mx = other.mx;
    acc->sum += other.sum;
    acc->sq += other.sq;
    acc->ws += other.ws;
    acc->nonfinite += other.nonfinite;
}

/* The pass over one buffer, shared by `stats` and `row`: 0 on bad arguments (error set). */
static int summarise(PyObject *args, acc_t *acc, long long *nan, long long *inf, size_t *n_out) {
    unsigned long long address;
    Py_ssize_t count;
    int dtype;
    if (!PyArg_ParseTuple(args, "Kni", &address, &count, &dtype)) return 0;
    if (dtype < DT_F32 || dtype > DT_BF16 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "unsupported dtype code or negative count");
        return 0;
    }
    const char *base = (const char *)(uintptr_t)address;
    size_t n = (size_t)count;
    *nan = 0; *inf = 0; *n_out = n;
    hash_t h = {0u, HASH_K};                    /* a contiguous buffer: index 0, 1, 2, ... */
    Py_BEGIN_ALLOW_THREADS
    run_split(base, n, dtype, h, acc);
    if (acc->nonfinite) careful(base, n, dtype, h, acc, nan, inf);
    Py_END_ALLOW_THREADS
    return 1;
}

static PyObject *fastats_stats(PyObject *self, PyObject *args) {
    acc_t acc;
    long long nan, inf;
    size_t n;
    if (!summarise(args, &acc, &nan, &inf, &n)) return NULL;
    return Py_BuildValue("(ddddLL)", acc.mn, acc.mx, acc.sum, acc.sq, nan, inf);
}

/* pos_mean: the finite values' mean weighted by position, sum of x_i w(i) over the finite
 * values divided by their count, w(i) = 1 + (2 s(i) + 1) / 2^32 in (0, 2) (s: the index hash
 * above): weights that average 1, so a constant tensor's pos_mean is its mean (to O(1/n)), and
 * that are all different, so swapping two unequal values changes it. `ws`: sum of x_i s(i),
 * `sum`: sum of x_i, both over the finite values. */
static double pos_mean(double ws, double sum, double finite) {
    const double unit = 1.0 / 4294967296.0;
    return finite > 0 ? (sum + (2.0 * ws + sum) * unit) / finite : Py_NAN;
}

/* A record's statistics as they are stored: the mean over the finite values (NaN when there
 * are none), the norm of the finite values and their position-weighted mean, so no Python
 * arithmetic runs per tensor. */
static PyObject *fastats_row(PyObject *self, PyObject *args) {
    acc_t acc;
    long long nan, inf;
    size_t n;
    if (!summarise(args, &acc, &nan, &inf, &n)) return NULL;
    long long finite = (long long)n - nan - inf;
    double mean = finite > 0 ? acc.sum / (double)finite : Py_NAN;
    double pos = pos_mean(acc.ws, acc.sum, (double)finite);
    return Py_BuildValue("(ddddLLd)", acc.mn, acc.mx, mean, sqrt(acc.sq), nan, inf, pos);
}

/* A strided view's statistics without a contiguous copy: `layout` is its canonical (size, step,
 * logical step) triples in elements, innermost first (precdbg_pt.statistics.element_layout; the
 * logical step: how far the dimension moves the row-major index, so that each element gets the
 * weight it has in the view's contiguous copy; (size, step) pairs: pos_mean is NaN). Rows of
 * the innermost size that are contiguous (step 1), up to MAX_OUTER further dimensions walked
 * as an odometer, broadcast dimensions (step 0) among them (their copies are read again: each
 * copy has a weight of its own). Each row is one pass of `run`; a view holding NaN or Inf is
 * summarised again row by row by the exact pass. None when the layout is not of that kind, or
 * its rows are too short to be worth a pass each (the caller copies instead). */
#define MAX_OUTER 8
#define MIN_ROW 8          /* rows shorter than this, and more than MANY_ROWS of them: a */
#define MANY_ROWS 4096     /* contiguous copy is faster than a pass each */

static void fold_exact(acc_t *acc, const acc_t *row, int *any) {
    /* a row of NaN only has NaN min and max: it adds nothing to them (told through the bits:
     * the file is compiled with -ffinite-math-only) */
    uint64_t u; memcpy(&u, &row->mn, sizeof u);
    if ((u & F64_EXP) == F64_EXP && (u & 0x000fffffffffffffull)) return;
    if (!*any) { acc->mn = row->mn; acc->mx = row->mx; *any = 1; return; }
    if (row->mn < acc->mn) acc->mn = row->mn;
    if (row->mx > acc->mx) acc->mx = row->mx;
}

static void strided(const char *base, int dtype, size_t inner, uint32_t inner_logical, int outer,
                    const size_t *sizes, const size_t *steps, const uint32_t *logical,
                    acc_t *acc, long long *nan_out, long long *inf_out) {
    size_t item = dtype == DT_F64 ? 8 : dtype == DT_F32 ? 4 : 2;
    size_t index[MAX_OUTER] = {0};
    acc_init(acc);
    *nan_out = 0; *inf_out = 0;
    for (int pass = 0; pass < 2; pass++) {         /* pass 1 only when pass 0 met NaN/Inf */
        int any = 0;
        if (pass) { acc->sum = 0.0; acc->sq = 0.0; acc->ws = 0.0; acc->mn = NAN; acc->mx = NAN; }
        memset(index, 0, sizeof index);
        for (;;) {
            size_t offset = 0;
            uint32_t first = 0;              /* the row-major index of the row's first element */
            for (int d = 0; d < outer; d++) {
                offset += index[d] * steps[d];
                first += (uint32_t)index[d] * logical[d];
            }
            hash_t h = {first * HASH_K, inner_logical * HASH_K};
            const char *row = base + offset * item;
            acc_t r;
            if (!pass) {
                run(row, inner, dtype, h, &r);
                acc->sum += r.sum; acc->sq += r.sq; acc->ws += r.ws;
                acc->nonfinite += r.nonfinite;
                if (r.mn < acc->mn) acc->mn = r.mn;
                if (r.mx > acc->mx) acc->mx = r.mx;
            } else {
                long long nan = 0, inf = 0;
                careful(row, inner, dtype, h, &r, &nan, &inf);
                acc->sum += r.sum; acc->sq += r.sq; acc->ws += r.ws;
                *nan_out += nan; *inf_out += inf;
                fold_exact(acc, &r, &any);
            }
            int d = 0;
            while (d < outer && ++index[d] == sizes[d]) { index[d] = 0; d++; }
            if (d == outer) break;
        }
        if (!pass && !acc->nonfinite) return;
    }
}

static PyObject *fastats_row_layout(PyObject *self, PyObject *args) {
    unsigned long long address;
    int dtype;
    PyObject *layout;
    if (!PyArg_ParseTuple(args, "KiO!", &address, &dtype, &PyTuple_Type, &layout)) return NULL;
    if (dtype < DT_F32 || dtype > DT_BF16) {
        PyErr_SetString(PyExc_ValueError, "unsupported dtype code");
        return NULL;
    }
    Py_ssize_t dims = PyTuple_GET_SIZE(layout);
    size_t inner = 1, sizes[MAX_OUTER], steps[MAX_OUTER];
    uint32_t logical[MAX_OUTER], inner_logical = 0;
    int outer = 0, have_inner = 0, ordered = 1;
    double n = 1.0;                               /* elements of the view */
    for (Py_ssize_t i = 0; i < dims; i++) {
        PyObject *pair = PyTuple_GET_ITEM(layout, i);
        long long size, step, lstep = -1;
        if (!PyTuple_Check(pair) || !PyArg_ParseTuple(pair, "LL|L", &size, &step, &lstep)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "layout: a tuple of (size, step, logical step) triples");
            return NULL;
        }
        if (size < 0 || step < 0) Py_RETURN_NONE;
        if (size == 0) Py_RETURN_NONE;
        if (lstep < 0) { ordered = 0; lstep = 0; }
        n *= (double)size;
        if (step != 0 && !have_inner) {
            if (step != 1) Py_RETURN_NONE;        /* no contiguous rows: the caller copies */
            inner = (size_t)size; inner_logical = (uint32_t)lstep; have_inner = 1;
            continue;
        }
        if (outer == MAX_OUTER) Py_RETURN_NONE;
        sizes[outer] = (size_t)size; steps[outer] = (size_t)step;
        logical[outer] = (uint32_t)lstep; outer++;
    }
    if (inner < MIN_ROW && n > (double)inner * MANY_ROWS) Py_RETURN_NONE;
    acc_t acc;
    long long nan = 0, inf = 0;
    Py_BEGIN_ALLOW_THREADS
    strided((const char *)(uintptr_t)address, dtype, inner, inner_logical, outer, sizes, steps,
            logical, &acc, &nan, &inf);
    Py_END_ALLOW_THREADS
    double finite = n - (double)nan - (double)inf;
    double mean = finite > 0 ? acc.sum / finite : Py_NAN;
    double pos = ordered ? pos_mean(acc.ws, acc.sum, finite) : Py_NAN;
    return Py_BuildValue("(ddddLLd)", acc.mn, acc.mx, mean, sqrt(acc.sq), nan, inf, pos);
}

static const char *const SIMD_NAMES[] = {"plain", "avx2", "avx512"};

static PyObject *fastats_simd(PyObject *self, PyObject *args) {
    int cap = -1;
    if (!PyArg_ParseTuple(args, "|i", &cap)) return NULL;
    if (cap >= 0) {
        int best = simd_best();
        simd_level = cap < best ? cap : best;
    }
    return PyUnicode_FromString(SIMD_NAMES[simd()]);
}

static PyMethodDef methods[] = {
    {"simd", fastats_simd, METH_VARARGS,
     "simd([cap]) -> the float32 pass in use: 'avx512', 'avx2' or 'plain'; with `cap` "
     "(0 plain, 1 AVX2, 2 AVX-512) use at most that one, as far as the CPU has it (tests)"},
    {"stats", fastats_stats, METH_VARARGS,
     "stats(address, count, dtype_code) -> (min, max, sum_finite, sumsq_finite, "
     "nan_count, inf_count); dtype codes: 0 float32, 1 float64, 2 float16, 3 bfloat16"},
    {"row", fastats_row, METH_VARARGS,
     "row(address, count, dtype_code) -> (min, max, mean_finite, norm_finite, nan_count, "
     "inf_count, pos_mean): the statistics a record stores; dtype codes as for stats()"},
    {"row_layout", fastats_row_layout, METH_VARARGS,
     "row_layout(address, dtype_code, layout) -> row() of a strided view, or None when its "
     "layout ((size, step, logical step) triples in elements, innermost first) has no "
     "contiguous rows (or rows too short)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastats",
                                    "One-pass tensor statistics on host memory.", -1, methods};

PyMODINIT_FUNC PyInit__fastats(void) {
    static int registered = 0;
    if (!registered) {
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        registered = 1;
    }
    return PyModule_Create(&module);
}
