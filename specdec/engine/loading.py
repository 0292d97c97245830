"""Building a decoder's parts from a DecoderConfig's fields: runners (native or transformers, on
float, int8/int4 or a GGUF's own blocks), a draft model's cheaper forms, Medusa/EAGLE heads.
api.load_config puts them together."""
from __future__ import annotations

from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.models.checkpoint import load_native, open_model, parse_dtype
from specdec.models.config import SUPPORTED_MODEL_TYPES
from specdec.models.group_quant import group_quantizable, group_quantize_model
from specdec.models.grouped import GroupedLinear
from specdec.models.quant import DEFAULT_GROUP_SIZE, LOAD_MODES, quantize_model
from specdec.models.runner import NativeRunner


def load_runner(folder: str | Path, dtype: str, backend: str = "auto", max_len: int | None = None,
                quantize: str | None = None, group_size: int = DEFAULT_GROUP_SIZE, pack: bool = True,
                compile: bool = False, four_bit: bool = False):
    """A runner for a model folder, a .gguf file (or a folder holding one) or a short name;
    quantize: "int8" or "int4" weights (native runtime: on the grouped kernels where they apply,
    models/group_quant.py, else PyTorch's weight-only kernels, models/quant.py, as with compile), or
    "gguf": a GGUF's own quantized blocks, never dequantized to a float copy (models/grouped.py);
    pack: projection weights packed once for oneDNN (models/packed.py); compile: fast passes
    compiled by inductor, embedding to logits (native runtime, models/compiled.py); four_bit
    (with "gguf", for a draft model): projections stored a value a byte rounded to 4 bits as
    they are read (models/grouped.py)."""
    if four_bit and quantize != "gguf":
        raise SpecdecError("--draft-4bit needs a draft model on a GGUF's own blocks (--quantize gguf)")
    if quantize is not None and quantize not in LOAD_MODES:
        raise SpecdecError(f"unknown quantization {quantize!r}; choose from {', '.join(LOAD_MODES)}")
    if backend not in ("auto", "native", "transformers"):
        raise SpecdecError(f"unknown backend {backend!r}; choose auto, native or transformers")
    source = open_model(folder)
    if quantize is not None and backend == "transformers":
        raise SpecdecError("quantization needs the native runtime (--backend auto or native)")
    if compile and backend == "transformers":
        raise SpecdecError("--compile needs the native runtime (--backend auto or native)")
    if source.is_gguf and backend == "transformers":
        from specdec.models.gguf import load_transformers_gguf
        from specdec.models.hf_backend import TransformersRunner

        return TransformersRunner(load_transformers_gguf(source.path, parse_dtype(dtype)), max_len)
    if quantize == "gguf":
        if not source.is_gguf:
            raise SpecdecError(f"--quantize gguf keeps a GGUF file's quantized blocks; {str(folder)!r} is not a GGUF "
                               "(use --quantize int8 or int4)")
        if compile:
            raise SpecdecError("--quantize gguf runs on its own kernels; drop --compile")
        from specdec.models.grouped import load_grouped

        return NativeRunner(load_grouped(source.gguf_file, parse_dtype(dtype), four_bit), max_len, pack=False)
    native = backend == "native" or (backend == "auto" and source.config().get("model_type") in SUPPORTED_MODEL_TYPES)
    if source.is_gguf or native:
        model = load_native(source, dtype).fuse_projections()
        if quantize is not None and not compile and group_quantizable(model, quantize, group_size) is None:
            group_quantize_model(model, quantize)  # the grouped kernels (group_quant.py)
            return NativeRunner(model, max_len, fuse=False, pack=False)
        runner = NativeRunner(model, max_len, fuse=False, pack=pack and quantize is None, compile=compile)
        if quantize is not None:
            quantize_model(runner.model, quantize, group_size)
        return runner
    if quantize is not None or compile:
        what = "quantization" if quantize is not None else "--compile"
        raise SpecdecError(f"{what} needs the native runtime; {str(folder)!r} is a "
                           f"{source.config().get('model_type')!r} model, run by transformers")
    from specdec.models.hf_backend import TransformersRunner, load_transformers

    return TransformersRunner(load_transformers(source.path, dtype), max_len)


def default_exact(dtype: str, compile: bool) -> bool:
    """Exact mode by default where rounding flips tokens often (bfloat16/float16), unless the
    layers are compiled (compiled passes are the fast kind)."""
    return not compile and parse_dtype(dtype) in (torch.bfloat16, torch.float16)


