// Batch-invariant kernels: every output row is computed by the same instruction sequence
// whatever the number of rows in the call and whatever the other rows hold, so a row scored
// in a K-token verify pass gets exactly the bits of a 1-token pass (exact mode by construction,
// no probing of another library's kernels). Compiled on the user's machine (build.py); AVX2 + FMA,
// AMX tiles or AVX-512 BF16 dot products for bfloat16 products and AVX-512 VNNI for grouped weights
// where the CPU has them and they measured faster (see amx_linear, dp_linear, vnni_glinear).
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
// the same fixed lane order; nothing depends on the other rows of the call. The rows of one
// sequence and the query heads of one kv head only share the (exact) float32 conversion of the
// keys and values each reads from position 0 on (a causal prefill's rows: each its own prefix).
// Three instruction sequences (attention_kernel, chosen once a machine by timing): 8 lanes as above,
// or 16 (AVX-512) with sixteen keys' lane sums added in one fixed tree (dots16) and each row's
// weighted values in two chains by key parity (weigh_lanes16), or AVX-512 BF16 dot products on the
// bfloat16 cache (attend_pairs: the query and the weights rounded to bfloat16 once, as a bfloat16
// model's attention rounds them).
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

// Threads: the kernels are written for a team (OpenMP worksharing without a parallel region of their
// own: `omp for` shares a loop among the threads of the enclosing region, or runs it whole on the
// one thread where there is none). A whole decoder stack runs in one region (stack_forward), its
// steps separated by the worksharing loops' barriers (0.2 us a bare barrier, 0.5 us a two-iteration
// loop, on a 2-core EPYC Zen 5) instead of a region each (~1.2 us to start and end a loop's region;
// ~240 a pass of 8 tokens on SmolLM2), and the steps that ran on one thread while the others waited
// (rope, residual adds, rounding x to 8 bits) split among them. The products' loops end without a barrier (nowait): project() waits once for all the parts
// of a fused projection. The C entry points open a region around one kernel. Who computes what never
// changes a bit: every row's arithmetic is the same on any thread. (Measured, SmolLM2 in one process
// against the build before, AMD EPYC Zen 5, 2 threads: int4 1- / 8-token passes 2.71 / 4.78 -> 2.56 /
// 4.68 ms, bfloat16 6.02 / 7.74 -> 5.94 / 7.57 ms; the same bits: scripts/stack_ab.py.)

// One object the whole team reads: made by one thread, its pointer handed to the others
template <class T>
inline std::shared_ptr<T> team_object() {
    std::shared_ptr<T> p;
    #pragma omp single copyprivate(p)
    p = std::make_shared<T>();
    return p;
}

// Per-row data the team reads (size(T&) then row(T&, m) for each row): each thread makes its own
// copy where the work is small or one row (no barrier to wait at), else one copy split by rows
constexpr int64_t PRIVATE_ROW_WORK = 4096;
template <class T, class Size, class Row>
inline std::shared_ptr<const T> team_rows(int64_t M, int64_t work, const Size& size, const Row& row) {
    if (M == 1 || work <= PRIVATE_ROW_WORK || omp_get_num_threads() == 1) {
        auto own = std::make_shared<T>();
        size(*own);
        for (int64_t m = 0; m < M; ++m) row(*own, m);
        return own;
    }
    std::shared_ptr<T> shared = team_object<T>();
    #pragma omp single
    size(*shared);
    #pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) row(*shared, m);
    return shared;
}

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

// 8 values at once, bit for bit what value() and store() give one at a time
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return Bf16::load(p); }
inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
inline __m256i bf16_bits8(__m256 v) {  // store()'s rounding on 8 lanes, as 32-bit lanes holding 16 bits
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
}
inline void store8(uint16_t* y, __m256 v) {
    const __m256i r = bf16_bits8(v);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i*)y, packed);
}
inline __m256 rounded8(__m256 v, float*) { return v; }
inline __m256 rounded8(__m256 v, uint16_t*) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(v), 16)); }

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

// Where tile() asks for the next tile's weights: 0 into L1, 1 into L2 only (set_tile_prefetch, chosen
// by timing where the bfloat16 products run here: variants.py). AMD EPYC Zen 4 made to run them, 2
// threads, SmolLM2's layer stack (scripts/stack_ab.py): 1 / 4 / 8-token passes 0.86-0.87 / 0.99-1.01 /
// 1.01x the time. Only speed differs, never a bit.
int tile_prefetch = 0;

// R rows x C columns of y, starting at x (row stride ldx) and w's column n0 (row stride K)
template <class W, int R, int C, class Y>
inline void tile(const float* x, int64_t ldx, const typename W::T* w, int64_t K, Y* y, int64_t ldy,
                 const Epilogue& e, int64_t n0) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const int64_t K8 = K & ~int64_t(7);
    // The next tile's weights follow this one's in memory (C rows of w): their cache lines are
    // asked for while this tile runs, C * 8 weights' worth a step, so that the short, interleaved
    // column streams (K of a few hundred) do not wait on memory each time a tile starts.
    const char* next = reinterpret_cast<const char*>(w + C * K);
    constexpr int64_t STEP = C * 8 * sizeof(typename W::T);
    auto sums = [&](auto hint) __attribute__((always_inline)) {  // the level a compile-time constant
        for (int64_t k = 0; k < K8; k += 8) {
            for (int64_t b = 0; b < STEP; b += 64) _mm_prefetch(next + k / 8 * STEP + b, decltype(hint)::value);
            __m256 wv[C];
            for (int c = 0; c < C; ++c) wv[c] = W::load(w + c * K + k);
            for (int r = 0; r < R; ++r) {
                const __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
                for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
            }
        }
    };
    if (tile_prefetch == 1)
        sums(std::integral_constant<_mm_hint, _MM_HINT_T1>());
    else
        sums(std::integral_constant<_mm_hint, _MM_HINT_T0>());
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float s = hsum(acc[r][c]);
            for (int64_t k = K8; k < K; ++k) s = fmaf(x[r * ldx + k], W::one(w + c * K + k), s);
            store(y + r * ldy + c, e.apply(s, n0 + c));
        }
}

// The loops the product kernels share: a column block's rows [0, M) as 4-row tiles and a tail
// of 3, 2 or 1 (rows(R, m): R rows from row m, R a std::integral_constant), and its columns
// [n0, n1) as tiles of C and single columns (columns(C, n)). Inlined whole, lambdas included:
// left to the compiler, tile()'s 4-8-row products ran 9-13% slower (bench/results/loops_stop62.txt)
template <class Rows>
__attribute__((always_inline)) inline void by_row_tiles(int64_t M, const Rows& rows) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows(std::integral_constant<int, 4>(), m);
    switch (M - m) {
        case 3: rows(std::integral_constant<int, 3>(), m); break;
        case 2: rows(std::integral_constant<int, 2>(), m); break;
        case 1: rows(std::integral_constant<int, 1>(), m); break;
        default: break;
    }
}
template <int C, class Columns>
__attribute__((always_inline)) inline void by_column_tiles(int64_t n0, int64_t n1, const Columns& columns) {
    int64_t n = n0;
    for (; n + C <= n1; n += C) columns(std::integral_constant<int, C>(), n);
    for (; n < n1; ++n) columns(std::integral_constant<int, 1>(), n);
}

// Past the rows a block's two halves hold in registers together (the columns layout's AVX2 kernels): a half
// at a time, its rows in tiles of up to 8 (rows(R, m0, h): R rows from m0 of half h, R a std::integral_constant)
template <class Rows>
__attribute__((always_inline)) inline void by_half_tiles(int64_t M, const Rows& rows) {
    for (int h = 0; h < 2; ++h)
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            switch (std::min<int64_t>(M - m0, 8)) {
                case 8: rows(std::integral_constant<int, 8>(), m0, h); break;
                case 7: rows(std::integral_constant<int, 7>(), m0, h); break;
                case 6: rows(std::integral_constant<int, 6>(), m0, h); break;
                case 5: rows(std::integral_constant<int, 5>(), m0, h); break;
                case 4: rows(std::integral_constant<int, 4>(), m0, h); break;
                case 3: rows(std::integral_constant<int, 3>(), m0, h); break;
                case 2: rows(std::integral_constant<int, 2>(), m0, h); break;
                default: rows(std::integral_constant<int, 1>(), m0, h); break;
            }
        }
}

// Rows in tiles of 3 (the last of 2 or 4) for the kernels with a block's both halves and the rows inner
// (rows(R, m0): R rows from m0, R a std::integral_constant), which take 2 to INNER_MAX_ROWS rows (past it a
// half at a time was as fast; measured in avx2_inner_rows' comment)
constexpr int64_t INNER_MAX_ROWS = 6;
template <class Rows>
__attribute__((always_inline)) inline void by_inner_tiles(int64_t M, const Rows& rows) {
    int64_t m0 = 0;
    for (; M - m0 > 4 || M - m0 == 3; m0 += 3) rows(std::integral_constant<int, 3>(), m0);
    if (M - m0 == 4) rows(std::integral_constant<int, 4>(), m0);
    else if (M - m0 == 2) rows(std::integral_constant<int, 2>(), m0);
}

template <class W, int R, class Y>
inline void rows_block(const float* x, int64_t ldx, const typename W::T* w, int64_t K, Y* y, int64_t ldy,
                       int64_t n0, int64_t n1, const Epilogue& e) {
    constexpr int C = R == 1 ? 8 : R == 2 ? 5 : 3;  // R x C accumulators within 16 registers (measured)
    by_column_tiles<C>(n0, n1, [&](auto c, int64_t n) __attribute__((always_inline)) { tile<W, R, decltype(c)::value>(x, ldx, w + n * K, K, y + n, ldy, e, n); });
}

// Column blocks of NB outputs are the parallel work items; within one, all rows go through
// its weights (read from memory once, from cache for the later rows).
constexpr int64_t NB = 32;

// AMX tiles for bfloat16 products with bfloat16 inputs (CPUs with amx-bf16, where the process
// chose them by timing: set_bf16_kernel). Another instruction sequence than tile()'s, so another
// rounding of the same sums; still batch-invariant, since the choice is made once per process and
// each output's sum is the same sequence whatever the rest of the call holds: y[m, n] accumulates
// TDPBF16PS steps over k = 32i .. 32i + 31 in increasing i, x's row m in a column of the B tile
// (as wide as the chunk of rows: each column's sums are its own, whatever the width; the tests
// check), w's row n in a row of the A tile, read where it lies ([N, K] row-major: no repacking).
// Whole 16-column blocks only; the remaining N % 16 columns, and K not a multiple of 32, go
// through tile() as before.
// 0: tile() (AVX2 + FMA); 1: AMX, 2: AVX-512 BF16 (dp_linear), where K % 32 == 0 and x is bfloat16
int bf16_kernel = 0;

// AMX and AVX-512 BF16 code (built with -DSPECDEC_NO_AMX where the compiler lacks their intrinsics)
#if defined(__GNUC__) && !defined(SPECDEC_NO_AMX)
#define SPECDEC_AMX 1
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,amx-tile,amx-bf16")))

struct alignas(64) TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// tile 0: sums [16 outputs n][r0 rows m] float32 for a chunk of x, 1: the same for the next chunk
// (r1 rows); 4: weights [16 n][32 k]; 6 and 7: the chunks of x [16 k pairs][r m x 2], r0 and r1 <=
// 16 rows (r1 = 0: one chunk; the tiles only r columns wide: a lone row is read where it lies)
AMX_TARGET inline void amx_configure(int r0, int r1) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[4] = 16;
    c.colsb[4] = 64;
    for (int t : {0, 6}) c.rows[t] = 16, c.colsb[t] = uint16_t(4 * r0);
    if (r1)
        for (int t : {1, 7}) c.rows[t] = 16, c.colsb[t] = uint16_t(4 * r1);
    _tile_loadconfig(&c);
}

// One column block of 16 outputs from n0 over one chunk of x as a B tile (xp, row stride ldx
// bytes) or two (CHUNKS 2: the next at xp1, stride ldx1), each weight tile loaded once for both.
// A block a work item: measured faster than two or four blocks sharing each load of x (Intel Xeon
// with AMX, 2 threads, one process alternating, SmolLM2's projections and head at 1 / 4 / 8 rows:
// 4.83 / 5.20 / 5.90 ms with one, 5.38 / 5.76 / 6.27 with two, 5.73 / 6.02 / 6.55 with four; and
// with chunks in pairs, at 32 / 64 / 256 rows: 28.3 / 39.5 / 135.9 ms with one block, 34.5 / 47.4 /
// 157.5 with two sharing each load of x: bench/results/amx_pairs_stop62.txt)
template <int CHUNKS>
AMX_TARGET inline void amx_block(const uint16_t* w, int64_t K, const uint16_t* xp, int64_t ldx, const uint16_t* xp1,
                                 int64_t ldx1, int64_t n0, float (*sums)[256]) {
    const int64_t ldw = K * 2;
    // The next block's weights follow these (16 rows of w): their cache lines are asked for while
    // this one runs, 16 lines a step, as tile() does
    const char* next = reinterpret_cast<const char*>(w + (n0 + 16) * K);
    _tile_zero(0);
    if (CHUNKS == 2) _tile_zero(1);
    for (int64_t k = 0; k < K; k += 32) {
        for (int64_t b = 0; b < 16 * 64; b += 64) _mm_prefetch(next + k / 32 * 16 * 64 + b, _MM_HINT_T0);
        _tile_loadd(4, w + n0 * K + k, ldw);
        _tile_loadd(6, reinterpret_cast<const char*>(xp) + k / 2 * ldx, ldx);
        _tile_dpbf16ps(0, 4, 6);
        if (CHUNKS == 2) {
            _tile_loadd(7, reinterpret_cast<const char*>(xp1) + k / 2 * ldx1, ldx1);
            _tile_dpbf16ps(1, 4, 7);
        }
    }
    _tile_stored(0, sums[0], 64);
    if (CHUNKS == 2) _tile_stored(1, sums[1], 64);
}

// Row j's outputs n0 .. n0 + 15 from a sums tile [16 n][16 m], 16 at once, through the epilogue
// in its order: times the scale, plus the bias (each lane what Epilogue::apply gives)
AMX_TARGET inline __m512 amx_row(const float* sums, int j, const Epilogue& e, int64_t n0) {
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    __m512 v = _mm512_i32gather_ps(column, sums + j, 4);
    if (e.scale) v = _mm512_mul_ps(v, _mm512_loadu_ps(e.scale + n0));
    if (e.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(e.bias + n0));
    return v;
}
AMX_TARGET inline void amx_put(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
AMX_TARGET inline void amx_put(uint16_t* y, __m512 v) {  // store()'s rounding to nearest even, NaN a quiet NaN
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i bits = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm512_cvtepi32_epi16(bits));
}
// y's first r rows (row stride ldy), outputs n0 .. n0 + 15 (the scalar epilogue took ~10% of a
// 16-64-row pass)
template <class Y>
AMX_TARGET inline void amx_store(const float* sums, int r, const Epilogue& e, Y* y, int64_t ldy, int64_t n0) {
    for (int j = 0; j < r; ++j) amx_put(y + j * ldy + n0, amx_row(sums, j, e, n0));
}

// Columns [0, N16) of y = x @ w.T, x bfloat16 [M, K] with K % 32 == 0, N16 % 16 == 0
template <class Y>
AMX_TARGET void amx_linear(const uint16_t* x, const uint16_t* w, const Epilogue& e, Y* y, int64_t M, int64_t N16,
                           int64_t K, int64_t ldy) {
    const int64_t chunks = (M + 15) / 16, P = K / 2;
    // x's rows as B tiles, chunk c of r rows: k pair p, row j -> x[16c + j][2p], x[16c + j][2p + 1]
    // (row stride 4r bytes); one row is already so laid out
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(x);
    const auto packed = team_rows<std::vector<uint32_t>>(
        M > 1 ? M : 0, M > 1 ? M * P : 0, [&](std::vector<uint32_t>& out) { out.resize(M > 1 ? M * P : 0); },
        [&](std::vector<uint32_t>& out, int64_t m) {
            const int64_t c = m / 16, j = m % 16, r = std::min<int64_t>(16, M - c * 16);
            for (int64_t p = 0; p < P; ++p) out[c * 16 * P + p * r + j] = xr[m * P + p];
        });
    const auto rows_of = [&](int64_t c) { return int(std::min<int64_t>(16, M - c * 16)); };
    const auto chunk = [&](int64_t c) {
        return M > 1 ? reinterpret_cast<const uint16_t*>(packed->data() + c * 16 * P) : x;
    };
    const int64_t blocks = N16 / 16;
    {
        alignas(64) float sums[2][256];
        int configured0 = 0, configured1 = -1;
        #pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t n0 = b * 16;
            // chunks in pairs sharing each weight tile: past 16 rows the tile products, not the
            // weights' memory, bound a block (SmolLM2's products at 32 / 64 / 256 rows 25-33% faster)
            for (int64_t c = 0; c < chunks; c += 2) {
                const int r0 = rows_of(c), r1 = c + 1 < chunks ? rows_of(c + 1) : 0;
                if (r0 != configured0 || r1 != configured1) amx_configure(configured0 = r0, configured1 = r1);
                if (r1)
                    amx_block<2>(w, K, chunk(c), 4 * r0, chunk(c + 1), 4 * r1, n0, sums);
                else
                    amx_block<1>(w, K, chunk(c), 4 * r0, nullptr, 0, n0, sums);
                amx_store(sums[0], r0, e, y + c * 16 * ldy, ldy, n0);
                if (r1) amx_store(sums[1], r1, e, y + (c + 1) * 16 * ldy, ldy, n0);
            }
        }
        if (configured0) _tile_release();
    }
}

int amx_request() {  // Linux asks a process to request the tile registers' state before using it
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

// AVX-512 BF16 dot products for bfloat16 weights with bfloat16 inputs (CPUs with avx512_bf16,
// AMX or not, where the process chose them by timing: set_bf16_kernel 2). w's rows read where they
// lie, 32 inputs a 512-bit load, against the same 32 of x's row: each (m, n) keeps one 16-lane
// float32 accumulator, lane j adding VDPBF16PS's two products of inputs 32i + 2j, 32i + 2j + 1 in
// increasing i; the lanes added in a fixed tree (hsum16), then the epilogue. So a row's sums are
// the same instructions whatever the call's other rows: batch-invariant. Tiles of R rows x C
// columns share loads only, as in tile(): a weight's 64 bytes serve R rows from one load (one row's
// memory traffic; from ~8 rows the dot products bound it where a core has one 512-bit FMA port,
// variants.py). K a multiple of 32 (else tile()).
#define DP_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw")))

DP_TARGET inline float hsum16(__m512 v) {  // fixed order: the 256-bit halves, then hsum's
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), high));
}

// The 16 sums of a 4 x 4 tile at once, lane 4r + c holding acc[r][c]'s: hsum16's additions, the
// same pairs in the same tree (halves, quarters, pairs, neighbours), four accumulators' at a time
// in one register, so each output has hsum16's bits at a quarter of its instructions.
DP_TARGET inline __m512 reduce16(const __m512 (&acc)[4][4]) {
    __m512 a[16], b[8], c[4], d[2];
    for (int r = 0; r < 4; ++r)
        for (int col = 0; col < 4; ++col) a[4 * col + r] = acc[r][col];
    for (int i = 0; i < 8; ++i)  // lane j + lane j + 8: a[2i] in the low half, a[2i + 1] in the high
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    for (int i = 0; i < 4; ++i)  // + lane j + 4: a[4i + q]'s four in quarter q
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; ++i)  // + lane j + 2: in quarter q, a[8i + q]'s two, then a[8i + 4 + q]'s
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xee));
    // + lane j + 1: lane 4q + i holds a[4i + q], i.e. acc[q][i]
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xdd));
}

// Epilogue::apply and store() on a 4 x 4 tile's sums (lane 4r + c), the same operations per lane
DP_TARGET inline __m512 dp_apply4x4(__m512 s, const Epilogue& e, int64_t n0) {
    if (e.scale) s = _mm512_mul_ps(s, _mm512_broadcast_f32x4(_mm_loadu_ps(e.scale + n0)));
    if (e.bias) s = _mm512_add_ps(s, _mm512_broadcast_f32x4(_mm_loadu_ps(e.bias + n0)));
    return s;
}
DP_TARGET inline void dp_epilogue4x4(__m512 s, float* y, int64_t ldy, const Epilogue& e, int64_t n0) {
    s = dp_apply4x4(s, e, n0);
    _mm_storeu_ps(y, _mm512_castps512_ps128(s));
    _mm_storeu_ps(y + ldy, _mm512_extractf32x4_ps(s, 1));
    _mm_storeu_ps(y + 2 * ldy, _mm512_extractf32x4_ps(s, 2));
    _mm_storeu_ps(y + 3 * ldy, _mm512_extractf32x4_ps(s, 3));
}
DP_TARGET inline void dp_epilogue4x4(__m512 s, uint16_t* y, int64_t ldy, const Epilogue& e, int64_t n0) {
    const __m512i u = _mm512_castps_si512(dp_apply4x4(s, e, n0));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0));
    const __m256i narrow = _mm512_cvtepi32_epi16(rounded);
    alignas(32) uint64_t rows[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(rows), narrow);
    for (int r = 0; r < 4; ++r) memcpy(y + r * ldy, rows + r, 8);
}

template <int R, int C, int PREFETCH, class Y>
DP_TARGET inline void dp_tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, Y* y, int64_t ldy,
                              const Epilogue& e, int64_t n0) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    // the next tile's weights (the C rows after these) asked for while this one runs, as in tile();
    // from 3 rows the tile after it (a tile's time then exceeds the memory's latency at one ahead:
    // SmolLM2 bf16 8- / 4-token passes 0.95x / 0.98x, AMD EPYC Zen 5; three ahead gained less).
    // PREFETCH 1: into L1; 2: into L2 only; 0: none (dp_linear's prefetch levels)
    const char* next = reinterpret_cast<const char*>(w + (R >= 3 ? 2 : 1) * C * K);
    for (int64_t k = 0; k < K; k += 32) {
        if constexpr (PREFETCH != 0)
            for (int c = 0; c < C; ++c)
                _mm_prefetch(next + k / 32 * C * 64 + c * 64, PREFETCH == 1 ? _MM_HINT_T0 : _MM_HINT_T1);
        __m512bh wv[C];
        for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * K + k);
        for (int r = 0; r < R; ++r) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * ldx + k);
            for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
        }
    }
    int first = 0;
    if constexpr (R >= 4 && C == 4) {
        __m512 four[4][4];
        for (int r = 0; r < 4; ++r)
            for (int c = 0; c < 4; ++c) four[r][c] = acc[r][c];
        dp_epilogue4x4(reduce16(four), y, ldy, e, n0);
        first = 4;
    }
    for (int r = first; r < R; ++r)
        for (int c = 0; c < C; ++c) store(y + r * ldy + c, e.apply(hsum16(acc[r][c]), n0 + c));
}

// Row tiles of 4 for dp_linear past 4 rows, and where dp_tail is 1 (set_dp_tail, chosen by timing:
// variants.py) the last 5 or 6 rows as one tile (20 or 24 sums and 4 weights in 32 registers): a
// 1- or 2-row tile after 4-row ones keeps one or two sums a column in flight, so the dot products'
// latency sets its pace (SmolLM2's 5-token pass took more than its 8-token one, AMD EPYC Zen 5; with
// the 5- and 6-row tiles its layer stack's 5 / 6 / 10-token passes 0.87-0.90 / 0.84-0.90 / 0.92x the
// time, scripts/stack_ab.py). Each output's sum is the same sequence in any tile: the same bits.
int dp_tail = 0;
template <class Rows>
__attribute__((always_inline)) inline void by_dp_row_tiles(int64_t M, const Rows& rows) {
    const int64_t tail = dp_tail == 1 && M >= 5 && M % 4 == 1 ? 5 : dp_tail == 1 && M >= 6 && M % 4 == 2 ? 6 : M % 4;
    int64_t m = 0;
    for (; m + tail < M; m += 4) rows(std::integral_constant<int, 4>(), m);
    switch (tail) {
        case 6: rows(std::integral_constant<int, 6>(), m); break;
        case 5: rows(std::integral_constant<int, 5>(), m); break;
        case 3: rows(std::integral_constant<int, 3>(), m); break;
        case 2: rows(std::integral_constant<int, 2>(), m); break;
        case 1: rows(std::integral_constant<int, 1>(), m); break;
        default: break;
    }
}

