"""Draft-length probes of one drafted step against three (spec/control/draft_length.py
`probe_steps`), beside plain decoding, in one process: three decoders of one method (plain, and the
method with each probe length), taking turns prompt by prompt at one temperature, 128 tokens each,
every request paying its prompt (no prefix reuse, no controller memory). Decoding tokens/s after
the prefill, summed over the prompts.

    python scripts/probe_steps_ab.py smollm2 draft longcode 3 1.0 [repeats]
    python scripts/probe_steps_ab.py qwen-coder draft code 2 1.0 1
"""
import sys

import torch

from specdec import load
from specdec.bench.methods import TextTokenizer
from specdec.chat.template import ChatTemplate
from specdec.data.prompts import build_suite, render_chat


def main() -> None:
    target, method, task, n, temperature = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    torch.set_num_threads(2)
    tokenizer = TextTokenizer(target)
    prompts = render_chat(build_suite(n, [task]), ChatTemplate.from_tokenizer_config(tokenizer.config))
    decoders = {"none": load(target=target, method="none", dtype="bfloat16", memory=False, reuse_prefix=False)}
    for steps in (1, 3):
        decoder = load(target=target, method=method, dtype="bfloat16", memory=False, reuse_prefix=False)
        bank = decoder.engine.controllers

        def made(new=bank.new, steps=steps):
            controller = new()
            controller.probe_steps = steps
            return controller

        bank.new = made
        decoders[f"{method}, probe_steps={steps}"] = decoder
    for decoder in decoders.values():  # warm-up
        decoder.generate(prompts[0].text, temperature=temperature, max_new_tokens=8, seed=0, ignore_eos=True)
    seconds = dict.fromkeys(decoders, 0.0)
    tokens = dict.fromkeys(decoders, 0)
    for repeat in range(repeats):
        for i, prompt in enumerate(prompts):
            for name, decoder in decoders.items():
                stats = decoder.generate(prompt.text, temperature=temperature, max_new_tokens=128,
                                         seed=i + 100 * repeat, ignore_eos=True).stats
                seconds[name] += stats.wall_seconds - stats.prefill_seconds
                tokens[name] += stats.new_tokens
    plain = tokens["none"] / seconds["none"]
    for name in decoders:
        rate = tokens[name] / seconds[name]
        print(f"{target} {task} T={temperature} {name:24s} decoding {rate:7.1f} tok/s  {rate / plain:.3f}x plain")


if __name__ == "__main__":
    main()