def eos_token_ids(folder: str | Path) -> tuple[int, ...]:
    return open_model(folder).eos_token_ids()


def head_proposer(method: str, folder: Path, target_runner, tree_nodes: int | None, pack: bool = True,
                  lookup: bool = True, four_bit: bool | None = None):
    """Medusa or EAGLE proposer on top of the target's own embedding and lm_head; pack: the
    head's weights packed for oneDNN, like its target's (models/packed.py); lookup: EAGLE's
    greedy trees also hold the prompt-lookup chain; four_bit (--draft-4bit): an EAGLE head's
    projections rounded to 4 bits (EagleHead.round_to_4bit; None: where the kernels take them)."""
    from specdec.spec.proposers.eagle import EagleProposer, TreeShape
    from specdec.spec.proposers.eagle_head import load_eagle
    from specdec.spec.proposers.medusa import MedusaProposer, load_medusa

    model = target_runner.model
    cfg = model.config
    loader = load_medusa if method == "medusa" else load_eagle
    head, meta = loader(folder, model.dtype)
    if four_bit and (method != "eagle" or not pack):
        what = "an EAGLE head left unpacked (--no-pack)" if method == "eagle" else f"a {method} head"
        raise SpecdecError(f"--draft-4bit rounds a draft model on a GGUF's blocks or a packed EAGLE head, not {what}")
    if pack:
        head.pack_weights()
    if method == "eagle" and pack and four_bit is not False:
        rounded = head.round_to_4bit()
        if four_bit and not rounded:
            raise SpecdecError(f"--draft-4bit: the grouped kernels do not take the EAGLE head in {str(folder)!r} (its "
                               "widths must be multiples of 32, its dtype bfloat16 or float32, the kernels built)")
    hidden = meta.get("hidden_size") or meta["head_config"]["hidden_size"]
    vocab = meta.get("target_vocab_size", cfg.vocab_size)
    if hidden != cfg.hidden_size or vocab != cfg.vocab_size:
        raise SpecdecError(f"the {method} head in {str(folder)!r} was trained for a target with hidden size "
                           f"{hidden} and vocabulary {vocab}; this target has {cfg.hidden_size} and {cfg.vocab_size}")
    if method == "medusa":
        choices = [tuple(c) for c in meta["tree"]]
        if tree_nodes is not None:
            choices = choices[:tree_nodes]
        return MedusaProposer(head, model.lm_head, choices)
    shape = TreeShape(**meta.get("tree", {}))
    if tree_nodes is not None:
        shape.nodes = tree_nodes
    return EagleProposer(head, model.model.embed_tokens, model.lm_head, target_runner.max_len, shape, lookup)


def draft_in_4bit(option: bool | None, quantize: str | None) -> bool:
    """Whether a same-vocabulary draft model loads with its byte-a-value projections rounded to
    4 bits (--draft-4bit; None: on for a draft on a GGUF's blocks): fewer bytes a draft pass;
    lossless, as any draft."""
    return quantize == "gguf" if option is None else option


def cut_draft_head(runner, tokenizer, rows: int) -> None:
    """A GGUF draft's output head cut to its `rows` most frequent tokens (frequent_tokens.py; 0: the
    whole vocabulary): a cheaper draft pass; lossless, as any draft. On by default only for the
    bundled coder's draft (bundled.default_draft_vocab: 65,536): the frequencies are counted on
    Python code, and a prompt in another language (Chinese: 41% of its tokens among a 64k cut,
    15% among 32k) loses many of its drafts."""
    from specdec.data.frequent_tokens import frequent_tokens
    from specdec.models.subset_head import restrict_head

    grouped = isinstance(getattr(getattr(runner, "model", None), "lm_head", None), GroupedLinear)
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise SpecdecError(f"draft_vocab must be a whole number of tokens (0: all), got {rows!r}")
    if rows == 0 or rows >= runner.vocab_size:
        return
    if not grouped:
        raise SpecdecError("--draft-vocab needs a draft model on a GGUF's own blocks (--quantize gguf)")
    restrict_head(runner.model, frequent_tokens(tokenizer, runner.vocab_size, rows))


def model_identity(model: Path | None) -> str:
    """A model folder as an absolute path, a packaged name (smollm2) as itself."""
    return str(model.resolve() if model is not None and model.exists() else model)