template <int R, int PREFETCH, class Y>
DP_TARGET inline void dp_rows(const uint16_t* x, const uint16_t* w, int64_t K, Y* y, int64_t ldy, int64_t n0,
                              int64_t n1, const Epilogue& e) {
    // R x C accumulators, C weights and one input within 32 registers. Fewer columns for fewer rows:
    // 1 or 2 rows read one weight row at a time (one sequential run, the next row prefetched), 3 rows
    // two: on an AMD EPYC (Zen 4) whole SmolLM2 passes of 1 / 2 / 3 tokens took 0.83 / 0.88 / 0.85x the
    // time of 8 interleaved weight rows (bench/results/dp_columns_stop63.txt). Each output's sum is
    // the same sequence whatever C is: the same bits.
    constexpr int C = R >= 4 ? 4 : R == 3 ? 2 : 1;
    by_column_tiles<C>(n0, n1, [&](auto c, int64_t n) __attribute__((always_inline)) { dp_tile<R, decltype(c)::value, PREFETCH>(x, K, w + n * K, K, y + n, ldy, e, n); });
}

// Where dp_tile asks for the weights ahead (set_dp_prefetch, chosen by timing: variants.py): 0 into L1
// from every row tile; 1 into L2 only (L1 then keeps x and the weights in use; the cores' own
// prefetchers bring them on), and from a column tile's first row tile alone (the later row tiles
// read its weights from L1: the requests only took issue slots from the dot products). AMD EPYC Zen 4,
// 2 threads, SmolLM2's layer stack (scripts/stack_ab.py): 1 / 2-token passes 0.89-0.99x the time (by
// the VM's state), 4 / 5 / 8 / 16-token 0.87-0.90 / 0.78 / 0.77-0.82 / 0.89x; only speed differs, never a bit.
int dp_prefetch = 0;
constexpr int64_t DP_PANEL_BYTES = 16384;

// y = x @ w.T, x bfloat16 [M, K] with K % 32 == 0; column blocks of NB outputs as in linear_columns
template <int LEVEL, class Y>
DP_TARGET void dp_linear_at(const uint16_t* x, const uint16_t* w, const Epilogue& e, Y* y, int64_t M, int64_t N,
                            int64_t K, int64_t ldy) {
    constexpr int FIRST = LEVEL == 1 ? 2 : 1, LATER = LEVEL == 1 ? 0 : 1;  // dp_tile's PREFETCH
    const int64_t blocks = (N + NB - 1) / NB;
    #pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * NB, n1 = std::min(N, n0 + NB);
        // Past 4 rows, all row tiles go through each 4-column tile while its weights are in L1 (a
        // 32-column block of them is not: each row tile read it again from L2; 5-64 tokens 0.87-0.93x)
        if (M <= 4) {
            by_row_tiles(M, [&](auto r, int64_t m) __attribute__((always_inline)) { dp_rows<decltype(r)::value, FIRST>(x + m * K, w, K, y + m * ldy, ldy, n0, n1, e); });
            continue;
        }
        // ... in panels of rows whose x fits L1 beside the tile's weights (DP_PANEL_BYTES; AMD EPYC
        // Zen 4, 2 threads, SmolLM2's layer stack, scripts/stack_ab.py: 16 / 32-token passes
        // 0.95-0.97x / 0.93-0.95x the time, 64 / 256 the same)
        // (a last 1 or 2 rows join the panel before them: by_dp_row_tiles then ends it with 5 or 6)
        const int64_t panel = std::max<int64_t>(4, DP_PANEL_BYTES / (2 * K) / 4 * 4);
        for (int64_t p0 = 0; p0 < M;) {
            const int64_t rows = M - p0 - panel <= 2 ? M - p0 : panel;
            const uint16_t* xp = x + p0 * K;
            Y* yp = y + p0 * ldy;
            by_column_tiles<4>(n0, n1, [&](auto c, int64_t n) __attribute__((always_inline)) {
                by_dp_row_tiles(rows, [&](auto r, int64_t m) __attribute__((always_inline)) {
                    if (m == 0 && p0 == 0)
                        dp_rows<decltype(r)::value, FIRST>(xp, w, K, yp, ldy, n, n + decltype(c)::value, e);
                    else
                        dp_rows<decltype(r)::value, LATER>(xp + m * K, w, K, yp + m * ldy, ldy, n, n + decltype(c)::value, e);
                });
            });
            p0 += rows;
        }
    }
}

template <class Y>
DP_TARGET void dp_linear(const uint16_t* x, const uint16_t* w, const Epilogue& e, Y* y, int64_t M, int64_t N,
                         int64_t K, int64_t ldy) {
    if (dp_prefetch == 1)
        dp_linear_at<1>(x, w, e, y, M, N, K, ldy);
    else
        dp_linear_at<0>(x, w, e, y, M, N, K, ldy);
}
#else
int amx_request() { return 0; }
int dp_prefetch = 0, dp_tail = 0;  // the AVX-512 BF16 products' switches (set_dp_switch keeps them 0)
#endif

template <class W, class Y>
void linear_columns(const void* x_in, bool x_bf16, const typename W::T* w, Epilogue e, Y* y, int64_t M, int64_t N,
                    int64_t K, int64_t ldy, int64_t n_first);

// x [M, K] float32 or bfloat16 (converted once to float32: exact), y [M, N] float32 or bfloat16
template <class W, class Y>
void linear(const void* x_in, bool x_bf16, const typename W::T* w, Epilogue e, Y* y, int64_t M, int64_t N,
            int64_t K, int64_t ldy) {
#ifdef SPECDEC_AMX
    if (std::is_same<W, Bf16>::value && bf16_kernel == 2 && x_bf16 && K % 32 == 0) {
        dp_linear(static_cast<const uint16_t*>(x_in), reinterpret_cast<const uint16_t*>(w), e, y, M, N, K, ldy);
        return;
    }
    if (std::is_same<W, Bf16>::value && bf16_kernel == 1 && x_bf16 && K % 32 == 0 && N >= 16) {
        const int64_t N16 = N & ~int64_t(15);
        amx_linear(static_cast<const uint16_t*>(x_in), reinterpret_cast<const uint16_t*>(w), e, y, M, N16, K, ldy);
        if (N16 == N) return;
        linear_columns<W>(x_in, x_bf16, w, e, y, M, N, K, ldy, N16);
        return;
    }
#endif
    linear_columns<W>(x_in, x_bf16, w, e, y, M, N, K, ldy, 0);
}

// columns [n_first, N) of y by tile()
template <class W, class Y>
void linear_columns(const void* x_in, bool x_bf16, const typename W::T* w, Epilogue e, Y* y, int64_t M, int64_t N,
                    int64_t K, int64_t ldy, int64_t n_first) {
    const uint16_t* xb = static_cast<const uint16_t*>(x_in);
    const auto converted = team_rows<std::vector<float>>(
        x_bf16 ? M : 0, x_bf16 ? M * K : 0, [&](std::vector<float>& out) { out.resize(x_bf16 ? M * K : 0); },
        [&](std::vector<float>& out, int64_t m) {
            for (int64_t i = m * K; i < (m + 1) * K; ++i) out[i] = Bf16::one(xb + i);
        });
    const float* x = x_bf16 ? converted->data() : static_cast<const float*>(x_in);
    const int64_t blocks = (N - n_first + NB - 1) / NB;
    #pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = n_first + b * NB, n1 = std::min(N, n0 + NB);
        by_row_tiles(M, [&](auto r, int64_t m) __attribute__((always_inline)) {
            rows_block<W, decltype(r)::value>(x + m * K, K, w, K, y + m * ldy, ldy, n0, n1, e);
        });
    }
}

template <class W>
void linear_any(const void* x, int x_bf16, const void* w, const float* scale, const float* bias, void* y,
                int y_bf16, int64_t M, int64_t N, int64_t K) {
    const Epilogue e{scale, bias};
    const typename W::T* wt = static_cast<const typename W::T*>(w);
    #pragma omp parallel
    {
        if (y_bf16)
            linear<W>(x, x_bf16 != 0, wt, e, static_cast<uint16_t*>(y), M, N, K, N);
        else
            linear<W>(x, x_bf16 != 0, wt, e, static_cast<float*>(y), M, N, K, N);
    }
}

// Grouped weights (GGUF's block formats unpacked, models/gguf_blocks.py), multiplied as
// llama.cpp does: w[n, k] = q[n, k] * scale[n, g] (+ offset[n, g]) for k in group g = k / G (16 or
// 32), and each row of x quantized to 8 bits by blocks of 32 (x ~ xq * dx, dx = max|x| / 127, the
// rounding to nearest even), so that a block's products are integer dot products:
//   y[m, n] = sum_b (dot(q, xq)_b * scale * dx_b) + sum_g offset_g * dx * sum(xq)_g (+ bias);
// the K-quants (two levels of scales) by superblocks of 256 instead (128 where K is not a multiple of 256:
// a draft's 4-bit rounding, gguf_blocks.requantized_4bit), summed in integers, offsets too (ktile).
// q is stored unsigned (4-bit: two a byte, byte j of a block holding value j in its low nibble and
// value j + 16 in its high one; or one a byte), or signed one a byte (SIGNED: Q8_0). A row's
// quantization and sums depend on that row only, in a fixed order: batch-invariant as above.

struct QuantizedRows {  // x quantized per row and block of 32 (or 256), with each group's sum of values
    std::vector<int8_t> q;  // [M, K], or superblock-major [K / QB, M, QB] (SUPER)
    std::vector<float> d;  // [M, K / 32], or [K / QB, M] (SUPER)
    std::vector<float> sums;  // [M, K / G]: dx * sum of the group's quantized values (one level)
    std::vector<int16_t> group_sums;  // SUPER: [K / QB, M, QB / G], each group's sum of quantized values
    std::vector<int32_t> shares;  // SHIFT_SHARES: [M, K / G], -128 x the group's sum of q (vnni_rows, signed weights)
    std::vector<int32_t> pairs;  // SUM_PAIRS: [M, K / G / 2], groups 2i and 2i + 1's sums of q as an
                                 // int16 pair (low: 2i), each |sum| <= 32 x 127 (vnni_super_rows)
};
enum RowExtras { SHIFT_SHARES = 1, SUM_PAIRS = 2 };

inline __m256 load_x8(const void* x, bool bf16, int64_t i) {
    return bf16 ? Bf16::load(static_cast<const uint16_t*>(x) + i) : _mm256_loadu_ps(static_cast<const float*>(x) + i);
}

inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// Row m of x: dx = max|x| / 127 per block of QB (32, or 256 for the K-quants' superblocks, as
// llama.cpp's Q8_0 and Q8_K); xq = x / dx rounded to nearest even (the default rounding mode of the
// conversion), in [-127, 127]; sums[g] = dx * sum of group g's xq. PAIRS: each 64 values stored
// as the 4-bit weights' two blocks come from one 32-byte load (ktile): values 0-15 of both
// blocks, then 16-31 of both. SUPER: blocks stored superblock-major (block b of every row, then
// block b + 1), so a tile's rows sit at fixed offsets from one pointer (ktile). A row writes only
// its own entries.
template <int QB, bool PAIRS, bool SUPER>
inline void quantize_row(const void* x, bool bf16, int64_t M, int64_t K, int64_t G, int64_t m, QuantizedRows& out) {
    const int64_t KB = K / QB;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < KB; ++b) {
        const int64_t at = m * K + b * QB, to = SUPER ? (b * M + m) * QB : at;
        __m256 amax = _mm256_setzero_ps();
        for (int i = 0; i < QB / 8; ++i) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, load_x8(x, bf16, at + 8 * i)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float d = _mm_cvtss_f32(h) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        out.d[SUPER ? b * M + m : m * KB + b] = d;
        for (int64_t c = 0; c < QB; c += 32) {
            __m256i qi[4];
            for (int i = 0; i < 4; ++i)
                qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(load_x8(x, bf16, at + c + 8 * i), _mm256_set1_ps(id)));
            // packs interleave 128-bit lanes: the permute puts the 32 values back in order
            const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
            const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                           _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            if (PAIRS) {
                const int64_t h = (c / 32) % 2, pair = to + c - 32 * h;
                _mm_storeu_si128((__m128i*)(out.q.data() + pair + 16 * h), _mm256_castsi256_si128(p8));
                _mm_storeu_si128((__m128i*)(out.q.data() + pair + 32 + 16 * h), _mm256_extracti128_si256(p8, 1));
            } else {
                _mm256_storeu_si256((__m256i*)(out.q.data() + to + c), p8);
            }
            const int lo = hsum_i32(_mm256_add_epi32(qi[0], qi[1])), hi = hsum_i32(_mm256_add_epi32(qi[2], qi[3]));
            if (SUPER) {  // at most 32 x 127: int16
                int16_t* gs = out.group_sums.data() + (to + c) / G;
                if (G == 32) gs[0] = int16_t(lo + hi);
                else {
                    gs[0] = int16_t(lo);
                    gs[1] = int16_t(hi);
                }
                continue;
            }
            const int64_t g = (at + c) / G;  // the first group of these 32 values (rows of K / G groups)
            if (G == 32) out.sums[g] = d * float(lo + hi);
            else {
                out.sums[g] = d * float(lo);
                out.sums[g + 1] = d * float(hi);
            }
        }
    }
}

// x [M, K] quantized for the team (team_rows), with the extras asked for (row-major q only)
template <int QB, bool PAIRS = false, bool SUPER = false>
inline std::shared_ptr<const QuantizedRows> quantize_rows(const void* x, bool bf16, int64_t M, int64_t K, int64_t G,
                                                          int extras = 0) {
    const auto size = [&](QuantizedRows& out) {
        out.q.resize(M * K);
        out.d.resize(M * (K / QB));
        if (SUPER) out.group_sums.resize(M * (K / G));
        else out.sums.resize(M * (K / G));
        if (extras & SHIFT_SHARES) out.shares.resize(M * (K / G));
        if (extras & SUM_PAIRS) out.pairs.resize(M * (K / G / 2));
    };
    const auto row = [&](QuantizedRows& out, int64_t m) {
        quantize_row<QB, PAIRS, SUPER>(x, bf16, M, K, G, m, out);
        if (extras & SHIFT_SHARES)
            for (int64_t i = m * (K / G); i < (m + 1) * (K / G); ++i) {
                int32_t sum = 0;
                for (int64_t k = 0; k < G; ++k) sum += out.q[i * G + k];
                out.shares[i] = -128 * sum;
            }
        if (extras & SUM_PAIRS)
            for (int64_t i = m * (K / G / 2); i < (m + 1) * (K / G / 2); ++i) {
                int32_t low = 0, high = 0;
                for (int64_t k = 0; k < G; ++k) low += out.q[2 * i * G + k], high += out.q[(2 * i + 1) * G + k];
                out.pairs[i] = int32_t((uint32_t(low) & 0xFFFFu) | (uint32_t(high) << 16));
            }
    };
    return team_rows<QuantizedRows>(M, M * K, size, row);
}

template <bool NIB>
inline __m256i load_block(const uint8_t* w) {
    if (NIB) {
        const __m128i bytes = _mm_loadu_si128((const __m128i*)w), mask = _mm_set1_epi8(0x0F);
        return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), _mm_and_si128(bytes, mask));
    }
    return _mm256_loadu_si256((const __m256i*)w);
}

// 8 lanes, lane i the sum of values 4i .. 4i + 3 of the block's products (exact integers)
template <bool SIGNED>
inline __m256 block_dot(__m256i w, __m256i x) {
    const __m256i pairs = SIGNED ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
                                 : _mm256_maddubs_epi16(w, x);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

inline float dot_f32(const float* a, const float* b, int64_t n) {  // fixed order: 8 lanes, then the tail
    __m256 acc = _mm256_setzero_ps();
    const int64_t n8 = n & ~int64_t(7);
    for (int64_t i = 0; i < n8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (int64_t i = n8; i < n; ++i) s = fmaf(a[i], b[i], s);
    return s;
}

// A group's scale and offset: float32 per group (one level: qtile), or an int8 per group times a
// float32 per superblock of S inputs (S = 256: the K-quants' own two levels, d * sc and -dmin * m;
// S = 128 where K is not a multiple of 256), which ktile reads (1-2 bytes a group instead of 4-8).
struct GroupScales {
    const void* scale;
    const void* offset;  // null: no offsets
    const float* scale_super;  // two levels: [N, K / S]
    const float* offset_super;
};

template <int G, bool NIB, bool SIGNED, bool OFF, int R, int C, class Y>
inline void qtile(const QuantizedRows& xr, int64_t m0, const uint8_t* w, int64_t ldw, const GroupScales& gs,
                  int64_t n, int64_t K, Y* y, int64_t ldy, const float* bias) {
    const int64_t KB = K / 32, KG = K / G, BB = NIB ? 16 : 32;  // bytes of a block of 32
    const float* sc = static_cast<const float*>(gs.scale) + n * KG;
    const float* off = OFF ? static_cast<const float*>(gs.offset) + n * KG : nullptr;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
        if ((b * BB) % 64 == 0)  // the next tile's rows, a tile ahead: short rows defeat the hardware prefetcher
            for (int c = 0; c < C; ++c) _mm_prefetch((const char*)(w + (c + C) * ldw + b * BB), _MM_HINT_T0);
        __m256i wv[C];
        __m256 sv[C];
        for (int c = 0; c < C; ++c) {
            wv[c] = load_block<NIB>(w + c * ldw + b * BB);
            const float* scc = sc + c * KG;
            sv[c] = G == 32 ? _mm256_set1_ps(scc[b]) : _mm256_set_m128(_mm_set1_ps(scc[2 * b + 1]), _mm_set1_ps(scc[2 * b]));
        }
        for (int r = 0; r < R; ++r) {
            const __m256i xv = _mm256_loadu_si256((const __m256i*)(xr.q.data() + (m0 + r) * K + b * 32));
            const __m256 dv = _mm256_set1_ps(xr.d[(m0 + r) * KB + b]);
            for (int c = 0; c < C; ++c)
                acc[r][c] = _mm256_fmadd_ps(block_dot<SIGNED>(wv[c], xv), _mm256_mul_ps(sv[c], dv), acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float v = hsum(acc[r][c]);
            if (OFF)
                v += dot_f32(off + c * KG, xr.sums.data() + (m0 + r) * KG, KG);
            if (bias) v += bias[n + c];
            store(y + r * ldy + c, v);
        }
}

// Two levels: x quantized per superblock of S (256 or 128), so a superblock's products are summed
// in integers, each block's pair sums weighted by its groups' int8 scales (madd_epi16), and
// enter float32 once per superblock times scale_super * dx, as llama.cpp's K-quant dot products
// do. Exact integers: values below 64 (Q4_K, Q5_K, Q6_K) keep a pair of products within int16,
// and 8 blocks' weighted sums within int32.

// the S / G int8 scales of a superblock as int16, arranged for block_scales: G = 32, the 8 (or 4) in
// each 128-bit lane; G = 16, the even groups' in the low lane and the odd ones' in the high lane
// (loads of exactly S / G bytes: a row's last superblock ends its buffer)
template <int N>
inline __m128i load_bytes(const int8_t* p) {  // exactly N = 4, 8 or 16 bytes, in the low lanes
    static_assert(N == 4 || N == 8 || N == 16, "superblocks of 4, 8 or 16 groups");
    if constexpr (N == 4) {
        int32_t v;
        memcpy(&v, p, 4);
        return _mm_cvtsi32_si128(v);
    } else if constexpr (N == 8) {
        return _mm_loadl_epi64((const __m128i*)p);
    } else {
        return _mm_loadu_si128((const __m128i*)p);
    }
}

template <int G, int S>
inline __m256i superblock_scales(const int8_t* sc) {
    const __m128i bytes = load_bytes<S / G>(sc);
    if (G == 32) return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(bytes));
    // S = 128: 8 scales, the even ones to bytes 0-3 and the odd ones to bytes 8-11
    const __m128i split = _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    return _mm256_cvtepi8_epi16(split);
}

// block j's scales over its 16 pair sums: G = 32, scale j everywhere; G = 16, group 2j's for the
// low 8 (values 0-15), group 2j + 1's for the high 8
inline __m256i block_scales(__m256i s, int j) {
    return _mm256_shuffle_epi8(s, _mm256_set1_epi16(int16_t((2 * j) | ((2 * j + 1) << 8))));
}

// a superblock's offsets times its groups' sums of x (int8 x int16 products, pairs summed): the
// PS = S / G groups' in int32 lanes (the rest zero)
template <int PS>
inline __m256i offset_sums(const int8_t* off, const int16_t* xsum) {
    const __m128i o = load_bytes<PS>(off);
    if constexpr (PS == 16)
        return _mm256_madd_epi16(_mm256_cvtepi8_epi16(o), _mm256_loadu_si256((const __m256i*)xsum));
    const __m128i x = PS == 8 ? _mm_loadu_si128((const __m128i*)xsum) : _mm_loadl_epi64((const __m128i*)xsum);
    return _mm256_set_m128i(_mm_setzero_si128(), _mm_madd_epi16(_mm_cvtepi8_epi16(o), x));
}

// 4-bit weights (NIB, groups of 32) go two blocks at a time: one 32-byte load holds blocks b and
// b + 1 (16 bytes each), its low nibbles their values 0-15 and its high nibbles 16-31, against x
// stored in that order (quantize_rows PAIRS); each half's pair sums (at most 2 * 15 * 127) add in
// int16 before the one multiply by the blocks' scales (low 128-bit lane block b's, high lane
// b + 1's). One value a byte (Q6_K's 8-bit values, groups of 16 or 32): a block at a time. The
// integer sums are exact, so the order of their additions does not change a bit. The offsets
// (int8 a group) multiply the groups' integer sums of x in the same integers. Then per superblock,
// in this order for every row and column: acc += sums * (scale_super * dx), acc += offset sums *
// (offset_super * dx); the lanes added at the end (hsum), plus the bias. x is stored
// superblock-major (quantize_rows SUPER): the tile's rows are fixed offsets from one pointer, and
// a column's weights are unpacked once for all the tile's rows, which then read x from L1 (the
// loop order that keeps the fewest registers live: measured faster than holding all C columns).
template <int G, int S, bool NIB, bool OFF, int R, int C, class Y>
inline void ktile(const QuantizedRows& xr, int64_t M, int64_t m0, const uint8_t* w, int64_t ldw,
                  const GroupScales& gs, int64_t n, int64_t K, Y* y, int64_t ldy, const float* bias) {
    static_assert(!NIB || G == 32, "4-bit weights come in groups of 32");
    constexpr int64_t WB = NIB ? S / 2 : S;  // weight bytes a superblock
    constexpr int PS = S / G;  // groups a superblock
    const int64_t KG = K / G, KS = K / S;
    const int8_t* sc = static_cast<const int8_t*>(gs.scale) + n * KG;
    const int8_t* off = OFF ? static_cast<const int8_t*>(gs.offset) + n * KG : nullptr;
    const float* ssup = gs.scale_super + n * KS;
    const float* osup = OFF ? gs.offset_super + n * KS : nullptr;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const int8_t* xs = xr.q.data() + m0 * S;  // superblock s of row m0 + r at xs + s * M * S + r * S
    for (int64_t s = 0; s < KS; ++s, xs += M * S) {
        __m256i isum[R][C];
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
        __m256i scales[C];
        for (int c = 0; c < C; ++c) scales[c] = superblock_scales<G, S>(sc + c * KG + s * PS);
        // column c's step j: its weights unpacked once for the tile's rows, which read x from L1
        const auto step = [&](int c, int j) {
            const uint8_t* ws = w + c * ldw + s * WB;
            // the next tile's rows, a tile ahead: short rows defeat the hardware prefetcher
            if ((32 * j) % 64 == 0) _mm_prefetch((const char*)(ws + C * ldw + 32 * j), _MM_HINT_T0);
            if constexpr (NIB) {  // a block pair: 64 inputs, 32 weight bytes
                const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(int16_t((4 * j + 2) | ((4 * j + 3) << 8))),
                                                      _mm_set1_epi16(int16_t((4 * j) | ((4 * j + 1) << 8))));
                const __m256i bytes = _mm256_loadu_si256((const __m256i*)(ws + 32 * j));
                const __m256i lo = _mm256_and_si256(bytes, mask);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
                const __m256i sv = _mm256_shuffle_epi8(scales[c], pick);
                for (int r = 0; r < R; ++r) {
                    const int8_t* xq = xs + r * S + 64 * j;
                    const __m256i pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)xq)),
                        _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(xq + 32))));
                    isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(pairs, sv));
                }
            } else {  // a block: 32 inputs, 32 weight bytes
                const __m256i wv = _mm256_loadu_si256((const __m256i*)(ws + 32 * j));
                const __m256i sv = block_scales(scales[c], j);
                for (int r = 0; r < R; ++r) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i*)(xs + r * S + 32 * j));
                    isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), sv));
                }
            }
        };
        constexpr int J = NIB ? S / 64 : S / 32;
        // one row: the columns' loads side by side (more reads in flight); more rows: a column at a
        // time (fewer registers live); both measured faster than the other order
        if constexpr (R == 1) {
            for (int j = 0; j < J; ++j)
                for (int c = 0; c < C; ++c) step(c, j);
        } else {
            for (int c = 0; c < C; ++c)
                for (int j = 0; j < J; ++j) step(c, j);
        }
        // the superblock's integer sums into the float32 accumulators, times its scales and dx
        for (int r = 0; r < R; ++r) {
            const __m256 dx = _mm256_broadcast_ss(&xr.d[s * M + m0 + r]);
            const int16_t* xsum = xr.group_sums.data() + (s * M + m0 + r) * PS;
            for (int c = 0; c < C; ++c) {
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]),
                                            _mm256_mul_ps(_mm256_broadcast_ss(ssup + c * KS + s), dx), acc[r][c]);
                if constexpr (OFF)
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(offset_sums<PS>(off + c * KG + s * PS, xsum)),
                                                _mm256_mul_ps(_mm256_broadcast_ss(osup + c * KS + s), dx), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float v = hsum(acc[r][c]);
            if (bias) v += bias[n + c];
            store(y + r * ldy + c, v);
        }
}

