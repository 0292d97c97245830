"""The batch-invariant C++ kernels (specdec/kernels): built here or refused with a reason, as
accurate as float32 arithmetic, and every row's bits independent of the rest of the call."""
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

from specdec.kernels import build, choose, invariant, variants

needs_kernels = pytest.mark.skipif(build.load() is None, reason=f"kernels unavailable: {build.unavailable()}")


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8])
def test_products_are_float32_accurate_and_row_invariant(dtype):
    g = torch.Generator().manual_seed(0)
    N, K = 45, 1003  # no multiple of a tile or a vector
    if dtype == torch.int8:
        weight = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        scale = torch.rand(N, generator=g) / 127
    else:
        weight, scale = (torch.randn(N, K, generator=g) * 0.05).to(dtype), None
    x = torch.randn(21, K, generator=g)
    y = invariant.linear(x, weight, scale)
    reference = F.linear(x.double(), weight.double() * (1 if scale is None else scale.double()[:, None]))
    assert torch.allclose(y.double(), reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))
    for m in range(1, 22):
        for start in (0, 21 - m):
            assert torch.equal(invariant.linear(x[start:start + m], weight, scale), y[start:start + m]), (m, start)


def _usable(variant: variants.Variant) -> list[str]:
    """The kernels of a variant this machine can run (AMX where the CPU has it and Linux grants it)."""
    lib = build.load()
    if lib is None:
        return []
    in_use = build.kernels_in_use()[variant.name]
    usable = [k for k in variant.runnable(build.cpu_flags()) if variant.set(lib, k) == k]
    variant.set(lib, in_use)
    return usable


BF16, GROUPED, GROUPED_WIDE, ATTENTION, TILE_PREFETCH, DP_PREFETCH, GROUPED_PREFETCH, DP_TAIL = variants.VARIANTS


@contextmanager
def kernel(variant: variants.Variant, name: str):
    """The variant's kernel `name` for the block (skipped where this machine lacks it), then back."""
    if name not in _usable(variant):
        pytest.skip(f"this machine cannot run the {name} kernel")
    lib, in_use = build.load(), build.kernels_in_use()[variant.name]
    variant.set(lib, name)
    try:
        yield
    finally:
        variant.set(lib, in_use)


@contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@needs_kernels
@pytest.mark.parametrize("name", BF16.kernels)
@pytest.mark.parametrize("N", [200, 203])  # 203: a column block ending in 3 columns outside a 4-column tile
@pytest.mark.parametrize("K", [576, 1536])  # AVX-512 BF16's panels of 12 and of 4 rows (DP_PANEL_BYTES)
def test_bfloat16_inputs_are_float32_accurate_and_row_invariant_on_each_kernel(name, N, K):
    g = torch.Generator().manual_seed(3)
    M = 40  # K a multiple of 32; N 12 blocks of 16 columns and 8 (or 11) more: AMX's shape
    weight = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    bias = torch.randn(N, generator=g)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    with kernel(BF16, name):
        y = invariant.linear(x, weight, bias=bias, out_dtype=torch.float32)
        reference = F.linear(x.double(), weight.double(), bias.double())
        assert torch.allclose(y.double(), reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))
        narrow = invariant.linear(x, weight, bias=bias)
        assert torch.equal(narrow, y.to(torch.bfloat16))  # one rounding of the same sums
        # chunks of 16 rows and what is left; tiles of 4 ending in 5 or 6 rows, a panel's last 1-2 rows joined
        for m in (1, 2, 3, 5, 6, 8, 9, 10, 13, 14, 15, 16, 17, 31, 33):
            for start in (0, M - m, 4):
                if start + m <= M:
                    for tail in (("split", "whole") if name == "avx512" else ("split",)):
                        with kernel(DP_TAIL, tail):
                            part = invariant.linear(x[start:start + m], weight, bias=bias, out_dtype=torch.float32)
                        assert torch.equal(part, y[start:start + m]), (name, m, start, tail)


