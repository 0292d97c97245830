// Batch-invariant kernels: every output row is computed by the same instruction sequence
// whatever the number of rows in the call and whatever the other rows hold, so a row scored
// in a K-token verify pass gets exactly the bits of a 1-token pass (exact mode by construction,
// no probing of another library's kernels). Compiled on the user's machine (build.py); AVX2 + FMA.
//
// Products: y[m, n] = sum_k x[m, k] * w[n, k], x in float32 or bfloat16 (converted to float32,
// exactly), w in bfloat16 / float32 / int8 (one scale per output row). Each (m, n) keeps one
// 8-lane float32 accumulator: lane j sums k = 8i + j in increasing i (one FMA each), then the
// lanes are added in a fixed tree and the K % 8 tail after them in order; then the scale, the bias
// and one rounding to y's dtype. Tiles of R rows x C columns only decide which accumulators share
// a register file.
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

// A result's one rounding to the output dtype: float32 as it is, bfloat16 to nearest even
// (PyTorch's conversion), NaN kept a quiet NaN.
inline void store(float* y, float v) { *y = v; }
inline void store(uint16_t* y, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    *y = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// What follows a product's sum, in this order for every row: times the weight row's scale
// (int8), plus the bias, one rounding.
struct Epilogue {
    const float* scale;
    const float* bias;
    inline float apply(float s, int64_t n) const {
        if (scale) s *= scale[n];
        if (bias) s += bias[n];
        return s;
    }
};

// R rows x C columns of y, starting at x (row stride ldx) and w's column n0 (row stride K)
template <class W, int R, int C, class Y>
inline void tile(const float* x, int64_t ldx, const typename W::T* w, int64_t K, Y* y, int64_t ldy,
                 const Epilogue& e, int64_t n0) {
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
            store(y + r * ldy + c, e.apply(s, n0 + c));
        }
}

template <class W, int R, class Y>
inline void rows_block(const float* x, int64_t ldx, const typename W::T* w, int64_t K, Y* y, int64_t ldy,
                       int64_t n0, int64_t n1, const Epilogue& e) {
    constexpr int C = R == 1 ? 8 : R == 2 ? 5 : 3;  // R x C accumulators within 16 registers (measured)
    int64_t n = n0;
    for (; n + C <= n1; n += C) tile<W, R, C>(x, ldx, w + n * K, K, y + n, ldy, e, n);
    for (; n < n1; ++n) tile<W, R, 1>(x, ldx, w + n * K, K, y + n, ldy, e, n);
}

// Column blocks of NB outputs are the parallel work items; within one, all rows go through
// its weights (read from memory once, from cache for the later rows).
constexpr int64_t NB = 32;

// x [M, K] float32 or bfloat16 (converted once to float32: exact), y [M, N] float32 or bfloat16
template <class W, class Y>
void linear(const void* x_in, bool x_bf16, const typename W::T* w, Epilogue e, Y* y, int64_t M, int64_t N,
            int64_t K) {
    std::vector<float> converted;
    const float* x = static_cast<const float*>(x_in);
    if (x_bf16) {
        converted.resize(M * K);
        const uint16_t* xb = static_cast<const uint16_t*>(x_in);
        for (int64_t i = 0; i < M * K; ++i) converted[i] = Bf16::one(xb + i);
        x = converted.data();
    }
    const int64_t blocks = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * NB, n1 = std::min(N, n0 + NB);
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) rows_block<W, 4>(x + m * K, K, w, K, y + m * N, N, n0, n1, e);
        switch (M - m) {
            case 3: rows_block<W, 3>(x + m * K, K, w, K, y + m * N, N, n0, n1, e); break;
            case 2: rows_block<W, 2>(x + m * K, K, w, K, y + m * N, N, n0, n1, e); break;
            case 1: rows_block<W, 1>(x + m * K, K, w, K, y + m * N, N, n0, n1, e); break;
            default: break;
        }
    }
}

