"""Native runtime vs transformers' own model classes on the same saved weights."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from specdec.models import load_native, save_native
from specdec.models.checkpoint import load_state_dict

from helpers import make_model_dir

CONFIGS = [
    dict(model_type="llama"),
    dict(model_type="llama", tie=True, kv_heads=1, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    dict(model_type="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    # Mistral's sliding window (4096 by default) exceeds the 256-token context, so it never applies.
    dict(model_type="mistral", kv_heads=2),
    dict(model_type="qwen2", tie=True, kv_heads=2),
]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values())[:40])
def model_pair(request, tmp_path_factory):
    path = make_model_dir(tmp_path_factory.mktemp("m"), tokenizer="char", vocab_size=50, **request.param)
    native = load_native(path, "float32")
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return native, hf


def test_whole_sequence_logits_match(model_pair):
    native, hf = model_pair
    ids = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(native(ids), hf(ids).logits, atol=1e-4)


def test_incremental_and_rollback_match(model_pair):
    native, hf = model_pair
    ids = torch.randint(0, 50, (1, 48), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hf(ids).logits[0]
        cache = native.new_cache(64)
        parts = [native(ids[:, :20], cache=cache)[0]]
        for i in range(20, 30):
            parts.append(native(ids[:, i:i + 1], cache=cache)[0])
        assert torch.allclose(torch.cat(parts), want[:30], atol=1e-4)
        # speculate garbage, roll back, continue with the true tokens
        native(torch.randint(0, 50, (1, 5)), cache=cache)
        cache.rollback(30)
        rest = native(ids[:, 30:], cache=cache)[0]
        assert torch.allclose(rest, want[30:], atol=1e-4)
        assert cache.length == 48


def test_tree_mask_and_keep(model_pair):
    """Two branches scored in one pass with a tree mask equal scoring each branch alone;
    keeping one branch in the cache equals having fed only it."""
    native, _ = model_pair
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(3))
    a, b = [5, 6], [7, 8]
    with torch.no_grad():
        cache = native.new_cache(64)
        native(ids, cache=cache)
        tree = torch.tensor([a + b])
        mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
        pos = torch.tensor([12, 13, 12, 13])
        tree_logits = native(tree, pos, cache, mask)[0]
        cache.keep(12, [2, 3])
        after = native(torch.tensor([[9]]), cache=cache)[0]
        alone = native(torch.cat([ids, torch.tensor([b + [9]])], 1))[0]
        assert torch.allclose(tree_logits[2:], alone[12:14], atol=1e-4)
        assert torch.allclose(after, alone[14:], atol=1e-4)
        ref_a = native(torch.cat([ids, torch.tensor([a])], 1))[0]
        assert torch.allclose(tree_logits[:2], ref_a[12:14], atol=1e-4)


def test_save_roundtrip_and_dtypes(model_pair, tmp_path):
    native, _ = model_pair
    save_native(native, tmp_path)
    for dtype in ("float32", "float64", "bfloat16", "float16"):
        m = load_native(tmp_path, dtype)
        assert m.dtype == getattr(torch, dtype)
        out = m(torch.tensor([[1, 2, 3]]))
        assert torch.isfinite(out.float()).all()
    state = load_state_dict(tmp_path)
    for k, v in native.state_dict().items():
        if k in state:
            assert torch.equal(state[k], v)


def test_sharded_checkpoint(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    path = make_model_dir(tmp_path / "m", tokenizer="char", vocab_size=30)
    state = load_file(str(path / "model.safetensors"))
    keys = sorted(state)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(path / name))
        weight_map.update({k: name for k in part})
    (path / "model.safetensors").unlink()
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    m = load_native(path)
    assert torch.equal(m.model.embed_tokens.weight, state["model.embed_tokens.weight"])


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[4]], ids=["llama", "qwen2-bias"])
def test_fused_projections_keep_names_weights_and_logits(config, tmp_path):
    """Fusing Q/K/V and gate/up changes the kernels, not the model: same state_dict names and
    tensors (shared, not copied), the same logits, and a save that reloads unfused."""
    path = make_model_dir(tmp_path / "m", tokenizer="char", vocab_size=50, **config)
    plain, fused = load_native(path, "float64"), load_native(path, "float64").fuse_projections()
    assert list(plain.state_dict()) == list(fused.state_dict())
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, fused.state_dict()[name]), name
    attn = fused.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn.qkv.weight.data_ptr()  # a view, not a copy
    ids = torch.randint(0, 50, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(plain(ids), fused(ids), atol=1e-12, rtol=0)
    save_native(fused, tmp_path / "saved")
    reloaded = load_native(tmp_path / "saved", "float64")
    with torch.no_grad():
        assert torch.allclose(plain(ids), reloaded(ids), atol=1e-12, rtol=0)


def _rows_one_by_one_and_in_one_pass(runner, prefix: list[int], tokens: list[int], exact: bool, mask=None):
    """1-token passes (in exact mode when exact, as the engine's plain steps run there), and one pass."""
    runner.reset()
    runner.extend(prefix)
    one_by_one = torch.stack([runner.extend([t], exact=exact)[-1].clone() for t in tokens])
    runner.reset()
    runner.extend(prefix)
    return one_by_one, runner.extend(tokens, attn_mask=mask, exact=exact).clone()


def test_exact_passes_are_batch_invariant_in_bfloat16():
    """In bfloat16, a row scored inside a 9-token pass rounds differently from the same token
    scored in a 1-token pass; in exact mode every row equals the 1-token pass bit for bit, for
    chains and for tree masks (here a chain-shaped tree)."""
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.models.runner import NativeRunner
    from specdec.spec.verify import tree_attention_mask

    runner = NativeRunner(load_native(DEFAULT_TARGET, "bfloat16"), 256)
    ids = torch.randint(10, 8000, (160,), generator=torch.Generator().manual_seed(0)).tolist()
    for start in range(100, 150, 10):
        prefix, tokens = ids[:start], ids[start:start + 9]
        single, exact = _rows_one_by_one_and_in_one_pass(runner, prefix, tokens, exact=True)
        assert torch.equal(single, exact)
        chain_tree = tree_attention_mask(list(range(-1, len(tokens) - 2)))
        _, exact_tree = _rows_one_by_one_and_in_one_pass(runner, prefix, tokens, True, chain_tree)
        assert torch.equal(single, exact_tree)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_exact_linear_rows_do_not_depend_on_the_pass_width(kernels, dtype):
    """Every row of an exact product gets the bits it gets alone, at every pass width (odd
    output and reduction sizes included), on the invariant kernel and row by row without it;
    and the product is F.linear's to float32 rounding."""
    from specdec.models.exact import exact_linear

    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(77, 1541, generator=g) * 0.05).to(dtype)
    x = torch.randn(40, 1541, generator=g).to(dtype)
    alone = torch.cat([exact_linear(x[r:r + 1], weight) for r in range(40)])
    for m in (2, 3, 4, 5, 8, 9, 16, 17, 33, 40):
        assert torch.equal(exact_linear(x[:m], weight), alone[:m]), m
        assert torch.equal(exact_linear(x[m - 1:2 * m - 1], weight), alone[m - 1:2 * m - 1]), m
    reference = torch.nn.functional.linear(x.double(), weight.double())
    assert torch.allclose(alone.double(), reference, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_exact_branching_tree_rows_equal_one_token_passes(dtype):
    """Each node of a branching tree, scored in one exact pass, gets the bits of a 1-token pass
    at the end of its own path (prefix + ancestors + itself): what makes greedy tree decoding
    equal plain decoding. Rows at the same depth see as many keys but different ones."""
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.models.runner import NativeRunner
    from specdec.spec.verify import tree_attention_mask

    runner = NativeRunner(load_native(DEFAULT_TARGET, dtype), 256)
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(10, 8000, (120,), generator=g).tolist()
    parents = [-1, 0, 0, 1, 1, 2, 3, -1, 7, 5]  # root row 0 = the last accepted token's successor slot
    tokens = torch.randint(10, 8000, (len(parents) + 1,), generator=g).tolist()
    paths = []
    for node in range(len(tokens)):
        path, i = [node], node
        while i > 0:
            i = parents[i - 1] + 1
            path.insert(0, i)
        paths.append(path)
    runner.reset()
    runner.extend(prefix)
    depths = torch.tensor([len(path) - 1 for path in paths])
    tree = runner.extend(tokens, attn_mask=tree_attention_mask(parents), positions=len(prefix) + depths,
                         exact=True).clone()
    for node, path in enumerate(paths):
        runner.rollback(len(prefix))
        for j in path:
            last = runner.extend([tokens[j]], exact=True)[-1]  # as the engine's plain steps in exact mode
        assert torch.equal(last, tree[node]), node


def test_attend_rows_equals_each_row_alone():
    """attend_rows (chain rows together, tree rows gathered) against a 1-token exact_attend_row
    call per row over its own keys, for chain rows (key counts) and tree rows (key positions),
    grouped-query heads, in bf16 and float32."""
    from specdec.models.exact import attend_rows, exact_attend_row

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(1, 6, 4, 16, generator=g).to(dtype)
        k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(2))
        row_keys = [37, torch.tensor([*range(36), 37, 38]), 39, torch.tensor([*range(36), 39])]
        together = attend_rows(q, k, v, row_keys)
        for i, keys in enumerate(row_keys):
            own = slice(keys) if isinstance(keys, int) else keys
            alone = exact_attend_row(q[:, :, i:i + 1], k[:, :, own], v[:, :, own])
            assert torch.equal(together[:, :, i:i + 1], alone), (dtype, i)


