// Batch-invariant kernels: every output row is computed by the same instruction sequence
// whatever the number of rows in the call and whatever the other rows hold, so a row scored
// in a K-token verify pass gets exactly the bits of a 1-token pass (exact mode by construction,
// no probing of another library's kernels). Compiled on the user's machine (build.py); AVX2 + FMA.
//
// Products: y[m, n] = sum_k x[m, k] * w[n, k], x in float32, w in bfloat16 / float32 / int8 (one
// scale per output row). Each (m, n) keeps one 8-lane accumulator: lane j sums k = 8i + j in
// increasing i (one FMA each), then the lanes are added in a fixed tree and the K % 8 tail after
// them in order. Tiles of R rows x C columns only decide which accumulators share a register file.
//
// Attention: per query row and head, scores over exactly the row's keys (given as a count or a
// list of cache positions, in cache order), softmax and the weighted sum of values, with sums in
// the same fixed lane order; nothing depends on the other rows of the call.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

namespace {

inline float hsum(__m256 v) {  // fixed order: (lanes 0-3 + 4-7), then pairs, then the last two
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

struct Bf16 {
    using T = uint16_t;
    static inline __m256 load(const T* p) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
    }
    static inline float one(const T* p) { uint32_t b = uint32_t(*p) << 16; float f; memcpy(&f, &b, 4); return f; }
};
struct F32 {
    using T = float;
    static inline __m256 load(const T* p) { return _mm256_loadu_ps(p); }
    static inline float one(const T* p) { return *p; }
};
struct I8 {
    using T = int8_t;
    static inline __m256 load(const T* p) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
    }
    static inline float one(const T* p) { return float(*p); }
};

// R rows x C columns of y, starting at x (row stride ldx) and w's column n0 (row stride K)
template <class W, int R, int C>
inline void tile(const float* x, int64_t ldx, const typename W::T* w, int64_t K, float* y, int64_t ldy) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const int64_t K8 = K & ~int64_t(7);
    for (int64_t k = 0; k < K8; k += 8) {
        __m256 wv[C];
        for (int c = 0; c < C; ++c) wv[c] = W::load(w + c * K + k);
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
            for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float s = hsum(acc[r][c]);
            for (int64_t k = K8; k < K; ++k) s = fmaf(x[r * ldx + k], W::one(w + c * K + k), s);
            y[r * ldy + c] = s;
        }
}

template <class W, int R>
inline void rows_block(const float* x, int64_t ldx, const typename W::T* w, int64_t K, float* y, int64_t ldy,
                       int64_t n0, int64_t n1) {
    constexpr int C = R == 1 ? 8 : R == 2 ? 5 : 3;  // R x C accumulators within 16 registers (measured)
    int64_t n = n0;
    for (; n + C <= n1; n += C) tile<W, R, C>(x, ldx, w + n * K, K, y + n, ldy);
    for (; n < n1; ++n) tile<W, R, 1>(x, ldx, w + n * K, K, y + n, ldy);
}

// Column blocks of NB outputs are the parallel work items; within one, all rows go through
// its weights (read from memory once, from cache for the later rows).
constexpr int64_t NB = 32;

template <class W>
void linear(const float* x, const typename W::T* w, const float* scale, float* y, int64_t M, int64_t N, int64_t K) {
    const int64_t blocks = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * NB, n1 = std::min(N, n0 + NB);
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) rows_block<W, 4>(x + m * K, K, w, K, y + m * N, N, n0, n1);
        switch (M - m) {
            case 3: rows_block<W, 3>(x + m * K, K, w, K, y + m * N, N, n0, n1); break;
            case 2: rows_block<W, 2>(x + m * K, K, w, K, y + m * N, N, n0, n1); break;
            case 1: rows_block<W, 1>(x + m * K, K, w, K, y + m * N, N, n0, n1); break;
            default: break;
        }
        if (scale)
            for (int64_t r = 0; r < M; ++r)
                for (int64_t n = n0; n < n1; ++n) y[r * N + n] *= scale[n];
    }
}

// exp on 8 lanes: Cephes' range reduction and degree-6 polynomial (~1 ulp on [-87, 0]);
// -inf and anything below -87 give 0.
inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

