"""specdec: lossless speculative decoding for LLM inference."""
from specdec.api import METHODS, SpecDecoder, load
from specdec.engine import GenerationResult, StreamChunk
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats, StepRecord

__all__ = ["METHODS", "GenerationResult", "GenerationStats", "SamplingParams", "SpecDecoder",
           "SpecdecError", "StepRecord", "StreamChunk", "load"]
# The one version source: pyproject.toml reads it (setuptools `dynamic = ["version"]`, statically).
__version__ = "0.1.0"