@pytest.mark.parametrize("heads", [(9, 3, 64), (5, 1, 64), (8, 2, 32), (4, 4, 24)])
def test_tree_rows_get_each_row_its_own_bits(kernels, heads):
    """Exact mode's tree attention: every node of a branching tree (keys: the prefix, its
    ancestors and itself) equals exact_attend_row over exactly its keys gathered in cache
    order. Prefixes from 0 keys to ~900, trees of 2 to 33 rows, in bfloat16 and float32."""
    from specdec.models.exact import TreeRows, attend_rows, exact_attend_row
    from specdec.spec.verify import tree_attention_mask

    nh, nkv, hd = heads
    g = torch.Generator().manual_seed(3)
    trees = ([-1], [-1, 0, 0, 1, 1, 2, 3, -1, 7, 5], list(range(-1, 15)),
             [-1, -1, -1, 0, 0, 1, 2, 2, 3, 4, 4, 4, 5, 6, 7, 8, 9, 9, 10, 11, 12, 13, 14, 14, 15, 16, 17, 18, 19,
              20, 21, 22])
    for dtype in (torch.bfloat16, torch.float32):
        for past, parents in zip((0, 37, 250, 897), trees):
            seen = tree_attention_mask(parents)
            T = seen.shape[0]
            q = torch.randn(1, nh, T, hd, generator=g).to(dtype)
            k, v = (torch.randn(1, nkv, past + T, hd, generator=g).to(dtype) for _ in range(2))
            tree = TreeRows(past, seen)
            with torch.inference_mode():
                together = attend_rows(q, k, v, tree)
            for i, keys in enumerate(tree.positions):
                alone = exact_attend_row(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys])
                assert torch.equal(together[:, :, i:i + 1], alone), (dtype, past, i)