template <class W>
void linear_any(const void* x, int x_bf16, const void* w, const float* scale, const float* bias, void* y,
                int y_bf16, int64_t M, int64_t N, int64_t K) {
    const Epilogue e{scale, bias};
    const typename W::T* wt = static_cast<const typename W::T*>(w);
    if (y_bf16)
        linear<W>(x, x_bf16 != 0, wt, e, static_cast<uint16_t*>(y), M, N, K);
    else
        linear<W>(x, x_bf16 != 0, wt, e, static_cast<float*>(y), M, N, K);
}

// Grouped weights (GGUF's block formats unpacked, models/gguf_blocks.py): weight
// w[n, k] = q[n, k] * scale[n, g] (+ offset[n, g]) for k in group g = k / G, q stored as int8, or
// (NIB) as unsigned 4-bit values, two a byte: a group of 32 is 16 bytes, byte j holding q[j] in
// its low nibble and q[j + 16] in its high one. Each column's group is dequantized once into a
// small float buffer (one multiply, or one FMA with an offset: the same for every row of the
// call), which then enters the same per-output 8-lane FMA chain as the products above.
template <int G, bool OFF, bool NIB>
inline void dequant_group(const uint8_t* q, float s, float o, float* out) {
    const __m256 sv = _mm256_set1_ps(s), ov = _mm256_set1_ps(o);
    __m256i v[G / 8];
    if (NIB) {
        static_assert(!NIB || G == 32, "4-bit groups hold 32 values");
        const __m128i bytes = _mm_loadu_si128((const __m128i*)q), mask = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_and_si128(bytes, mask), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
        v[0] = _mm256_cvtepu8_epi32(lo);
        v[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
        v[2] = _mm256_cvtepu8_epi32(hi);
        v[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
    } else {
        for (int i = 0; i < G / 8; ++i) v[i] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + 8 * i)));
    }
    for (int i = 0; i < G / 8; ++i) {
        const __m256 f = _mm256_cvtepi32_ps(v[i]);
        _mm256_store_ps(out + 8 * i, OFF ? _mm256_fmadd_ps(f, sv, ov) : _mm256_mul_ps(f, sv));
    }
}

template <int G, bool OFF, bool NIB, int R, int C, class Y>
inline void gtile(const float* x, int64_t ldx, const uint8_t* w, int64_t ldw, const float* sc, const float* off,
                  int64_t K, Y* y, int64_t ldy, const float* bias, int64_t n0) {
    const int64_t KG = K / G, GB = NIB ? G / 2 : G;  // bytes of a group
    alignas(32) float buf[C][G];
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t g = 0; g < KG; ++g) {
        if ((g * GB) % 64 == 0)  // the next tile's rows, a tile ahead: short rows defeat the hardware prefetcher
            for (int c = 0; c < C; ++c) _mm_prefetch((const char*)(w + (c + C) * ldw + g * GB), _MM_HINT_T0);
        for (int c = 0; c < C; ++c)
            dequant_group<G, OFF, NIB>(w + c * ldw + g * GB, sc[c * KG + g], OFF ? off[c * KG + g] : 0.f, buf[c]);
        for (int i = 0; i < G; i += 8)
            for (int r = 0; r < R; ++r) {
                const __m256 xv = _mm256_loadu_ps(x + r * ldx + g * G + i);
                for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, _mm256_load_ps(buf[c] + i), acc[r][c]);
            }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float v = hsum(acc[r][c]);
            if (bias) v += bias[n0 + c];
            store(y + r * ldy + c, v);
        }
}

template <int G, bool OFF, bool NIB, int R, class Y>
inline void grows_block(const float* x, int64_t ldx, const uint8_t* w, const float* sc, const float* off, int64_t K,
                        Y* y, int64_t ldy, int64_t n0, int64_t n1, const float* bias) {
    constexpr int C = R <= 2 ? 4 : 3;  // measured: 2-8 columns a tile time alike here
    const int64_t KG = K / G, ldw = NIB ? K / 2 : K;
    int64_t n = n0;
    for (; n + C <= n1; n += C)
        gtile<G, OFF, NIB, R, C>(x, ldx, w + n * ldw, ldw, sc + n * KG, OFF ? off + n * KG : nullptr, K, y + n, ldy,
                                 bias, n);
    for (; n < n1; ++n)
        gtile<G, OFF, NIB, R, 1>(x, ldx, w + n * ldw, ldw, sc + n * KG, OFF ? off + n * KG : nullptr, K, y + n, ldy,
                                 bias, n);
}