def _grouped(layout: str, N: int, K: int, g: torch.Generator):
    """Random weights in one of the layouts models/gguf_blocks.py unpacks GGUF's formats to."""
    from specdec.kernels.invariant import super_width
    from specdec.models.grouped_weights import Grouped

    def ints(G):  # the whole int8 range: the AMX kernel splits the K-quants' scales in parts (rows.cpp)
        return torch.randint(-128, 128, (N, K // G), generator=g, dtype=torch.int8)

    def supers():
        return torch.rand(N, K // super_width(K), generator=g) / 1000

    def floats(G):
        return torch.rand(N, K // G, generator=g) / 100
    if layout == "Q4_K":  # 4 bits, two levels, offsets
        q = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
        return Grouped(q, ints(32), ints(32), 32, 4, supers(), supers())
    if layout == "Q6_K":  # a byte a value, groups of 16, two levels
        q = torch.randint(0, 64, (N, K), generator=g, dtype=torch.uint8)
        return Grouped(q, ints(16), ints(16), 16, 8, supers(), supers())
    if layout == "Q8_0":  # signed, one level, no offsets
        return Grouped(torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8), floats(32), None, 32)
    if layout == "Q4_1":  # 4 bits, one level, offsets
        q = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
        return Grouped(q, floats(32), -floats(32), 32, 4)
    q = torch.randint(0, 32, (N, K), generator=g, dtype=torch.uint8)  # Q5_0: a byte a value, offsets
    return Grouped(q, floats(32), -floats(32), 32, 8)


def laid_for(name: str, grouped, packed: bool = False):
    """grouped in the layout a kernel reads, as models/grouped_weights.py for_kernels lays it: the columns
    layout for VNNI, and for avx2-columns where it reads the format (4-bit values, Q6_K's, Q8_0's)."""
    if name.startswith("vnni") or (name == "avx2-columns" and (grouped.six_bit_packable
                                                                or grouped.four_bit_superblocks
                                                                or grouped.four_bit_one_level
                                                                or grouped.signed_bytes)):
        return grouped.in_columns(packed)
    return grouped


@contextmanager
def grouped_kernel(name: str):
    """avx2, vnni, avx2-columns, or vnni+amx: VNNI with its full 16-row chunks on AMX-INT8 tiles."""
    with kernel(GROUPED, name.split("+")[0]), kernel(GROUPED_WIDE, "amx" if name.endswith("+amx") else "vnni"):
        yield


@needs_kernels
@pytest.mark.parametrize("name", [*GROUPED.kernels, "vnni+amx"])
@pytest.mark.parametrize("layout,K", [("Q4_K", 512), ("Q4_K", 384), ("Q6_K", 512), ("Q6_K packed", 512),
                                      ("Q8_0", 160), ("Q4_1", 96), ("Q5_0", 96)])
def test_grouped_weights_with_bfloat16_inputs_are_accurate_and_row_invariant_on_each_kernel(name, layout, K):
    g = torch.Generator().manual_seed(4)
    N, M = 96, 53  # 6 blocks of 16 outputs (the columns layout's); 48 rows on AMX tiles for every layout
    grouped = _grouped(layout.split()[0], N, K, g)
    bias = torch.randn(N, generator=g)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    reference = F.linear(x.double(), grouped.dequantized().double(), bias.double())

    # the layout each kernel reads ("packed": Q6_K's values 6 bits each, grouped_weights.pack_six)
    laid = laid_for(name, grouped, layout.endswith("packed"))

    def product(rows):
        return invariant.linear_grouped(rows, laid.q, laid.scale, laid.offset, laid.group, bias, bits=laid.bits,
                                        scale_super=laid.scale_super, offset_super=laid.offset_super,
                                        out=torch.empty(len(rows), N), columns=laid.columns)
    with grouped_kernel(name):
        y = product(x)
        # x rounded to 8 bits by blocks, as llama.cpp does
        assert (y.double() - reference).abs().max() < 0.02 * float(reference.abs().max()), (name, layout)
        for m in (1, 2, 5, 7, 11, 16, 17, 32, 48):  # 11, 17: tiles of 11, 8 + 9 (SUPER_MAX_ROWS)
            for start in (0, M - m):
                assert torch.equal(product(x[start:start + m]), y[start:start + m]), (name, layout, m, start)
    if name == "vnni+amx":  # the tiles' rows have VNNI's bits, so either may run any row
        with grouped_kernel("vnni"):
            assert torch.equal(product(x), y), layout


@needs_kernels
def test_where_the_weights_are_asked_for_ahead_changes_no_bit():
    """tile_prefetch, dp_prefetch and grouped_prefetch (into L1 or L2; rows.cpp) are chosen by speed
    alone: the AVX2, AVX-512 BF16 and VNNI products give the same bits at either, whatever the rows
    (1-4 rows, and past 4 a column tile's first row tile apart from the later ones)."""
    g = torch.Generator().manual_seed(5)
    K, N = 576, 203
    weight = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(21, K, generator=g).to(torch.bfloat16)
    grouped = laid_for("vnni", _grouped("Q4_K", 96, 512, g))
    xg = torch.randn(21, 512, generator=g).to(torch.bfloat16)

    def products():
        out = []
        for m in (1, 2, 3, 4, 5, 9, 21):
            out.append(invariant.linear(x[:m], weight, out_dtype=torch.float32))
            out.append(invariant.linear_grouped(xg[:m], grouped.q, grouped.scale, grouped.offset, grouped.group,
                                                None, bits=grouped.bits, scale_super=grouped.scale_super,
                                                offset_super=grouped.offset_super, out=torch.empty(m, 96),
                                                columns=grouped.columns))
        return out
    with kernel(BF16, "avx2"):
        with kernel(TILE_PREFETCH, "l1"):
            near = products()
        with kernel(TILE_PREFETCH, "l2"):
            far = products()
    assert all(torch.equal(a, b) for a, b in zip(near, far))
    with kernel(BF16, "avx512"), kernel(GROUPED, "vnni"):
        with kernel(DP_PREFETCH, "l1"), kernel(GROUPED_PREFETCH, "l1"):
            near = products()
        with kernel(DP_PREFETCH, "l2"), kernel(GROUPED_PREFETCH, "l2"):
            far = products()
    assert all(torch.equal(a, b) for a, b in zip(near, far))


@needs_kernels
@pytest.mark.parametrize("layout", ["Q4_K", "Q6_K", "Q6_K packed"])
def test_the_tiles_rows_in_several_panels_have_vnnis_bits(layout):
    """Rows wide enough that the AMX kernel takes x in several panels (rows.cpp amx_super_glinear:
    each panel's quantized x within 1.5 MB): still each row's VNNI bits."""
    g = torch.Generator().manual_seed(6)
    N, K, M = 32, 8192, 208
    laid = _grouped(layout.split()[0], N, K, g).in_columns(layout.endswith("packed"))
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)

    def product():
        return invariant.linear_grouped(x, laid.q, laid.scale, laid.offset, laid.group, None, bits=laid.bits,
                                        scale_super=laid.scale_super, offset_super=laid.offset_super,
                                        out=torch.empty(M, N), columns=True)
    with grouped_kernel("vnni+amx"):
        tiles = product()
    with grouped_kernel("vnni"):
        assert torch.equal(product(), tiles)


@needs_kernels
@pytest.mark.parametrize("layout,K", [("Q4_K", 512), ("Q4_K", 384), ("Q6_K", 512), ("Q6_K packed", 512),
                                      ("Q4_1", 96), ("Q4_1", 576), ("Q8_0", 160), ("Q8_0", 576)])
def test_avx2_columns_give_vnnis_bits(layout, K):
    """The AVX2 kernel on the columns layout computes VNNI's integers and float steps: the same bits
    for every row (where this CPU has VNNI to compare with), and its own at any width."""
    g = torch.Generator().manual_seed(9)
    N, M = 64, 19
    laid = _grouped(layout.split()[0], N, K, g).in_columns(layout.endswith("packed"))
    bias = torch.randn(N, generator=g)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)

    def product(rows, dtype=torch.float32):
        return invariant.linear_grouped(rows, laid.q, laid.scale, laid.offset, laid.group, bias, bits=laid.bits,
                                        scale_super=laid.scale_super, offset_super=laid.offset_super,
                                        out=torch.empty(len(rows), N, dtype=dtype), columns=True)
    with grouped_kernel("avx2-columns"):
        y, narrow = product(x), product(x, torch.bfloat16)
        for m in (1, 2, 3, 4, 5, 6, 7, 8, 9):  # 2-6 rows inner (4-bit values: tiles of 2-4), 8 a half at a time
            assert torch.equal(product(x[M - m:]), y[M - m:]), m
    if "vnni" not in _usable(GROUPED):
        pytest.skip("this CPU lacks AVX-512 VNNI to compare with")
    with grouped_kernel("vnni"):
        assert torch.equal(product(x), y) and torch.equal(product(x, torch.bfloat16), narrow)


@needs_kernels
@pytest.mark.parametrize("name", [*GROUPED.kernels, "vnni+amx"])
@pytest.mark.parametrize("layout,K", [("Q4_K", 384), ("Q4_1", 96), ("Q8_0", 160)])
def test_grouped_bfloat16_out_is_one_rounding_of_the_float32_result(name, layout, K):
    """The kernels' bfloat16 outputs (rounded 16 lanes at a time on the VNNI path) against torch's
    rounding of their float32 outputs, bit for bit (nearest even), and a NaN stays a NaN."""
    g = torch.Generator().manual_seed(8)
    N, M = 48, 21
    laid = _grouped(layout, N, K, g)
    laid = laid_for(name, laid)
    bias = torch.randn(N, generator=g)
    bias[5] = float("nan")
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)

    def product(dtype):
        return invariant.linear_grouped(x, laid.q, laid.scale, laid.offset, laid.group, bias, bits=laid.bits,
                                        scale_super=laid.scale_super, offset_super=laid.offset_super,
                                        out=torch.empty(M, N, dtype=dtype), columns=laid.columns)
    with grouped_kernel(name):
        wide, narrow = product(torch.float32), product(torch.bfloat16)
    assert narrow[:, 5].isnan().all() and not narrow[:, 6:].isnan().any()  # (torch's NaN has other bits)
    numbers = torch.ones(N, dtype=torch.bool).index_fill_(0, torch.tensor([5]), False)
    assert torch.equal(narrow[:, numbers].view(torch.int16), wide[:, numbers].to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("layout,K", [("Q4_K", 512), ("Q6_K", 512), ("Q8_0", 160)])
def test_the_columns_layout_keeps_every_weight(layout, K):
    grouped = _grouped(layout, 48, K, torch.Generator().manual_seed(5))
    columns = grouped.in_columns()
    assert columns.columns and not torch.equal(columns.q, grouped.q)
    assert torch.equal(columns.values(), grouped.values())
    rows = torch.tensor([47, 0, 17, 16, 3])
    assert torch.equal(columns.dequantized(rows), grouped.dequantized(rows))
    assert torch.equal(columns.row_major_q(slice(5, 21)), grouped.q[5:21])
    assert torch.equal(columns.row_major(columns.scale, rows), grouped.scale[rows])


def test_a_kernel_is_chosen_once_by_timing_and_remembered(tmp_path, monkeypatch):
    calls = []

    class Lib:  # stands for the built library: what set_bf16_kernel keeps
        kernel = 0

        def set_bf16_kernel(self, kernel):
            self.kernel = kernel
            return kernel

    def measure(self, lib, cpu_flags):
        calls.append(1)
        return {"avx2": 2.0, "amx": 1.0}

    monkeypatch.setattr(variants.Variant, "measure", measure)
    monkeypatch.delenv("SPECDEC_BF16_KERNEL", raising=False)
    library, amx = tmp_path / "rows-abc.so", {"avx2", "fma", "avx512f", "avx512bw", "amx_bf16", "amx_tile"}
    lib = Lib()
    assert variants.choose(lib, BF16, library, amx, "key") == "amx" and lib.kernel == 1 and calls == [1]
    assert variants.choose(Lib(), BF16, library, amx, "key") == "amx" and calls == [1]  # remembered, not timed
    assert variants.choose(Lib(), BF16, library, amx, "another CPU") == "amx" and calls == [1, 1]
    assert variants.choose(lib, BF16, library, {"avx2", "fma"}, "key") == "avx2" and lib.kernel == 0  # no AMX here
    monkeypatch.setenv("SPECDEC_BF16_KERNEL", "avx2")
    assert variants.choose(lib, BF16, library, amx, "key") == "avx2" and lib.kernel == 0 and calls == [1, 1]


def test_a_cpu_with_avx512_bf16_but_no_amx_times_avx2_against_the_dot_products(tmp_path, monkeypatch):
    """The AMD kind with AVX-512 BF16 (no AMX): two kernels timed, AMX never set; AVX2-only: none timed."""
    import dataclasses

    class Lib:
        def __init__(self):
            self.kernel, self.kernels_set = 0, []

        def set_bf16_kernel(self, kernel):
            self.kernels_set.append(kernel)
            self.kernel = kernel
            return kernel

    costs = {"avx2": 2.0, "amx": 0.5, "avx512": 1.0}
    timed = dataclasses.replace(BF16, timing=lambda lib, kernel: lambda M: costs[kernel] * M)
    monkeypatch.delenv("SPECDEC_BF16_KERNEL", raising=False)
    flags = {"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16"}
    lib = Lib()
    assert variants.choose(lib, timed, tmp_path / "rows-abc.so", flags, "zen4") == "avx512" and lib.kernel == 2
    assert 1 not in lib.kernels_set  # AMX's code never set on a CPU without it
    monkeypatch.setenv("SPECDEC_BF16_KERNEL", "amx")  # asked for, but this CPU lacks it: the timed choice kept
    assert variants.choose(lib, timed, tmp_path / "rows-abc.so", flags, "zen4") == "avx512"
    zen3 = Lib()
    assert variants.choose(zen3, timed, tmp_path / "rows-abc.so", {"avx2", "fma"}, "zen3") == "avx2"
    assert zen3.kernels_set == [0]


@needs_kernels
def test_bfloat16_in_and_out_with_a_bias_is_one_rounding_of_the_float32_result():
    g = torch.Generator().manual_seed(2)
    weight = (torch.randn(70, 300, generator=g) * 0.05).to(torch.bfloat16)
    bias = torch.randn(70, generator=g).to(torch.bfloat16)
    x = torch.randn(6, 300, generator=g).to(torch.bfloat16)
    wide = invariant.linear(x.float(), weight, bias=bias)
    assert wide.dtype == torch.float32
    narrow = invariant.linear(x, weight, bias=bias)
    assert narrow.dtype == torch.bfloat16
    assert torch.equal(narrow, wide.to(torch.bfloat16))  # round to nearest even, as PyTorch converts
    assert torch.equal(invariant.linear(x, weight, bias=bias, out_dtype=torch.float32), wide)


@needs_kernels
@pytest.mark.parametrize("name", ATTENTION.kernels)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hd", [40, 64])  # 40: a vector and a tail (8 lanes); 64: 16 lanes' four vectors
def test_attention_by_counts_or_positions_gives_the_same_bits(name, dtype, hd):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 3, hd, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 90, hd, generator=g).to(dtype) for _ in range(2))
    counts = [5, 60, 0, 90, 33, 1]
    with kernel(ATTENTION, name):
        by_count = invariant.attend(q, k, v, counts)
        by_position = invariant.attend(q, k, v, [], invariant.key_lists([torch.arange(c) for c in counts]))
    assert torch.equal(by_count, by_position)
    assert by_count.dtype == dtype and not by_count[0, :, 2].any()  # row b * T + t = 2 has no keys: zeros
    reference = F.scaled_dot_product_attention(q[:, :, :1].double(), k[:, :, :5].double(), v[:, :, :5].double(),
                                               enable_gqa=True)
    assert torch.allclose(by_count[:1, :, :1].double(), reference[:1], atol=1e-5 if dtype == torch.float32 else 1e-2)