@pytest.mark.parametrize("heads", [(9, 3, 64), (5, 1, 64), (8, 2, 32)])
def test_attend_counted_gives_each_row_its_own_bits_beside_other_sequences(kernels, heads):
    """Exact mode's batched attention: sequences with different key counts and several rows
    each (ragged: a slot's padding rows stay zero); every row equals exact_attend_row over
    exactly its keys."""
    from specdec.models.exact import attend_counted, exact_attend_row

    nh, nkv, hd = heads
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float32):
        for base, widths in (([3, 450, 17, 200, 64, 1000], [1] * 6), ([30, 511, 95], [4] * 3),
                             ([30, 511, 95, 7], [1, 5, 2, 1]), ([300, 20, 40, 9], [1, 1, 9, 2])):
            counts = tuple(tuple(b + t + 1 for t in range(w)) for b, w in zip(base, widths))
            T = max(widths)  # ragged: a slot's padding rows stay zero
            q = torch.randn(len(base), nh, T, hd, generator=g).to(dtype)
            k, v = (torch.randn(len(base), nkv, max(base) + T + 3, hd, generator=g).to(dtype) for _ in range(2))
            with torch.inference_mode():
                together = attend_counted(q, k, v, counts)
            for b in range(len(base)):
                assert not together[b, :, widths[b]:].any()
                for t, c in enumerate(counts[b]):
                    alone = exact_attend_row(q[b:b + 1, :, t:t + 1], k[b:b + 1, :, :c], v[b:b + 1, :, :c])
                    assert torch.equal(together[b:b + 1, :, t:t + 1], alone), (dtype, b, t)


