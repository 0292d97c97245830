"""Two versions of the draft model's proposer (spec/proposers/draft_model.py) in one process, beside
plain decoding: decoders of the `draft` method, one with the proposer's `propose` from an older copy
of the file, taking turns prompt by prompt (the two drafts' order swapped every other prompt), 128
tokens each, every request paying its prompt (no prefix reuse, no controller memory). Decoding
tokens/s after the prefill, summed over the prompts, each prompt's ratio to plain, the drafted
tokens and the drafting seconds (catch-ups included), and whether the tokens are plain decoding's.

    git show HEAD~1:specdec/spec/proposers/draft_model.py > /tmp/old_draft_model.py
    python scripts/draft_version_ab.py /tmp/old_draft_model.py qwen-coder code 3 0 [repeats]
"""
import importlib.util
import sys
import types

import torch

from specdec import load
from specdec.bench.methods import TextTokenizer
from specdec.chat.template import ChatTemplate
from specdec.data.prompts import build_suite, render_chat


def main() -> None:
    old_path, target, task, n, temperature = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    torch.set_num_threads(2)
    spec = importlib.util.spec_from_file_location("old_draft_model", old_path)
    old_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old_module)
    tokenizer = TextTokenizer(target)
    prompts = render_chat(build_suite(n, [task]), ChatTemplate.from_tokenizer_config(tokenizer.config))
    decoders = {name: load(target=target, method=method, dtype="bfloat16", memory=False, reuse_prefix=False)
                for name, method in (("none", "none"), ("old", "draft"), ("new", "draft"))}
    proposer = decoders["old"].engine.proposer
    proposer.propose = types.MethodType(old_module.DraftModelProposer.propose, proposer)
    for decoder in decoders.values():  # warm-up
        decoder.generate(prompts[0].text, temperature=temperature, max_new_tokens=8, seed=0, ignore_eos=True)
    seconds, tokens, drafted, draft_seconds, same = ({name: 0 for name in decoders} for _ in range(5))
    ratios: dict[str, list[float]] = {name: [] for name in decoders}
    for repeat in range(repeats):
        for i, prompt in enumerate(prompts):
            order = ["none", "old", "new"] if (repeat + i) % 2 == 0 else ["none", "new", "old"]
            results = {}
            for name in order:
                result = decoders[name].generate(prompt.text, temperature=temperature, max_new_tokens=128,
                                                 seed=i + 100 * repeat, ignore_eos=True)
                stats = result.stats
                decoding = stats.wall_seconds - stats.prefill_seconds
                seconds[name] += decoding
                tokens[name] += stats.new_tokens
                drafted[name] += stats.drafted_tokens
                draft_seconds[name] += stats.draft_seconds
                results[name] = (result, stats.new_tokens / decoding)
            for name in decoders:
                ratios[name].append(results[name][1] / results["none"][1])
                same[name] += results[name][0].token_ids == results["none"][0].token_ids
    plain = tokens["none"] / seconds["none"]
    for name in decoders:
        rate = tokens[name] / seconds[name]
        print(f"{target} {task} T={temperature} {name:4s} decoding {rate:6.1f} tok/s {rate / plain:.3f}x plain | "
              f"per prompt {' '.join(f'{r:.2f}' for r in ratios[name])} | drafted {drafted[name]}, "
              f"drafting {draft_seconds[name]:.1f} s | tokens as plain's {same[name]}/{len(ratios[name])}")


if __name__ == "__main__":
    main()