template <int G, bool NIB, bool SIGNED, bool OFF, int S, int R, class Y>
inline void qrows_block(const QuantizedRows& xr, int64_t M, int64_t m0, const uint8_t* w, const GroupScales& gs, int64_t K,
                        Y* y, int64_t ldy, int64_t n0, int64_t n1, const float* bias) {
    // R x C accumulators with the blocks and scales within 16 registers (measured: two-level
    // R 4 x C 2 spills; one level as before)
    constexpr int C = S > 0 ? (R == 1 ? 4 : R == 2 ? 2 : 1) : (R == 1 ? 4 : R == 2 ? 3 : 2);
    const int64_t ldw = NIB ? K / 2 : K;
    int64_t n = n0;
    if constexpr (S > 0) {
        for (; n + C <= n1; n += C) ktile<G, S, NIB, OFF, R, C>(xr, M, m0, w + n * ldw, ldw, gs, n, K, y + n, ldy, bias);
        for (; n < n1; ++n) ktile<G, S, NIB, OFF, R, 1>(xr, M, m0, w + n * ldw, ldw, gs, n, K, y + n, ldy, bias);
        return;
    }
    for (; n + C <= n1; n += C)
        qtile<G, NIB, SIGNED, OFF, R, C>(xr, m0, w + n * ldw, ldw, gs, n, K, y + n, ldy, bias);
    for (; n < n1; ++n) qtile<G, NIB, SIGNED, OFF, R, 1>(xr, m0, w + n * ldw, ldw, gs, n, K, y + n, ldy, bias);
}

// x [M, K] (float32 or bfloat16), y rows of stride ldy (a fused projection's part writes its
// columns of the whole output); S: the superblock of two-level scales, 0 for one level
template <int G, bool NIB, bool SIGNED, bool OFF, int S, class Y>
void glinear(const void* x, bool x_bf16, const uint8_t* w, const GroupScales& gs, const float* bias, Y* y,
             int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const auto quantized = quantize_rows<(S > 0 ? S : 32), (S > 0 && NIB), (S > 0)>(x, x_bf16, M, K, G);
    const QuantizedRows& xr = *quantized;
    const int64_t blocks = (N + NB - 1) / NB;
    #pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * NB, n1 = std::min(N, n0 + NB);
        if constexpr (S > 0) {
            int64_t m = 0;
            // two levels: tiles of 7 rows, then the last 1-7 rows in one tile (a verify pass is
            // often 5-7), as the weights' unpacking is shared by more rows (measured: 7-row tiles
            // 1.04-1.1x faster than 4-row ones at 12-265 rows, 6 rows the same as 7, 8 not faster
            // than two of 4; 5-7 rows in one tile 1.12-1.18x faster than 4 and then 1-3)
            for (; m + 7 < M; m += 7) qrows_block<G, NIB, SIGNED, OFF, S, 7>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias);
            switch (M - m) {
                case 7: qrows_block<G, NIB, SIGNED, OFF, S, 7>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias); break;
                case 6: qrows_block<G, NIB, SIGNED, OFF, S, 6>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias); break;
                case 5: qrows_block<G, NIB, SIGNED, OFF, S, 5>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias); break;
                case 4: qrows_block<G, NIB, SIGNED, OFF, S, 4>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias); break;
                case 3: qrows_block<G, NIB, SIGNED, OFF, S, 3>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias); break;
                case 2: qrows_block<G, NIB, SIGNED, OFF, S, 2>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias); break;
                case 1: qrows_block<G, NIB, SIGNED, OFF, S, 1>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias); break;
                default: break;
            }
            continue;
        }
        by_row_tiles(M, [&](auto r, int64_t m) __attribute__((always_inline)) {
            qrows_block<G, NIB, SIGNED, OFF, S, decltype(r)::value>(xr, M, m, w, gs, K, y + m * ldy, ldy, n0, n1, bias);
        });
    }
}

// Grouped weights in the columns layout (Grouped.columns, models/gguf_blocks.py), on CPUs with
// AVX-512 VNNI: in each block of 16 outputs, group g's weights stored as G / 4 runs of 64 bytes,
// run p holding the 16 outputs' inputs 4p .. 4p + 3 side by side (4-bit values: 4 runs, inputs
// 4p .. in the low nibbles and 16 + 4p .. in the high ones), and the block's scales and offsets
// of a group (or superblock) side by side too. So one VPDPBUSD multiplies a row's
// 4 quantized inputs (broadcast) by 16 outputs' weights at once, a group's exact integer dot
// products for 16 outputs land in the lanes of one register, and the weights stream as one run.
// x is quantized per row and block of 32 as for one level (quantize_rows), whatever the weights'
// levels. Then in float32, per group g in increasing order, for each output:
//   acc = fma(float(dot_g), scale(n, g) * dx(m, g), acc);  acc = fma(offset(n, g), dx * sum(xq)_g, acc)
// with scale(n, g) the group's float32 scale, or its int8 scale times the superblock's float32
// (offsets alike); then + bias and one rounding. A row's bits depend on nothing else in the call
// (batch-invariant), but differ from qtile()/ktile()'s order: which layout a model's weights take
// is chosen once per machine (variants.py "grouped"), so a weight always runs one way.
// Signed weights (Q8_0) are read as unsigned, w + 128 (their sign bit flipped as they are loaded), against
// x as it is, and each row's chain starts at the shift's share, -128 sum(x) a group (quantize_rows
// SHIFT_SHARES): sum x (w + 128) - 128 sum x = sum x w, the same integers as x shifted against the
// weights as they are (which took a share -128 sum(w) a group and output: 8 more VPDPBUSD a group's
// 16 outputs, as many as one row's dots).
// (Tried: AMX-INT8 tiles per group over row-major weights: flat in rows but 3x slower than AVX2 at
// one row, the per-group tile steps' latency and stores; see variants.py.)
// 1 where this build has the AVX-512 VNNI code and load() chose it; 2: avx2_super_glinear (two-level
// 4-bit and Q6_K weights; the rest row-major, models/grouped_weights.py for_kernels)
int grouped_columns_kernel = 0;

// The bytes one output's group of G values takes in the columns layout: 4 bits a value (NIB), 6
// (SIX: Q6_K packed) or 8
template <int G, bool NIB, bool SIX>
constexpr int64_t group_bytes() { return NIB ? G / 2 : SIX ? G * 3 / 4 : G; }

constexpr int64_t GROUPED_PREFETCH = 2048;  // bytes ahead in the weights' run (vnni_glinear)
// A call of 3 or more rows spends long enough on each group that its weights must be asked for
// further ahead to arrive in time (a 1-row call streams at the memory's pace, which the hardware's
// prefetcher keeps up with). 6144 bytes, measured against 2048, AMD EPYC Zen 5, 2 threads,
// Qwen2.5-Coder-1.5B's Q4_K/Q6_K layers streamed from memory at 8 rows: 0.80-0.87x the time, its
// layer stack's 8-token pass 37.1 -> 33.1 ms (scripts/stack_ab.py); 4096 and 10240 gained less.
constexpr int64_t WIDE_PREFETCH = 6144;
constexpr int64_t prefetch_ahead(int rows) { return rows >= 3 ? WIDE_PREFETCH : GROUPED_PREFETCH; }
// Into L1, or (set_grouped_prefetch 1, chosen by timing: variants.py) for 3 or more rows into L2
// only, where in L1 they evicted the activations and the weights in use: Qwen2.5-Coder-1.5B's GGUF
// layer stack, AMD EPYC Zen 4, 2 threads (scripts/stack_ab.py), 3 / 5-token passes 0.91-0.96x /
// 0.86-0.96x the time; 1-2 rows, which stream at the memory's pace, ran 1.01-1.13x slower so.
// Only speed differs, never a bit.
int grouped_prefetch = 0;
template <int R>
inline void prefetch_group(const void* p) {
    if (R >= 3 && grouped_prefetch == 1) _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
    else _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
}

#ifdef SPECDEC_AMX
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

// Block blk's 16 outputs' scales (or offsets) of group g side by side: the columns layout keeps
// them so ([N / 16][K / G][16], supers [N / 16][K / S][16]); two levels: float(int8) * super
template <int G, int S>
VNNI_TARGET inline __m512 group_factors(const void* level, const float* super, int64_t blk, int64_t g, int64_t KG,
                                        int64_t KS) {
    if constexpr (S == 0) return _mm512_loadu_ps(static_cast<const float*>(level) + (blk * KG + g) * 16);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(level) + (blk * KG + g) * 16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)),
                         _mm512_loadu_ps(super + (blk * KS + g * G / S) * 16));
}
// One group's float32 steps for a row's 16 outputs, in the order both kernels keep (vnni_rows,
// amx_rows: one definition, so the same bits whichever runs a row)
template <bool OFF>
VNNI_TARGET inline __m512 group_step(__m512 acc, __m512i dot, __m512 f, __m512 o, float d, float xsum) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(f, _mm512_set1_ps(d)), acc);
    if constexpr (OFF) acc = _mm512_fmadd_ps(o, _mm512_set1_ps(xsum), acc);
    return acc;
}

// Group g's weights for block wb's 16 outputs as G / 4 runs of 4 inputs (vnni_rows's order)
template <int G, bool NIB>
VNNI_TARGET inline void group_runs(const uint8_t* wc, __m512i* col) {
    if constexpr (NIB) {
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (int j = 0; j < 4; ++j) {
            const __m512i t = _mm512_loadu_si512(wc + 64 * j);
            col[j] = _mm512_and_si512(t, low);
            col[4 + j] = _mm512_and_si512(_mm512_srli_epi16(t, 4), low);
        }
    } else {
        for (int p = 0; p < G / 4; ++p) col[p] = _mm512_loadu_si512(wc + 64 * p);
    }
}

// Q6_K's values (below 64) packed to 6 bits in the columns layout (Grouped.in_columns, bits 6): a
// group of 16 inputs' four runs of 64 bytes as their low nibbles two a byte (runs 0 and 1, then 2
// and 3) and their top 2 bits four a byte (run r at bits 2r), 192 bytes instead of 256: a 1-token
// pass reads 3/4 of these weights' bytes for a few shifts and masks a group.
VNNI_TARGET inline void group_runs6(const uint8_t* wc, __m512i* col) {
    const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const __m512i t0 = _mm512_loadu_si512(wc), t1 = _mm512_loadu_si512(wc + 64), h = _mm512_loadu_si512(wc + 128);
    col[0] = _mm512_or_si512(_mm512_and_si512(t0, low), _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
    col[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(t0, 4), low), _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
    col[2] = _mm512_or_si512(_mm512_and_si512(t1, low), _mm512_and_si512(h, top));
    col[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(t1, 4), low), _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
}

// A group's runs as bytes (group_runs or group_runs6), for VNNI and AMX alike
template <int G, bool NIB, bool SIX>
VNNI_TARGET inline void super_group_runs(const uint8_t* wc, __m512i* col) {
    if constexpr (SIX)
        group_runs6(wc, col);
    else
        group_runs<G, NIB>(wc, col);
}

// One row's exact integer dots with a group's runs (group_runs): two chains of steps (half the
// latency), added; each 4 inputs broadcast straight from memory (through a general register they
// queued on the shuffle port)
template <int P>
VNNI_TARGET inline __m512i group_dot(const __m512i* col, const int8_t* xg) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int p = 0; p < P; p += 2) {
        even = _mm512_dpbusd_epi32(even, col[p], _mm512_broadcastd_epi32(_mm_loadu_si32(xg + 4 * p)));
        odd = _mm512_dpbusd_epi32(odd, col[p + 1], _mm512_broadcastd_epi32(_mm_loadu_si32(xg + 4 * p + 4)));
    }
    return _mm512_add_epi32(even, odd);
}

// The same dots for signed weights (Q8_0), their runs as w + 128 (col): the chain started at the row's
// shift share, -128 sum(x) (share), so the sum is sum x w exactly
template <int P>
VNNI_TARGET inline __m512i group_dot_shifted(const __m512i* col, const int8_t* xg, int32_t share) {
    __m512i even = _mm512_set1_epi32(share), odd = _mm512_setzero_si512();
    for (int p = 0; p < P; p += 2) {
        even = _mm512_dpbusd_epi32(even, col[p], _mm512_broadcastd_epi32(_mm_loadu_si32(xg + 4 * p)));
        odd = _mm512_dpbusd_epi32(odd, col[p + 1], _mm512_broadcastd_epi32(_mm_loadu_si32(xg + 4 * p + 4)));
    }
    return _mm512_add_epi32(even, odd);
}

// store() on 16 lanes, the same bits: bfloat16 to nearest even, NaN a quiet NaN (one at a time
// through a buffer, the stores took ~18% of an 8-row call: 1536 x 576 4-bit, bfloat16 out)
AVX512_TARGET inline void store16(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
AVX512_TARGET inline void store16(uint16_t* y, __m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm512_cvtepi32_epi16(r));  // each lane below 2^16
}

// A row's 16 sums plus bias, rounded once into y
template <class Y>
VNNI_TARGET inline void store_sums(Y* y, __m512 acc, const float* bias) {
    store16(y, bias ? _mm512_add_ps(acc, _mm512_loadu_ps(bias)) : acc);
}

// R rows from m0 of block blk's 16 outputs: R a constant, so the sums stay in registers (a
// runtime count kept them on the stack, a store and a load a group and row)
template <int G, bool NIB, bool SIGNED, bool OFF, int S, int R, class Y>
VNNI_TARGET inline void vnni_rows(const QuantizedRows& xr, const uint8_t* wb,
                                  const GroupScales& gs, const float* bias, Y* y, int64_t ldy, int64_t m0,
                                  int64_t blk, int64_t K) {
    constexpr int64_t GB = NIB ? G / 2 : G;  // weight bytes of a group and output
    constexpr int P = G / 4;
    const int64_t KG = K / G, KB = K / 32, KS = S > 0 ? K / S : 0, n0 = blk * 16;
    __m512 acc[R];
    for (int j = 0; j < R; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < KG; ++g) {
        const uint8_t* wc = wb + g * GB * 16;
        // the weights stream as one run (a thread's blocks follow each other): a few KB ahead
        // (prefetch_ahead), within L1 however long a row (a block ahead overflowed it at K = 8960)
        for (int k = 0; k < GB / 4; ++k)
            prefetch_group<R>(wc + prefetch_ahead(R) + 64 * k);
        __m512i col[P];
        group_runs<G, NIB>(wc, col);
        if constexpr (SIGNED)  // w + 128: unsigned, VPDPBUSD's first operand
            for (int p = 0; p < P; ++p) col[p] = _mm512_xor_si512(col[p], _mm512_set1_epi8(char(0x80)));
        const __m512 f = group_factors<G, S>(gs.scale, gs.scale_super, blk, g, KG, KS);
        const __m512 o = OFF ? group_factors<G, S>(gs.offset, gs.offset_super, blk, g, KG, KS) : _mm512_setzero_ps();
#pragma GCC unroll 16  // the rows' sums in registers (else on the stack: a load and a store a group and row)
        for (int j = 0; j < R; ++j) {
            const int64_t m = m0 + j;
            const __m512i dot = SIGNED ? group_dot_shifted<P>(col, xr.q.data() + m * K + g * G, xr.shares[m * KG + g])
                                       : group_dot<P>(col, xr.q.data() + m * K + g * G);
            acc[j] = group_step<OFF>(acc[j], dot, f, o, xr.d[m * KB + g * G / 32], OFF ? xr.sums[m * KG + g] : 0.0f);
        }
    }
    for (int j = 0; j < R; ++j) store_sums(y + (m0 + j) * ldy + n0, acc[j], bias ? bias + n0 : nullptr);
}

// The same products for 16 rows at a time on AMX-INT8 tiles (grouped_wide_kernel 1, where the
// process chose them by timing: prefill chunks, wide verify passes). A tile step gives each group's
// exact integer dots for 16 rows x 16 outputs (x's rows as the signed A tile, the columns layout's
// runs as the B tile: it is already the tiles' layout; signed weights multiplied as signed, so no
// shift to take back); the float32 steps then follow vnni_rows's per row, in its order, from the
// stored dots. Same integers, same float steps: the same bits as vnni_rows, whichever runs a row.
#define AMX_INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,amx-tile,amx-int8")))
constexpr int AMX_GROUPED_BLOCKS = 2;  // blocks of 16 outputs sharing a load of x's tile

// tiles 0, 1 and 2, 3: dots [16 rows][16 outputs] int32 of 2 blocks, for even and odd groups (a
// group's tile steps run while the float steps of the one before read its stored dots); 4: x
// [16 rows][G bytes]; 6, 7: weights [G / 4 runs][16 outputs x 4 bytes]
template <int G>
AMX_INT8_TARGET inline void amx_grouped_configure() {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t : {0, 1, 2, 3, 4, 6, 7}) {
        c.rows[t] = t >= 6 ? G / 4 : 16;
        c.colsb[t] = t == 4 ? G : 64;
    }
    _tile_loadconfig(&c);
}

// Group g's dots into tile set SET (tiles 2 SET, 2 SET + 1) for nb blocks; runs: the blocks'
// weights of the group; unpacked: room for two 4-bit blocks' runs as bytes
template <int SET, bool NIB, bool SIGNED>
AMX_INT8_TARGET inline void amx_issue(const int8_t* xg, int64_t ldx, const uint8_t* const* runs, int nb,
                                      uint8_t (*unpacked)[8 * 64]) {
    _tile_loadd(4, xg, ldx);
    for (int b = 0; b < nb; ++b) {
        const void* w = runs[b];
        if constexpr (NIB) {  // the runs' nibbles as bytes, in vnni_rows's order
            __m512i col[8];
            group_runs<32, true>(runs[b], col);
            for (int j = 0; j < 8; ++j) _mm512_store_si512(unpacked[b] + 64 * j, col[j]);
            w = unpacked[b];
        }
        // tile numbers must be constants
#define SPECDEC_AMX_DOT(T, W) \
    _tile_loadd(W, w, 64); \
    if constexpr (SIGNED) _tile_dpbssd(T, 4, W); else _tile_dpbsud(T, 4, W);
        if constexpr (SET == 0) {
            if (b == 0) { SPECDEC_AMX_DOT(0, 6) } else { SPECDEC_AMX_DOT(1, 7) }
        } else {
            if (b == 0) { SPECDEC_AMX_DOT(2, 6) } else { SPECDEC_AMX_DOT(3, 7) }
        }
#undef SPECDEC_AMX_DOT
    }
}

template <int SET>
AMX_INT8_TARGET inline void amx_take(int32_t* dots, int nb) {
    if constexpr (SET == 0) {
        _tile_stored(0, dots, 64);
        _tile_zero(0);
        if (nb > 1) { _tile_stored(1, dots + 256, 64); _tile_zero(1); }
    } else {
        _tile_stored(2, dots, 64);
        _tile_zero(2);
        if (nb > 1) { _tile_stored(3, dots + 256, 64); _tile_zero(3); }
    }
}

// Rows [m0, m0 + 16) of nb blocks of 16 outputs from blk
template <int G, bool NIB, bool SIGNED, bool OFF, int S, class Y>
AMX_INT8_TARGET void amx_rows(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs, const float* bias,
                              Y* y, int64_t ldy, int64_t m0, int64_t blk, int nb, int64_t K, float* acc) {
    constexpr int64_t GB = NIB ? G / 2 : G;
    constexpr int TB = AMX_GROUPED_BLOCKS;
    const int64_t KG = K / G, KB = K / 32, KS = S > 0 ? K / S : 0, ldw = NIB ? K / 2 : K;
    alignas(64) int32_t dots[2][TB * 256];
    alignas(64) uint8_t unpacked[2][TB][8 * 64];
    auto issue = [&](int64_t g) {
        const uint8_t* runs[TB];
        for (int b = 0; b < nb; ++b) {
            runs[b] = w + (blk + b) * 16 * ldw + g * GB * 16;
            for (int k = 0; k < GB / 4; ++k)
                _mm_prefetch(reinterpret_cast<const char*>(runs[b] + GROUPED_PREFETCH + 64 * k), _MM_HINT_T0);
        }
        const int8_t* xg = xr.q.data() + m0 * K + g * G;
        if (g & 1) amx_issue<1, NIB, SIGNED>(xg, K, runs, nb, unpacked[1]);
        else amx_issue<0, NIB, SIGNED>(xg, K, runs, nb, unpacked[0]);
    };
    for (int i = 0; i < nb * 256; ++i) acc[i] = 0.0f;
    issue(0);
    for (int64_t g = 0; g < KG; ++g) {
        int32_t* d = dots[g & 1];
        if (g & 1) amx_take<1>(d, nb); else amx_take<0>(d, nb);
        if (g + 1 < KG) issue(g + 1);
        for (int b = 0; b < nb; ++b) {
            const __m512 f = group_factors<G, S>(gs.scale, gs.scale_super, blk + b, g, KG, KS);
            const __m512 o = OFF ? group_factors<G, S>(gs.offset, gs.offset_super, blk + b, g, KG, KS)
                                 : _mm512_setzero_ps();
            for (int j = 0; j < 16; ++j) {
                const int64_t m = m0 + j;
                float* a = acc + b * 256 + j * 16;
                _mm512_store_ps(a, group_step<OFF>(_mm512_load_ps(a), _mm512_load_si512(d + b * 256 + j * 16), f, o,
                                                   xr.d[m * KB + g * G / 32], OFF ? xr.sums[m * KG + g] : 0.0f));
            }
        }
    }
    for (int b = 0; b < nb; ++b) {
        const int64_t n0 = (blk + b) * 16;
        for (int j = 0; j < 16; ++j)
            store_sums(y + (m0 + j) * ldy + n0, _mm512_load_ps(acc + b * 256 + j * 16), bias ? bias + n0 : nullptr);
    }
}