def test_exact_attention_is_as_accurate_as_the_fast_kernel():
    """exact_attend_row computes the same attention as attend_row (SDPA), to float32 rounding."""
    from specdec.models.exact import attend_row, exact_attend_row

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 9, 1, 64, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 203, 64, generator=g, dtype=torch.float64) for _ in range(2))
    reference = attend_row(q, k, v)  # float64
    for dtype in (torch.float32, torch.bfloat16):
        fast = attend_row(q.to(dtype), k.to(dtype), v.to(dtype)).double()
        exact = exact_attend_row(q.to(dtype), k.to(dtype), v.to(dtype)).double()
        assert (exact - reference).abs().max() <= 2 * (fast - reference).abs().max() + 1e-6, dtype


def test_prefill_without_logits_leaves_the_same_cache():
    """want_logits=False skips the LM head (a prefill needs only the cache): nothing comes back,
    and the next pass's logits equal those after a prefill that computed them."""
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.models.runner import NativeRunner

    runner = NativeRunner(load_native(DEFAULT_TARGET, "float32"), 64)
    prompt = list(range(20, 40))
    assert runner.extend(prompt, want_logits=False) is None
    skipped = runner.extend([7])
    runner.reset()
    assert runner.extend(prompt).shape[0] == len(prompt)
    assert torch.equal(runner.extend([7]), skipped)


def test_a_pass_asking_for_its_last_row_gets_that_row_alone():
    """last_logits (a draft's 2-token catch-up pass): the head runs over the last row only, and
    in exact mode that row's logits are the bits the whole pass gives it."""
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.models.runner import NativeRunner

    runner = NativeRunner(load_native(DEFAULT_TARGET, "float32"), 64)
    prompt = list(range(20, 40))
    runner.extend(prompt, want_logits=False)
    full = runner.extend([7, 8], exact=True)
    runner.rollback(len(prompt))
    last = runner.extend([7, 8], exact=True, last_logits=True)
    assert last.shape == (1, full.shape[-1]) and torch.equal(last[0], full[-1])
    assert runner.length == len(prompt) + 2


def test_keep_copies_only_the_positions_that_move():
    """An accepted path's leading rows already sit where they belong (the root, first children):
    only the later ones are copied down, and the result is what copying them all gives."""
    from specdec.models.cache import KVCache

    cache = KVCache(2, 1, 4, 16, torch.float32)
    for layer in range(2):
        for buf, sign in ((cache.keys[layer], 1), (cache.values[layer], -1)):
            buf[0, 0, :8] = sign * (torch.arange(8.0)[:, None] + 10 * layer)
    cache.length = 8
    cache.keep(3, [0, 1, 3, 4])  # positions 3, 4 stay; 6 and 7 move to 5 and 6
    assert cache.length == 7
    for layer in range(2):
        expected = torch.tensor([0.0, 1, 2, 3, 4, 6, 7]) + 10 * layer
        assert torch.equal(cache.keys[layer][0, 0, :7, 0], expected)
        assert torch.equal(cache.values[layer][0, 0, :7, 0], -expected)
    cache.keep(2, [0, 1])
    assert cache.length == 4 and torch.equal(cache.keys[1][0, 0, :4, 0], torch.tensor([10.0, 11, 12, 13]))


