"""Held-out loss of the target in bfloat16 and quantized (int8, int4 at several group sizes; on
the grouped kernels, as --quantize loads them, and on PyTorch's weight-only kernels, as
--quantize with --compile does): the quality each setting costs. Text: the held-out CPython stdlib files (never
trained on by the bundled models, and the same files the bench prompts come from), cut into
windows; loss in nats per token, plus how often the quantized model's argmax equals bf16's.

    python scripts/quant_loss.py smollm2 24 512
"""
import math
import sys

import torch

from specdec.data.corpus import split_files, stdlib_root
from specdec.engine.loading import load_runner
from specdec.engine.text import TextTokenizer
from specdec.models.checkpoint import load_native
from specdec.models.quant import quantize_model


def windows(target: str, count: int, length: int) -> torch.Tensor:
    _, held = split_files(stdlib_root())
    tokenizer = TextTokenizer(target)
    ids: list[int] = []
    for path in held:
        ids += tokenizer.encode(path.read_text(errors="replace"))
        if len(ids) >= count * length * 4:
            break
    stride = len(ids) // count  # windows spread over the text, not its first file only
    return torch.tensor([ids[i * stride:i * stride + length] for i in range(count)])


@torch.inference_mode()
def evaluate(model, batch: torch.Tensor) -> tuple[float, torch.Tensor]:
    losses, argmaxes = [], []
    for row in batch:
        logits = model(row[None, :-1])[0].float()
        losses.append(torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum").item())
        argmaxes.append(logits.argmax(-1))
    return sum(losses) / (batch.shape[0] * (batch.shape[1] - 1)), torch.stack(argmaxes)


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    length = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    batch = windows(target, count, length)
    # a group size that does not divide a weight's inputs falls back to one that does (quant.group_for)
    settings = [(None, 0, "grouped"), ("int8", 32, "grouped"), ("int8", 0, "torch"), ("int4", 32, "grouped"),
                ("int4", 32, "torch"), ("int4", 64, "torch"), ("int4", 128, "torch")]
    reference = None
    for mode, group, kernels in settings:
        if kernels == "torch":  # PyTorch's weight-only kernels (models/quant.py)
            model = quantize_model(load_native(target, "bfloat16").fuse_projections(), mode, group or 32)
        else:
            model = load_runner(target, "bfloat16", quantize=mode, group_size=group or 32).model
        loss, argmax = evaluate(model, batch)
        reference = argmax if reference is None else reference
        agree = (argmax == reference).float().mean().item()
        name = "bfloat16" if mode is None else f"{mode} group {group or 'row'} ({kernels})"
        print(f"{name:26s} held-out loss {loss:.4f} nats/token (ppl {math.exp(loss):.3f}), "
              f"argmax = bf16's {agree:.3f}, {batch.numel()} tokens", flush=True)


if __name__ == "__main__":
    main()