// Rows [0, wide) (a multiple of 16) of all blocks
template <int G, bool NIB, bool SIGNED, bool OFF, int S, class Y>
AMX_INT8_TARGET void amx_glinear(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs, const float* bias,
                                 Y* y, int64_t ldy, int64_t wide, int64_t blocks, int64_t K) {
    constexpr int TB = AMX_GROUPED_BLOCKS;
    const int64_t sets = (blocks + TB - 1) / TB;
    {
        alignas(64) float acc[TB * 256];
        amx_grouped_configure<G>();
        #pragma omp for schedule(static) nowait
        for (int64_t set = 0; set < sets; ++set) {
            const int nb = int(std::min<int64_t>(TB, blocks - set * TB));
            for (int64_t m0 = 0; m0 < wide; m0 += 16)
                amx_rows<G, NIB, SIGNED, OFF, S>(xr, w, gs, bias, y, ldy, m0, set * TB, nb, K, acc);
        }
        _tile_release();
    }
}
#endif

int grouped_wide_kernel = 0;  // 1: full 16-row chunks of columns-layout products on AMX-INT8 tiles

#ifdef SPECDEC_AMX
// The K-quants with offsets on the columns layout (Q4_K and a draft's 4-bit rounding: 4-bit values
// in groups of 32; Q6_K: values below 64 a byte, groups of 16): x quantized by superblocks (one dx a
// row and superblock, as llama.cpp's Q8_K for these formats), so that a superblock's products add
// up in integers, sum_g scale_g * dot_g and sum_g offset_g * sum(xq)_g, and the float32 steps come
// once a superblock (super_step) instead of once a group: 8 or 16x fewer of the steps that bounded
// vnni_rows and amx_rows at many rows. Both kernels below compute the same integers (exactly, each
// its own way) and then the same float steps: the same bits for a row whichever runs it.
VNNI_TARGET inline __m512 super_step(__m512 acc, __m512i dots, __m512i offs, __m512 f, __m512 o, float d) {
    const __m512 dx = _mm512_set1_ps(d);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(f, dx), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(offs), _mm512_mul_ps(o, dx), acc);
}

VNNI_TARGET inline __m512i load_i8x16(const int8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// R rows from m0 of block blk's 16 outputs; xpair: each row's sums of quantized x of groups 2i and 2i + 1 as
// an int16 pair, [M, K / G / 2]. The offsets' integer sums take one VPDPWSSD a row and pair of groups (each
// output's two offsets an int16 pair) instead of a broadcast, a multiply and an add a row and group: 8- / 16-
// token passes 0.94x / 0.93x (Qwen2.5-Coder-1.5B, AMD EPYC Zen 5), the same integers, so the same bits.
// They run after the superblock's groups, not among them: the R offset sums then need no registers
// while the groups' dots run (8 rows: R dots, R sums of floats and a group's 8 runs fill the 32)
template <int G, bool NIB, int S, int R, class Y, bool SIX = false>
VNNI_TARGET inline void vnni_super_rows(const QuantizedRows& xr, const int32_t* xpair, const uint8_t* wb,
                                        const GroupScales& gs, const float* bias, Y* y, int64_t ldy, int64_t m0,
                                        int64_t blk, int64_t K) {
    constexpr int GS = S / G, P = G / 4;
    static_assert(GS % 2 == 0, "a superblock holds pairs of groups");
    static_assert(!SIX || (G == 16 && !NIB), "6-bit packing is Q6_K's: groups of 16");
    constexpr int64_t GB = group_bytes<G, NIB, SIX>();
    const int64_t KG = K / G, KS = K / S, n0 = blk * 16;
    const int8_t* scale = static_cast<const int8_t*>(gs.scale) + blk * KG * 16;
    const int8_t* offset = static_cast<const int8_t*>(gs.offset) + blk * KG * 16;
    const __m512i pair_order = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
        23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 acc[R];
    for (int j = 0; j < R; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t s = 0; s < KS; ++s) {
        __m512i dots[R];
        for (int j = 0; j < R; ++j) dots[j] = _mm512_setzero_si512();
        for (int gi = 0; gi < GS; ++gi) {
            const int64_t g = s * GS + gi;
            const uint8_t* wc = wb + g * GB * 16;
            for (int k = 0; k < GB / 4; ++k)
                prefetch_group<R>(wc + prefetch_ahead(R) + 64 * k);
            __m512i col[P];
            super_group_runs<G, NIB, SIX>(wc, col);
            const __m512i sc = load_i8x16(scale + g * 16);
            for (int j = 0; j < R; ++j) {
                const __m512i dot = group_dot<P>(col, xr.q.data() + (m0 + j) * K + g * G);
                dots[j] = _mm512_add_epi32(dots[j], _mm512_mullo_epi32(dot, sc));
            }
        }
        const __m512 f = _mm512_loadu_ps(gs.scale_super + (blk * KS + s) * 16);
        const __m512 o = _mm512_loadu_ps(gs.offset_super + (blk * KS + s) * 16);
        __m512i pairs[GS / 2];  // groups 2i and 2i + 1: each output's two offsets as an int16 pair
        for (int i = 0; i < GS / 2; ++i)
            pairs[i] = _mm512_permutexvar_epi16(pair_order, _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(offset + (s * GS + 2 * i) * 16))));
        for (int j = 0; j < R; ++j) {
            const int32_t* xp = xpair + (m0 + j) * (KG / 2) + s * GS / 2;
            __m512i offs = _mm512_setzero_si512();
            for (int i = 0; i < GS / 2; ++i) offs = _mm512_dpwssd_epi32(offs, _mm512_set1_epi32(xp[i]), pairs[i]);
            acc[j] = super_step(acc[j], dots[j], offs, f, o, xr.d[(m0 + j) * KS + s]);
        }
    }
    for (int j = 0; j < R; ++j) store_sums(y + (m0 + j) * ldy + n0, acc[j], bias ? bias + n0 : nullptr);
}

// A superblock's integer sums for 16 rows x 16 outputs as AMX-INT8 tile products, by chunks of 64
// inputs. The scales are split in parts of PB bits, the last signed, so that each value times a
// part is a byte (4-bit values: 2 parts of 4 bits, q * part in [-120, 225]; values below 64: 4 parts
// of 2 bits, in [-126, 189]): sum_i (x * (q * part_i)) << (PB * i) is sum_g scale_g * dot_g; and
// x * offset, each group's offset in each of its bytes, is sum_g offset_g * sum(xq)_g.
template <bool NIB>
struct SuperChunk {
    static constexpr int PARTS = NIB ? 2 : 4, PB = NIB ? 4 : 2;
    alignas(64) int8_t b[PARTS + 1][16 * 64];  // the B tiles: parts, then offsets
};

template <int G, bool NIB, int S, bool SIX>
AMX_INT8_TARGET inline void super_chunks(const uint8_t* wb, const int8_t* scale, const int8_t* offset, int64_t s,
                                         SuperChunk<NIB>* out) {
    using C = SuperChunk<NIB>;
    constexpr int64_t GB = group_bytes<G, NIB, SIX>();
    const __m512i even = _mm512_set1_epi16(0x00FF);
    for (int h = 0; h < S / G; ++h) {
        const int64_t g = s * (S / G) + h;
        C& c = out[h * G / 64];
        const int64_t at = (h * G % 64) / 4 * 64;  // the group's first B row in its chunk
        const __m512i sc = load_i8x16(scale + g * 16);
        const __m512i off = _mm512_mullo_epi32(_mm512_and_si512(load_i8x16(offset + g * 16), _mm512_set1_epi32(0xFF)),
                                               _mm512_set1_epi32(0x01010101));
        __m512i col[G / 4];
        super_group_runs<G, NIB, SIX>(wb + g * GB * 16, col);
        if constexpr (NIB) {  // 4-bit parts: q * part as 16-bit products of the even and odd bytes
            const __m512i lo = _mm512_and_si512(sc, _mm512_set1_epi32(15)), hi = _mm512_srai_epi32(sc, 4);
            // each output's part in both 16-bit lanes of its 4 bytes
            const __m512i part[2] = {_mm512_or_si512(lo, _mm512_slli_epi32(lo, 16)),
                                     _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0xFFFF)),
                                                     _mm512_slli_epi32(hi, 16))};
            for (int r = 0; r < G / 4; ++r) {
                const __m512i qe = _mm512_and_si512(col[r], even), qo = _mm512_srli_epi16(col[r], 8);
                for (int i = 0; i < C::PARTS; ++i) {
                    const __m512i lo = _mm512_and_si512(_mm512_mullo_epi16(qe, part[i]), even);
                    _mm512_store_si512(c.b[i] + at + 64 * r,
                                       _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_mullo_epi16(qo, part[i]), 8)));
                }
                _mm512_store_si512(c.b[C::PARTS] + at + 64 * r, off);
            }
        } else {  // parts of 2 bits: q * part from q and 2q, each taken where the part's bit is set
            const __m512i bytes = _mm512_mullo_epi32(_mm512_and_si512(sc, _mm512_set1_epi32(0xFF)),
                                                     _mm512_set1_epi32(0x01010101));
            __mmask64 bit[8];
            for (int b = 0; b < 8; ++b) bit[b] = _mm512_test_epi8_mask(bytes, _mm512_set1_epi8(char(1 << b)));
            for (int r = 0; r < G / 4; ++r) {
                const __m512i q = col[r], q2 = _mm512_add_epi8(col[r], col[r]);
                for (int i = 0; i < 3; ++i)
                    _mm512_store_si512(c.b[i] + at + 64 * r, _mm512_add_epi8(_mm512_maskz_mov_epi8(bit[2 * i], q),
                                                                             _mm512_maskz_mov_epi8(bit[2 * i + 1], q2)));
                // the last part signed: bit 7 weighs -2
                _mm512_store_si512(c.b[3] + at + 64 * r, _mm512_sub_epi8(_mm512_maskz_mov_epi8(bit[6], q),
                                                                         _mm512_maskz_mov_epi8(bit[7], q2)));
                _mm512_store_si512(c.b[C::PARTS] + at + 64 * r, off);
            }
        }
    }
}

// tiles 0-3: a chunk of 16 rows' sums [16 rows][16 outputs] int32 by part (2 or 4), 4: by offset;
// 5: x [16 rows][64 bytes]; 6, 7: B tiles [16 runs][16 outputs x 4 bytes], in turn
AMX_INT8_TARGET inline void amx_super_configure() {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; ++t) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

// One chunk of 64 inputs into the sum tiles: x (A, tile 5) times each B tile of the chunk
template <bool NIB>
AMX_INT8_TARGET inline void super_products(const int8_t* xa, const SuperChunk<NIB>& c) {
    _tile_loadd(5, xa, 64);
    _tile_loadd(6, c.b[0], 64);
    _tile_dpbsud(0, 5, 6);  // unsigned parts
    _tile_loadd(7, c.b[1], 64);
    if constexpr (NIB) {
        _tile_dpbssd(1, 5, 7);  // the last part, signed
        _tile_loadd(6, c.b[2], 64);
        _tile_dpbssd(4, 5, 6);  // offsets
    } else {
        _tile_dpbsud(1, 5, 7);
        _tile_loadd(6, c.b[2], 64);
        _tile_dpbsud(2, 5, 6);
        _tile_loadd(7, c.b[3], 64);
        _tile_dpbssd(3, 5, 7);
        _tile_loadd(6, c.b[4], 64);
        _tile_dpbssd(4, 5, 6);
    }
}

// Rows [0, wide) (a multiple of 16) of all blocks
template <int G, bool NIB, int S, class Y, bool SIX>
AMX_INT8_TARGET void amx_super_glinear(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs,
                                       const float* bias, Y* y, int64_t ldy, int64_t wide, int64_t blocks, int64_t K) {
    using C = SuperChunk<NIB>;
    constexpr int CH = S / 64;
    const int64_t KG = K / G, KS = K / S, ldw = KG * group_bytes<G, NIB, SIX>();
    // x's rows by chunks of 64 inputs, [K / 64][wide][64]: each A tile one contiguous KB (rows K
    // bytes apart fell in few cache sets)
    const auto chunked = team_rows<std::vector<int8_t>>(
        wide, wide * K, [&](std::vector<int8_t>& out) { out.resize(wide * K); },
        [&](std::vector<int8_t>& out, int64_t m) {
            for (int64_t kc = 0; kc < K / 64; ++kc) memcpy(out.data() + (kc * wide + m) * 64, xr.q.data() + m * K + kc * 64, 64);
        });
    const std::vector<int8_t>& xt = *chunked;
    // rows by panels whose x (read again for each block) stays in L2
    const int64_t panel = std::max<int64_t>(16, std::min<int64_t>(wide, (int64_t(3) << 19) / K / 16 * 16));
    for (int64_t p0 = 0; p0 < wide; p0 += panel) {
        const int64_t rows = std::min(panel, wide - p0);
        {
            C chunks[CH];
            alignas(64) int32_t sums[5][256];
            std::vector<float> acc_store(rows * 16 + 16);
            float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(acc_store.data()) + 63) & ~uintptr_t(63));
            amx_super_configure();
            #pragma omp for schedule(static) nowait
            for (int64_t blk = 0; blk < blocks; ++blk) {
                const uint8_t* wb = w + blk * 16 * ldw;
                const int8_t* scale = static_cast<const int8_t*>(gs.scale) + blk * KG * 16;
                const int8_t* offset = static_cast<const int8_t*>(gs.offset) + blk * KG * 16;
                for (int64_t i = 0; i < rows * 16; ++i) acc[i] = 0.0f;
                for (int64_t s = 0; s < KS; ++s) {
                    super_chunks<G, NIB, S, SIX>(wb, scale, offset, s, chunks);
                    const __m512 f = _mm512_loadu_ps(gs.scale_super + (blk * KS + s) * 16);
                    const __m512 o = _mm512_loadu_ps(gs.offset_super + (blk * KS + s) * 16);
                    for (int64_t m0 = p0; m0 < p0 + rows; m0 += 16) {
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(4);
                        if constexpr (!NIB) {
                            _tile_zero(2);
                            _tile_zero(3);
                        }
                        for (int c = 0; c < CH; ++c) super_products<NIB>(xt.data() + ((s * CH + c) * wide + m0) * 64, chunks[c]);
                        _tile_stored(0, sums[0], 64);
                        _tile_stored(1, sums[1], 64);
                        _tile_stored(4, sums[4], 64);
                        if constexpr (!NIB) {
                            _tile_stored(2, sums[2], 64);
                            _tile_stored(3, sums[3], 64);
                        }
                        for (int j = 0; j < 16; ++j) {
                            float* a = acc + (m0 - p0 + j) * 16;
                            __m512i dots = _mm512_load_si512(sums[0] + 16 * j);
                            for (int i = 1; i < C::PARTS; ++i)
                                dots = _mm512_add_epi32(dots, _mm512_slli_epi32(_mm512_load_si512(sums[i] + 16 * j), C::PB * i));
                            _mm512_store_ps(a, super_step(_mm512_load_ps(a), dots, _mm512_load_si512(sums[4] + 16 * j),
                                                          f, o, xr.d[(m0 + j) * KS + s]));
                        }
                    }
                }
                const int64_t n0 = blk * 16;
                for (int64_t j = 0; j < rows; ++j)
                    store_sums(y + (p0 + j) * ldy + n0, _mm512_load_ps(acc + j * 16), bias ? bias + n0 : nullptr);
            }
            _tile_release();
        }
    }
}

constexpr int64_t AMX_SUPER_MIN_ROWS_8BIT = 48;
// Rows left at the end of a block's row loop up to this many run as one tile of vnni_super_rows
// (else tiles of 8): each tile unpacks the block's weights again, so a verify pass of 9 rows (8
// drafts) as 8 + 1 cost a ninth of the pass more than 8 rows (Qwen2.5-Coder-1.5B Q4_K_M, whole
// passes, Intel Xeon with AMX, 2 threads, one process, medians of 3: 9 rows 90.5 -> 76.7 ms, 8 rows
// 77.7, 10 / 11 / 12 rows 92.3 / 103.2 / 99.6 -> 88.3 / 90.4 / 93.1). A row's sums are its own
// registers' whatever the tile: the same bits.
constexpr int64_t SUPER_MAX_ROWS = 12;

// Columns [0, N) (N % 16 == 0) of y, x quantized by superblocks of S (xr: q [M, K], d [M, K / S])
template <int G, bool NIB, int S, class Y, bool SIX = false>
VNNI_TARGET void vnni_super_glinear(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs, const float* bias,
                                    Y* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const int64_t KG = K / G, ldw = KG * group_bytes<G, NIB, SIX>(), blocks = N / 16;
    // rows on AMX tiles, the rest as below: from 16 rows for 4-bit values, from 48 for Q6_K, whose
    // B tiles (4 parts) cost more to build, paid again for each panel (Qwen2.5-Coder-1.5B's layers
    // 0-3, Intel Xeon with AMX, 2 threads, AMX vs VNNI: 16 rows 4.1 vs 3.0 ms, 64 rows 8.4 vs 10.5;
    // 48 rows 6.0-11.0 vs 10.6-11.2 after the masked-move build)
    // (Q6_K's 6-bit packing is unpacked to bytes as the tiles' B rows are built, as for VNNI: a
    // decode pass reads 3/4 of those weights' bytes on either)
    const int64_t wide = grouped_wide_kernel && M >= (NIB ? 16 : AMX_SUPER_MIN_ROWS_8BIT) ? M / 16 * 16 : 0;
    if (wide) {
        amx_super_glinear<G, NIB, S, Y, SIX>(xr, w, gs, bias, y, ldy, wide, blocks, K);
        if (wide == M) return;
    }
    const int32_t* xpair = xr.pairs.data();
    #pragma omp for schedule(static) nowait
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* wb = w + blk * 16 * ldw;
        for (int64_t m0 = wide, r = 0; m0 < M; m0 += r) {
            r = M - m0 <= SUPER_MAX_ROWS ? M - m0 : 8;
            switch (r) {
#define SPECDEC_SUPER_ROWS(R) \
    case R: vnni_super_rows<G, NIB, S, R, Y, SIX>(xr, xpair, wb, gs, bias, y, ldy, m0, blk, K); break;
                SPECDEC_SUPER_ROWS(1) SPECDEC_SUPER_ROWS(2) SPECDEC_SUPER_ROWS(3) SPECDEC_SUPER_ROWS(4)
                SPECDEC_SUPER_ROWS(5) SPECDEC_SUPER_ROWS(6) SPECDEC_SUPER_ROWS(7) SPECDEC_SUPER_ROWS(8)
                SPECDEC_SUPER_ROWS(9) SPECDEC_SUPER_ROWS(10) SPECDEC_SUPER_ROWS(11) SPECDEC_SUPER_ROWS(12)
#undef SPECDEC_SUPER_ROWS
                default: break;
            }
        }
    }
}
#endif

#ifdef SPECDEC_AMX
// Columns [0, N) (N % 16 == 0) of y, x already quantized (xr: q [M, K], d [M, K / 32], sums [M, K / G])
template <int G, bool NIB, bool SIGNED, bool OFF, int S, class Y>
VNNI_TARGET void vnni_glinear(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs, const float* bias,
                              Y* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    static_assert(!NIB || G == 32, "4-bit weights come in groups of 32");
    const int64_t KG = K / G, ldw = NIB ? K / 2 : K, blocks = N / 16;
    const int64_t wide = grouped_wide_kernel ? M / 16 * 16 : 0;  // rows on AMX tiles, the rest as below
    if (wide) {
        amx_glinear<G, NIB, SIGNED, OFF, S>(xr, w, gs, bias, y, ldy, wide, blocks, K);
        if (wide == M) return;
    }
    #pragma omp for schedule(static) nowait
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* wb = w + blk * 16 * ldw;
        for (int64_t m0 = wide; m0 < M; m0 += 8) {  // 8 rows' sums and a group's weights within 32 registers
            switch (std::min<int64_t>(8, M - m0)) {
#define SPECDEC_VNNI_ROWS(R) \
    case R: vnni_rows<G, NIB, SIGNED, OFF, S, R>(xr, wb, gs, bias, y, ldy, m0, blk, K); break;
                SPECDEC_VNNI_ROWS(1) SPECDEC_VNNI_ROWS(2) SPECDEC_VNNI_ROWS(3) SPECDEC_VNNI_ROWS(4)
                SPECDEC_VNNI_ROWS(5) SPECDEC_VNNI_ROWS(6) SPECDEC_VNNI_ROWS(7) SPECDEC_VNNI_ROWS(8)
#undef SPECDEC_VNNI_ROWS
                default: break;
            }
        }
    }
}
#endif

// The K-quants' superblock products of vnni_super_rows on the columns layout with AVX2 alone (grouped kernel 2,
// "avx2-columns"): a block's 16 outputs as two halves of 8 (bytes 0-31 of each 64-byte run, then 32-63), a
// group's runs unpacked once for the tile's rows. A row's 4 inputs are broadcast against the half's 4 weights
// an output (VPMADDUBSW: products in int16 pairs), a group's pairs added in int16 (4-bit values: 8 steps, at
// most 8 x 2 x 15 x 127 = 30,480; values below 64: 2 steps, 32,004) and multiplied by the group's int8 scales
// (VPMADDWD: an output's two int16 against its scale twice, scale x dot in int32). The same exact integers as
// VNNI's (the dots and the offsets' sums) and the same float steps in the same order: each row gets
// vnni_super_glinear's bits, at any width. Why: the row-major kernel (ktile) pays the float steps and the
// offsets once an output, superblock and row, and unpacks a column's weights for 7 rows at most; here the
// steps come once per 8 outputs and a group's runs serve 8 rows. Measured on an AMD EPYC Zen 3 (AVX2, no
// AVX-512), 2 threads, Qwen2.5-Coder-1.5B Q4_K_M whole passes, two runners in one process, medians of 3
// rounds: 1 / 4 / 8 / 16 / 32 rows 61.0 / 95.1 / 209.1 / 386.8 / 664.0 ms row-major, 53.1 / 77.5 / 138.8 /
// 214.6 / 446.7 here (tiles of 8; the last rows as one tile of 9-16 measured no faster at 9 and 16,
// bench/results/avx2_columns_stop75_zen3.txt).
template <int G, bool NIB, bool SIX>
inline void half_runs(const uint8_t* wc, __m256i* col) {  // wc: the group's runs, at the half's first byte
    const __m256i low = _mm256_set1_epi8(0x0F);
    const auto at = [&](int64_t i) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + i)); };
    if constexpr (SIX) {  // group_runs6's unpacking
        const __m256i top = _mm256_set1_epi8(0x30), t0 = at(0), t1 = at(64), h = at(128);
        col[0] = _mm256_or_si256(_mm256_and_si256(t0, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), top));
        col[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(t0, 4), low), _mm256_and_si256(_mm256_slli_epi16(h, 2), top));
        col[2] = _mm256_or_si256(_mm256_and_si256(t1, low), _mm256_and_si256(h, top));
        col[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(t1, 4), low), _mm256_and_si256(_mm256_srli_epi16(h, 2), top));
    } else if constexpr (NIB) {
        for (int j = 0; j < 4; ++j) {
            const __m256i t = at(64 * j);
            col[j] = _mm256_and_si256(t, low);
            col[4 + j] = _mm256_and_si256(_mm256_srli_epi16(t, 4), low);
        }
    } else {
        for (int p = 0; p < G / 4; ++p) col[p] = at(64 * p);
    }
}