// x [M, K] (float32 or bfloat16), y rows of stride ldy (a fused projection's part writes its
// columns of the whole output)
template <int G, bool OFF, bool NIB, class Y>
void glinear(const void* x_in, bool x_bf16, const uint8_t* w, const float* sc, const float* off, const float* bias,
             Y* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    std::vector<float> converted;
    const float* x = static_cast<const float*>(x_in);
    if (x_bf16) {
        converted.resize(M * K);
        const uint16_t* xb = static_cast<const uint16_t*>(x_in);
        for (int64_t i = 0; i < M * K; ++i) converted[i] = Bf16::one(xb + i);
        x = converted.data();
    }
    const int64_t blocks = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * NB, n1 = std::min(N, n0 + NB);
        int64_t m = 0;
        for (; m + 4 <= M; m += 4)
            grows_block<G, OFF, NIB, 4>(x + m * K, K, w, sc, off, K, y + m * ldy, ldy, n0, n1, bias);
        switch (M - m) {
            case 3: grows_block<G, OFF, NIB, 3>(x + m * K, K, w, sc, off, K, y + m * ldy, ldy, n0, n1, bias); break;
            case 2: grows_block<G, OFF, NIB, 2>(x + m * K, K, w, sc, off, K, y + m * ldy, ldy, n0, n1, bias); break;
            case 1: grows_block<G, OFF, NIB, 1>(x + m * K, K, w, sc, off, K, y + m * ldy, ldy, n0, n1, bias); break;
            default: break;
        }
    }
}

template <class Y>
int glinear_any(const void* x, bool x_bf16, const uint8_t* w, int bits, const float* sc, const float* off,
                int64_t G, const float* bias, Y* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    if (K % G) return 1;
    if (bits == 4 && G == 32) {
        if (off) glinear<32, true, true>(x, x_bf16, w, sc, off, bias, y, ldy, M, N, K);
        else glinear<32, false, true>(x, x_bf16, w, sc, off, bias, y, ldy, M, N, K);
        return 0;
    }
    if (bits != 8) return 1;
    switch (G * 2 + (off != nullptr)) {
        case 32: glinear<16, false, false>(x, x_bf16, w, sc, off, bias, y, ldy, M, N, K); return 0;
        case 33: glinear<16, true, false>(x, x_bf16, w, sc, off, bias, y, ldy, M, N, K); return 0;
        case 64: glinear<32, false, false>(x, x_bf16, w, sc, off, bias, y, ldy, M, N, K); return 0;
        case 65: glinear<32, true, false>(x, x_bf16, w, sc, off, bias, y, ldy, M, N, K); return 0;
        default: return 1;
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

// q . k[i] for G keys at once (independent FMA chains hide their latency); each key's sum is
// the same instruction sequence whatever G is and whichever keys share the call.
template <class W, int G>
inline void dots(const float* q, const typename W::T* const* k, int64_t hd, float* out) {
    __m256 acc[G];
    for (int i = 0; i < G; ++i) acc[i] = _mm256_setzero_ps();
    const int64_t h8 = hd & ~int64_t(7);
    for (int64_t d = 0; d < h8; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int i = 0; i < G; ++i) acc[i] = _mm256_fmadd_ps(qv, W::load(k[i] + d), acc[i]);
    }
    for (int i = 0; i < G; ++i) {
        float s = hsum(acc[i]);
        for (int64_t d = h8; d < hd; ++d) s = fmaf(q[d], W::one(k[i] + d), s);
        out[i] = s;
    }
}

// q [rows, nh, hd] float32; row r reads the sequence at k + base[r] (v + base[r]) with
// position p's head g at p * pos_stride + g * head_stride; its keys are positions
// index[start[r] .. start[r] + count[r]) when index is given, else 0 .. count[r]. out [rows, nh, hd].
template <class W, class Y>
void attend(const float* q, const typename W::T* k, const typename W::T* v, const int64_t* base,
            const int64_t* count, const int64_t* start, const int64_t* index, Y* out,
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
            Y* o = out + item * hd;
            if (n == 0) { for (int64_t d = 0; d < hd; ++d) store(o + d, 0.f); continue; }
            const typename W::T* kg = k + base[r] + g * head_stride;
            const typename W::T* vg = v + base[r] + g * head_stride;
            const int64_t* at = index ? index + start[r] : nullptr;
            const int64_t n8 = (n + 7) & ~int64_t(7);
            scores.resize(n8);
            float m = -INFINITY;
            constexpr int G = 4;
            const typename W::T* keys[G];
            int64_t j = 0;
            for (; j + G <= n; j += G) {
                for (int i = 0; i < G; ++i) keys[i] = kg + (at ? at[j + i] : j + i) * pos_stride;
                dots<W, G>(qh, keys, hd, &scores[j]);
            }
            for (; j < n; ++j) {
                keys[0] = kg + (at ? at[j] : j) * pos_stride;
                dots<W, 1>(qh, keys, hd, &scores[j]);
            }
            for (j = 0; j < n; ++j) {
                scores[j] *= scale;
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
            for (int64_t d = 0; d < hd; ++d) store(o + d, acc[d] * inv);
        }
    }
}

}  // namespace

