"""specdec: lossless speculative decoding for LLM inference."""
from specdec.engine.config import METHODS, DecoderConfig
from specdec.engine.decoder import SpecDecoder, load, load_config
from specdec.engine.sequence import GenerationResult, StreamChunk
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats, StepRecord

__all__ = ["METHODS", "DecoderConfig", "GenerationResult", "GenerationStats", "SamplingParams", "SpecDecoder",
           "SpecdecError", "StepRecord", "StreamChunk", "load", "load_config"]
# The one version source: pyproject.toml reads it (setuptools `dynamic = ["version"]`, statically).
__version__ = "0.1.0"