// GCC turns a run of integer vector sums into a tree: every product of a group computed first and spilled
// to the stack (seen in the code it emits for nib_group_sums), the sums after. An empty asm that claims to
// change a sum keeps each step's add where it is written, so the products stay in registers.
__attribute__((always_inline)) inline void in_order(__m256i& sum) { asm volatile("" : "+x"(sum)); }
__attribute__((always_inline)) inline void in_order(__m256i& a, __m256i& b) { asm volatile("" : "+x"(a), "+x"(b)); }

inline __m256i broadcast4(const int8_t* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// One row's group dot for the half's 8 outputs, times their scales (sc: each an int16 pair of it): int32 lanes
template <int G, bool NIB>
inline __m256i half_dot(const __m256i* col, const int8_t* xg, __m256i sc) {
    constexpr int P = G / 4, RUN = NIB ? 8 : 2;  // steps whose int16 sums stay within int16
    __m256i dots = _mm256_setzero_si256();
    for (int p0 = 0; p0 < P; p0 += RUN) {
        __m256i even = _mm256_maddubs_epi16(col[p0], broadcast4(xg + 4 * p0));
        __m256i odd = _mm256_maddubs_epi16(col[p0 + 1], broadcast4(xg + 4 * p0 + 4));
        for (int p = p0 + 2; p < p0 + RUN; p += 2) {
            even = _mm256_add_epi16(even, _mm256_maddubs_epi16(col[p], broadcast4(xg + 4 * p)));
            odd = _mm256_add_epi16(odd, _mm256_maddubs_epi16(col[p + 1], broadcast4(xg + 4 * p + 4)));
            in_order(even, odd);
        }
        dots = _mm256_add_epi32(dots, _mm256_madd_epi16(_mm256_add_epi16(even, odd), sc));
    }
    return dots;
}

// 8 int8 scales as int16, each twice (s0 s0 s1 s1 ... s7 s7: VPMADDWD's pairs): the bytes doubled, then widened,
// two shuffles where widening first took four
inline __m256i scale_pairs(const int8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b, b));
}

// A tile's sums plus bias into y, rounded once: rows m0 .. m0 + R - 1, halves h0 .. h0 + H - 1 of block blk
template <int H, int R, class Y>
__attribute__((always_inline)) inline void store_halves(const __m256 (&acc)[H][R], const float* bias, Y* y, int64_t ldy,
                                                        int64_t m0, int64_t blk, int h0) {
    for (int h = 0; h < H; ++h) {
        const int64_t n0 = blk * 16 + 8 * (h0 + h);
        for (int j = 0; j < R; ++j)
            store8(y + (m0 + j) * ldy + n0, bias ? _mm256_add_ps(acc[h][j], _mm256_loadu_ps(bias + n0)) : acc[h][j]);
    }
}

// Group g's 4-bit products for rows 0 .. R - 1 and both halves of a block (wg: the group's runs), the rows
// inner: each of the four 32-byte runs of a half holds two steps (low and high nibbles), unpacked once and met
// by every row's broadcasts (shared by the halves), each row's sum of the group's eight steps in int16 (at
// most 30,480)
template <int R>
__attribute__((always_inline)) inline void nib_group_sums(const uint8_t* wg, const int8_t* xq, int64_t K, int64_t g,
                                                          __m256i (&sums)[2][R]) {
    constexpr int G = 32, H = 2;
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int q = 0; q < 4; ++q) {  // run q: steps q (low nibbles) and q + 4 (high)
        __m256i lo[H], hi[H];
        for (int h = 0; h < H; ++h) {
            const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 32 * h + 64 * q));
            lo[h] = _mm256_and_si256(t, low);
            hi[h] = _mm256_and_si256(_mm256_srli_epi16(t, 4), low);
        }
        for (int j = 0; j < R; ++j) {
            const int8_t* xg = xq + j * K + g * G;
            const __m256i xlo = broadcast4(xg + 4 * q), xhi = broadcast4(xg + 4 * q + 16);
            for (int h = 0; h < H; ++h) {
                const __m256i two = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xlo), _mm256_maddubs_epi16(hi[h], xhi));
                sums[h][j] = q == 0 ? two : _mm256_add_epi16(sums[h][j], two);
                in_order(sums[h][j]);
            }
        }
    }
}

// One group's float32 steps for a row's 8 outputs, vnni_rows's (group_step) on 8 lanes: the dot times scale x
// dx, then (OFF) the offset times the row's sum
template <bool OFF>
__attribute__((always_inline)) inline __m256 group_step8(__m256 acc, __m256i dot, __m256 f, __m256 o, float d, float xsum) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(f, _mm256_set1_ps(d)), acc);
    if constexpr (OFF) acc = _mm256_fmadd_ps(o, _mm256_set1_ps(xsum), acc);
    return acc;
}

// R rows from m0 of H halves from h0 (outputs blk * 16 + 8 * h0 .. + 8 * H) of block blk. One or two rows take
// both halves in one pass over the block's groups (each 64-byte line read whole while it is in flight); more rows
// a half at a time, the second reading what the first brought into the caches (both halves' sums for more rows
// spill). Measured as below, one process, 5 rounds: 1 / 2 rows 50.8 / 54.0 -> 39.1 / 41.8 ms with both halves; 3-8
// rows slower with both (8 rows 135 -> 165). 4-bit values' 2-6 rows and Q6_K's 3-4: avx2_inner_rows.
// The superblocks of R rows from m0, H halves from h0, of block blk: each superblock's int32 dots summed
// over its groups by group_dots(g, dots), then VNNI's float steps in its order (the dots times the superblock
// scales and the row's step, then the offsets, int16 pairs of two groups' each against the row's sums of 32
// inputs, times the superblock offsets and the step); the rows' results stored at the end
template <int GS, int R, int H, class Y, class GroupDots>
__attribute__((always_inline)) inline void avx2_superblocks(const QuantizedRows& xr, const int32_t* xpair,
                                                             const GroupScales& gs, const int8_t* offset, const float* bias,
                                                             Y* y, int64_t ldy, int64_t m0, int64_t blk, int h0,
                                                             int64_t KG, int64_t KS, GroupDots group_dots) {
    __m256 acc[H][R];
    for (int h = 0; h < H; ++h)
        for (int j = 0; j < R; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int64_t s = 0; s < KS; ++s) {
        __m256i dots[H][R];
        for (int h = 0; h < H; ++h)
            for (int j = 0; j < R; ++j) dots[h][j] = _mm256_setzero_si256();
        for (int gi = 0; gi < GS; ++gi) group_dots(s * GS + gi, dots);
        for (int h = 0; h < H; ++h) {
            const int64_t at = (blk * KS + s) * 16 + 8 * (h0 + h);
            const __m256 f = _mm256_loadu_ps(gs.scale_super + at), o = _mm256_loadu_ps(gs.offset_super + at);
            __m256i pairs[GS / 2];  // groups 2i and 2i + 1: each output's two offsets as an int16 pair
            for (int i = 0; i < GS / 2; ++i) {
                const int8_t* oi = offset + (s * GS + 2 * i) * 16 + 8 * (h0 + h);
                pairs[i] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(oi)),
                                                                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(oi + 16))));
            }
            for (int j = 0; j < R; ++j) {
                const int32_t* xp = xpair + (m0 + j) * (KG / 2) + s * GS / 2;
                __m256i offs = _mm256_setzero_si256();
                for (int i = 0; i < GS / 2; ++i) offs = _mm256_add_epi32(offs, _mm256_madd_epi16(pairs[i], _mm256_set1_epi32(xp[i])));
                const __m256 dx = _mm256_set1_ps(xr.d[(m0 + j) * KS + s]);
                acc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h][j]), _mm256_mul_ps(f, dx), acc[h][j]);
                acc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(offs), _mm256_mul_ps(o, dx), acc[h][j]);
            }
        }
    }
    store_halves(acc, bias, y, ldy, m0, blk, h0);
}

template <int G, bool NIB, int S, int R, int H, class Y, bool SIX>
inline void avx2_super_rows(const QuantizedRows& xr, const int32_t* xpair, const uint8_t* wb, const GroupScales& gs,
                            const float* bias, Y* y, int64_t ldy, int64_t m0, int64_t blk, int h0, int64_t K) {
    constexpr int P = G / 4;
    constexpr int64_t GB = group_bytes<G, NIB, SIX>();
    const int64_t KG = K / G;
    const int8_t* scale = static_cast<const int8_t*>(gs.scale) + blk * KG * 16;
    const auto group_dots = [&](int64_t g, __m256i (&dots)[H][R]) __attribute__((always_inline)) {
        const uint8_t* wg = wb + g * GB * 16;
        if (h0 == 0)  // a second call for the other half reads the lines this one brought in
            for (int k = 0; k < GB / 4; ++k) prefetch_group<R>(wg + prefetch_ahead(R) + 64 * k);
        for (int h = 0; h < H; ++h) {
            __m256i col[P];
            half_runs<G, NIB, SIX>(wg + 32 * (h0 + h), col);
            const __m256i sc = scale_pairs(scale + g * 16 + 8 * (h0 + h));
            for (int j = 0; j < R; ++j)
                dots[h][j] = _mm256_add_epi32(dots[h][j], half_dot<G, NIB>(col, xr.q.data() + (m0 + j) * K + g * G, sc));
        }
    };
    avx2_superblocks<S / G, R, H>(xr, xpair, gs, static_cast<const int8_t*>(gs.offset) + blk * KG * 16, bias, y, ldy,
                                  m0, blk, h0, KG, K / S, group_dots);
}

// Group g's products for rows 0 .. R - 1 and both halves of a block, values below 64 in groups of 16 (Q6_K's, six
// bits a value: half_runs' SIX unpacking), the rows inner: two steps of 8 inputs, each unpacking a half's two
// registers once for every row, whose two broadcasts serve both halves; a row's pair of products summed in int16
// (at most 32,004) and scaled into its int32 dots at once (as half_dot: the same integers)
template <int R>
__attribute__((always_inline)) inline void six_group_dots(const uint8_t* wg, const int8_t* xq, int64_t K, int64_t g,
                                                         const __m256i (&sc)[2], __m256i (&dots)[2][R]) {
    constexpr int G = 16, H = 2;
    const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    const auto at = [&](int64_t i) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + i)); };
    for (int s = 0; s < 2; ++s) {  // steps 2s (low nibbles of run s) and 2s + 1 (its high), top bits from run 2
        __m256i lo[H], hi[H];
        for (int h = 0; h < H; ++h) {
            const __m256i t = at(32 * h + 64 * s), b = at(32 * h + 128);
            const __m256i b_lo = s == 0 ? _mm256_slli_epi16(b, 4) : b, b_hi = s == 0 ? _mm256_slli_epi16(b, 2) : _mm256_srli_epi16(b, 2);
            lo[h] = _mm256_or_si256(_mm256_and_si256(t, low), _mm256_and_si256(b_lo, top));
            hi[h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(t, 4), low), _mm256_and_si256(b_hi, top));
        }
        for (int j = 0; j < R; ++j) {
            const int8_t* xg = xq + j * K + g * G + 8 * s;
            const __m256i x0 = broadcast4(xg), x1 = broadcast4(xg + 4);
            for (int h = 0; h < H; ++h) {
                const __m256i two = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x0), _mm256_maddubs_epi16(hi[h], x1));
                dots[h][j] = _mm256_add_epi32(dots[h][j], _mm256_madd_epi16(two, sc[h]));
                in_order(dots[h][j]);
            }
        }
    }
}

// R rows from m0 of both halves of block blk, 4-bit values (G = 32), the rows inner: each of a group's
// four 32-byte runs of a half holds two steps (low and high nibbles), unpacked once and met by every row's
// broadcasts (shared by the halves), each row's int16 sum of the group's eight steps held in a register (at
// most 30,480; in_order keeps it there), scaled into int32 once a group. The same exact integers as
// avx2_super_rows', so the same bits, with 4 weight registers live instead of 8 and half the broadcasts.
// Measured against avx2_super_rows on an AMD EPYC Zen 3, 2 threads, Qwen2.5-Coder-1.5B Q4_K_M and its 0.5B
// draft in 4 bits, whole passes alternating, medians of per-pair ratios: 1 / 2 / 3 rows 0.97-1.01 /
// 0.94-0.97 / 0.95-0.98 (draft 0.98-0.99 / 0.92-1.00 / 0.89); one row no faster (kept on avx2_super_rows).
// With in_order (stop 79; before it GCC spilled every product of a group) against the build before it:
// target 2 / 3 / 4 rows 0.93-0.97 / 0.85-0.91 / 0.89-0.95, draft 0.93 / 0.83 / 0.93 (4 rows in one tile
// against a half at a time); tiles of 3 + 2 and 3 + 3 against a half at a time 0.96-0.98 (5 rows) and
// 0.94-0.98 (6); 7-8 rows no faster (0.98-1.02), kept a half at a time.
// SIX (values below 64 in groups of 16, Q6_K's: six_group_dots), the same integers and float steps, for 3 and 4
// rows, which avx2_super_rows ran a half at a time, each row's broadcasts made once a half. Measured the same
// way (stop 81): its Q6_K products (the output head, 152k x 1536; 14 layers' down projections) at 3 rows
// 0.76-0.81 / 0.81-0.83x the time, 4 rows 0.82-0.86 / 0.79-0.88x; whole 3-token passes 0.89-0.90x; 5-6 rows as
// tiles of 3 + 2 and 3 + 3 slower (1.07-1.11x, the head); 4 rows in one tile 0.79x the time of two tiles of 2;
// 2 rows (both halves already) 0.98x, left as they were.
template <bool SIX, int S, int R, class Y>
inline void avx2_inner_rows(const QuantizedRows& xr, const int32_t* xpair, const uint8_t* wb, const GroupScales& gs,
                            const float* bias, Y* y, int64_t ldy, int64_t m0, int64_t blk, int64_t K) {
    constexpr int G = SIX ? 16 : 32, H = 2;
    constexpr int64_t GB = group_bytes<G, !SIX, SIX>();
    const int64_t KG = K / G;
    const int8_t* scale = static_cast<const int8_t*>(gs.scale) + blk * KG * 16;
    const auto group_dots = [&](int64_t g, __m256i (&dots)[H][R]) __attribute__((always_inline)) {
        const uint8_t* wg = wb + g * GB * 16;
        for (int k = 0; k < GB / 4; ++k) prefetch_group<R>(wg + prefetch_ahead(R) + 64 * k);
        if constexpr (SIX) {
            const __m256i sc[H] = {scale_pairs(scale + g * 16), scale_pairs(scale + g * 16 + 8)};
            six_group_dots<R>(wg, xr.q.data() + m0 * K, K, g, sc, dots);
        } else {
            __m256i sums[H][R];
            nib_group_sums<R>(wg, xr.q.data() + m0 * K, K, g, sums);
            for (int h = 0; h < H; ++h) {
                const __m256i sc = scale_pairs(scale + g * 16 + 8 * h);
                for (int j = 0; j < R; ++j) dots[h][j] = _mm256_add_epi32(dots[h][j], _mm256_madd_epi16(sums[h][j], sc));
            }
        }
    };
    avx2_superblocks<S / G, R, H>(xr, xpair, gs, static_cast<const int8_t*>(gs.offset) + blk * KG * 16, bias, y, ldy,
                                  m0, blk, 0, KG, K / S, group_dots);
}

// Columns [0, N) (N % 16 == 0) of y, x quantized by superblocks of S (xr: q [M, K], d [M, K / S], pairs)
template <int G, bool NIB, int S, class Y, bool SIX = false>
void avx2_super_glinear(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs, const float* bias, Y* y,
                        int64_t ldy, int64_t M, int64_t N, int64_t K) {
    static_assert(NIB ? G == 32 : G == 16, "4-bit values in groups of 32, or values below 64 in groups of 16");
    const int64_t ldw = K / G * group_bytes<G, NIB, SIX>(), blocks = N / 16;
    const int32_t* xpair = xr.pairs.data();
    #pragma omp for schedule(static) nowait
    for (int64_t blk = 0; blk < blocks; ++blk) {
        if constexpr (SIX) {
            if (M == 3 || M == 4) {  // the rows inner (avx2_inner_rows' comment)
                if (M == 3) avx2_inner_rows<true, S, 3, Y>(xr, xpair, w + blk * 16 * ldw, gs, bias, y, ldy, 0, blk, K);
                else avx2_inner_rows<true, S, 4, Y>(xr, xpair, w + blk * 16 * ldw, gs, bias, y, ldy, 0, blk, K);
                continue;
            }
        }
        if constexpr (NIB) {
            if (M >= 2 && M <= INNER_MAX_ROWS) {  // the rows inner (see above), in tiles of 2-4 rows
                by_inner_tiles(M, [&](auto r, int64_t m0) __attribute__((always_inline)) {
                    avx2_inner_rows<false, S, decltype(r)::value, Y>(xr, xpair, w + blk * 16 * ldw, gs, bias, y, ldy, m0, blk, K);
                });
                continue;
            }
        }
        if (M <= 2) {  // one and two rows stream both halves together (see above)
            if (M == 1) avx2_super_rows<G, NIB, S, 1, 2, Y, SIX>(xr, xpair, w + blk * 16 * ldw, gs, bias, y, ldy, 0, blk, 0, K);
            else avx2_super_rows<G, NIB, S, 2, 2, Y, SIX>(xr, xpair, w + blk * 16 * ldw, gs, bias, y, ldy, 0, blk, 0, K);
            continue;
        }
        by_half_tiles(M, [&](auto r, int64_t m0, int h) __attribute__((always_inline)) {
            avx2_super_rows<G, NIB, S, decltype(r)::value, 1, Y, SIX>(xr, xpair, w + blk * 16 * ldw, gs, bias, y, ldy, m0, blk, h, K);
        });
    }
}

// R rows from m0 of H halves from h0 of block blk, one-level 4-bit groups: each group's int32 dots from
// group_dots(wg, g, dots) (dots[h][j]: row m0 + j's, half h0 + h), then vnni_rows's float steps in its order;
// the rows' results stored at the end
template <int R, int H, class Y, class GroupDots>
__attribute__((always_inline)) inline void avx2_one_level_groups(const QuantizedRows& xr, const uint8_t* wb,
                                                                 const GroupScales& gs, const float* bias, Y* y,
                                                                 int64_t ldy, int64_t m0, int64_t blk, int h0,
                                                                 int64_t K, GroupDots group_dots) {
    constexpr int G = 32;
    constexpr int64_t GB = group_bytes<G, true, false>();
    const int64_t KG = K / G;
    const float* scale = static_cast<const float*>(gs.scale) + blk * KG * 16;
    const float* offset = static_cast<const float*>(gs.offset) + blk * KG * 16;
    __m256 acc[H][R];
    for (int h = 0; h < H; ++h)
        for (int j = 0; j < R; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < KG; ++g) {
        const uint8_t* wg = wb + g * GB * 16;
        if (h0 == 0)  // a second call for the other half reads the lines this one brought in
            for (int k = 0; k < GB / 4; ++k) prefetch_group<R>(wg + prefetch_ahead(R) + 64 * k);
        __m256i dots[H][R];
        group_dots(wg, g, dots);
        for (int h = 0; h < H; ++h) {
            const __m256 f = _mm256_loadu_ps(scale + g * 16 + 8 * (h0 + h));
            const __m256 o = _mm256_loadu_ps(offset + g * 16 + 8 * (h0 + h));
            for (int j = 0; j < R; ++j) {
                const int64_t m = m0 + j;
                acc[h][j] = group_step8<true>(acc[h][j], dots[h][j], f, o, xr.d[m * KG + g], xr.sums[m * KG + g]);
            }
        }
    }
    store_halves(acc, bias, y, ldy, m0, blk, h0);
}

// One-level 4-bit weights (a float32 scale and offset a group of 32: Q4_1's shape, `--quantize int4` where K
// is not a multiple of 128, as SmolLM2's 576) on the columns layout with AVX2 alone (grouped kernel 2,
// "avx2-columns"): a half's group runs unpacked once for the tile's rows, each row's dots with them exact
// integers (half_dot, scales of one: the group's int16 sums at most 30,480), then vnni_rows's float steps in
// its order (the dot times scale x dx, then the offset times the row's sum). So each row gets vnni_glinear's
// bits at any width. Why: the row-major kernel (qtile) pays a conversion, a scale multiply and an FMA per
// 32 products of an output and row; here once per group, 8 outputs and row.
template <int R, int H, class Y>
inline void avx2_group_rows(const QuantizedRows& xr, const uint8_t* wb, const GroupScales& gs, const float* bias,
                            Y* y, int64_t ldy, int64_t m0, int64_t blk, int h0, int64_t K) {
    constexpr int G = 32, P = G / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    avx2_one_level_groups<R, H>(xr, wb, gs, bias, y, ldy, m0, blk, h0, K,
                                [&](const uint8_t* wg, int64_t g, __m256i (&dots)[H][R]) __attribute__((always_inline)) {
        for (int h = 0; h < H; ++h) {
            __m256i col[P];
            half_runs<G, true, false>(wg + 32 * (h0 + h), col);
            for (int j = 0; j < R; ++j) dots[h][j] = half_dot<G, true>(col, xr.q.data() + (m0 + j) * K + g * G, ones);
        }
    });
}

// Q8_0's signed weights the same way: a step's products as |w| (VPMADDUBSW's unsigned operand; a half at a
// time, each run's taken once for the tile's rows) times x carrying w's sign (VPSIGNB), a pair of them within
// int16 (2 x 128 x 127), so each step's pairs go to int32 at once; the same exact integers as VNNI's shifted
// dots, then its float steps (no offsets). One and two rows take both halves in one pass over a block's groups
// (SmolLM2 int8 1- / 2-token passes 0.955 / 0.878x the time, one process; 3 rows 0.991x, not kept).
template <int R, int H, class Y>
inline void avx2_signed_rows(const QuantizedRows& xr, const uint8_t* wb, const GroupScales& gs, const float* bias,
                             Y* y, int64_t ldy, int64_t m0, int64_t blk, int h0, int64_t K) {
    constexpr int G = 32, P = G / 4;
    const int64_t KG = K / G;
    const float* scale = static_cast<const float*>(gs.scale) + blk * KG * 16;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[H][R];
    for (int h = 0; h < H; ++h)
        for (int j = 0; j < R; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < KG; ++g) {
        const uint8_t* wg = wb + g * G * 16;
        if (h0 == 0)  // the second half reads the lines the first brought in
            for (int k = 0; k < G / 4; ++k) prefetch_group<R>(wg + prefetch_ahead(R) + 64 * k);
        for (int h = 0; h < H; ++h) {
            const auto run = [&](int p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 32 * (h0 + h) + 64 * p)); };
            __m256i magnitude[H == 1 ? P : 1];
            if constexpr (H == 1)  // taken once for the tile's rows (both halves' would not fit the registers)
                for (int p = 0; p < P; ++p) magnitude[p] = _mm256_abs_epi8(run(p));
            const auto mag = [&](int p) { if constexpr (H == 1) return magnitude[p]; else return _mm256_abs_epi8(run(p)); };
            const __m256 f = _mm256_loadu_ps(scale + g * 16 + 8 * (h0 + h));
            for (int j = 0; j < R; ++j) {
                const int64_t m = m0 + j;
                const int8_t* xg = xr.q.data() + m * K + g * G;
                __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
                for (int p = 0; p < P; p += 2) {
                    even = _mm256_add_epi32(even, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(mag(p), _mm256_sign_epi8(broadcast4(xg + 4 * p), run(p))), ones));
                    odd = _mm256_add_epi32(odd, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(mag(p + 1), _mm256_sign_epi8(broadcast4(xg + 4 * p + 4), run(p + 1))), ones));
                    in_order(even, odd);
                }
                acc[h][j] = group_step8<false>(acc[h][j], _mm256_add_epi32(even, odd), f, f, xr.d[m * KG + g], 0.0f);
            }
        }
    }
    store_halves(acc, bias, y, ldy, m0, blk, h0);
}

