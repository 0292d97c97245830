"""Controller memory (specdec.spec.control.memory.py): what the draft-length and tree-size
controllers learned carries over to the next process, so a fresh process with a drafter that
does not pay here drafts far less than one starting blind; damaged or missing files only mean
a fresh start; output never depends on it."""
import json
import random

import pytest
from test_controller import record, simulate

import specdec
from specdec.engine.controllers import sampling_key
from specdec.sampling import SamplingParams
from specdec.spec.control.draft_length import DraftLengthController
from specdec.spec.control.memory import ENV_VAR, MAX_ENTRIES, ControllerMemory, default_path
from specdec.spec.control.tree_size import TreeSizeController

COSTS = {0: 1.0, 1: 1.05, 2: 1.1, 4: 1.2, 8: 1.4}


def calibrated() -> DraftLengthController:
    """A new process's controller: pass costs timed at load, acceptance unknown."""
    return DraftLengthController(max_k=8, target_seconds=dict(COSTS), draft_seconds_per_token=0.05)


def test_a_recalled_chain_controller_drafts_far_less_where_drafts_fail():
    first = calibrated()
    first.start_sequence()
    simulate(first, 0.05, lambda k: COSTS.get(k, 1.0 + 0.05 * k), 0.05, steps=160)
    state = json.loads(json.dumps(first.memory()))  # through the file's format

    fresh, recalled = calibrated(), calibrated()
    recalled.target_seconds[0] = 0.9  # timed in this process: kept over the recalled timing
    recalled.recall(state)
    assert recalled.acceptance == pytest.approx(first.acceptance)
    assert recalled.target_seconds[0] == 0.9 and recalled.target_seconds[1] == COSTS[1]
    drafted = []
    for controller in (fresh, recalled):
        controller.start_sequence()
        drafted.append(sum(simulate(controller, 0.05, lambda k: COSTS.get(k, 1.0 + 0.05 * k), 0.05, steps=160,
                                    seed=1)))
    assert drafted[1] < drafted[0]  # measured: 6 drafted tokens against 13
    assert drafted[1] > 0  # it still probes a new text


def tree_steps(controller: TreeSizeController, steps: int, seed: int = 0) -> list[int]:
    """Trees that rarely pay: each drafted node is kept with probability 0.1, a tree step costs
    1.5 + 0.1 per node against 1.0 for a plain step."""
    rnd = random.Random(seed)
    sizes = []
    for _ in range(steps):
        size = controller.choose(64)
        kept = sum(rnd.random() < 0.1 for _ in range(min(size, 3)))
        controller.observe(record(size, size, kept, 1.5 + 0.1 * size if size else 1.0, 0.0, 0.0))
        sizes.append(size)
    return sizes


def test_a_recalled_tree_controller_skips_the_exploration_it_already_did():
    first = TreeSizeController(sizes=[2, 4, 8, 16])
    first.start_sequence()
    tree_steps(first, 160)
    state = json.loads(json.dumps(first.memory()))
    fresh, recalled = TreeSizeController(sizes=[2, 4, 8, 16]), TreeSizeController(sizes=[2, 4, 8, 16])
    recalled.recall(state)
    assert recalled.samples == first.samples and recalled.rate(0) == pytest.approx(first.rate(0))
    assert max(recalled.weight.values()) <= recalled.recall_weight  # a prior, not a verdict
    nodes = []
    for controller in (fresh, recalled):
        controller.start_sequence()
        nodes.append(sum(tree_steps(controller, 160, seed=1)))
    assert nodes[1] < nodes[0]
    assert recalled.samples.get(4, 0) == first.samples.get(4, 0)  # larger trees not tried again


@pytest.mark.parametrize("state", [{"accepted": "many", "rejected": 1, "target_seconds": {},
                                    "overhead_seconds": {}, "draft_seconds_per_token": None},
                                   {"accepted": 1, "rejected": 1, "target_seconds": {"1": -2.0},
                                    "overhead_seconds": {}, "draft_seconds_per_token": None},
                                   {"accepted": 1}])
