"""The controllers of an engine: one per sampling setting (acceptance depends on temperature,
filters and penalties), kept across generations so measured costs carry over, each starting
from what earlier processes learned with the same setup on this machine (ControllerMemory)."""
from __future__ import annotations

from collections.abc import Callable

from specdec.sampling import SamplingParams
from specdec.spec.calibrate import PassCosts
from specdec.spec.control.base import Controller
from specdec.spec.control.draft_length import DraftLengthController
from specdec.spec.control.memory import ControllerMemory, machine_key
from specdec.spec.control.tree_size import TreeSizeController

MAX_SETTINGS = 64  # controllers kept; the oldest setting goes first


def sampling_key(params: SamplingParams) -> tuple:
    """The settings acceptance depends on: one controller (and memory entry) per value."""
    # floats as floats: a request's `"temperature": 0` and the default 0.0 are one setting (they
    # were two memory entries, each learning alone)
    return (float(params.temperature), params.top_k, float(params.top_p), float(params.min_p),
            float(params.presence_penalty), float(params.frequency_penalty), float(params.repetition_penalty),
            params.logit_bias, params.grammar is not None, params.drafter_invariant)


def new_controller(tree_sizes: list[int] | None, max_draft_tokens: int, fixed: int | None,
                   pass_costs: PassCosts | None, stops_at_floor: bool = False) -> Controller:
    """A fresh controller: a tree size controller over tree_sizes (tree drafters), else a draft
    length controller starting from the calibrated pass costs (stops_at_floor: its drafter ends
    chains at the controller's confidence_floor)."""
    if tree_sizes is not None:
        return TreeSizeController(tree_sizes, fixed_size=fixed)
    controller = DraftLengthController(max_k=max_draft_tokens, fixed_k=fixed, stops_at_floor=stops_at_floor)
    if pass_costs is not None:
        controller.target_seconds = dict(pass_costs.target_seconds)
        controller.draft_seconds_per_token = pass_costs.draft_seconds_per_token
    return controller


class ControllerBank:
    def __init__(self, new: Callable[[], Controller], memory: ControllerMemory | None, setup: str):
        self.new = new  # a fresh controller (the engine's, from its drafter and calibrated costs)
        self.memory = memory
        self.setup = setup  # target, drafter, dtype, kernels: part of the memory key
        self._by_key: dict[tuple, Controller] = {}

    def get(self, params: SamplingParams) -> Controller:
        key = sampling_key(params)
        if key not in self._by_key:
            if len(self._by_key) >= MAX_SETTINGS:
                self._by_key.pop(next(iter(self._by_key)))
            controller = self._by_key[key] = self.new()
            state = self.memory.recall(self._memory_key(key)) if self.memory is not None else None
            if state is not None:
                try:
                    controller.recall(state)
                except (KeyError, TypeError, ValueError, AttributeError):
                    pass  # a damaged or older entry: start fresh, as without memory
        return self._by_key[key]

    def remember(self, params: SamplingParams, controller: Controller) -> None:
        """Leave controller's state in memory if it is this bank's controller for params (a
        batch's sequences have their own)."""
        key = sampling_key(params)
        if self.memory is not None and self._by_key.get(key) is controller:
            self.memory.remember(self._memory_key(key), controller.memory())

    def clear(self) -> None:
        self._by_key.clear()

    def _memory_key(self, key: tuple) -> str:
        return f"{machine_key()}|{self.setup}|{key!r}"
