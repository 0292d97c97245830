"""Model hyper-parameters read from a Hugging Face config.json (Llama family)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.errors import SpecdecError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qwen2 always has q/k/v bias
    head_dim: int | None = None
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    sliding_window: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise SpecdecError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or self.attention_bias

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise SpecdecError(
                f"unsupported model_type {model_type!r} for the native runtime; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} (use backend='transformers' for others)")
        try:
            kw = dict(
                vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=d["num_hidden_layers"],
                num_attention_heads=d["num_attention_heads"],
                num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
            )
        except KeyError as e:
            raise SpecdecError(f"config.json is missing required field {e.args[0]!r}") from None
        rope_params = d.get("rope_parameters") or {}
        rope_scaling = d.get("rope_scaling")
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = rope_params
        theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        return cls(
            **kw,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            head_dim=d.get("head_dim"),
            model_type=model_type,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            sliding_window=d.get("sliding_window"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM"}[self.model_type]
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        d["architectures"] = [arch]
        d["hidden_act"] = "silu"
        if self.model_type == "qwen2":
            d.pop("attention_bias")
        d.update(self.extra)
        return d
