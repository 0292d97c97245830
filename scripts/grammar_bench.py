"""Structured output under speculation (issue #19 item 3): for each method, the same chat
prompts with a JSON schema (response_format) on and off. Prints, per method and grammar
setting: tokens/s, speedup over `none` in the same setting, mean accepted length, how many
responses parse and fit their schema, greedy identity with `none` (grammar on), and the
grammar's cost: mask time per emitted token and per mask computed.

    OMP_NUM_THREADS=2 python scripts/grammar_bench.py --target smollm2 --methods none,ngram --prompts 50
    OMP_NUM_THREADS=1 python scripts/grammar_bench.py --prompts 2 --tokens 32   # a quick check
    # the bundled family has every method (its own draft and heads):
    OMP_NUM_THREADS=2 python scripts/grammar_bench.py --target bundled --methods none,draft,ngram,eagle
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import specdec
from specdec.chat.template import ChatTemplate
from specdec.sampling.grammar import GrammarState

# strings bounded as a client would bound them: a 135M model can loop inside an unbounded
# string until the token limit, and then the JSON never closes
STR = {"type": "string", "maxLength": 80}
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": STR, "born": {"type": "integer"}, "occupation": STR,
        "known_for": {"type": "array", "items": STR, "maxItems": 3}},
        "required": ["name", "born", "occupation", "known_for"], "additionalProperties": False},
    "city": {"type": "object", "properties": {
        "city": STR, "country": STR, "population": {"type": "integer"},
        "is_capital": {"type": "boolean"}}, "required": ["city", "country", "population", "is_capital"],
        "additionalProperties": False},
    "function": {"type": "object", "properties": {
        "name": STR, "arguments": {"type": "array", "items": STR, "maxItems": 4},
        "returns": STR, "summary": STR},
        "required": ["name", "arguments", "returns", "summary"], "additionalProperties": False},
    "review": {"type": "object", "properties": {
        "title": STR, "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "sentiment": {"enum": ["positive", "neutral", "negative"]}, "summary": STR},
        "required": ["title", "rating", "sentiment", "summary"], "additionalProperties": False},
    "task": {"type": "object", "properties": {
        "task": STR, "priority": {"enum": ["low", "medium", "high"]},
        "steps": {"type": "array", "items": STR, "maxItems": 4}, "done": {"type": "boolean"}},
        "required": ["task", "priority", "steps", "done"], "additionalProperties": False},
}
SUBJECTS = {
    "person": ["Ada Lovelace", "Alan Turing", "Marie Curie", "Isaac Newton", "Grace Hopper",
               "Charles Darwin", "Albert Einstein", "Rosalind Franklin", "Nikola Tesla", "Emmy Noether"],
    "city": ["Paris", "Tokyo", "Nairobi", "Lima", "Toronto", "Sydney", "Cairo", "Oslo", "Mumbai", "Rome"],
    "function": ["os.path.join", "json.loads", "sorted", "re.sub", "math.sqrt", "zip", "open",
                 "itertools.chain", "str.split", "random.choice"],
    "review": ["a pocket calculator", "a rain jacket", "a novel about the sea", "a cheap laptop", "a coffee mill",
               "a city bike", "a travel pillow", "a chess set", "a desk lamp", "a pair of running shoes"],
    "task": ["moving house", "learning Python", "planting a garden", "writing a thesis", "cooking dinner",
             "fixing a bike", "planning a trip", "cleaning the garage", "painting a room", "training for a 10k run"],
}


def requests(n: int) -> list[tuple[list[dict], dict]]:
    """n (messages, schema) pairs, cycling through the schemas; the schema is in the prompt,
    as clients of structured output usually do."""
    out = []
    for i in range(n):
        kind = list(SCHEMAS)[i % len(SCHEMAS)]
        subject = SUBJECTS[kind][(i // len(SCHEMAS)) % len(SUBJECTS[kind])]
        schema = SCHEMAS[kind]
        text = (f"Describe {subject} as a JSON object that follows this JSON schema:\n{json.dumps(schema)}\n"
                "Reply with the JSON object only.")
        out.append(([{"role": "user", "content": text}], schema))
    return out


def conforms(value, schema: dict) -> bool:
    """The subset of JSON Schema that SCHEMAS use."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", []))
                and (schema.get("additionalProperties", True) or set(value) <= set(props))
                and all(conforms(v, props[k]) for k, v in value.items() if k in props))
    if kind == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", len(value))
                and all(conforms(v, schema.get("items", {})) for v in value))
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema.get("minimum", value) <= value <= schema.get("maximum", value))
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    return {"boolean": bool}.get(kind, object) is type(value) or kind is None


def valid(text: str, schema: dict) -> bool:
    try:
        return conforms(json.loads(text), schema)
    except ValueError:
        return False


class MaskClock:
    """Times GrammarState's mask computations (the matcher walk: consume, mask, roll back)."""

    def __init__(self):
        self.seconds, self.count = 0.0, 0
        self._walk = GrammarState._walk
        clock = self

        def timed(state, path):
            t0 = time.perf_counter()
            try:
                return clock._walk(state, path)
            finally:
                clock.seconds += time.perf_counter() - t0
                clock.count += 1
        GrammarState._walk = timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2", help="a model, or 'bundled' for the bundled family")
    parser.add_argument("--draft", default=None, help="draft model / head folder (default: the bundled one)")
    parser.add_argument("--methods", default="none,ngram")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = MaskClock()
    rows, reference = [], {}
    for method in args.methods.split(","):
        target = None if args.target == "bundled" else args.target
        decoder = specdec.load(target, args.draft if method != "none" else None, method=method, dtype=args.dtype)
        template = ChatTemplate.from_tokenizer_config(decoder.tokenizer.config)
        work = [(template.render(messages), schema) for messages, schema in requests(args.prompts)]
        decoder.generate(work[0][0], max_new_tokens=8)  # warm-up
        for grammar in (False, True):
            tokens = seconds = steps = ok = finished = same = 0
            clock.seconds = clock.count = 0
            for i, (prompt, schema) in enumerate(work):
                fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}} if grammar else None
                t0 = time.perf_counter()
                r = decoder.generate(prompt, max_new_tokens=args.tokens, response_format=fmt)
                seconds += time.perf_counter() - t0
                tokens += len(r.token_ids)
                steps += r.stats.target_forwards
                ok += valid(r.text, schema)
                finished += r.finish_reason == "stop"
                key = (grammar, i)
                if method == "none":
                    reference[key] = r.token_ids
                same += reference.get(key) == r.token_ids
            row = {"method": method, "grammar": grammar, "tokens_per_s": tokens / seconds,
                   "mean_accepted_length": tokens / max(steps, 1), "valid": ok, "finished": finished,
                   "prompts": len(work),
                   "identical_to_none": same if reference else None,
                   "mask_us_per_token": 1e6 * clock.seconds / max(tokens, 1),
                   "mask_us_per_mask": 1e6 * clock.seconds / max(clock.count, 1)}
            base = next((x for x in rows if x["method"] == "none" and x["grammar"] == grammar), None)
            row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base else 1.0
            rows.append(row)
            print(f"{method:6s} grammar {'on ' if grammar else 'off'}: {row['tokens_per_s']:6.1f} tok/s "
                  f"({row['speedup']:.2f}x none), accepted length {row['mean_accepted_length']:.2f}, "
                  f"valid {ok}/{len(work)} (ended {finished}), identical to none {same}/{len(work)}, "
                  f"mask {row['mask_us_per_token']:.0f} us/token ({row['mask_us_per_mask']:.0f} us/mask)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
