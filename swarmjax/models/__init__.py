"""Policy networks: the Qwen3/Llama decoder, its config, and HF weight interchange."""

from swarmjax.models.config import PRESETS, ModelConfig, preset
from swarmjax.models.transformer import (ForwardOutput, KVCache, abstract_params, forward,
                                         init_cache, init_params, param_logical_axes)

__all__ = ["PRESETS", "ModelConfig", "preset", "ForwardOutput", "KVCache", "abstract_params",
           "forward", "init_cache", "init_params", "param_logical_axes"]
