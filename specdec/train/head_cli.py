"""`specdec train medusa | medusa-tree | eagle | eagle-data | answers | eagle-features`: draft
heads for a target (Medusa, EAGLE), their training data (the target's own answers, its stored
features) and trees (train/cli.py registers them beside the language-model commands)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from specdec.data.corpus import corpus_root
from specdec.errors import SpecdecError
from specdec.extras import require


def _head_data(args, target_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    from specdec.data.corpus import split_files
    from specdec.train.recipe import encode_files

    tok = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    train_files, held = split_files(corpus_root(args.corpus))
    return encode_files(tok, train_files[:args.max_files]), encode_files(tok, held[:args.max_files])


def _target_and_data(args):
    """What a head trains on: the frozen float32 target and its tokenized train / held-out ids;
    the seed set for the head's initialisation."""
    from specdec.models.checkpoint import load_native

    target = load_native(args.target, "float32")
    train_ids, held_ids = _head_data(args, args.target)
    torch.manual_seed(args.seed)
    return target, train_ids, held_ids


def _head_config(args):
    from specdec.train.heads import HeadTrainConfig

    return HeadTrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                           warmup=min(20, max(1, args.steps // 10)), seed=args.seed, threads=args.threads)


def cmd_medusa(args) -> int:
    require("rich.progress", "train", "training")  # the trainers' progress bars
    from specdec.spec.proposers.medusa import MedusaHeads, save_medusa
    from specdec.spec.proposers.trees import build_tree, expected_accepted_length
    from specdec.train.heads import medusa_rank_accuracy, train_medusa

    target, train_ids, held_ids = _target_and_data(args)
    if args.init:
        from specdec.spec.proposers.medusa import load_medusa

        heads = load_medusa(args.init)[0].train()
    else:
        heads = MedusaHeads(args.num_heads, target.config.hidden_size)
    cfg = _head_config(args)
    seconds = train_medusa(target, heads, train_ids, cfg)
    acc = medusa_rank_accuracy(target, heads, held_ids, seq_len=min(256, len(held_ids) - 1))
    tree = build_tree(acc, args.tree_nodes)
    meta = {"target": Path(args.target).name, "target_vocab_size": target.config.vocab_size,
            "tree": [list(c) for c in tree],
            "heldout_rank_accuracy": [[round(a, 4) for a in row] for row in acc],
            "heldout_top1": [round(row[0], 4) for row in acc],
            "heldout_top5": [round(sum(row[:5]), 4) for row in acc],
            "tree_expected_accepted_length": round(expected_accepted_length(tree, acc), 3),
            "train_seconds": round(seconds), "init": args.init, "train_config": cfg.__dict__}
    save_medusa(heads, args.out, meta)
    print(json.dumps({k: meta[k] for k in ("heldout_top1", "heldout_top5", "tree_expected_accepted_length")}))
    return 0


def cmd_medusa_tree(args) -> int:
    """Rebuild the tree of a heads folder for another node budget from its measured accuracies."""
    from specdec.spec.proposers.trees import build_tree, expected_accepted_length

    cfg_path = Path(args.heads) / "config.json"
    if not cfg_path.is_file():
        raise SpecdecError(f"{args.heads!r} has no config.json")
    cfg = json.loads(cfg_path.read_text())
    if "heldout_rank_accuracy" not in cfg:
        raise SpecdecError(f"{args.heads!r} has no measured accuracies (heldout_rank_accuracy)")
    tree = build_tree(cfg["heldout_rank_accuracy"], args.nodes)
    cfg["tree"] = [list(c) for c in tree]
    cfg["tree_expected_accepted_length"] = round(expected_accepted_length(tree, cfg["heldout_rank_accuracy"]), 3)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"{len(tree)} nodes, expected accepted length {cfg['tree_expected_accepted_length']}")
    return 0


def cmd_eagle(args) -> int:
    require("rich.progress", "train", "training")  # the trainers' progress bars
    if args.features:
        return cmd_eagle_features(args)
    from dataclasses import replace

    from specdec.spec.proposers.eagle import TreeShape
    from specdec.spec.proposers.eagle_head import EagleHead, save_eagle
    from specdec.train.heads import eagle_accuracy, train_eagle

    target, train_ids, held_ids = _target_and_data(args)
    if args.init:
        from specdec.spec.proposers.eagle_head import load_eagle

        head = load_eagle(args.init)[0].train()
    else:
        head = EagleHead(replace(target.config, num_hidden_layers=1))
    cfg = _head_config(args)
    cfg.unroll, cfg.feature_noise, cfg.cls_weight = args.unroll, args.feature_noise, args.cls_weight
    seconds = train_eagle(target, head, train_ids, cfg)
    acc = eagle_accuracy(target, head, held_ids, seq_len=min(256, len(held_ids) - 1))
    meta = {"target": Path(args.target).name, "target_vocab_size": target.config.vocab_size,
            "tree": TreeShape().__dict__, "heldout_accuracy": acc, "train_seconds": round(seconds),
            "init": args.init,
            "train_config": cfg.__dict__}
    save_eagle(head, args.out, meta)
    print(json.dumps(acc))
    return 0


def cmd_eagle_data(args) -> int:
    """Self-distilled answers (generations.jsonl) and the target's features over them and over
    stdlib code windows (train/), plus held-out code windows (heldout/). Each part is skipped
    when its file exists, so an interrupted run resumes."""
    from specdec.data.corpus import split_files
    from specdec.engine.text import TextTokenizer
    from specdec.models.bundled import resolve_model_name
    from specdec.train.features import FEATURES_FILE, code_windows, extract_features, feature_model
    from specdec.train.self_distill import read_generations

    out = Path(args.out)
    train_files, held_files = split_files(corpus_root(args.corpus))
    _answers(args, train_files, out)
    target_path = resolve_model_name(args.target)
    model = feature_model(target_path, args.dtype)
    tok = TextTokenizer(target_path).tok
    if not (out / "train" / FEATURES_FILE).is_file():
        gens = read_generations(out / "generations.jsonl")
        seqs = [g["prompt_ids"] + g["output_ids"] for g in gens]
        seqs += code_windows(tok, train_files, args.seq_len, args.code_tokens)
        data = extract_features(model, seqs)
        data.save(out / "train")
        print(f"train: {data.num_sequences} sequences, {len(data.tokens)} tokens -> {out / 'train'}")
    if not (out / "heldout" / FEATURES_FILE).is_file():
        data = extract_features(model, code_windows(tok, held_files, args.seq_len, args.heldout_tokens))
        data.save(out / "heldout")
        print(f"heldout: {data.num_sequences} sequences, {len(data.tokens)} tokens -> {out / 'heldout'}")
    return 0


def _answers(args, train_files: list[Path], out: Path) -> Path:
    """OUT/generations.jsonl: the target's answers to prompts made from train_files (kept when
    it exists, so an interrupted recipe resumes)."""
    import specdec
    from specdec.train.self_distill import generate_answers

    path = out / "generations.jsonl"
    if path.is_file():
        print(f"{path} exists; kept")
        return path
    decoder = specdec.load(args.target, dtype=args.dtype, exact=False, max_len=args.max_len)
    return generate_answers(decoder, train_files, out, args.prompts, args.max_tokens, max_batch=args.max_batch)


def cmd_answers(args) -> int:
    """Only the self-distilled answers (OUT/generations.jsonl), e.g. for a draft model."""
    from specdec.data.corpus import split_files

    train_files, _ = split_files(corpus_root(args.corpus))
    _answers(args, train_files, Path(args.out))
    return 0


def cmd_eagle_features(args) -> int:
    """An EAGLE head with a reduced draft vocabulary, trained on stored target features."""
    from dataclasses import replace

    from specdec.models.bundled import resolve_model_name
    from specdec.models.checkpoint import load_native
    from specdec.spec.proposers.draft_vocab import coverage, frequent_tokens
    from specdec.spec.proposers.eagle import TreeShape
    from specdec.spec.proposers.eagle_head import EagleHead, load_eagle, save_eagle
    from specdec.train.features import FeatureSet
    from specdec.train.heads import eagle_feature_accuracy, train_eagle_features
    from specdec.train.loop import LoopSettings

    target = load_native(resolve_model_name(args.target), "float32")
    embed, lm_weight = target.model.embed_tokens, target.lm_head.weight.detach()
    data = FeatureSet.load(Path(args.features) / "train")
    held = FeatureSet.load(Path(args.features) / "heldout")
    counts = data.token_counts(target.config.vocab_size)
    cfg = _head_config(args)
    cfg.unroll, cfg.feature_noise, cfg.cls_weight = args.unroll, args.feature_noise, args.cls_weight
    torch.manual_seed(args.seed)
    if args.init:
        head = load_eagle(args.init)[0].train()
    else:
        head = EagleHead(replace(target.config, num_hidden_layers=1), args.draft_vocab)
        head.d2t.copy_(frequent_tokens(counts, args.draft_vocab))
        with torch.no_grad():  # start from the target's own output rows
            head.lm_head.weight.copy_(lm_weight[head.d2t])
    out = Path(args.out)
    settings = LoopSettings("eagle", checkpoint_dir=out / "run", checkpoint_every=args.checkpoint_every)
    seconds = train_eagle_features(head, embed, lm_weight, data, cfg, settings)
    acc = eagle_feature_accuracy(head, embed, lm_weight, held, seq_len=min(256, cfg.seq_len))
    meta = {"target": args.target, "target_vocab_size": target.config.vocab_size,
            "tree": TreeShape().__dict__, "heldout_accuracy": acc,
            "draft_vocab_coverage_of_training_tokens": round(coverage(counts, head.d2t), 4),
            "train_tokens": len(data.tokens), "train_seconds": round(seconds), "init": args.init,
            "train_config": cfg.__dict__}
    save_eagle(head, out / "model", meta)
    print(json.dumps(acc))
    print(f"head saved to {out / 'model'}")
    return 0


def _add_answers_args(p, out_help: str) -> None:
    """The options of a self-distillation run (the target answering prompts made from the corpus)."""
    p.add_argument("--target", required=True, help="target model (folder, GGUF or a name such as smollm2)")
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--corpus", help="folder of .py files (default: this Python's stdlib)")
    p.add_argument("--dtype", default="bfloat16", help="the dtype the target will serve in")
    p.add_argument("--prompts", type=int, default=400, help="chat and code-completion prompts answered, each")
    p.add_argument("--max-tokens", type=int, default=160, help="tokens per answer")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-len", type=int, default=1024)


def add_head_parsers(tsub) -> None:
    d = tsub.add_parser("eagle-data", help="self-distilled answers and stored target features for an EAGLE head")
    _add_answers_args(d, "data folder (resumes: finished parts are kept)")
    d.add_argument("--seq-len", type=int, default=512, help="code window length")
    d.add_argument("--code-tokens", type=int, default=400_000, help="stdlib code tokens (training split)")
    d.add_argument("--heldout-tokens", type=int, default=40_000, help="held-out stdlib code tokens")
    d.set_defaults(func=cmd_eagle_data)

    a = tsub.add_parser("answers", help="self-distilled answers of a target (generations.jsonl) to train a draft on")
    _add_answers_args(a, "data folder (kept if it already holds generations.jsonl)")
    a.set_defaults(func=cmd_answers)

    for name, func, steps in (("medusa", cmd_medusa, 600), ("eagle", cmd_eagle, 800)):
        p = tsub.add_parser(name, help=f"train {name} head(s) on a frozen target")
        p.add_argument("--target", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--corpus", help="folder of .py files (default: this Python's stdlib)")
        p.add_argument("--max-files", type=int, default=None)
        p.add_argument("--steps", type=int, default=steps)
        p.add_argument("--batch-size", type=int, default=8)
        p.add_argument("--seq-len", type=int, default=256)
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, default=0)
        p.add_argument("--init", help=f"continue from an existing {name} folder (e.g. after the target changed); "
                                      "its shape (head count, layer sizes) is kept")
        if name == "eagle":
            p.add_argument("--unroll", type=int, default=1,
                           help="also train on the head's own predicted features for this many steps")
            p.add_argument("--features", help="train on stored target features (a `train eagle-data` folder) "
                                              "with a reduced draft vocabulary; OUT is then a run folder "
                                              "(checkpoints in OUT/run, the head in OUT/model)")
            p.add_argument("--draft-vocab", type=int, default=8192,
                           help="with --features: tokens the head predicts over (the most frequent)")
            p.add_argument("--feature-noise", type=float, default=0.1)
            p.add_argument("--cls-weight", type=float, default=0.1,
                           help="weight of the distillation loss next to the feature regression")
            p.add_argument("--checkpoint-every", type=int, default=100,
                           help="with --features: steps between checkpoints")
        if name == "medusa":
            p.add_argument("--num-heads", type=int, default=4)
            p.add_argument("--tree-nodes", type=int, default=24)
        p.set_defaults(func=func)
    t = tsub.add_parser("medusa-tree", help="rebuild a Medusa tree for a node budget from measured accuracies")
    t.add_argument("--heads", required=True)
    t.add_argument("--nodes", type=int, required=True)
    t.set_defaults(func=cmd_medusa_tree)