@pytest.mark.slow  # compiles the kernels a second time (~20 s)
def test_the_timed_stack_build_gives_the_same_bits_and_times_every_step():
    """rows.cpp built with -DSPECDEC_PHASES (scripts/stack_phases.py): the same logits as the
    running build, and each step's seconds recorded on the team's threads, then zeroed."""
    import ctypes

    from specdec.kernels import build
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.models.runner import NativeRunner

    if build.load() is None:
        pytest.skip(f"the kernels are unavailable here: {build.unavailable()}")
    timed = build.load_beside(("SPECDEC_PHASES",))
    runner = NativeRunner(load_native(DEFAULT_TARGET, "bfloat16"), 64)
    stack = runner.model.stack
    assert stack is not None
    outputs = []
    table = (ctypes.c_double * (64 * 10))()
    for lib in (stack.lib, timed):
        stack.lib = lib
        runner.reset()
        outputs.append([runner.extend(list(range(5, 25))), runner.extend([7]), runner.extend([8, 9, 10])])
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
    timed.phase_seconds_take(table)
    assert all(table[step] > 0 for step in range(10))  # thread 0: every step of the three passes
    timed.phase_seconds_take(table)
    assert not any(table)


def test_the_stack_keeps_a_caches_buffer_addresses_and_never_another_caches():
    """LayerStack._pointers: a cache's per-layer buffers' addresses built once per list; a list
    that is not the one kept (another cache, or a new list where a freed one was) gets its own."""
    from specdec.kernels import build
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.models.runner import NativeRunner

    if build.load() is None:
        pytest.skip(f"the kernels are unavailable here: {build.unavailable()}")
    stack = NativeRunner(load_native(DEFAULT_TARGET, "bfloat16"), 64).model.stack
    assert stack is not None

    def buffers():
        return [torch.zeros(1, 2, 8, 4) for _ in range(3)]

    first, second = buffers(), buffers()
    kept = stack._pointers(first)
    assert stack._pointers(first) is kept and list(kept) == [t.data_ptr() for t in first]
    assert list(stack._pointers(second)) == [t.data_ptr() for t in second]
    del first, kept
    for _ in range(20):  # new lists, some of them where a freed one was
        fresh = buffers()
        assert list(stack._pointers(fresh)) == [t.data_ptr() for t in fresh]


def test_the_layers_take_a_width_only_where_they_run_clearly_faster(monkeypatch):
    """time_fast_paths on a stand-in model whose passes take fixed, known times (a fake clock):
    layers 5% faster keep the stack (prefix reuse stays on), 30% faster take the width; the two
    ways are timed in turn."""
    import types

    from specdec.models import stack as stack_module

    class Clock:
        now = 0.0

    class Model:
        device, config = torch.device("cpu"), types.SimpleNamespace(vocab_size=50)
        stack = "the stack"
        order: list[bool] = []

        def new_cache(self, n):
            return types.SimpleNamespace(rollback=lambda length: None)

        def hidden_states(self, ids, cache):
            on_stack = self.stack is not None
            self.order.append(on_stack)
            width = ids.shape[1]
            Clock.now += 1.0 if on_stack else (0.95 if width <= 4 else 0.7)

    monkeypatch.setattr(stack_module, "time", types.SimpleNamespace(perf_counter=lambda: Clock.now))
    model = Model()
    paths = stack_module.time_fast_paths(model, repeats=3)
    assert paths.on_stack == {1: True, 2: True, 4: True, 8: False, 16: False, 32: False, 64: False}
    assert model.stack == "the stack" and model.order[1:5] == [True, False, True, False]  # in turn
