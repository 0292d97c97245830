"""A decode step's attention on bfloat16 caches: one query row per head over the cached keys,
read in bfloat16 and computed in float32, in one C++ kernel built by inductor's compiler.

Why: PyTorch's fused attention kernel is slow for a single bfloat16 query, so plain decoding
converts the cache to float32 and calls it on the copy (exact.attend_row). That conversion and
the float32 read grow with the context: measured here in SmolLM2's compiled 1-token graph at
1,000 cached tokens, 117 us a layer in the fused kernel and 62 us in the conversion, 5.4 ms of
a ~15 ms pass, where llama.cpp's pass barely grows with its context. This kernel reads each
bf16 key and value once: the keys are split into chunks of CHUNK (flash-decoding's split over
the sequence, so that 2 threads share even 3 key-value heads), each chunk keeps its running
max and sum, and the chunks are merged at the end.

The arithmetic is the float32 kernel's (scores, softmax and weighted sum in float32, one
rounding to bfloat16 at the end), in another summation order: the fast (not batch-invariant)
kind, like the compiled passes. Exact mode keeps exact_attend_row.

It is a torch op of ours (`specdec::attend_row_bf16`), so that dynamo and inductor treat it as
one opaque call inside a compiled graph. The C++ is compiled on first use by inductor's own
toolchain (the compiler, flags and disk cache its generated kernels use); where that fails the
op computes exact.attend_row's way instead, and `kernel_error()` says why."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.kernels.torch_private import compile_cpp_binding

CHUNK = 256  # keys per work item (written into the C++ source below)
MAX_HEAD_DIM, MAX_GROUP = 256, 16  # the sizes of the C++ kernel's scratch arrays

SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>

@LIMITS@
using Half = at::vec::Vectorized<at::BFloat16>;
using Floats = at::vec::VectorizedN<float, 2>;  // one Half's worth of floats
using Vec = at::vec::Vectorized<float>;

static inline Floats load_floats(const at::BFloat16* p) {
    return at::vec::convert<float, 2, at::BFloat16, 1>(Half::loadu(p, Half::size()));
}

// q [B, nh, hd] (contiguous), k and v: row j of kv head g of sequence b at
// k + b*batch_stride + g*head_stride + j*hd; out [B, nh, hd]; work: B*nkv*chunks*group*(hd+2) floats.
extern "C" void kernel(const at::BFloat16* q, const at::BFloat16* k, const at::BFloat16* v,
                       at::BFloat16* out, float* work, int64_t B, int64_t nh, int64_t nkv, int64_t hd,
                       int64_t L, int64_t batch_stride, int64_t head_stride) {
    const int64_t group = nh / nkv, chunks = (L + CHUNK - 1) / CHUNK, items = B * nkv * chunks;
    const int64_t W = Half::size(), parts = hd / W, part = hd + 2;
    const float scale = 1.0f / std::sqrt(float(hd));
    #pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
        const int64_t b = item / (nkv * chunks), g = item / chunks % nkv, c = item % chunks;
        const int64_t j0 = c * CHUNK, n = std::min(L, j0 + CHUNK) - j0;
        alignas(64) float qf[MAX_GROUP][MAX_HD], s[MAX_GROUP][CHUNK];
        const at::BFloat16* qg = q + (b * nh + g * group) * hd;
        for (int64_t h = 0; h < group; ++h)
            for (int64_t d = 0; d < hd; ++d) qf[h][d] = float(qg[h * hd + d]) * scale;
        const at::BFloat16* kg = k + b * batch_stride + g * head_stride + j0 * hd;
        const at::BFloat16* vg = v + b * batch_stride + g * head_stride + j0 * hd;
        const Vec zero(0.f);
        for (int64_t h = 0; h < group; ++h) {  // scores (the chunk's keys stay in cache for the next head)
            Floats qv[MAX_HD / 16];
            for (int64_t p = 0; p < parts; ++p) qv[p] = Floats::loadu(qf[h] + p * W);
            for (int64_t j = 0; j < n; ++j) {
                Floats acc = qv[0] * load_floats(kg + j * hd);
                for (int64_t p = 1; p < parts; ++p) acc = acc + qv[p] * load_floats(kg + j * hd + p * W);
                s[h][j] = at::vec::vec_reduce_all<float, 2>([](Vec& x, Vec& y) { return x + y; }, acc);
            }
        }
        float* w = work + item * group * part;
        for (int64_t h = 0; h < group; ++h) {  // this chunk's softmax numerators, max and sum
            float m = -INFINITY, l = 0.f;
            for (int64_t j = 0; j < n; ++j) m = std::max(m, s[h][j]);
            int64_t j = 0;
            Vec sum = zero;
            for (; j + Vec::size() <= n; j += Vec::size()) {
                Vec e = (Vec::loadu(s[h] + j) - Vec(m)).exp_u20();
                e.store(s[h] + j);
                sum = sum + e;
            }
            l = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
            for (; j < n; ++j) { s[h][j] = std::exp(s[h][j] - m); l += s[h][j]; }
            w[h * part] = m;
            w[h * part + 1] = l;
            for (int64_t p = 0; p < parts; ++p) {  // weighted values, summed in registers
                Floats acc(0.f);
                for (int64_t j = 0; j < n; ++j) acc = acc + Floats(s[h][j]) * load_floats(vg + j * hd + p * W);
                acc.store(w + h * part + 2 + p * W);
            }
        }
    }
    for (int64_t row = 0; row < B * nh; ++row) {  // merge the chunks of each head
        const int64_t b = row / nh, g = row % nh / group, h = row % group;
        const float* first = work + ((b * nkv + g) * chunks * group + h) * part;
        float m = -INFINITY, l = 0.f, acc[MAX_HD] = {0.f};
        for (int64_t c = 0; c < chunks; ++c) m = std::max(m, first[c * group * part]);
        for (int64_t c = 0; c < chunks; ++c) {
            const float* w = first + c * group * part;
            const float f = std::exp(w[0] - m);
            l += w[1] * f;
            for (int64_t d = 0; d < hd; ++d) acc[d] += w[2 + d] * f;
        }
        for (int64_t d = 0; d < hd; ++d) out[row * hd + d] = at::BFloat16(acc[d] / l);
    }
}
"""