template <class Y>
void avx2_signed_glinear(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs, const float* bias, Y* y,
                         int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const int64_t ldw = K, blocks = N / 16;
    #pragma omp for schedule(static) nowait
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* wb = w + blk * 16 * ldw;
        if (M <= 2) {  // one and two rows stream both halves together (as avx2_super_glinear)
            if (M == 1) avx2_signed_rows<1, 2, Y>(xr, wb, gs, bias, y, ldy, 0, blk, 0, K);
            else avx2_signed_rows<2, 2, Y>(xr, wb, gs, bias, y, ldy, 0, blk, 0, K);
            continue;
        }
        by_half_tiles(M, [&](auto r, int64_t m0, int h) __attribute__((always_inline)) {
            avx2_signed_rows<decltype(r)::value, 1, Y>(xr, wb, gs, bias, y, ldy, m0, blk, h, K);
        });
    }
}

// 2-4 rows from m0 of both halves, the rows inner (as avx2_inner_rows): each of a group's four 32-byte runs of
// a half unpacked once and met by every row's broadcasts, shared by the halves; the same integers and float
// steps, so the same bits. SmolLM2 int4 passes against a half at a time (scripts/stack_ab.py, one process): 3
// tokens 0.925-0.950x the time, 4 tokens 0.917 / 0.947x. With in_order (stop 79), against the build before
// (2 rows both halves row by row, 5-6 a half at a time): 2 / 3 / 4 / 5 / 6 tokens 0.96 / 0.91 / 0.90 / 0.91 /
// 0.89x; 8 tokens 0.99x (kept a half at a time).
template <int R, class Y>
inline void avx2_group_rows_inner(const QuantizedRows& xr, const uint8_t* wb, const GroupScales& gs, const float* bias,
                                  Y* y, int64_t ldy, int64_t m0, int64_t blk, int64_t K) {
    constexpr int H = 2;
    const __m256i ones = _mm256_set1_epi16(1);
    avx2_one_level_groups<R, H>(xr, wb, gs, bias, y, ldy, m0, blk, 0, K,
                                [&](const uint8_t* wg, int64_t g, __m256i (&dots)[H][R]) __attribute__((always_inline)) {
        __m256i sums[H][R];
        nib_group_sums<R>(wg, xr.q.data() + m0 * K, K, g, sums);
        for (int h = 0; h < H; ++h)
            for (int j = 0; j < R; ++j) dots[h][j] = _mm256_madd_epi16(sums[h][j], ones);
    });
}

// Columns [0, N) (N % 16 == 0) of y, x quantized by blocks of 32 (xr: q [M, K], d and sums [M, K / 32]); rows
// as avx2_super_glinear takes them: one with both halves together, 2-6 with the rows inner (by_inner_tiles), more a
// half at a time in tiles of 8
template <class Y>
void avx2_group_glinear(const QuantizedRows& xr, const uint8_t* w, const GroupScales& gs, const float* bias, Y* y,
                        int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const int64_t ldw = K / 32 * group_bytes<32, true, false>(), blocks = N / 16;
    #pragma omp for schedule(static) nowait
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* wb = w + blk * 16 * ldw;
        if (M == 1) {
            avx2_group_rows<1, 2, Y>(xr, wb, gs, bias, y, ldy, 0, blk, 0, K);
            continue;
        }
        if (M <= INNER_MAX_ROWS) {
            by_inner_tiles(M, [&](auto r, int64_t m0) __attribute__((always_inline)) {
                avx2_group_rows_inner<decltype(r)::value, Y>(xr, wb, gs, bias, y, ldy, m0, blk, K);
            });
            continue;
        }
        by_half_tiles(M, [&](auto r, int64_t m0, int h) __attribute__((always_inline)) {
            avx2_group_rows<decltype(r)::value, 1, Y>(xr, wb, gs, bias, y, ldy, m0, blk, h, K);
        });
    }
}

// glinear() on row-major weights, vnni_glinear() on the columns layout (1 where this build lacks it)
template <int G, bool NIB, bool SIGNED, bool OFF, int S, class Y>
int grouped(const void* x, bool x_bf16, const uint8_t* w, bool columns, const GroupScales& gs, const float* bias, Y* y,
            int64_t ldy, int64_t M, int64_t N, int64_t K) {
    if (!columns) {
        glinear<G, NIB, SIGNED, OFF, S>(x, x_bf16, w, gs, bias, y, ldy, M, N, K);
        return 0;
    }
    if constexpr (OFF && S > 0 && (NIB || G == 16)) {
        if (N % 16 == 0 && grouped_columns_kernel == 2) {
            const auto xr = quantize_rows<S>(x, x_bf16, M, K, G, SUM_PAIRS);
            avx2_super_glinear<G, NIB, S>(*xr, w, gs, bias, y, ldy, M, N, K);
            return 0;
        }
    }
    if constexpr (SIGNED && !OFF && S == 0 && !NIB && G == 32) {
        if (N % 16 == 0 && grouped_columns_kernel == 2) {
            const auto xr = quantize_rows<32>(x, x_bf16, M, K, G, 0);
            avx2_signed_glinear(*xr, w, gs, bias, y, ldy, M, N, K);
            return 0;
        }
    }
    if constexpr (OFF && S == 0 && NIB && G == 32) {
        if (N % 16 == 0 && grouped_columns_kernel == 2) {
            const auto xr = quantize_rows<32>(x, x_bf16, M, K, G, 0);
            avx2_group_glinear(*xr, w, gs, bias, y, ldy, M, N, K);
            return 0;
        }
    }
#ifdef SPECDEC_AMX
    if (N % 16 == 0 && grouped_columns_kernel == 1) {
        if constexpr (OFF && S > 0 && (NIB || G == 16)) {  // Q4_K, Q6_K: integer sums by superblocks
            const auto xr = quantize_rows<(S > 0 ? S : 32)>(x, x_bf16, M, K, G, SUM_PAIRS);
            vnni_super_glinear<G, NIB, (S > 0 ? S : 32)>(*xr, w, gs, bias, y, ldy, M, N, K);
            return 0;
        }
        const auto xr = quantize_rows<32>(x, x_bf16, M, K, G, SIGNED ? SHIFT_SHARES : 0);
        vnni_glinear<G, NIB, SIGNED, OFF, S>(*xr, w, gs, bias, y, ldy, M, N, K);
        return 0;
    }
#endif
    return 1;
}

// The layouts models/gguf_blocks.py produces: 4-bit unsigned with offsets (groups of 32), 8-bit
// unsigned with offsets (groups of 16 or 32), 8-bit signed without (Q8_0); scales of one level,
// or two: by superblocks of 256 (K-quants), or of 128 where K is not a multiple of 256 (4-bit in
// groups of 32 only). 1 for anything else.
template <class Y>
int glinear_any(const void* x, bool x_bf16, const uint8_t* w, bool columns, int bits, int is_signed, const GroupScales& gs,
                int64_t G, const float* bias, Y* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const bool two = gs.scale_super != nullptr, off = gs.offset != nullptr;
    if (K % 32 || (G != 16 && G != 32) || (two && (K % 128 || (off && !gs.offset_super)))) return 1;
    if (two && K % 256) {
        if (bits != 4 || G != 32 || !off || is_signed) return 1;
        return grouped<32, true, false, true, 128>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
    }
    if (is_signed) {
        if (bits != 8 || off || two || G != 32) return 1;
        return grouped<32, false, true, false, 0>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
    }
    if (!off) return 1;
    if (bits == 6) {  // Q6_K packed to 6 bits: the columns layout on VNNI only
        if (G != 16 || !two || !columns || N % 16) return 1;
        if (grouped_columns_kernel == 2) {
            const auto xr = quantize_rows<256>(x, x_bf16, M, K, G, SUM_PAIRS);
            avx2_super_glinear<16, false, 256, Y, true>(*xr, w, gs, bias, y, ldy, M, N, K);
            return 0;
        }
#ifdef SPECDEC_AMX
        if (grouped_columns_kernel == 1) {
            const auto xr = quantize_rows<256>(x, x_bf16, M, K, G, SUM_PAIRS);
            vnni_super_glinear<16, false, 256, Y, true>(*xr, w, gs, bias, y, ldy, M, N, K);
            return 0;
        }
#endif
        return 1;
    }
    const int key = (bits == 4) * 4 + (G == 16) * 2 + two;
    switch (key) {
        case 4: return grouped<32, true, false, true, 0>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
        case 5: return grouped<32, true, false, true, 256>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
        case 0: return grouped<32, false, false, true, 0>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
        case 1: return grouped<32, false, false, true, 256>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
        case 2: return grouped<16, false, false, true, 0>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
        case 3: return grouped<16, false, false, true, 256>(x, x_bf16, w, columns, gs, bias, y, ldy, M, N, K);
        default: return 1;  // 4-bit in groups of 16
    }
}

constexpr float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};  // Horner, highest first

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
    __m256 p = _mm256_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_POLY[i]));
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

// The runs of a call: consecutive rows reading one sequence (the same base); and for each row the
// keys [0, P) it reads in cache order from position 0 (its count, or the leading run of positions
// 0, 1, ... in its list), which the queries of a work item convert once and share (attend).
inline void row_runs(const int64_t* base, const int64_t* count, const int64_t* start, const int64_t* index,
                     int64_t rows, std::vector<int64_t>& run_start, std::vector<int64_t>& prefix) {
    for (int64_t r = 0; r < rows; ++r)
        if (r == 0 || base[r] != base[r - 1]) run_start.push_back(r);
    run_start.push_back(rows);
    prefix.resize(rows);
    for (int64_t r = 0; r < rows; ++r) {
        int64_t pr = count[r];
        if (index) {
            const int64_t* at = index + start[r];
            pr = 0;
            while (pr < count[r] && at[pr] == pr) ++pr;
        }
        prefix[r] = pr;
    }
}

// One position's head of hd values asked for ahead: a chunk's reads ask for the next chunk's same
// positions, which then arrive while this chunk's scores or weighted values are worked out (in the
// 8-lane code, after 1,000 / 4,000 keys, without them: 1.03-1.09x the time at 1 row, 0.98-1.01x at 3-4)
template <class T>
inline void prefetch_head(const T* p, int64_t hd) {
    for (int64_t b = 0; b < hd * int64_t(sizeof(T)); b += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + b, _MM_HINT_T0);
}

// attend()'s shared chunks: CHUNK keys, and the 8-lane blocks ask for the next chunk's (CHUNK
// positions on) as they read theirs
constexpr int64_t CHUNK = 64;

// scores[j] = q . key j for the keys [j0, j1) given by their cache positions (at), or j's row of kg
template <class W>
inline void score_keys(const float* qh, const typename W::T* kg, const int64_t* at, int64_t j0, int64_t j1,
                       int64_t hd, int64_t pos_stride, float* scores) {
    constexpr int G = 8;  // 8 independent sums: the FMA latency hidden
    const typename W::T* keys[G];
    int64_t j = j0;
    for (; j + G <= j1; j += G) {
        for (int i = 0; i < G; ++i) keys[i] = kg + (at ? at[j + i] : j + i) * pos_stride;
        dots<W, G>(qh, keys, hd, scores + j);
    }
    for (; j < j1; ++j) {
        keys[0] = kg + (at ? at[j] : j) * pos_stride;
        dots<W, 1>(qh, keys, hd, scores + j);
    }
}

// dots<W, G>() for QB queries at once against G keys: each key vector's load (and widening) serves every query,
// each query's load every key; each (query, key) sum is dots()' instruction sequence, so its bits. attend()'s
// 8-lane code scores a shared chunk's keys this way, straight from the cache: six queries by two keys (a row's
// grouped-query heads: Qwen2.5-Coder's six; as two blocks of three by four, 1.14-1.27x the time, AMD EPYC Zen 3)
// or three by four (a stand-alone loop over float32 keys in L1, head size 128: 34 GMAC/s a core against
// dots<F32, 8>'s 18).
template <class W, int QB, int G>
inline void dots_block(const float* const* q, const typename W::T* const* k, int64_t hd, float* const* out) {
    __m256 acc[QB][G];
    for (int a = 0; a < QB; ++a)
        for (int i = 0; i < G; ++i) acc[a][i] = _mm256_setzero_ps();
    const int64_t h8 = hd & ~int64_t(7);
    for (int64_t d = 0; d < h8; d += 8) {
        __m256 kv[G];
        for (int i = 0; i < G; ++i) kv[i] = W::load(k[i] + d);
        for (int a = 0; a < QB; ++a) {
            const __m256 qv = _mm256_loadu_ps(q[a] + d);
            for (int i = 0; i < G; ++i) acc[a][i] = _mm256_fmadd_ps(qv, kv[i], acc[a][i]);
        }
    }
    for (int a = 0; a < QB; ++a)
        for (int i = 0; i < G; ++i) {
            float s = hsum(acc[a][i]);
            for (int64_t d = h8; d < hd; ++d) s = fmaf(q[a][d], W::one(k[i] + d), s);
            out[a][i] = s;
        }
}

// scores[a * stride + j] = q[a] . key j for QB queries and the keys [0, n) at kg (key j at kg + j * pos_stride):
// dots_block G keys at a time, the rest one at a time (score_keys' sums, so its bits)
template <class W, int QB, int G>
inline void score_block(const float* const* q, const typename W::T* kg, int64_t n, int64_t hd, int64_t pos_stride,
                        float* scores, int64_t stride, int64_t ahead) {
    int64_t j = 0;
    for (; j + G <= n; j += G) {
        for (int i = 0; i < G && j + i < ahead; ++i) prefetch_head(kg + (j + i + CHUNK) * pos_stride, hd);
        const typename W::T* keys[G];
        for (int i = 0; i < G; ++i) keys[i] = kg + (j + i) * pos_stride;
        float* out[QB];
        for (int a = 0; a < QB; ++a) out[a] = scores + a * stride + j;
        dots_block<W, QB, G>(q, keys, hd, out);
    }
    for (int a = 0; a < QB; ++a) score_keys<W>(q[a], kg, nullptr, j, n, hd, pos_stride, scores + a * stride);
}

// acc[a][d] += sum_j p[a][j] * v_j[d] for QB queries over the keys [0, n) at vg in order, 8C of d at a time: each
// value vector widened once for every query (six queries as two blocks of three: 1.05-1.08x the time); each
// (query, d) sum is weigh_lanes' sequence, so its bits
template <class W, int QB, int C>
inline void weigh_block(const float* const* p, const typename W::T* vg, int64_t n, int64_t hd, int64_t pos_stride,
                        float* const* acc, int64_t ahead) {
    constexpr int64_t KEYS = 16;  // a few keys at a time stay in L1 across the d steps (64: 0.94-1.08x the time)
    for (int64_t j0 = 0; j0 < n; j0 += KEYS) {
        const int64_t j1 = std::min(n, j0 + KEYS);
        for (int64_t j = j0; j < j1 && j < ahead; ++j) prefetch_head(vg + (j + CHUNK) * pos_stride, hd);
        for (int64_t d0 = 0; d0 < hd; d0 += 8 * C) {
            __m256 a[QB][C];
            for (int b = 0; b < QB; ++b)
                for (int c = 0; c < C; ++c) a[b][c] = _mm256_loadu_ps(acc[b] + d0 + 8 * c);
            for (int64_t j = j0; j < j1; ++j) {
                __m256 vv[C];
                for (int c = 0; c < C; ++c) vv[c] = W::load(vg + j * pos_stride + d0 + 8 * c);
                for (int b = 0; b < QB; ++b) {
                    const __m256 pj = _mm256_set1_ps(p[b][j]);
                    for (int c = 0; c < C; ++c) a[b][c] = _mm256_fmadd_ps(pj, vv[c], a[b][c]);
                }
            }
            for (int b = 0; b < QB; ++b)
                for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc[b] + d0 + 8 * c, a[b][c]);
        }
    }
}

// acc[0 .. 8C) += sum_j p[j] * v_j[d0 .. d0 + 8C) over the keys [j0, j1) in order, C vectors in registers
template <class W, int C>
inline void weigh_lanes(const float* p, const typename W::T* vg, const int64_t* at, int64_t j0, int64_t j1,
                        int64_t pos_stride, int64_t d0, float* acc) {
    __m256 a[C];
    for (int c = 0; c < C; ++c) a[c] = _mm256_loadu_ps(acc + 8 * c);
    for (int64_t j = j0; j < j1; ++j) {
        const typename W::T* vj = vg + (at ? at[j] : j) * pos_stride + d0;
        const __m256 pj = _mm256_set1_ps(p[j]);
        for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(pj, W::load(vj + 8 * c), a[c]);
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}

// acc[d] += sum_j p[j] * v_j[d] over the keys [j0, j1) in order, each d on its own
template <class W>
inline void weigh_values(const float* p, const typename W::T* vg, const int64_t* at, int64_t j0, int64_t j1,
                         int64_t hd, int64_t pos_stride, float* acc) {
    const int64_t h8 = hd & ~int64_t(7);
    int64_t d0 = 0;
    for (; d0 + 64 <= h8; d0 += 64) weigh_lanes<W, 8>(p, vg, at, j0, j1, pos_stride, d0, acc + d0);
    for (; d0 < h8; d0 += 8) weigh_lanes<W, 1>(p, vg, at, j0, j1, pos_stride, d0, acc + d0);
    for (int64_t j = j0; j < j1; ++j) {
        const typename W::T* vj = vg + (at ? at[j] : j) * pos_stride;
        for (int64_t d = h8; d < hd; ++d) acc[d] = fmaf(p[j], W::one(vj + d), acc[d]);
    }
}

// Which instruction sequence attention's scores and weighted values run: 0 the 8-lane code above,
// 1 the 16-lane code below (AVX-512, head sizes a multiple of 16), 2 AVX-512 BF16 dot products
// (attend_pairs: bfloat16 caches, head sizes a multiple of 32; else kernel 1's code). The caller
// checked the CPU. Set once, before any attention, and kept: a score's bits depend on it
// (variants.py times them).
int attention_kernel = 0;

#ifdef SPECDEC_AMX
template <class W> struct Wide;
template <> struct Wide<Bf16> {
    AVX512_TARGET static inline __m512 load(const uint16_t* p) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
    }
};
template <> struct Wide<F32> {
    AVX512_TARGET static inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
};

// Sixteen keys' scores at once (head size hd <= 128, a multiple of 16; key i at key(i)): key i's 16
// lanes sum d = lane + 16t in increasing t (one FMA each), then the sixteen vectors are added lane
// with lane in one fixed tree (halves, quarters, pairs, neighbours: the same tree for every key,
// whichever of the sixteen it is), which replaces a horizontal sum a key; out[i] = key i's score.
template <class W, int T, class Key>
AVX512_TARGET inline void dots16(const __m512* qv, Key key, float* out) {
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) {  // a key at a time: one pointer live; the keys' chains overlap
        const typename W::T* k = key(i);
        __m512 a = _mm512_mul_ps(qv[0], Wide<W>::load(k));
        for (int t = 1; t < T; ++t) a = _mm512_fmadd_ps(qv[t], Wide<W>::load(k + 16 * t), a);
        acc[i] = a;
    }
    __m512 half[8], quarter[4], pair[2];
    for (int i = 0; i < 8; ++i)  // lanes j and j + 8 of keys 2i (lanes 0-7) and 2i + 1 (8-15)
        half[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; ++i)  // j and j + 4: keys 4i .. 4i + 3, one 128-bit lane each
        quarter[i] = _mm512_add_ps(_mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; ++i)  // j and j + 2: in 128-bit lane l, keys 8i + l (elements 0, 1), 8i + 4 + l (2, 3)
        pair[i] = _mm512_add_ps(_mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    // the neighbours: in 128-bit lane l, keys l, 4 + l, 8 + l, 12 + l; then in key order
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(pair[0], pair[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(pair[0], pair[1], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0),
                                                sums));
}

// score_keys() by dots16 (T = hd / 16 vectors a key): a last group of fewer than 16 keys repeats its
// last key in the rest
template <class W, int T>
AVX512_TARGET void score_keys16(const float* qh, const typename W::T* kg, const int64_t* at, int64_t j0, int64_t j1,
                                int64_t pos_stride, float* scores) {
    __m512 qv[T];
    for (int t = 0; t < T; ++t) qv[t] = _mm512_loadu_ps(qh + 16 * t);
    alignas(64) float out[16];
    for (int64_t j = j0; j < j1; j += 16) {
        const int64_t n = std::min<int64_t>(16, j1 - j);
        float* dst = n == 16 ? scores + j : out;
        if (at) dots16<W, T>(qv, [&](int i) { return kg + at[j + std::min<int64_t>(i, n - 1)] * pos_stride; }, dst);
        else dots16<W, T>(qv, [&](int i) { return kg + (j + std::min<int64_t>(i, n - 1)) * pos_stride; }, dst);
        if (n < 16)
            for (int64_t i = 0; i < n; ++i) scores[j + i] = out[i];
    }
}

template <class W, int C>
AVX512_TARGET inline void weigh_step(__m512* a, const float* p, const typename W::T* vg, const int64_t* at, int64_t j,
                                     int64_t pos_stride, int64_t d0) {
    const typename W::T* vj = vg + (at ? at[j] : j) * pos_stride + d0;
    const __m512 pj = _mm512_set1_ps(p[j]);
    for (int c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(pj, Wide<W>::load(vj + 16 * c), a[c]);
}

// Weighted values on 16 lanes: acc[0, hd) sums p[j] v_j over the even keys j, acc[hd, 2 hd) over the
// odd ones, each lane in increasing j (two chains: half the FMA latency; the caller adds the halves).
// Every key lands in the half its position gives, whichever call it comes in: the same bits for a
// row however its keys are split between calls. (Tried: two queries sharing each key's loads,
// 1-3% faster: not kept.)
template <class W, int C>
AVX512_TARGET inline void weigh_lanes16(const float* p, const typename W::T* vg, const int64_t* at, int64_t j0,
                                        int64_t j1, int64_t pos_stride, int64_t d0, int64_t hd, float* acc) {
    __m512 a[2][C];
    for (int h = 0; h < 2; ++h)
        for (int c = 0; c < C; ++c) a[h][c] = _mm512_loadu_ps(acc + h * hd + d0 + 16 * c);
    int64_t j = j0;
    if (j < j1 && (j & 1)) weigh_step<W, C>(a[1], p, vg, at, j++, pos_stride, d0);
    for (; j + 1 < j1; j += 2) {
        weigh_step<W, C>(a[0], p, vg, at, j, pos_stride, d0);
        weigh_step<W, C>(a[1], p, vg, at, j + 1, pos_stride, d0);
    }
    if (j < j1) weigh_step<W, C>(a[0], p, vg, at, j, pos_stride, d0);
    for (int h = 0; h < 2; ++h)
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + h * hd + d0 + 16 * c, a[h][c]);
}

// weigh_values() for head sizes a multiple of 16, into the two halves of acc [2 hd]
template <class W>
AVX512_TARGET void weigh_values16(const float* p, const typename W::T* vg, const int64_t* at, int64_t j0, int64_t j1,
                                  int64_t hd, int64_t pos_stride, float* acc) {
    int64_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) weigh_lanes16<W, 4>(p, vg, at, j0, j1, pos_stride, d0, hd, acc);
    for (; d0 < hd; d0 += 16) weigh_lanes16<W, 1>(p, vg, at, j0, j1, pos_stride, d0, hd, acc);
}

// exp8's steps on 16 lanes (the same value a lane)
AVX512_TARGET inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[i]));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(__mmask16(~under), _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// softmax_in_place() on 16 lanes (the last vector masked): the exponentials a lane as exp8's; their
// sum: lane l adds keys 16i + l in order, then the two halves, then hsum()'s tree
AVX512_TARGET float softmax16(float* sc, int64_t n, float scale) {
    const __m512 sv = _mm512_set1_ps(scale);
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = first_lanes(n - j);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + j), sv);
        _mm512_mask_storeu_ps(sc + j, m, x);
        mv = _mm512_mask_max_ps(mv, m, mv, x);
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mv));  // a maximum: the same in any order
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = first_lanes(n - j);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + j), top));
        _mm512_mask_storeu_ps(sc + j, m, e);
        sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1));
    return 1.0f / hsum(_mm256_add_ps(_mm512_castps512_ps256(sum), high));
}