template <class W>
inline float dot(const float* q, const typename W::T* k, int64_t hd) {
    __m256 acc = _mm256_setzero_ps();
    const int64_t h8 = hd & ~int64_t(7);
    for (int64_t d = 0; d < h8; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), W::load(k + d), acc);
    float s = hsum(acc);
    for (int64_t d = h8; d < hd; ++d) s = fmaf(q[d], W::one(k + d), s);
    return s;
}

// q [rows, nh, hd] float32; row r reads the sequence at k + base[r] (v + base[r]) with
// position p's head g at p * pos_stride + g * head_stride; its keys are positions
// index[start[r] .. start[r] + count[r]) when index is given, else 0 .. count[r]. out [rows, nh, hd].
template <class W>
void attend(const float* q, const typename W::T* k, const typename W::T* v, const int64_t* base,
            const int64_t* count, const int64_t* start, const int64_t* index, float* out,
            int64_t rows, int64_t nh, int64_t nkv, int64_t hd, int64_t pos_stride, int64_t head_stride,
            float scale) {
    const int64_t group = nh / nkv;
    #pragma omp parallel
    {
        std::vector<float> scores, acc(hd);
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < rows * nh; ++item) {
            const int64_t r = item / nh, h = item % nh, g = h / group, n = count[r];
            const float* qh = q + item * hd;
            float* o = out + item * hd;
            if (n == 0) { std::fill(o, o + hd, 0.f); continue; }
            const typename W::T* kg = k + base[r] + g * head_stride;
            const typename W::T* vg = v + base[r] + g * head_stride;
            const int64_t* at = index ? index + start[r] : nullptr;
            const int64_t n8 = (n + 7) & ~int64_t(7);
            scores.resize(n8);
            float m = -INFINITY;
            for (int64_t j = 0; j < n; ++j) {
                const int64_t p = at ? at[j] : j;
                scores[j] = dot<W>(qh, kg + p * pos_stride, hd) * scale;
                m = std::max(m, scores[j]);
            }
            for (int64_t j = n; j < n8; ++j) scores[j] = -INFINITY;
            const __m256 mv = _mm256_set1_ps(m);
            __m256 sum = _mm256_setzero_ps();
            for (int64_t j = 0; j < n8; j += 8) {
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(&scores[j]), mv));
                _mm256_storeu_ps(&scores[j], e);
                sum = _mm256_add_ps(sum, e);
            }
            const float inv = 1.0f / hsum(sum);
            std::fill(acc.begin(), acc.end(), 0.f);
            const int64_t h8 = hd & ~int64_t(7);
            for (int64_t j = 0; j < n; ++j) {
                const typename W::T* vj = vg + (at ? at[j] : j) * pos_stride;
                const __m256 pj = _mm256_set1_ps(scores[j]);
                for (int64_t d = 0; d < h8; d += 8)
                    _mm256_storeu_ps(&acc[d], _mm256_fmadd_ps(pj, W::load(vj + d), _mm256_loadu_ps(&acc[d])));
                for (int64_t d = h8; d < hd; ++d) acc[d] = fmaf(scores[j], W::one(vj + d), acc[d]);
            }
            for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
        }
    }
}

}  // namespace

extern "C" {

int specdec_kernels_version() { return 1; }

void linear_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K) {
    linear<Bf16>(x, w, nullptr, y, M, N, K);
}
void linear_f32(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K) {
    linear<F32>(x, w, nullptr, y, M, N, K);
}
void linear_i8(const float* x, const int8_t* w, const float* scale, float* y, int64_t M, int64_t N, int64_t K) {
    linear<I8>(x, w, scale, y, M, N, K);
}

void attend_bf16(const float* q, const uint16_t* k, const uint16_t* v, const int64_t* base, const int64_t* count,
                 const int64_t* start, const int64_t* index, float* out, int64_t rows, int64_t nh, int64_t nkv,
                 int64_t hd, int64_t pos_stride, int64_t head_stride, float scale) {
    attend<Bf16>(q, k, v, base, count, start, index, out, rows, nh, nkv, hd, pos_stride, head_stride, scale);
}
void attend_f32(const float* q, const float* k, const float* v, const int64_t* base, const int64_t* count,
                const int64_t* start, const int64_t* index, float* out, int64_t rows, int64_t nh, int64_t nkv,
                int64_t hd, int64_t pos_stride, int64_t head_stride, float scale) {
    attend<F32>(q, k, v, base, count, start, index, out, rows, nh, nkv, hd, pos_stride, head_stride, scale);
}

}  // extern "C"
