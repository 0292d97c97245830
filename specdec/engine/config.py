"""What a decoder is made of: DecoderConfig, the one description `specdec.load` (keyword
arguments), the command line (cli_common.decoder_config) and `serve --ray`'s replicas share."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.checkpoint import parse_dtype
from specdec.models.quant import DEFAULT_GROUP_SIZE
from specdec.spec.proposers.cross_vocab import CROSS_VOCAB_MODES

METHODS = ("none", "draft", "ngram", "medusa", "eagle")
MAX_DRAFT_TOKENS_LIMIT = 64


@dataclass(frozen=True)
class DecoderConfig:
    # the target: a folder in Hugging Face layout, a .gguf file or a shipped name; None: bundled
    target: str | Path | None = None
    # method 'draft': the draft model (None: the one shipped for the target); 'medusa'/'eagle':
    # the head folder
    draft: str | Path | None = None
    method: str = "none"  # one of METHODS
    dtype: str = "float32"
    backend: str = "auto"  # "native" | "transformers" | "auto"
    # fixes K (chain) or the tree size; None: adapted per step up to max_draft_tokens / tree_nodes
    draft_tokens: int | None = None
    max_draft_tokens: int = 8
    max_len: int | None = None  # the KV cache's length (None: the model's window, at most 8k)
    tree_nodes: int | None = None  # largest tree for medusa / eagle
    # LOSSY: Medusa's typical acceptance for the tree methods at T > 0 (the output no longer
    # follows the target's distribution)
    typical_acceptance: bool = False
    # time (and so warm up) the passes decoding uses at load: the first generation is neither
    # slowed by cold kernels nor steered by guessed costs
    calibrate: bool = True
    # batch-invariant target passes: each row's logits bit for bit a 1-token pass's, so greedy
    # output equals plain decoding's in every dtype; False: the fastest kernels; None: on for
    # bfloat16/float16
    exact: bool | None = None
    # weight-only quantization of the target's and draft model's projections: "int8", "int4"
    # (group_size inputs per scale, bfloat16 only) or "gguf" (a GGUF's own blocks; the default
    # for qwen-coder); lossless with respect to the quantized target
    quantize: str | None = None
    group_size: int = DEFAULT_GROUP_SIZE
    # a draft model with another tokenizer (proposers/cross_vocab.py): "auto" (greedy: the draft's
    # text re-encoded into target tokens; sampling: the shared tokens), "tli" (shared tokens always)
    # or "string" (as auto)
    cross_vocab: str = "auto"
    # projection weights packed once for oneDNN (models/packed.py): faster decoding, a second copy
    # of those weights in memory
    pack: bool = True
    # passes through PyTorch's inductor (models/compiled.py): faster after 35-90 s of compilation,
    # with the fastest kernels (exact=True is refused)
    compile: bool = False
    # the draft-length / tree-size controllers start from what earlier processes learned with this
    # setup on this machine and leave what they learn (control/memory.py); a path: that file;
    # False: nothing kept. Output never depends on it.
    memory: bool | str | Path = True
    # a GGUF draft's one-value-a-byte projections, or an EAGLE head's, rounded to 4 bits (None: on
    # for drafts on a GGUF's blocks and for EAGLE heads the kernels take): a cheaper draft pass,
    # lossless as any draft
    draft_4bit: bool | None = None
    # keep the cache entries of a prompt's leading tokens that the previous generation left where
    # they are bit for bit what a fresh prefill writes (models on a GGUF's blocks)
    reuse_prefix: bool = True
    # a GGUF draft's output head cut to its N most frequent tokens in code (0: all): a cheaper
    # draft pass, lossless as any draft. None: the draft's own default (bundled.default_draft_vocab:
    # 65,536 for qwen-coder-draft, else 0)
    draft_vocab: int | None = None
    # greedy drafts also hold the prompt-lookup chain (what followed the context's last n-gram
    # earlier), kept before the drafter's own tokens (a tree where they differ; the native
    # runtime's targets): lossless, as any candidate. None: eagle's trees and a draft with another
    # tokenizer (measured faster on SmolLM2's code: 1.51-1.55x / 1.40x plain after prefill against
    # 1.04-1.22x / 1.11x), not a same-tokenizer draft (Qwen2.5-Coder's 0.5B: 1.16x against 1.24x)
    tree_lookup: bool | None = None

    def check(self) -> None:
        """A clear SpecdecError for each field that cannot work, before anything loads."""
        if self.method not in METHODS:
            raise SpecdecError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.cross_vocab not in CROSS_VOCAB_MODES:
            raise SpecdecError(f"unknown cross_vocab {self.cross_vocab!r}; choose one of "
                               f"{', '.join(CROSS_VOCAB_MODES)}")
        parse_dtype(self.dtype)
        if self.compile and self.exact:
            raise SpecdecError("--compile runs the fastest kernels, not exact mode's: drop --exact (or --compile)")
        for name in ("draft_tokens", "max_draft_tokens", "tree_nodes"):
            k = getattr(self, name)
            if k is not None and (not isinstance(k, int) or isinstance(k, bool)
                                  or not 1 <= k <= MAX_DRAFT_TOKENS_LIMIT):
                raise SpecdecError(f"{name} must be an integer in [1, {MAX_DRAFT_TOKENS_LIMIT}], got {k!r}")
        if self.typical_acceptance and self.method not in ("medusa", "eagle"):
            raise SpecdecError("typical acceptance applies to the tree methods (medusa, eagle) only")