// positions [c0, c1) of one kv head, converted to float32 (exactly) into buf [c1 - c0, hd], 16 lanes at a time
// (the 16-lane attention's shared chunks; the 8-lane code reads the cache itself)
template <class W>
AVX512_TARGET void convert_keys16(const typename W::T* kg, int64_t c0, int64_t c1, int64_t hd, int64_t pos_stride,
                                  float* buf) {
    for (int64_t j = c0; j < c1; ++j) {
        prefetch_head(kg + (j + c1 - c0) * pos_stride, hd);
        for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(buf + (j - c0) * hd + d, Wide<W>::load(kg + j * pos_stride + d));
    }
}

// Attention kernel 2 (AVX-512 BF16; bfloat16 caches, head sizes a multiple of 32 up to 128): both
// products by VDPBF16PS on the cached bfloat16 values as they lie, with the query and the softmax's
// weights rounded to bfloat16 once (as a bfloat16 model's own attention rounds them before its two
// products): half the instructions of the float32 FMAs, and no key or value converted to float32.
// Scores: sixteen keys a vector, key i in lane i (the keys transposed: vector c holds each key's
// inputs 2c, 2c + 1), a lane's sum over c in four chains (c mod 4) added (0 + 1) + (2 + 3): no
// horizontal sums. Weighted values: one output d a lane, a VDPBF16PS step a key pair (2m, 2m + 1)
// of the row's key list (the pair's values interleaved; a missing second key is zero), in two
// chains by m's parity, added at the end. A key's lane, pair and chain follow from its place in the
// row's key list only, so a row gets the same bits in any call: the shared float32 conversion of
// the other kernels becomes a shared transposition (keys) and interleaving (values), a row's shared
// part ending at an even key so that no pair straddles it.

// x[0, n) rounded to bfloat16 into out[0, n rounded up to 16), the rest zeros: out's 32-bit word m
// is the pair (x[2m], x[2m + 1])
DP_TARGET inline void bf16_pairs(const float* x, int64_t n, uint16_t* out) {
    for (int64_t j = 0; j < n; j += 16) store16(out + j, _mm512_maskz_loadu_ps(first_lanes(n - j), x + j));
}

// keys key(0 .. 15) (bfloat16 rows of hd) transposed: kt[16 c + i] = key i's inputs 2c, 2c + 1 as one
// 32-bit word, c < hd / 2 (a 16 x 16 transpose of 32-bit words per 32 inputs)
template <class Key>
DP_TARGET inline void transpose_keys16(Key key, int64_t hd, uint32_t* kt) {
    for (int64_t c0 = 0; c0 < hd / 2; c0 += 16) {
        __m512i r[16], a[16], b[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(key(i) + 2 * c0);
        for (int i = 0; i < 8; ++i) {  // lane l: keys 2i, 2i + 1 at words 4l, 4l + 1 (lo) and 4l + 2, 4l + 3 (hi)
            a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; ++i) {  // b[4i + k]'s lane l: word 4l + k of keys 4i .. 4i + 3
            b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
            b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
        }
        for (int k = 0; k < 4; ++k) {  // lane l of b[k], b[4 + k], b[8 + k], b[12 + k]: word 4l + k of all 16
            const __m512i x0 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x88), x1 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xDD);
            const __m512i y0 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x88);
            const __m512i y1 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xDD);
            uint32_t* out = kt + (c0 + k) * 16;
            _mm512_storeu_si512(out, _mm512_shuffle_i32x4(x0, y0, 0x88));            // words 0 .. 3 (+ k)
            _mm512_storeu_si512(out + 4 * 16, _mm512_shuffle_i32x4(x1, y1, 0x88));   // 4 .. 7
            _mm512_storeu_si512(out + 8 * 16, _mm512_shuffle_i32x4(x0, y0, 0xDD));   // 8 .. 11
            _mm512_storeu_si512(out + 12 * 16, _mm512_shuffle_i32x4(x1, y1, 0xDD));  // 12 .. 15
        }
    }
}

// the scores of 16 transposed keys for NQ queries (qd[s]: hd / 2 bfloat16 pairs), lane i key i's
template <int NQ>
DP_TARGET inline void score_pairs16(const uint32_t* const* qd, const uint32_t* kt, int64_t hd, __m512* out) {
    __m512 a[NQ][4];
    for (int s = 0; s < NQ; ++s)
        for (int u = 0; u < 4; ++u) a[s][u] = _mm512_setzero_ps();
    for (int64_t c = 0; c < hd / 2; c += 4)
        for (int u = 0; u < 4; ++u) {
            const __m512bh k = (__m512bh)_mm512_loadu_si512(kt + (c + u) * 16);
            for (int s = 0; s < NQ; ++s)
                a[s][u] = _mm512_dpbf16_ps(a[s][u], k, (__m512bh)_mm512_set1_epi32(int(qd[s][c + u])));
        }
    for (int s = 0; s < NQ; ++s) out[s] = _mm512_add_ps(_mm512_add_ps(a[s][0], a[s][1]), _mm512_add_ps(a[s][2], a[s][3]));
}

// pairs (2m, 2m + 1) of keys key(2m), key(2m + 1) (null: a missing key, zeros) interleaved: pair m's
// hd words at vb + (m - m0) hd, vector z = 2b (+ 1) the unpacked low (high) halves of inputs 32b ..
template <class Key>
DP_TARGET inline void interleave_pairs(Key key, int64_t m0, int64_t m1, int64_t hd, uint32_t* vb) {
    for (int64_t m = m0; m < m1; ++m) {
        const uint16_t *x = key(2 * m), *y = key(2 * m + 1);
        uint32_t* out = vb + (m - m0) * hd;
        for (int64_t b = 0; b < hd / 32; ++b) {
            const __m512i xv = _mm512_loadu_si512(x + 32 * b);
            const __m512i yv = y ? _mm512_loadu_si512(y + 32 * b) : _mm512_setzero_si512();
            _mm512_storeu_si512(out + 32 * b, _mm512_unpacklo_epi16(xv, yv));
            _mm512_storeu_si512(out + 32 * b + 16, _mm512_unpackhi_epi16(xv, yv));
        }
    }
}

template <int Z>
DP_TARGET inline void weigh_pair(__m512* a, const uint32_t* vm, uint32_t w) {
    const __m512bh wv = (__m512bh)_mm512_set1_epi32(int(w));
    for (int z = 0; z < Z; ++z) a[z] = _mm512_dpbf16_ps(a[z], (__m512bh)_mm512_loadu_si512(vm + 16 * z), wv);
}

// acc [2][hd] (the chains of even and odd m; d in the interleaved order) += pairs [m0, m1) from vb
// (pair m0 first) weighted by pw[m] (the pair's two bfloat16 weights)
template <int Z>
DP_TARGET inline void weigh_pairs(const uint32_t* pw, const uint32_t* vb, int64_t m0, int64_t m1, float* acc) {
    __m512 a[2][Z];
    for (int h = 0; h < 2; ++h)
        for (int z = 0; z < Z; ++z) a[h][z] = _mm512_loadu_ps(acc + (h * Z + z) * 16);
    int64_t m = m0;
    const uint32_t* v = vb;
    if (m < m1 && (m & 1)) weigh_pair<Z>(a[1], v, pw[m++]), v += 16 * Z;
    for (; m + 1 < m1; m += 2, v += 32 * Z) {
        weigh_pair<Z>(a[0], v, pw[m]);
        weigh_pair<Z>(a[1], v + 16 * Z, pw[m + 1]);
    }
    if (m < m1) weigh_pair<Z>(a[0], v, pw[m]);
    for (int h = 0; h < 2; ++h)
        for (int z = 0; z < Z; ++z) _mm512_storeu_ps(acc + (h * Z + z) * 16, a[h][z]);
}

DP_TARGET inline void weigh_pairs_any(int64_t hd, const uint32_t* pw, const uint32_t* vb, int64_t m0, int64_t m1,
                                      float* acc) {
    switch (hd / 16) {
        case 2: return weigh_pairs<2>(pw, vb, m0, m1, acc);
        case 4: return weigh_pairs<4>(pw, vb, m0, m1, acc);
        case 6: return weigh_pairs<6>(pw, vb, m0, m1, acc);
        default: return weigh_pairs<8>(pw, vb, m0, m1, acc);
    }
}

// One query of a work item: its float32 vector, its keys (count n, positions at[] or 0 .. n - 1),
// how many of them it reads from the item's shared chunks (even), and where its output goes
template <class Y>
struct PairQuery {
    const float* q;
    const int64_t* at;
    int64_t n, shared;
    Y* out;
};

struct PairSpace {  // a thread's buffers, kept from item to item
    std::vector<uint32_t> qd, pw, chunk, own;
    std::vector<float> scores, acc, inv;
    std::vector<int64_t> list;
};

// the scores of 16 transposed keys (kt), keys j .. j + 15, for the queries list[0, L): each query's
// lanes up to its key count stored in its row of scores
template <class Y>
DP_TARGET inline void score_block16(const PairQuery<Y>* qs, const int64_t* list, int64_t L, const uint32_t* kt,
                                    int64_t j, int64_t hd, const uint32_t* qd_all, float* scores, int64_t stride) {
    __m512 out[4];
    const uint32_t* qd[4];
    for (int64_t s0 = 0; s0 < L; s0 += 4) {
        const int64_t S = std::min<int64_t>(4, L - s0);
        for (int64_t s = 0; s < S; ++s) qd[s] = qd_all + list[s0 + s] * (hd / 2);
        if (S == 4) score_pairs16<4>(qd, kt, hd, out);
        else if (S == 3) score_pairs16<3>(qd, kt, hd, out);
        else if (S == 2) score_pairs16<2>(qd, kt, hd, out);
        else score_pairs16<1>(qd, kt, hd, out);
        for (int64_t s = 0; s < S; ++s) {
            const int64_t i = list[s0 + s], end = std::min(qs[i].n, j + 16);
            _mm512_mask_storeu_ps(scores + i * stride + j, first_lanes(end - j), out[s]);
        }
    }
}

// A work item's queries (sharing one kv head: kg, vg) by kernel 2
template <class Y>
DP_TARGET void attend_pairs(const PairQuery<Y>* qs, int64_t Q, const uint16_t* kg, const uint16_t* vg, int64_t hd,
                            int64_t pos_stride, float scale, PairSpace& w) {
    constexpr int64_t CH = 64;  // keys a shared chunk (even)
    const int64_t H2 = hd / 2;
    int64_t stride = 32, P = 0;
    for (int64_t i = 0; i < Q; ++i) {
        stride = std::max(stride, (qs[i].n + 31) & ~int64_t(31));
        P = std::max(P, qs[i].shared);
    }
    w.qd.resize(Q * H2);
    w.scores.resize(Q * stride);
    w.pw.resize(Q * stride / 2);
    w.acc.assign(Q * 2 * hd, 0.f);
    w.inv.assign(Q, 0.f);
    w.chunk.resize(CH * H2);
    w.own.resize(CH * H2);
    for (int64_t i = 0; i < Q; ++i) bf16_pairs(qs[i].q, hd, reinterpret_cast<uint16_t*>(&w.qd[i * H2]));
    auto key_at = [&](const PairQuery<Y>& s, int64_t j) { return s.at ? s.at[j] : j; };
    auto score_block = [&](const int64_t* list, int64_t L, const uint32_t* kt, int64_t j) {
        score_block16(qs, list, L, kt, j, hd, w.qd.data(), w.scores.data(), stride);
    };
    w.list.resize(Q);
    int64_t* list = w.list.data();
    for (int64_t c0 = 0; c0 < P; c0 += CH) {  // the shared keys, transposed once for all the queries
        const int64_t c1 = std::min(P, c0 + CH);
        for (int64_t j = c0; j < c1; j += 16) {
            for (int64_t i = 0; i < 16 && j + CH + i < P; ++i) prefetch_head(kg + (j + CH + i) * pos_stride, hd);
            transpose_keys16([&](int i) { return kg + std::min(j + i, c1 - 1) * pos_stride; }, hd,
                             &w.chunk[(j - c0) * H2]);
        }
        for (int64_t j = c0; j < c1; j += 16) {
            int64_t L = 0;
            for (int64_t i = 0; i < Q; ++i)
                if (qs[i].shared > j) list[L++] = i;
            score_block(list, L, &w.chunk[(j - c0) * H2], j);
        }
    }
    for (int64_t i = 0; i < Q; ++i) {  // each query's other keys, and the softmax
        const PairQuery<Y>& s = qs[i];
        for (int64_t j = s.shared; j < s.n; j += 16) {
            transpose_keys16([&](int l) { return kg + key_at(s, std::min(j + l, s.n - 1)) * pos_stride; }, hd,
                             w.own.data());
            score_block(&i, 1, w.own.data(), j);
        }
        if (s.n == 0) continue;
        w.inv[i] = softmax16(&w.scores[i * stride], s.n, scale);
        bf16_pairs(&w.scores[i * stride], s.n, reinterpret_cast<uint16_t*>(&w.pw[i * stride / 2]));
    }
    for (int64_t c0 = 0; c0 < P; c0 += CH) {  // the shared values, interleaved once
        const int64_t c1 = std::min(P, c0 + CH);
        interleave_pairs([&](int64_t j) { return vg + j * pos_stride; }, c0 / 2, c1 / 2, hd, w.chunk.data());
        for (int64_t i = 0; i < Q; ++i)
            if (qs[i].shared > c0)
                weigh_pairs_any(hd, &w.pw[i * stride / 2], w.chunk.data(), c0 / 2, std::min(c1, qs[i].shared) / 2,
                                &w.acc[i * 2 * hd]);
    }
    for (int64_t i = 0; i < Q; ++i) {
        const PairQuery<Y>& s = qs[i];
        for (int64_t c0 = s.shared; c0 < s.n; c0 += CH) {  // its other values
            const int64_t c1 = std::min(s.n, c0 + CH);
            interleave_pairs([&](int64_t j) { return j < c1 ? vg + key_at(s, j) * pos_stride : nullptr; },
                             c0 / 2, (c1 + 1) / 2, hd, w.own.data());
            weigh_pairs_any(hd, &w.pw[i * stride / 2], w.own.data(), c0 / 2, (c1 + 1) / 2, &w.acc[i * 2 * hd]);
        }
        const float* a = &w.acc[i * 2 * hd];
        for (int64_t z = 0; z < hd / 16; ++z)  // lane l of vector z: d = 32 (z / 2) + 8 (l / 4) + 4 (z % 2) + l % 4
            for (int64_t l = 0; l < 16; ++l) {
                const int64_t d = 32 * (z / 2) + 8 * (l / 4) + 4 * (z % 2) + l % 4;
                store(s.out + d, s.n ? (a[z * 16 + l] + a[hd + z * 16 + l]) * w.inv[i] : 0.f);
            }
    }
}
#endif

// scores and weighted values by the kernel in use (wide: attention_kernel 1, hd <= 128 a multiple of 16)
template <class W>
inline void score_any(bool wide, const float* qh, const typename W::T* kg, const int64_t* at, int64_t j0, int64_t j1,
                      int64_t hd, int64_t pos_stride, float* scores) {
#ifdef SPECDEC_AMX
    if (wide) {
        switch (hd / 16) {
#define SPECDEC_SCORE16(T) \
    case T: return score_keys16<W, T>(qh, kg, at, j0, j1, pos_stride, scores);
            SPECDEC_SCORE16(1) SPECDEC_SCORE16(2) SPECDEC_SCORE16(3) SPECDEC_SCORE16(4)
            SPECDEC_SCORE16(5) SPECDEC_SCORE16(6) SPECDEC_SCORE16(7) SPECDEC_SCORE16(8)
#undef SPECDEC_SCORE16
            default: break;
        }
    }
#endif
    score_keys<W>(qh, kg, at, j0, j1, hd, pos_stride, scores);
}
template <class W>
inline void weigh_any(bool wide, const float* p, const typename W::T* vg, const int64_t* at, int64_t j0, int64_t j1,
                      int64_t hd, int64_t pos_stride, float* acc) {
#ifdef SPECDEC_AMX
    if (wide) return weigh_values16<W>(p, vg, at, j0, j1, hd, pos_stride, acc);
#endif
    weigh_values<W>(p, vg, at, j0, j1, hd, pos_stride, acc);
}

// exp(s - max) over a row's n scores (padded with -inf to n8) in place; returns 1 / their sum
inline float softmax_in_place(float* sc, int64_t n, float scale) {
    const int64_t n8 = (n + 7) & ~int64_t(7);
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(sc + j), sv);
        _mm256_storeu_ps(sc + j, x);
        mv = _mm256_max_ps(mv, x);
    }
    float m = -INFINITY;
    for (; j < n; ++j) {
        sc[j] *= scale;
        m = std::max(m, sc[j]);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mv);
    for (int i = 0; i < 8; ++i) m = std::max(m, lanes[i]);  // a maximum: the same in any order
    for (j = n; j < n8; ++j) sc[j] = -INFINITY;
    mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j < n8; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv));
        _mm256_storeu_ps(sc + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hsum(sum);
}

inline float softmax_any(bool wide, float* sc, int64_t n, float scale) {
#ifdef SPECDEC_AMX
    if (wide) return softmax16(sc, n, scale);
#endif
    return softmax_in_place(sc, n, scale);
}

// q [rows, nh, hd] float32; row r reads the sequence at k + base[r] (v + base[r]) with
// position p's head g at p * pos_stride + g * head_stride; its keys are positions
// index[start[r] .. start[r] + count[r]) when index is given, else 0 .. count[r]. out [rows, nh, hd].
// Every (row, head) gets the same instructions over its keys in order whatever the rest of the call
// holds: its scores, softmax and weighted sum of values. The query vectors of a work item (the
// query heads of one kv head over rows of one sequence) only share their reads of the keys and
// values from position 0 on, CH at a time, each query taking the part of a chunk within its own
// prefix: the 8-lane code takes up to six queries that read as many keys of a chunk together, each
// key and value vector loaded and widened (exactly) once for all of them (score_block, weigh_block);
// the 16-lane code converts a chunk to float32 once for all its queries. So a verify pass, a prefill
// chunk's causal rows and a grouped-query head's heads read those once, not once a row and head.
// The rest of a row's keys (a tree's own rows) are read from the cache as they come.
template <class W, class Y>
void attend(const float* q, const typename W::T* k, const typename W::T* v, const int64_t* base,
            const int64_t* count, const int64_t* start, const int64_t* index, Y* out,
            int64_t rows, int64_t nh, int64_t nkv, int64_t hd, int64_t pos_stride, int64_t head_stride,
            float scale) {
    constexpr int64_t CH = CHUNK;  // even: a shared chunk's keys keep their positions' parity (weigh_lanes16)
    static_assert(CH % 2 == 0, "chunks of an even number of keys");
    const int64_t group = nh / nkv;
    std::vector<int64_t> run_start, prefix;
    row_runs(base, count, start, index, rows, run_start, prefix);
    const int64_t runs = int64_t(run_start.size()) - 1;
    // kernel 2 where it applies (bfloat16 keys, hd a multiple of 32), else kernel 1's code
    const bool pairs = attention_kernel == 2 && std::is_same<W, Bf16>::value && hd % 32 == 0 && hd <= 128;
    const bool wide = (attention_kernel == 1 || (attention_kernel == 2 && !pairs)) && hd % 16 == 0 && hd <= 128;
    const int64_t AH = wide ? 2 * hd : hd;  // a query's accumulators (weigh_values16: two halves)
    // work items: a run's query heads of one kv head, split in `parts` so that the threads share
    // them evenly; but each part reads and converts the shared keys for itself, so where an item's
    // queries are few (reading the keys, not the arithmetic, bounds it), only as far as every thread
    // needs an item. Per layer, AMD EPYC Zen 5, 2 threads, 2,000 keys, interleaved: SmolLM2's heads
    // (9 / 3) 1 / 4 / 8 rows 0.065 / 0.144 / 0.253 ms split in two, 0.053 / 0.122 / 0.306 not;
    // Qwen2.5-Coder's (12 / 2) 1 row 0.144 / 0.134, 8 rows 0.612 / 0.610. Which thread scores which
    // query does not change a bit.
    const int64_t threads = omp_get_num_threads();  // the team's
    const int64_t items = runs * nkv, queries = rows * group / std::max<int64_t>(1, runs);
    const int64_t parts = queries >= 16 ? std::max<int64_t>(1, (2 * threads + items - 1) / items)
                                        : std::max<int64_t>(1, (threads + items - 1) / items);
    {
        std::vector<float> scores, acc, inv, buf(wide ? CH * hd : 0);  // buf: the 16-lane code's float32 chunk
        std::vector<int64_t> shared;
#ifdef SPECDEC_AMX
        std::vector<PairQuery<Y>> pq;
        PairSpace space;
#endif
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < runs * nkv * parts; ++item) {
            const int64_t u = item / (nkv * parts), g = item / parts % nkv, part = item % parts;
            const int64_t r0 = run_start[u], R = run_start[u + 1] - r0;
            const int64_t all = R * group;  // the run's query vectors of this kv head: (row, head)
            const int64_t first = all * part / parts, Q = all * (part + 1) / parts - first;
            if (Q == 0) continue;
            const typename W::T* kg = k + base[r0] + g * head_stride;
            const typename W::T* vg = v + base[r0] + g * head_stride;
            auto row = [&](int64_t i) { return r0 + (first + i) / group; };
            auto head = [&](int64_t i) { return g * group + (first + i) % group; };
            auto query = [&](int64_t i) { return q + (row(i) * nh + head(i)) * hd; };
#ifdef SPECDEC_AMX
            if constexpr (std::is_same<W, Bf16>::value) {
                if (pairs) {
                    pq.resize(Q);
                    for (int64_t i = 0; i < Q; ++i) {
                        const int64_t r = row(i);
                        pq[i] = PairQuery<Y>{query(i), index ? index + start[r] : nullptr, count[r],
                                             Q > 1 ? prefix[r] & ~int64_t(1) : 0, out + (r * nh + head(i)) * hd};
                    }
                    attend_pairs<Y>(pq.data(), Q, kg, vg, hd, pos_stride, scale, space);
                    continue;
                }
            }
#endif
            int64_t stride = 8;
            for (int64_t r = r0; r < r0 + R; ++r) stride = std::max(stride, (count[r] + 7) & ~int64_t(7));
            scores.resize(Q * stride);
            acc.assign(Q * AH, 0.f);
            inv.resize(Q);
            // each query's keys from position 0 in the shared float32 chunks: none for a lone query
            // (a copy read back once would only cost a store and a load)
            shared.assign(Q, 0);
            int64_t P = 0;
            if (Q > 1)
                for (int64_t i = 0; i < Q; ++i) P = std::max(P, shared[i] = prefix[row(i)]);
            // query i's keys in the chunk at c0, and how many queries from i on (up to 6) read as many
            const auto within = [&](int64_t i, int64_t c0) { return std::max<int64_t>(0, std::min(c0 + CH, shared[i]) - c0); };
            const auto alike_from = [&](int64_t i, int64_t c0) {
                int64_t a = 1;
                while (i + a < Q && a < 6 && within(i + a, c0) == within(i, c0)) ++a;
                return a;
            };
            for (int64_t c0 = 0; c0 < P; c0 += CH) {  // the shared keys
                const int64_t c1 = std::min(P, c0 + CH);
                // the 8-lane code reads the cache itself (bfloat16 widened in registers: the same values). Its
                // float32 copy cost a store a vector, and its reads from memory overlapped nothing. Against that
                // copy (AMD EPYC Zen 3, 2 threads, one process, builds alternating, same bits): 28 layers of
                // Qwen2.5-Coder's heads after 200 / 1,000 / 4,000 keys 0.76 / 0.70 / 0.86x the time at 1 row,
                // 0.78-0.92x at 2-8 rows (SmolLM2's 0.74-0.89x); whole passes after 4,000 cached tokens T=1 / 3 /
                // 4 0.93 / 0.92 / 0.97x
#ifdef SPECDEC_AMX
                if (wide) convert_keys16<W>(kg, c0, c1, hd, pos_stride, buf.data());
#endif
                const typename W::T* ck = kg + c0 * pos_stride;
                for (int64_t i = 0; i < Q;) {
                    const int64_t n = within(i, c0), alike = alike_from(i, c0);
                    // the first block asks for the next chunk's keys as it goes (a burst of requests at a
                    // chunk's start took 1.0-1.2x the time, measured in a position-major test layout)
                    const int64_t ahead = !wide && i == 0 && n == CH ? std::min(CH, P - c1) : 0;
                    if (!wide && n > 0 && alike >= 3) {
                        const float* qs[6];
                        for (int64_t a = 0; a < alike; ++a) qs[a] = query(i + a);
                        float* sc = &scores[i * stride + c0];
                        if (alike == 6) score_block<W, 6, 2>(qs, ck, n, hd, pos_stride, sc, stride, ahead);
                        else score_block<W, 3, 4>(qs, ck, n, hd, pos_stride, sc, stride, ahead);
                        i += alike == 6 ? 6 : 3;
                        continue;
                    }
                    for (int64_t j = 0; j < ahead; ++j) prefetch_head(ck + (CH + j) * pos_stride, hd);
                    if (n > 0 && wide) score_any<F32>(wide, query(i), buf.data(), nullptr, 0, n, hd, hd, &scores[i * stride + c0]);
                    else if (n > 0) score_keys<W>(query(i), ck, nullptr, 0, n, hd, pos_stride, &scores[i * stride + c0]);
                    ++i;
                }
            }
            for (int64_t i = 0; i < Q; ++i) {  // each row's other keys, and the softmax
                const int64_t r = row(i), n = count[r];
                if (n == 0) continue;
                score_any<W>(wide, query(i), kg, index ? index + start[r] : nullptr, shared[i], n, hd, pos_stride,
                              &scores[i * stride]);
                inv[i] = softmax_any(wide, &scores[i * stride], n, scale);
            }
            for (int64_t c0 = 0; c0 < P; c0 += CH) {  // the shared values
                const int64_t c1 = std::min(P, c0 + CH);
#ifdef SPECDEC_AMX
                if (wide) convert_keys16<W>(vg, c0, c1, hd, pos_stride, buf.data());
#endif
                const typename W::T* cv = vg + c0 * pos_stride;
                for (int64_t i = 0; i < Q;) {
                    const int64_t n = within(i, c0), alike = alike_from(i, c0);
                    const int64_t ahead = !wide && i == 0 && n == CH ? std::min(CH, P - c1) : 0;
                    // weigh_block steps through 16 values at a time (32 for two queries); other head sizes take
                    // the one-query code, reading and widening the values once a query
                    if (!wide && n > 0 && alike >= 2 && hd % 32 == 0) {
                        const float* ps[6];
                        float* as[6];
                        for (int64_t a = 0; a < alike; ++a) ps[a] = &scores[(i + a) * stride + c0], as[a] = &acc[(i + a) * AH];
                        if (alike == 6) weigh_block<W, 6, 2>(ps, cv, n, hd, pos_stride, as, ahead);
                        else if (alike >= 3) weigh_block<W, 3, 2>(ps, cv, n, hd, pos_stride, as, ahead);
                        else weigh_block<W, 2, 4>(ps, cv, n, hd, pos_stride, as, ahead);
                        i += alike == 6 ? 6 : alike >= 3 ? 3 : 2;
                        continue;
                    }
                    for (int64_t j = 0; j < ahead; ++j) prefetch_head(cv + (CH + j) * pos_stride, hd);
                    if (n > 0 && wide) weigh_any<F32>(wide, &scores[i * stride + c0], buf.data(), nullptr, 0, n, hd, hd, &acc[i * AH]);
                    else if (n > 0) weigh_values<W>(&scores[i * stride + c0], cv, nullptr, 0, n, hd, pos_stride, &acc[i * AH]);
                    ++i;
                }
            }
            for (int64_t i = 0; i < Q; ++i) {
                const int64_t r = row(i), n = count[r];
                Y* o = out + (r * nh + head(i)) * hd;
                if (n == 0) {
                    for (int64_t d = 0; d < hd; ++d) store(o + d, 0.f);
                    continue;
                }
                weigh_any<W>(wide, &scores[i * stride], vg, index ? index + start[r] : nullptr, shared[i], n, hd,
                                pos_stride, &acc[i * AH]);
                const float* a = &acc[i * AH];
                for (int64_t d = 0; d < hd; ++d) store(o + d, (wide ? a[d] + a[hd + d] : a[d]) * inv[i]);
            }
        }
    }
}