@needs_kernels
@pytest.mark.parametrize("name", ATTENTION.kernels)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hd", [44, 64, 72, 128])  # a tail; 8 vectors (4 of 16 lanes); 8 and one more; 8 of 16
@pytest.mark.parametrize("group", [3, 5])  # query heads a kv head: blocks of 6 and 3 queries; of 3, 2 and 1
def test_each_attention_row_has_the_bits_it_has_alone(name, dtype, hd, group):
    """Rows of one sequence share their reads of the keys each reads from position 0 (a verify
    pass's chain or tree over a long prefix, a prefill's causal rows); each row's output must still
    be what a call of that row alone gives. Two threads: a lone row's query heads then split into work
    items of one query, which read every key on their own."""
    g = torch.Generator().manual_seed(3)
    B, nh, nkv, L = 2, 2 * group, 2, 120
    k, v = (torch.randn(B, nkv, L, hd, generator=g).to(dtype) for _ in range(2))
    counts = [71, 72, 73, 74, 101, 0, 99, 100]  # per sequence: shared prefixes of 71 and 0 keys
    q = torch.randn(B, nh, 4, hd, generator=g).to(dtype)
    with kernel(ATTENTION, name), threads(2):
        together = invariant.attend(q, k, v, counts)
        for b in range(B):
            for t in range(4):
                alone = invariant.attend(q[b:b + 1, :, t:t + 1], k[b:b + 1], v[b:b + 1], [counts[b * 4 + t]])
                assert torch.equal(together[b, :, t], alone[0, :, 0]), (b, t)
        for b in range(B):  # and near attention in float64
            for t in range(4):
                c = counts[b * 4 + t]
                if c:
                    row_keys, row_values = k[b:b + 1, :, :c].double(), v[b:b + 1, :, :c].double()
                    reference = F.scaled_dot_product_attention(q[b:b + 1, :, t:t + 1].double(), row_keys, row_values,
                                                               enable_gqa=True)
                    atol = 1e-5 if dtype == torch.float32 else 1e-2
                    assert torch.allclose(together[b, :, t].double(), reference[0, :, 0], atol=atol), (b, t)
        # a tree: a prefix of 70 keys, then each row's ancestors (cache order)
        lists = [list(range(70)) + extra for extra in ([70], [70, 71], [70, 72], [70, 71, 73])] * 2
        lists[4] = list(range(65)) + [66, 70]  # the second sequence's rows share 65 leading keys
        together = invariant.attend(q, k, v, [], invariant.key_lists([torch.tensor(x) for x in lists]))
        for b in range(B):
            for t in range(4):
                one = invariant.key_lists([torch.tensor(lists[b * 4 + t])])
                alone = invariant.attend(q[b:b + 1, :, t:t + 1], k[b:b + 1], v[b:b + 1], [], one)
                assert torch.equal(together[b, :, t], alone[0, :, 0]), (b, t)