def test_a_damaged_chain_state_is_refused_whole(state):
    controller = calibrated()
    with pytest.raises((ValueError, TypeError, KeyError)):
        controller.recall(state)
    assert controller.target_seconds == COSTS and controller.accepted_count == 0


def test_tree_tables_that_disagree_are_refused():
    controller = TreeSizeController(sizes=[4])
    with pytest.raises(ValueError):
        controller.recall({"tokens": {"0": 1.0}, "seconds": {"0": 1.0, "4": 1.0}, "weight": {"0": 1.0},
                           "samples": {"0": 1}})
    assert controller.samples == {}


def test_where_the_memory_lives(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, "off")
    assert default_path() is None
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "m.json"))
    assert default_path() == tmp_path / "m.json"
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_path() == tmp_path / "cache" / "specdec" / "controllers.json"


def test_the_file_keeps_the_newest_entries_and_survives_damage(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{not json")
    memory = ControllerMemory(path)
    assert memory.recall("a") is None
    for i in range(MAX_ENTRIES + 10):
        memory.remember(f"k{i}", {"i": i}, force=True)
    entries = json.loads(path.read_text())
    assert len(entries) == MAX_ENTRIES and "k9" not in entries and entries[f"k{MAX_ENTRIES + 9}"]["state"] == {
        "i": MAX_ENTRIES + 9}
    assert ControllerMemory(path).recall("k10") == {"i": 10}
    unwritable = ControllerMemory(tmp_path / "m.json" / "below-a-file.json")
    unwritable.remember("k", {"i": 1}, force=True)  # no error: the next process starts fresh
    assert not list(tmp_path.glob(".controllers-*"))


def test_processes_writing_one_file_keep_each_others_entries(tmp_path):
    path = tmp_path / "m.json"
    first, second = ControllerMemory(path), ControllerMemory(path)
    assert first.recall("a") is None and second.recall("b") is None  # both read the empty file
    first.remember("a", {"i": 1}, force=True)
    second.remember("b", {"i": 2}, force=True)
    second.remember("b", {"i": 3})  # throttled: written at the next flush (or at exit)
    assert json.loads(path.read_text())["b"]["state"] == {"i": 2}
    second.flush()
    assert {k: v["state"] for k, v in json.loads(path.read_text()).items()} == {"a": {"i": 1}, "b": {"i": 3}}


def test_a_second_process_starts_from_the_first_ones_controller(tmp_path):
    """Two loads of the same setup share the file as two processes would: the second's
    controller starts with the first's acceptance evidence; output is the same either way."""
    path = tmp_path / "controllers.json"
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
    first = specdec.load(method="ngram", memory=path, calibrate=False)
    out = first.generate(prompt, max_new_tokens=48, temperature=0.0)
    first.engine.memory.flush()
    (key, entry), = json.loads(path.read_text()).items()
    assert "|ngram|" in key and entry["state"]["accepted"] > 0

    second = specdec.load(method="ngram", memory=path, calibrate=False)
    controller = second.engine.controller_for(SamplingParams(temperature=0.0))
    assert controller.accepted_count == pytest.approx(entry["state"]["accepted"])
    assert second.generate(prompt, max_new_tokens=48, temperature=0.0).token_ids == out.token_ids

    other = specdec.load(method="ngram", memory=path, calibrate=False, max_draft_tokens=4)  # another setup
    assert other.engine.controller_for(SamplingParams(temperature=0.0)).accepted_count == 0
    assert sampling_key(SamplingParams(temperature=1.0)) != sampling_key(SamplingParams(temperature=0.7))
    assert sampling_key(SamplingParams(temperature=0)) == sampling_key(SamplingParams(temperature=0.0))
    assert specdec.load(method="ngram", memory=False, calibrate=False).engine.memory is None
    assert specdec.load(method="none", memory=path, calibrate=False).engine.memory is None  # nothing to learn
