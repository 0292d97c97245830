"""`specdec train ...`: tokenizer, language models (target / distilled draft), evaluation."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from specdec.data.corpus import corpus_root
from specdec.errors import SpecdecError
from specdec.extras import require
from specdec.train.head_cli import add_head_parsers


def cmd_tokenizer(args) -> int:
    from specdec.train.recipe import build_tokenizer

    tok = build_tokenizer(corpus_root(args.corpus), args.out, args.vocab_size, args.max_files)
    print(f"tokenizer with {tok.get_vocab_size()} tokens saved to {args.out}")
    return 0


def _token_data(args, tok: Tokenizer, out: Path) -> tuple[np.ndarray, np.ndarray]:
    from specdec.train.recipe import build_token_files

    data = out / "data"
    if (data / "train.npy").is_file():
        return np.load(data / "train.npy"), np.load(data / "heldout.npy")
    return build_token_files(tok, corpus_root(args.corpus), data, args.max_files)


def _generation_data(args, tok: Tokenizer, init) -> tuple[np.ndarray, np.ndarray]:
    """A target's self-distilled answers (`specdec train answers`) in this model's own
    tokenization; every 20th conversation held out."""
    from specdec.engine.text import TextTokenizer
    from specdec.models.bundled import resolve_model_name
    from specdec.train.self_distill import generations_tokens
    from specdec.train.tokenizer import EOS

    if not args.target:
        raise SpecdecError("--generations needs --target: the model whose token ids the answers are in")
    if not Path(args.generations).is_file():
        raise SpecdecError(f"generations file {args.generations!r} does not exist")
    eos = init.config.eos_token_id if init is not None else tok.token_to_id(EOS)
    return generations_tokens(Path(args.generations), TextTokenizer(resolve_model_name(args.target)).tok, tok, eos)


def export_model(model, tokenizer_dir: Path, folder: Path, dtype: str, card: dict) -> None:
    from specdec.models import save_native

    cfg = model.config
    save_native(model, folder, dtype=getattr(torch, dtype),
                generation_config={"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
                                   "do_sample": False, "max_new_tokens": 128})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    (folder / "training.json").write_text(json.dumps(card, indent=2) + "\n")


def cmd_lm(args) -> int:
    require("rich.progress", "train", "training")  # the trainers' progress bars
    from specdec.models.checkpoint import load_native
    from specdec.train.lm import TrainConfig, evaluate, grow_layers, train_lm
    from specdec.train.recipe import PRESETS, build_tokenizer, preset

    out = Path(args.out)
    if args.preset not in PRESETS:
        raise SpecdecError(f"unknown preset {args.preset!r}; choose {', '.join(PRESETS)}")
    init = load_native(args.init, "float32") if args.init else None
    if args.layers is not None:
        if init is None:
            raise SpecdecError("--layers grows the --init model: give --init")
        init = grow_layers(init, args.layers)
    tok_dir = Path(args.tokenizer or args.init or out / "tokenizer")
    if not (tok_dir / "tokenizer.json").is_file():
        build_tokenizer(corpus_root(args.corpus), tok_dir, args.vocab_size, args.max_files)
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    if args.generations:
        train_ids, held_ids = _generation_data(args, tok, init)
    else:
        train_ids, held_ids = _token_data(args, tok, out)
    teacher = load_native(args.teacher, "float32") if args.teacher else None
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                      warmup=min(args.warmup, max(1, args.steps // 10)), seed=args.seed,
                      checkpoint_every=args.checkpoint_every,
                      distill_weight=args.distill_weight if teacher is not None else 0.0,
                      threads=args.threads)
    t0 = time.time()
    model_config = init.config if init is not None else preset(args.preset, tok)
    model, total_seconds = train_lm(model_config, train_ids, out / "run", cfg, teacher=teacher, init=init)
    seconds = time.time() - t0
    held_loss = evaluate(model, held_ids, min(args.seq_len, len(held_ids) - 1))
    card = {"preset": None if init is not None else args.preset, "init": str(args.init) if init is not None else None,
            "generations": str(args.generations) if args.generations else None,
            "generations_target": args.target if args.generations else None,
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
            "heldout_loss_nats_per_token": round(held_loss, 4), "train_seconds_this_run": round(seconds),
            "train_seconds_total": round(total_seconds),
            "teacher": str(args.teacher) if args.teacher else None, "train_config": cfg.__dict__}
    export_model(model, tok_dir, out / "model", args.export_dtype, card)
    print(json.dumps({k: card[k] for k in ("parameters", "heldout_loss_nats_per_token")}))
    print(f"model saved to {out / 'model'}")
    return 0


def cmd_eval(args) -> int:
    from specdec.train.evaluate import evaluate_pair

    report = evaluate_pair(args.target, args.draft, args.heldout, args.windows, args.seq_len)
    print(json.dumps(report, indent=2))
    return 0


def add_parser(sub) -> None:
    train = sub.add_parser("train", help="train the bundled models")
    tsub = train.add_subparsers(dest="train_command", required=True, parser_class=type(train))

    t = tsub.add_parser("tokenizer", help="train the byte-level BPE tokenizer")
    t.add_argument("--out", required=True)
    t.add_argument("--corpus", help="folder of .py files (default: this Python's stdlib)")
    t.add_argument("--vocab-size", type=int, default=8192)
    t.add_argument("--max-files", type=int, default=None)
    t.set_defaults(func=cmd_tokenizer)

    lm = tsub.add_parser("lm", help="train a language model (target, or a draft distilled from --teacher)")
    lm.add_argument("--preset", default="target", help="target | draft | tiny")
    lm.add_argument("--out", required=True, help="run folder (resumes from its checkpoint)")
    lm.add_argument("--tokenizer", help="tokenizer folder (default: train one into OUT/tokenizer)")
    lm.add_argument("--corpus", help="folder of .py files (default: this Python's stdlib)")
    lm.add_argument("--teacher", help="target model folder to distil from")
    lm.add_argument("--init", help="model folder to train on from (fine-tuning; its config and tokenizer are used)")
    lm.add_argument("--layers", type=int, help="with --init: deepen it to this many layers first (new layers start "
                    "as copies of its last with zeroed output projections, computing what it did)")
    lm.add_argument("--generations", help="train on a target's answers (generations.jsonl from `specdec train "
                    "answers`), re-encoded with this model's tokenizer, instead of the corpus")
    lm.add_argument("--target", help="with --generations: the model whose token ids they hold (e.g. smollm2)")
    lm.add_argument("--distill-weight", type=float, default=0.9)
    lm.add_argument("--vocab-size", type=int, default=8192)
    lm.add_argument("--max-files", type=int, default=None)
    lm.add_argument("--steps", type=int, default=800)
    lm.add_argument("--batch-size", type=int, default=8)
    lm.add_argument("--seq-len", type=int, default=512)
    lm.add_argument("--lr", type=float, default=1.5e-3)
    lm.add_argument("--warmup", type=int, default=50)
    lm.add_argument("--checkpoint-every", type=int, default=50)
    lm.add_argument("--seed", type=int, default=0)
    lm.add_argument("--threads", type=int, default=0)
    lm.add_argument("--export-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    lm.set_defaults(func=cmd_lm)

    ev = tsub.add_parser("eval", help="held-out loss, greedy agreement and forward cost of a target/draft pair")
    ev.add_argument("--target", required=True)
    ev.add_argument("--draft", required=True)
    ev.add_argument("--heldout", help="token file (.npy); default: held-out stdlib files")
    ev.add_argument("--windows", type=int, default=None, help="windows of --seq-len tokens to score (default: all)")
    ev.add_argument("--seq-len", type=int, default=512)
    ev.set_defaults(func=cmd_eval)
    add_head_parsers(tsub)