extern "C" {

int specdec_kernels_version() { return 3; }

// y = x @ w.T (times scale, plus bias: both optional, float32 [N]); x and y float32 or bfloat16
void linear_bf16(const void* x, int x_bf16, const uint16_t* w, const float* bias, void* y, int y_bf16,
                 int64_t M, int64_t N, int64_t K) {
    linear_any<Bf16>(x, x_bf16, w, nullptr, bias, y, y_bf16, M, N, K);
}
void linear_f32(const void* x, int x_bf16, const float* w, const float* bias, void* y, int y_bf16,
                int64_t M, int64_t N, int64_t K) {
    linear_any<F32>(x, x_bf16, w, nullptr, bias, y, y_bf16, M, N, K);
}
void linear_i8(const void* x, int x_bf16, const int8_t* w, const float* scale, const float* bias, void* y,
               int y_bf16, int64_t M, int64_t N, int64_t K) {
    linear_any<I8>(x, x_bf16, w, scale, bias, y, y_bf16, M, N, K);
}

// y[:, :N] (row stride ldy) = x @ (q * scale (+ offset)).T (+ bias), groups of G inputs; q int8
// [N, K] (bits 8, G 16 or 32) or 4-bit [N, K / 2] (bits 4, G 32); scale, offset [N, K / G]
// float32 (offset may be null). Returns 1 for a layout it lacks.
int linear_grouped(const void* x, int x_bf16, const void* q, int bits, const float* scale, const float* offset,
                   int64_t G, const float* bias, void* y, int y_bf16, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const uint8_t* w = static_cast<const uint8_t*>(q);
    if (y_bf16)
        return glinear_any(x, x_bf16 != 0, w, bits, scale, offset, G, bias, static_cast<uint16_t*>(y), ldy, M, N, K);
    return glinear_any(x, x_bf16 != 0, w, bits, scale, offset, G, bias, static_cast<float*>(y), ldy, M, N, K);
}

// caches in bfloat16 or float32; out float32 or bfloat16 (out_bf16)
#define ATTEND(NAME, W, CACHE)                                                                              \
    void NAME(const float* q, const CACHE* k, const CACHE* v, const int64_t* base, const int64_t* count,    \
              const int64_t* start, const int64_t* index, void* out, int out_bf16, int64_t rows, int64_t nh, \
              int64_t nkv, int64_t hd, int64_t pos_stride, int64_t head_stride, float scale) {              \
        if (out_bf16)                                                                                       \
            attend<W>(q, k, v, base, count, start, index, static_cast<uint16_t*>(out), rows, nh, nkv, hd,   \
                      pos_stride, head_stride, scale);                                                      \
        else                                                                                                \
            attend<W>(q, k, v, base, count, start, index, static_cast<float*>(out), rows, nh, nkv, hd,      \
                      pos_stride, head_stride, scale);                                                      \
    }
ATTEND(attend_bf16, Bf16, uint16_t)
ATTEND(attend_f32, F32, float)

}  // extern "C"
