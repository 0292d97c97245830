"""A draft model's chains stopped at its controller's confidence floor (spec/control/draft_length.py
confidence_floor) against the controller's K alone, beside plain decoding, in one process: decoders
of the `draft` method taking turns prompt by prompt at one temperature, 128 tokens each, every
request paying its prompt (no prefix reuse, no controller memory). Variants: `off` (the K the
controller picks, no stop: before stop 73), `learned` (the floor, its calibration learned: the
default), `k:N` (N drafts every step, no controller), a number g (the floor with the calibration's
exponent fixed at g), `no-guess` (the floor, without a draft's prompt-lookup guesses,
prompt_lookup.Guesser), `guess:N` (the floor, N guesses a draft pass where
the prompt has them, not sized by the draft's pass costs: guess:4 is before stop 80), `file:PATH` (the default, its
proposer's `propose` from another copy of spec/proposers/draft_model.py: an older version), `control:PATH` (the
default, its controllers from another copy of spec/control/draft_length.py), `prior:W` (the default, its acceptance
prior worth W drafts; `prior:W:D` also its evidence forgotten at D a drafted step). Decoding
tokens/s after the prefill, summed over the prompts, and the drafts a step.

    python scripts/draft_floor_ab.py qwen-coder code 3 0 off,learned,0.5 [repeats]
    python scripts/draft_floor_ab.py qwen-coder code 3 0 learned,k:1 2
    git show HEAD~1:specdec/spec/proposers/draft_model.py > /tmp/old.py
    python scripts/draft_floor_ab.py qwen-coder code 3 0 file:/tmp/old.py,learned 3
    git show HEAD:specdec/spec/control/draft_length.py > /tmp/old_control.py
    python scripts/draft_floor_ab.py qwen-coder code 3 0 control:/tmp/old_control.py,learned 2
"""
import dataclasses
import importlib.util
import sys
import types

import torch

from specdec import load
from specdec.bench.methods import TextTokenizer
from specdec.chat.template import ChatTemplate
from specdec.data.prompts import build_suite, render_chat
from specdec.spec.control.draft_length import ConfidenceCalibration


class FixedCalibration(ConfidenceCalibration):
    def __init__(self, gamma: float):
        super().__init__()
        self.fixed = gamma

    @property
    def gamma(self) -> float:
        return self.fixed


def decoder_for(target: str, variant: str):
    fixed = int(variant[len("k:"):]) if variant.startswith("k:") else None
    decoder = load(target=target, method="draft", dtype="bfloat16", memory=False, reuse_prefix=False,
                   draft_tokens=fixed)
    if variant == "off":
        decoder.engine.proposer.stops_at_floor = False  # read when the engine makes its controllers
    elif variant == "no-guess":  # the floor, without the greedy draft's prompt-lookup guesses
        decoder.engine.proposer.ahead = False
    elif variant.startswith("guess:"):  # the floor, N guesses a draft pass where the prompt has them (not sized)
        decoder.engine.proposer.guesser.tokens = int(variant[len("guess:"):])
        decoder.engine.proposer.guesser.pass_seconds = None
    elif variant.startswith("control:"):  # the default, its controllers from another copy of draft_length.py
        spec = importlib.util.spec_from_file_location("other_draft_length", variant[len("control:"):])
        other = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(other)
        names = {f.name for f in dataclasses.fields(other.DraftLengthController)}
        remake_controllers(decoder, lambda c: other.DraftLengthController(
            **{n: getattr(c, n) for n in names if hasattr(c, n)}))
    elif variant.startswith("prior:"):  # the default, its acceptance prior worth W drafts (prior:W or prior:W:DECAY)
        settings = [float(v) for v in variant[len("prior:"):].split(":")]
        remake_controllers(decoder, lambda c: dataclasses.replace(
            c, prior_weight=settings[0], decay=settings[1] if len(settings) > 1 else c.decay))
    elif variant.startswith("file:"):
        spec = importlib.util.spec_from_file_location("other_draft_model", variant[len("file:"):])
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        proposer = decoder.engine.proposer
        proposer.propose = types.MethodType(other.DraftModelProposer.propose, proposer)
    elif variant != "learned" and fixed is None:
        gamma = float(variant)
        remake_controllers(decoder, lambda c: dataclasses.replace(c, calibration=FixedCalibration(gamma)))
    return decoder


def remake_controllers(decoder, change) -> None:
    """The decoder's new controllers (its bank's, made as the engine makes them) passed through change."""
    bank = decoder.engine.controllers
    new = bank.new
    bank.new = lambda: change(new())


def main() -> None:
    target, task, n, temperature = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    variants = sys.argv[5].split(",")
    repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    torch.set_num_threads(2)
    tokenizer = TextTokenizer(target)
    prompts = render_chat(build_suite(n, [task]), ChatTemplate.from_tokenizer_config(tokenizer.config))
    decoders = {"none": load(target=target, method="none", dtype="bfloat16", memory=False, reuse_prefix=False)}
    decoders |= {variant: decoder_for(target, variant) for variant in variants}
    for decoder in decoders.values():  # warm-up
        decoder.generate(prompts[0].text, temperature=temperature, max_new_tokens=8, seed=0, ignore_eos=True)
    seconds, tokens = dict.fromkeys(decoders, 0.0), dict.fromkeys(decoders, 0)
    passes, drafted, kept, same = (dict.fromkeys(decoders, 0) for _ in range(4))
    for repeat in range(repeats):
        for i, prompt in enumerate(prompts):
            plain_ids = None
            for name, decoder in decoders.items():
                result = decoder.generate(prompt.text, temperature=temperature, max_new_tokens=128,
                                          seed=i + 100 * repeat, ignore_eos=True)
                stats = result.stats
                seconds[name] += stats.wall_seconds - stats.prefill_seconds
                tokens[name] += stats.new_tokens
                passes[name] += stats.target_forwards
                drafted[name] += stats.drafted_tokens
                kept[name] += stats.accepted_tokens
                plain_ids = result.token_ids if name == "none" else plain_ids
                same[name] += result.token_ids == plain_ids
    plain = tokens["none"] / seconds["none"]
    for name in decoders:
        rate = tokens[name] / seconds[name]
        print(f"{target} {task} T={temperature} {name:8s} decoding {rate:6.1f} tok/s {rate / plain:.3f}x plain | "
              f"drafts a step {drafted[name] / passes[name]:.2f}, kept {kept[name] / passes[name]:.2f} | "
              f"tokens as plain's {same[name]}/{repeats * len(prompts)}")


if __name__ == "__main__":
    main()
