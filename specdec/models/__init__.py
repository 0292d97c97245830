from specdec.models.checkpoint import load_native, save_native
from specdec.models.config import ModelConfig
from specdec.models.llama import LlamaModel

__all__ = ["LlamaModel", "ModelConfig", "load_native", "save_native"]