// A whole decoder stack (llama / qwen2 layers on grouped weights) for the M rows of one pass, in
// one call: the same steps as models/llama.py's layers, with every elementwise step computed in
// float32 and rounded once to the model dtype Y, each row on its own (norm, rope, silu) or by the
// invariant kernels above (products, attention). So a row's bits depend on that row and its keys
// only: exact mode by construction, with none of the ~90 framework calls a layer otherwise costs.

struct Part {  // one GGUF tensor's unpacked blocks (models/grouped_weights.py Grouped), or a dense weight
               // (bits 16: bfloat16 [rows, K] at q; bits 32: float32; no scales)
    const void* q;
    const void* scale;
    const void* offset;
    const float* scale_super;
    const float* offset_super;
    const float* bias;  // float32 [rows] or null
    int64_t rows, bits, is_signed, group, columns;  // columns: the columns layout (vnni_glinear)
};
struct Projection {  // parts side by side in the output (a fused q/k/v or gate/up)
    Part parts[3];
    int64_t count, out;
};
struct Layer {
    Projection qkv, o, gate_up, down;
    const float* norm_in;  // the norms' weights (model dtype values, in float32)
    const float* norm_post;
};
struct Dims {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    int64_t pos_stride, head_stride;  // a cache position's and a kv head's stride in elements
    float eps;
};

inline float rounded(float v, float*) { return v; }
inline float rounded(float v, uint16_t*) {
    uint16_t b;
    store(&b, v);
    return Bf16::one(&b);
}
template <class Y> inline float value(const Y* p) { return float(*p); }
template <> inline float value(const uint16_t* p) { return Bf16::one(p); }

// y[i] = rounded(a[i] + b[i]) for n values, 8 at a time (the tail one at a time, the same sums)
template <class Y>
inline void add_rounded(Y* y, const Y* b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8(y + i, _mm256_add_ps(load8(y + i), load8(b + i)));
    for (; i < n; ++i) store(y + i, value(y + i) + value(b + i));
}

template <class Y>
int project(const Projection& p, const Y* x, int64_t M, int64_t K, Y* y) {
    int64_t column = 0;
    for (int64_t i = 0; i < p.count; ++i) {
        const Part& part = p.parts[i];
        const bool x_bf16 = std::is_same<Y, uint16_t>::value;
        if (part.bits == 16 || part.bits == 32) {
            const Epilogue e{nullptr, part.bias};
            if (part.bits == 16)
                linear<Bf16>(x, x_bf16, static_cast<const uint16_t*>(part.q), e, y + column, M, part.rows, K, p.out);
            else
                linear<F32>(x, x_bf16, static_cast<const float*>(part.q), e, y + column, M, part.rows, K, p.out);
            column += part.rows;
            continue;
        }
        const GroupScales gs{part.scale, part.offset, part.scale_super, part.offset_super};
        if (glinear_any(x, x_bf16, static_cast<const uint8_t*>(part.q), part.columns != 0, int(part.bits),
                        int(part.is_signed), gs, part.group, part.bias, y + column, p.out, M, part.rows, K))
            return 1;
        column += part.rows;
    }
    // the products' loops end without waiting (nowait), so that a fused projection's parts follow
    // each other: one barrier for the whole output
    #pragma omp barrier
    return 0;
}

// out = weight * (x / rms(x)) over one row of H, the normalized value rounded before the weight as
// Hugging Face's RMSNorm does, then the product rounded; the sum of squares in dot_f32's order (8
// lanes, then the tail)
template <class Y>
inline void norm_row(const Y* row, const float* weight, int64_t H, float eps, Y* out) {
    const int64_t H8 = H & ~int64_t(7);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < H8; i += 8) {
        const __m256 v = load8(row + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float squares = hsum(acc);
    for (int64_t i = H8; i < H; ++i) squares = fmaf(value(row + i), value(row + i), squares);
    const float inv = 1.0f / sqrtf(squares / float(H) + eps);
    const __m256 iv = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < H8; i += 8)
        store8(out + i, _mm256_mul_ps(rounded8(_mm256_mul_ps(load8(row + i), iv), out), _mm256_loadu_ps(weight + i)));
    for (int64_t i = H8; i < H; ++i) store(out + i, rounded(value(row + i) * inv, out) * weight[i]);
}

// The residual stream's step between sublayers, a row at a time for the team: x += add (rounded;
// none without add), then out = norm(x) (none without weight)
template <class Y>
void add_norm(Y* x, const Y* add, const float* weight, int64_t M, int64_t H, float eps, Y* out) {
    #pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
        if (add) add_rounded(x + m * H, add + m * H, H);
        if (weight) norm_row(x + m * H, weight, H, eps, out + m * H);
    }
}

// silu(g) * u over n values: g / (1 + exp(-g)) * u, exp by exp8 (the tail by the same lanes)
template <class Y>
inline void silu_product(const Y* g, const Y* u, Y* out, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    auto silu = [&](__m256 gv, __m256 uv) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv);
    };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8(out + i, silu(load8(g + i), load8(u + i)));
    if (i < n) {  // the tail through a buffer, zeros beyond it
        const int64_t k = n - i;
        float gs[8] = {0}, us[8] = {0}, r[8];
        for (int64_t j = 0; j < k; ++j) gs[j] = value(g + i + j), us[j] = value(u + i + j);
        _mm256_storeu_ps(r, silu(_mm256_loadu_ps(gs), _mm256_loadu_ps(us)));
        for (int64_t j = 0; j < k; ++j) store(out + i + j, r[j]);
    }
}

// x * cos + rotate_half(x) * sin over one head, cos and sin float32 [hd] (sin's first half negated)
template <class Y>
inline void rope_head(const Y* x, const float* cos, const float* sin, int64_t hd, float* out) {
    const int64_t half = hd / 2;
    for (int64_t d = 0; d < hd; ++d) {
        const float rotated = value(x + (d < half ? d + half : d - half));
        out[d] = rounded(fmaf(value(x + d), cos[d], rotated * sin[d]), static_cast<Y*>(nullptr));
    }
}

template <class Y>
struct Activations {  // one pass's intermediate rows, which the team shares
    std::vector<Y> h, qkv, att, o, gu, act;
    std::vector<float> q;
    Activations(const Dims& s, int64_t M)
        : h(M * s.hidden), qkv(M * (s.heads + 2 * s.kv_heads) * s.head_dim), att(M * s.heads * s.head_dim),
          o(M * s.hidden), gu(M * 2 * s.intermediate), act(M * s.intermediate), q(M * s.heads * s.head_dim) {}
};

// Rows' rotary embedding: queries into q (float32), keys and values into the caches, a row at a time
template <class Y>
void rope_rows(const Dims& s, const Y* qkv, int64_t M, const float* cos, const float* sin, const int64_t* pos,
               Y* keys, Y* values, const int64_t* base, const int64_t* write, float* q) {
    const int64_t hd = s.head_dim, nh = s.heads, nkv = s.kv_heads, QKV = (nh + 2 * nkv) * hd;
    std::vector<float> rotated(hd);
    #pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
        const Y* row = qkv + m * QKV;
        const float* c = cos + (pos ? pos[m] : m) * hd;  // the tables' row of its position, or row m
        const float* sn = sin + (pos ? pos[m] : m) * hd;
        for (int64_t g = 0; g < nh; ++g) rope_head(row + g * hd, c, sn, hd, q + (m * nh + g) * hd);
        for (int64_t g = 0; g < nkv; ++g) {
            const int64_t at = base[m] + g * s.head_stride + write[m] * s.pos_stride;
            rope_head(row + (nh + g) * hd, c, sn, hd, rotated.data());
            for (int64_t d = 0; d < hd; ++d) store(keys + at + d, rotated[d]);
            memcpy(values + at, row + (nh + nkv + g) * hd, hd * sizeof(Y));
        }
    }
}

// Where a pass's time goes, step by step: built only with -DSPECDEC_PHASES (scripts/stack_phases.py),
// each thread adding the seconds from one step's end to the next's (a step's barrier wait included)
#ifdef SPECDEC_PHASES
constexpr int PHASES = 10, PHASE_THREADS = 64;
double phase_seconds[PHASE_THREADS][PHASES];
#define PHASE_START double phase_at = omp_get_wtime()
#define PHASE(i)                                                                   \
    do {                                                                           \
        const double now = omp_get_wtime();                                       \
        phase_seconds[omp_get_thread_num() % PHASE_THREADS][i] += now - phase_at; \
        phase_at = now;                                                            \
    } while (0)
#else
#define PHASE_START
#define PHASE(i)
#endif

// The layers for the team (every thread of the region calls it)
template <class Y>
int stack(const Layer* layers, int64_t L, const Dims& s, Y* x, int64_t M, const float* cos, const float* sin,
          const int64_t* pos, Y* const* keys, Y* const* values, const int64_t* base, const int64_t* write, const int64_t* count,
          const int64_t* start, const int64_t* index, const float* final_norm, Activations<Y>& a) {
    using W = typename std::conditional<std::is_same<Y, uint16_t>::value, Bf16, F32>::type;
    const int64_t H = s.hidden, hd = s.head_dim, nh = s.heads, nkv = s.kv_heads, I = s.intermediate;
    PHASE_START;
    add_norm<Y>(x, nullptr, L > 0 ? layers[0].norm_in : final_norm, M, H, s.eps, a.h.data());  // no layers: the final norm
    PHASE(9);
    for (int64_t l = 0; l < L; ++l) {
        const Layer& layer = layers[l];
        if (project(layer.qkv, a.h.data(), M, H, a.qkv.data())) return 1;
        PHASE(0);
        rope_rows(s, a.qkv.data(), M, cos, sin, pos, keys[l], values[l], base, write, a.q.data());
        PHASE(1);
        attend<W>(a.q.data(), keys[l], values[l], base, count, start, index, a.att.data(), M, nh, nkv, hd, s.pos_stride,
                  s.head_stride, 1.0f / sqrtf(float(hd)));
        PHASE(2);
        if (project(layer.o, a.att.data(), M, nh * hd, a.o.data())) return 1;
        PHASE(3);
        add_norm(x, a.o.data(), layer.norm_post, M, H, s.eps, a.h.data());
        PHASE(4);
        if (project(layer.gate_up, a.h.data(), M, H, a.gu.data())) return 1;
        PHASE(5);
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m)
            silu_product(a.gu.data() + m * 2 * I, a.gu.data() + m * 2 * I + I, a.act.data() + m * I, I);
        PHASE(6);
        if (project(layer.down, a.act.data(), M, I, a.o.data())) return 1;
        PHASE(7);
        // the residual, and the next layer's first norm with it (after the last, the final norm)
        add_norm(x, a.o.data(), l + 1 < L ? layers[l + 1].norm_in : final_norm, M, H, s.eps, a.h.data());
        PHASE(8);
    }
    if (final_norm) {  // x becomes the final hidden states (the residual is not needed after)
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) memcpy(x + m * H, a.h.data() + m * H, H * sizeof(Y));
    }
    return 0;
}

// stack() in one parallel region
template <class Y>
int stack_region(const Layer* layers, int64_t L, const Dims& s, Y* x, int64_t M, const float* cos, const float* sin,
                 const int64_t* pos, Y* const* keys, Y* const* values, const int64_t* base, const int64_t* write, const int64_t* count,
                 const int64_t* start, const int64_t* index, const float* final_norm) {
    Activations<Y> a(s, M);
    int failed = 0;
    #pragma omp parallel
    {
        const int r = stack(layers, L, s, x, M, cos, sin, pos, keys, values, base, write, count, start, index,
                            final_norm, a);
        #pragma omp master
        failed = r;
    }
    return failed;
}

}  // namespace

extern "C" {

#ifdef SPECDEC_PHASES
// The seconds each step took on each thread since the last call ([64 threads][10 steps]: q/k/v,
// rope, attention, o, norm, gate/up, silu, down, the next norm, the first norm), then zeroed
void phase_seconds_take(double* out) {
    memcpy(out, phase_seconds, sizeof(phase_seconds));
    memset(phase_seconds, 0, sizeof(phase_seconds));
}
#endif

int specdec_kernels_version() { return 18; }

// Which kernel bfloat16 weights with bfloat16 inputs go through: 0 tile() (AVX2 + FMA), 1 AMX
// (asks Linux for the tile state first), 2 AVX-512 BF16 dot products (dp_linear; the caller checked
// the CPU). Set once, before any product, and kept: a row's bits
// depend on it. Returns the kernel now in use.
int set_bf16_kernel(int kernel) {
    if (kernel == 1 && !amx_request()) return bf16_kernel;
#ifndef SPECDEC_AMX
    if (kernel == 2) return bf16_kernel;  // a compiler without the AVX-512 BF16 intrinsics
#endif
    bf16_kernel = kernel == 1 || kernel == 2 ? kernel : 0;
    return bf16_kernel;
}

// Where the products ask for their weights ahead (tile_prefetch, dp_prefetch, grouped_prefetch: 0 into L1, 1 into
// L2): only speed differs, so it may change at any time. Return the level now in use.
static inline int set_dp_switch(int& flag, int on) {  // 0 where this build lacks the AVX-512 BF16 code
#ifdef SPECDEC_AMX
    flag = on == 1 ? 1 : 0;
#endif
    return flag;
}
int set_dp_prefetch(int level) { return set_dp_switch(dp_prefetch, level); }
// How AVX-512 BF16 products past 4 rows end (dp_tail: 0 in 1- or 2-row tiles, 1 in a 5- or 6-row
// one): only speed differs. Return the choice now in use.
int set_dp_tail(int whole) { return set_dp_switch(dp_tail, whole); }
int set_tile_prefetch(int level) {
    tile_prefetch = level == 1 ? 1 : 0;
    return tile_prefetch;
}
int set_grouped_prefetch(int level) {
    grouped_prefetch = level == 1 ? 1 : 0;
    return grouped_prefetch;
}

// Whether grouped weights in the columns layout can be multiplied (1: this build has the AVX-512
// VNNI code; the caller checked the CPU): load() sets it from variants.py's choice before any
// weight is laid out. Returns the setting now in use.
// Whether full 16-row chunks of columns-layout products run on AMX-INT8 tiles (1, where Linux
// grants the tiles; the caller checked the CPU): the same bits as VNNI's, chosen by timing.
int set_grouped_wide_kernel(int kernel) {
#ifdef SPECDEC_AMX
    if (kernel == 1 && !amx_request()) return grouped_wide_kernel;
    grouped_wide_kernel = kernel == 1 ? 1 : 0;
#endif
    return grouped_wide_kernel;
}

// Which attention kernel runs (see attention_kernel; 1 where this build has the AVX-512 code and the
// caller checked the CPU). Returns the kernel now in use.
int set_attention_kernel(int kernel) {
#ifdef SPECDEC_AMX
    attention_kernel = kernel == 1 || kernel == 2 ? kernel : 0;
#endif
    return attention_kernel;
}

int set_grouped_kernel(int kernel) {
    grouped_columns_kernel = kernel == 2 ? 2 : 0;
#ifdef SPECDEC_AMX
    if (kernel == 1) grouped_columns_kernel = 1;
#endif
    return grouped_columns_kernel;
}

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

// y[:, :N] (row stride ldy) = x @ (q * scale (+ offset)).T (+ bias) with x quantized to 8 bits
// by blocks of 32 (see glinear), groups of G inputs; q [N, K] one value a byte (bits 8, G 16 or
// 32; is_signed: int8 without offsets) or [N, K / 2] unsigned 4-bit (bits 4, G 32); scale, offset
// [N, K / G] float32 (offset may be null), or with scale_super (and offset_super) [N, K / 256]
// float32, int8 times those (GroupScales); columns: q in the columns layout (vnni_glinear, N % 16 == 0).
// Returns 1 for a layout it lacks.
int linear_grouped(const void* x, int x_bf16, const void* q, int columns, int bits, int is_signed, const void* scale,
                   const void* offset, const float* scale_super, const float* offset_super, int64_t G,
                   const float* bias, void* y, int y_bf16, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const uint8_t* w = static_cast<const uint8_t*>(q);
    const GroupScales gs{scale, offset, scale_super, offset_super};
    int missing = 0;
    #pragma omp parallel
    {
        const int r = y_bf16 ? glinear_any(x, x_bf16 != 0, w, columns != 0, bits, is_signed, gs, G, bias,
                                           static_cast<uint16_t*>(y), ldy, M, N, K)
                             : glinear_any(x, x_bf16 != 0, w, columns != 0, bits, is_signed, gs, G, bias,
                                           static_cast<float*>(y), ldy, M, N, K);
        #pragma omp master
        missing = r;
    }
    return missing;
}

// caches in bfloat16 or float32; out float32 or bfloat16 (out_bf16)
#define ATTEND(NAME, W, CACHE)                                                                              \
    void NAME(const float* q, const CACHE* k, const CACHE* v, const int64_t* base, const int64_t* count,    \
              const int64_t* start, const int64_t* index, void* out, int out_bf16, int64_t rows, int64_t nh, \
              int64_t nkv, int64_t hd, int64_t pos_stride, int64_t head_stride, float scale) {              \
        _Pragma("omp parallel")                                                                             \
        if (out_bf16)                                                                                       \
            attend<W>(q, k, v, base, count, start, index, static_cast<uint16_t*>(out), rows, nh, nkv, hd,   \
                      pos_stride, head_stride, scale);                                                      \
        else                                                                                                \
            attend<W>(q, k, v, base, count, start, index, static_cast<float*>(out), rows, nh, nkv, hd,      \
                      pos_stride, head_stride, scale);                                                      \
    }
ATTEND(attend_bf16, Bf16, uint16_t)
ATTEND(attend_f32, F32, float)

// decoder layers [0, L) over x [M, hidden] (the residual stream, float32 or bfloat16 as the
// caches, updated in place); cos and sin float32 tables [positions, head_dim] (sin's first half
// negated), row m at rope position pos[m] (pos null: the tables are [M, head_dim], row m's at m);
// row m writes its key and value at cache position write[m] of the sequence at base[m] and
// attends as attend() does (count, start, index). final_norm (float32 [hidden], or null): x ends
// as the final norm of the residual stream, as the layers' norms compute it (one torch call
// fewer a pass: its code, cold after the weights streamed through the caches, cost ~40 us a
// call). 1 if a weight layout is missing (see glinear_any): then x and the caches hold partial
// results.
int stack_forward(const Layer* layers, int64_t L, const Dims* dims, void* x, int x_bf16, int64_t M,
                  const float* cos, const float* sin, const int64_t* pos, void* const* keys, void* const* values, const int64_t* base,
                  const int64_t* write, const int64_t* count, const int64_t* start, const int64_t* index,
                  const float* final_norm) {
    if (x_bf16)
        return stack_region(layers, L, *dims, static_cast<uint16_t*>(x), M, cos, sin, pos,
                            reinterpret_cast<uint16_t* const*>(keys), reinterpret_cast<uint16_t* const*>(values), base,
                            write, count, start, index, final_norm);
    return stack_region(layers, L, *dims, static_cast<float*>(x), M, cos, sin, pos, reinterpret_cast<float* const*>(keys),
                        reinterpret_cast<float* const*>(values), base, write, count, start, index, final_norm);
}

}  // extern "C"
