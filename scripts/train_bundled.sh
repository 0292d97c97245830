#!/usr/bin/env bash
# The recipe that made the bundled model family, step by step as it was run on a 2-core CPU.
# Each step resumes from its checkpoint if interrupted. Outputs go to runs/ (ignored by git);
# scripts/ship_bundled.py then copies the final models into specdec/bundled_models/.
# Asking `train lm` for more steps than its checkpoint holds resumes it with the cosine schedule
# re-stretched to the new length; the bundled models grew that way (see the model cards).
set -euo pipefail
RUNS=${RUNS:-runs}
specdec train tokenizer --out "$RUNS/tokenizer" --vocab-size 8192
# target: ~11M parameters, 8 x 512 tokens per step. 700 steps (30 min) ...
specdec train lm --preset target --out "$RUNS/target" --tokenizer "$RUNS/tokenizer" \
    --steps 700 --batch-size 8 --seq-len 512 --lr 1.5e-3 --threads 2
# draft: distilled from the target (KL to the target's distribution, weight 0.9), 400 then 1000 steps
specdec train lm --preset draft --out "$RUNS/draft" --tokenizer "$RUNS/tokenizer" \
    --teacher "$RUNS/target/model" --distill-weight 0.9 --steps 400 --batch-size 8 --seq-len 512 --lr 2e-3 --threads 2
specdec train lm --preset draft --out "$RUNS/draft" --tokenizer "$RUNS/tokenizer" \
    --teacher "$RUNS/target/model" --distill-weight 0.9 --steps 1000 --batch-size 8 --seq-len 512 --lr 2e-3 --threads 2
# heads on the frozen 700-step target (self-distillation), side by side on one core each
specdec train medusa --target "$RUNS/target/model" --out "$RUNS/medusa2" --num-heads 3 --steps 800 \
    --batch-size 4 --seq-len 256 --lr 2e-3 --threads 1 &
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle" --steps 600 \
    --batch-size 4 --seq-len 256 --threads 1
wait
# EAGLE fine-tune on its own predicted features (3 unrolled steps), for deeper drafts
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle2" --init "$RUNS/eagle" --unroll 3 \
    --steps 350 --batch-size 4 --seq-len 256 --lr 5e-4 --threads 1
# ... then the target resumed to 1500 steps (~35 min more; its held-out loss was only 0.02 nats
# below the draft's at 700 steps), the draft re-distilled from it for 300 more steps, and both
# heads re-fitted to its features starting from the heads above
specdec train lm --preset target --out "$RUNS/target" --tokenizer "$RUNS/tokenizer" \
    --steps 1500 --batch-size 8 --seq-len 512 --lr 1e-3 --threads 2
specdec train lm --preset draft --out "$RUNS/draft" --tokenizer "$RUNS/tokenizer" \
    --teacher "$RUNS/target/model" --distill-weight 0.9 --steps 1300 --batch-size 8 --seq-len 512 --lr 2e-3 --threads 2
specdec train medusa --target "$RUNS/target/model" --out "$RUNS/medusa3" --init "$RUNS/medusa2" --steps 400 \
    --batch-size 4 --seq-len 256 --lr 5e-4 --threads 1 &
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle3" --init "$RUNS/eagle2" --unroll 3 \
    --steps 300 --batch-size 4 --seq-len 256 --lr 5e-4 --threads 1
wait
# the new target's features moved far (held-out top-1 fell to 0.25 / 0.51): longer re-fits
specdec train medusa --target "$RUNS/target/model" --out "$RUNS/medusa4" --init "$RUNS/medusa3" --steps 600 \
    --batch-size 4 --seq-len 256 --lr 1e-3 --threads 1 &
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle4" --init "$RUNS/eagle3" --unroll 3 \
    --steps 500 --batch-size 4 --seq-len 256 --lr 1e-3 --threads 1
wait
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle5" --init "$RUNS/eagle4" --unroll 3 \
    --steps 500 --batch-size 4 --seq-len 256 --lr 1e-3 --threads 1
specdec train eval --target "$RUNS/target/model" --draft "$RUNS/draft/model" | tee "$RUNS/pair_eval.json"
python scripts/ship_bundled.py --runs "$RUNS" --medusa medusa4 --eagle eagle5
