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
# draft: distilled from the target (KL to the target's distribution, weight 0.9)
specdec train lm --preset draft --out "$RUNS/draft" --tokenizer "$RUNS/tokenizer" \
    --teacher "$RUNS/target/model" --distill-weight 0.9 --steps 500 --batch-size 8 --seq-len 512 --lr 2e-3 --threads 2
# heads on the frozen target (self-distillation)
specdec train medusa --target "$RUNS/target/model" --out "$RUNS/medusa" --steps 500 --threads 2
specdec train eagle --target "$RUNS/target/model" --out "$RUNS/eagle" --steps 700 --threads 2
specdec train eval --target "$RUNS/target/model" --draft "$RUNS/draft/model" | tee "$RUNS/pair_eval.json"
python scripts/ship_bundled.py --runs "$RUNS"