def test_turned_off_or_refused_with_a_reason(tmp_path):
    code = ("from specdec.kernels import build, invariant; import torch; "
            "print(build.load() is None, build.unavailable(), invariant.linear(torch.ones(1, 8), torch.ones(2, 8)))")
    env = {"SPECDEC_KERNELS": "off", "SPECDEC_KERNEL_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split("\n")[0] == "True turned off by SPECDEC_KERNELS None"


@needs_kernels
def test_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path))
    compiler = build._compiler()
    first = build._build(compiler)
    assert first.parent == tmp_path and first.exists()
    stamp = first.stat().st_mtime_ns
    assert build._build(compiler) == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    assert list(tmp_path.iterdir()) == [first]  # no temporary files left


@needs_kernels
def test_fast_projections_choose_a_kernel_by_timing_and_keep_the_choice(monkeypatch):
    # an empty table of choices: another test in this worker may have timed a 64 x 128 weight
    monkeypatch.setattr(choose, "_choice", {})
    weight = torch.randn(64, 128).to(torch.bfloat16)
    x = torch.randn(3, 128).to(torch.bfloat16)
    calls = []

    def theirs(rows, bias):  # stands for a packed weight: called as packed(x, bias)
        calls.append(rows.shape[0])
        return F.linear(rows, weight, bias)

    chosen = choose.prefers_invariant(x, weight, packed=theirs)
    assert calls and chosen == choose.choices()[((64, 128), torch.bfloat16, torch.bfloat16, 3, torch.get_num_threads())]
    timed = len(calls)
    assert choose.prefers_invariant(x, weight, packed=theirs) == chosen and len(calls) == timed  # remembered
    wide = torch.randn(choose.WIDE_ROWS + 9, 128).bfloat16()
    decided = choose.prefers_invariant(wide, weight, packed=theirs)  # timed once on WIDE_ROWS rows
    timed = len(calls)
    assert choose.prefers_invariant(wide[:choose.MAX_ROWS + 1], weight, packed=theirs) == decided
    assert len(calls) == timed
    assert max(calls) == choose.WIDE_ROWS


