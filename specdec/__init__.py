"""specdec: lossless speculative decoding for LLM inference."""
from specdec.api import METHODS, SpecDecoder, load
from specdec.engine import GenerationResult, GenerationStats, StreamChunk
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

__all__ = ["METHODS", "GenerationResult", "GenerationStats", "SamplingParams", "SpecDecoder",
           "SpecdecError", "StreamChunk", "load"]
__version__ = "0.1.0"
