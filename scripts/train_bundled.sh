#!/usr/bin/env bash
# The full recipe for the bundled model family on a 2-core CPU (about 100 minutes in all).
# Each step resumes from its checkpoint if interrupted. Outputs go to runs/ (ignored by git);
# scripts/ship_bundled.py then copies the final models into specdec/bundled_models/.
set -euo pipefail
RUNS=${RUNS:-runs}
specdec train tokenizer --out "$RUNS/tokenizer" --vocab-size 8192
# target: ~11M parameters, 700 steps x 8 x 512 tokens (~45 min)
specdec train lm --preset target --out "$RUNS/target" --tokenizer "$RUNS/tokenizer" \
    --steps 700 --batch-size 8 --seq-len 512 --lr 1.5e-3 --threads 2
# draft: distilled from the target (KL to the target's distribution, weight 0.9). The shipped
# draft ran 400 steps, then was resumed to 1000 (the cosine schedule re-stretched at step 400).
specdec train lm --preset draft --out "$RUNS/draft" --tokenizer "$RUNS/tokenizer" \
    --teacher "$RUNS/target/model" --distill-weight 0.9 --steps 400 --batch-size 8 --seq-len 512 --lr 2e-3 --threads 2
specdec train lm --preset draft --out "$RUNS/draft" --tokenizer "$RUNS/tokenizer" \
    --teacher "$RUNS/target/model" --distill-weight 0.9 --steps 1000 --batch-size 8 --seq-len 512 --lr 2e-3 --threads 2
# heads on the frozen target (self-distillation), the two side by side on one core each
specdec train medusa --target "$RUNS/target/model" --out "$RUNS/medusa" --num-heads 3 --steps 400 \
    --batch-size 4 --seq-len 256 --threads 1 &
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle" --steps 600 \
    --batch-size 4 --seq-len 256 --threads 1
wait
# EAGLE fine-tune on its own predicted features (3 unrolled steps), for deeper drafts
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle2" --init "$RUNS/eagle" --unroll 3 \
    --steps 350 --batch-size 4 --seq-len 256 --lr 5e-4 --threads 1
specdec train eval --target "$RUNS/target/model" --draft "$RUNS/draft/model" | tee "$RUNS/pair_eval.json"
python scripts/ship_bundled.py --runs "$RUNS" --eagle eagle2
