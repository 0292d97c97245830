"""Plain decoding against transformers' generate() and basic engine behaviour."""
import pytest
import torch
from transformers import AutoModelForCausalLM

import specdec

from helpers import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("plain"), layers=2, kv_heads=1)


def test_greedy_matches_transformers_generate_float64(model_dir):
    decoder = specdec.load(target=model_dir, dtype="float64")
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    for prompt in ["def add", "class Point:\n", "for i in"]:
        ids = decoder.tokenizer.encode(prompt)
        ours = decoder.generate(prompt, max_new_tokens=24).token_ids
        out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24, eos_token_id=0,
                          pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        theirs = out[0, len(ids):].tolist()
        assert ours == theirs


def test_seeded_sampling_reproducible(model_dir):
    decoder = specdec.load(target=model_dir)
    a = decoder.generate("def", temperature=1.0, seed=3, max_new_tokens=16)
    b = decoder.generate("def", temperature=1.0, seed=3, max_new_tokens=16)
    c = decoder.generate("def", temperature=1.0, seed=4, max_new_tokens=16)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_stream_chunks_concatenate_to_result(model_dir):
    decoder = specdec.load(target=model_dir)
    chunks = list(decoder.stream("def", temperature=0.8, seed=1, max_new_tokens=20))
    result = chunks[-1].result
    assert "".join(c.text for c in chunks) == result.text
    assert sum((c.token_ids for c in chunks), []) == result.token_ids
    assert result.stats.new_tokens == len(result.token_ids) == 20
    assert result.finish_reason == "length"


def test_eos_stops_generation(model_dir):
    decoder = specdec.load(target=model_dir)
    decoder.engine.eos_ids = set(decoder.generate("def", max_new_tokens=5).token_ids[2:3])
    r = decoder.generate("def", max_new_tokens=5)
    assert r.finish_reason == "stop" and len(r.token_ids) == 3


def test_context_window_caps_generation(model_dir):
    decoder = specdec.load(target=model_dir)
    ids = list(range(1, 250))
    r = decoder.generate(ids, max_new_tokens=50)
    assert len(r.token_ids) == 256 - 249 and r.finish_reason == "length"