SOURCE = SOURCE.replace(
    "@LIMITS@", f"constexpr int64_t MAX_HD = {MAX_HEAD_DIM}, MAX_GROUP = {MAX_GROUP}, CHUNK = {CHUNK};")
_ARGTYPES = ["const at::BFloat16*"] * 3 + ["at::BFloat16*", "float*"] + ["int64_t"] * 7
_built: dict = {}  # "kernel" or "error", set by the first call


def _kernel():
    """The compiled kernel, built on first use (a few seconds; then from inductor's disk
    cache), or None if it cannot be built here."""
    if not _built:
        try:
            _built["kernel"] = compile_cpp_binding(_ARGTYPES, SOURCE)
        except Exception as error:  # no compiler, or an inductor without this interface
            _built["error"] = f"{type(error).__name__}: {error}"
    return _built.get("kernel")


def kernel_error() -> str | None:
    """Why the kernel could not be built (None: it was, or has not been tried yet)."""
    return _built.get("error")


def supports(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether attend_row_bf16 takes these shapes: bf16 on CPU, one query row, head sizes that
    split into whole vectors, key-value heads laid out as cache rows (contiguous [L, hd])."""
    B, nh, T, hd = q.shape
    nkv = k.shape[1]
    return (q.dtype == k.dtype == torch.bfloat16 and q.device.type == "cpu" and T == 1 and nh % nkv == 0
            and nh // nkv <= MAX_GROUP and hd % 32 == 0 and hd <= MAX_HEAD_DIM and k.stride(3) == 1
            and k.stride(2) == hd)


def reference_attend_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, with PyTorch's kernels: float32 attention over a float32 copy
    of the cache (the fallback, and exact.attend_row's arithmetic)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), enable_gqa=k.shape[1] != q.shape[1])
    return out.to(q.dtype)


def _attend_row_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    kernel = _kernel()
    if kernel is None or k.stride() != v.stride():
        return reference_attend_row(q, k, v)
    B, nh, _, hd = q.shape
    nkv, L = k.shape[1], k.shape[2]
    q = q.contiguous()
    out = torch.empty_like(q)
    work = torch.empty(B * nkv * -(-L // CHUNK) * (nh // nkv) * (hd + 2), dtype=torch.float32)
    kernel(q, k, v, out, work, B, nh, nkv, hd, L, k.stride(0), k.stride(1))
    return out


# Registered with torch.library's low-level interface, not torch.library.custom_op: measured
# here, a call through custom_op's Python layers cost ~5 us more (a decode step makes one per
# layer), against ~1 us for a plain dispatcher entry.
_library = torch.library.Library("specdec", "DEF")
_library.define("attend_row_bf16(Tensor q, Tensor k, Tensor v) -> Tensor")
_library.impl("attend_row_bf16", _attend_row_bf16, "CPU")


@torch.library.register_fake("specdec::attend_row_bf16")
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def attend_row_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, nh, 1, hd] over all of k, v [B, nkv, L, hd] (bfloat16, `supports`): out [B, nh, 1, hd]."""
    return torch.ops.specdec.attend_row_bf16.default(q, k, v)