def test_a_variant_that_needs_another_kernel_keeps_its_first_without_timing(tmp_path):
    """AMX chunks of the columns layout only where VNNI runs it: elsewhere nothing is timed."""
    class Lib:
        calls: list[int] = []

        def set_grouped_wide_kernel(self, kernel: int) -> int:
            self.calls.append(kernel)
            return kernel

    lib, flags = Lib(), set(GROUPED_WIDE.cpu_flags[0])
    library = tmp_path / "rows-x.so"
    assert variants.choose(lib, GROUPED_WIDE, library, flags, "k", {"grouped": "avx2"}) == "vnni"
    assert lib.calls == [0] and not list(tmp_path.iterdir())  # set, not measured, nothing remembered


@needs_kernels
def test_the_build_keeps_the_avx512_code_where_the_cpu_has_it():
    """The library falls back to an AVX2-only build when the compiler refuses the AVX-512/AMX
    code: on a CPU with VNNI or AVX-512 BF16 that would silently lose the faster kernels."""
    if not GROUPED.cpu_flags[0] <= build.cpu_flags() and not BF16.cpu_flags[1] <= build.cpu_flags():
        pytest.skip("this CPU lacks AVX-512 VNNI and AVX-512 BF16")
    if GROUPED.cpu_flags[0] <= build.cpu_flags():
        assert "vnni" in _usable(GROUPED)
    if BF16.cpu_flags[1] <= build.cpu_flags():
        assert "avx512" in _usable(BF16)
