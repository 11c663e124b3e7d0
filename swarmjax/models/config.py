"""Typed configuration of the decoder-only policy network (Qwen3 / Llama family)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

# Names accepted for dtypes in configs and on the command line.
DTYPES: dict[str, Any] = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
}

# RoPE variants this implementation knows (HF ``rope_type``).
ROPE_TYPES = ("default", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (HF ``rope_type: "yarn"``), the fields of its ``rope_scaling``
    dict with transformers' defaults (``_compute_yarn_parameters``). ``attention_factor``
    None: ``0.1 ln(factor) + 1``, or the ratio of the ``mscale`` / ``mscale_all_dim``
    forms when both are set (see :func:`swarmjax.models.transformer.rope_attention_factor`)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        if not self.factor > 0:
            raise ValueError(f"YarnScaling.factor must be > 0, got {self.factor!r}")
        if not isinstance(self.original_max_position_embeddings, int) or \
                self.original_max_position_embeddings <= 0:
            raise ValueError("YarnScaling.original_max_position_embeddings must be a positive int, "
                             f"got {self.original_max_position_embeddings!r}")


# target -> (module, its input dims, its output dims) as names of ModelConfig sizes
LORA_TARGETS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "q_proj": ("attn", ("hidden_size",), ("num_heads", "head_dim")),
    "k_proj": ("attn", ("hidden_size",), ("num_kv_heads", "head_dim")),
    "v_proj": ("attn", ("hidden_size",), ("num_kv_heads", "head_dim")),
    "o_proj": ("attn", ("num_heads", "head_dim"), ("hidden_size",)),
    "gate_proj": ("mlp", ("hidden_size",), ("intermediate_size",)),
    "up_proj": ("mlp", ("hidden_size",), ("intermediate_size",)),
    "down_proj": ("mlp", ("intermediate_size",), ("hidden_size",)),
}
LORA_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters of rank ``rank`` on the ``targets`` (weight names of the model's
    attention and MLP: :data:`LORA_TARGETS`), scaled by ``alpha / rank``; ``dropout``: the
    probability of dropping each input of an adapter's path in training (the base path
    keeps all of them), as PEFT's ``lora_dropout``; ``optimizer``: the optimizer of the
    adapters (a name of ``swarmjax.optim.OPTIMIZERS``, AdamW by default as for LoRA
    elsewhere; None: the job's own), with the job's other optimizer settings;
    ``subagents``: what a job's frozen sub-agents decode with over the shared base: a
    snapshot of the adapters RL starts from, or "base" (no adapter); ``warm_start``: a
    job's warm start trains the adapters too, or (False) the whole model, which RL then
    adapts (its base: the warm-started model)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_ATTENTION + LORA_MLP
    optimizer: str | None = "adamw"
    subagents: str = "snapshot"         # frozen sub-agents: the adapters RL starts from, or "base" (none)
    warm_start: bool = True             # the warm start trains the adapters too (False: the whole model,
                                        # and RL adapts the warm-started model)

    def __post_init__(self):
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"lora.rank must be an int >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if self.subagents not in ("snapshot", "base"):
            raise ValueError(f"lora.subagents must be 'snapshot' (the adapters RL starts from) or 'base' "
                             f"(the bare base), got {self.subagents!r}")
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        if not self.targets or unknown or len(set(self.targets)) < len(self.targets):
            raise ValueError(f"lora.targets: distinct names of the model's linear maps, one or more of "
                             f"{', '.join(LORA_TARGETS)}; got {self.targets!r}" +
                             (f" ({', '.join(map(repr, unknown))} matches no module)" if unknown else ""))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> dict:
        """The config as JSON values (a checkpoint's meta); :meth:`from_json` reads it back."""
        return {**dataclasses.asdict(self), "targets": list(self.targets)}

    @classmethod
    def from_json(cls, data: dict) -> "LoraConfig":
        return cls(**{**data, "targets": tuple(data["targets"])})

    def check(self, cfg: "ModelConfig") -> None:
        """A one-line error for targets this model cannot carry (a mixture of experts has
        no dense MLP weights: its experts are not LoRA targets yet)."""
        dense = [t for t in self.targets if LORA_TARGETS[t][0] == "mlp"]
        if cfg.is_moe and dense:
            raise ValueError(f"lora.targets {dense}: this model's MLP is a mixture of experts, whose "
                             f"experts take no adapters yet; target {', '.join(LORA_ATTENTION)}")



@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Qwen3-style decoder.

    ``qk_norm=True`` is Qwen3 (per-head RMSNorm on queries and keys before RoPE);
    ``qk_norm=False`` is Llama, or Qwen2 with ``attention_bias=True, o_bias=False``
    (biases on the q, k, v projections only). The dataclass is frozen and hashable,
    so it can be a static argument of ``jax.jit``.
    """

    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_type: str = "default"
    # rope scaling parameters: rope_type == "llama3": (factor, low_freq_factor,
    # high_freq_factor, original_max_position_embeddings); "yarn": a YarnScaling
    rope_scaling: tuple[float, float, float, int] | YarnScaling | None = None
    max_position_embeddings: int = 4096
    qk_norm: bool = True
    attention_bias: bool = False   # biases on the q, k, v projections (and o, see o_bias)
    # bias on the o projection: None = as attention_bias (Llama and Qwen3's attention_bias
    # covers q, k, v and o); False with attention_bias=True is Qwen2
    o_bias: bool | None = None
    tie_embeddings: bool = True
    param_dtype: str = "float32"
    dtype: str = "float32"  # compute dtype of matmuls; norms and softmax stay float32
    # Mixture of experts (Qwen3-MoE): num_experts > 0 replaces every layer's MLP with
    # experts_per_token of num_experts SwiGLU experts of moe_intermediate_size, chosen
    # per token by a linear router (softmax over all experts, top-k, renormalised to
    # sum 1 when norm_topk_prob). expert_capacity: with the experts split over devices,
    # each device receives at most expert_capacity x its even share of a layer's
    # assignments (see swarmjax.models.moe); 0 = no cap (exact, worst-case buffers).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    expert_capacity: float = 2.0
    # LoRA adapters over the frozen weights (swarmjax.models.lora): the params then hold
    # them under "lora", and every forward adds them (the base takes no gradient)
    lora: LoraConfig | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig.{name} must be one of {sorted(DTYPES)}, "
                                 f"got {getattr(self, name)!r}")
        if self.num_experts:
            if not isinstance(self.num_experts, int) or self.num_experts < 0:
                raise ValueError(f"ModelConfig.num_experts must be an int >= 0, got {self.num_experts!r}")
            if not isinstance(self.experts_per_token, int) or not 0 < self.experts_per_token <= self.num_experts:
                raise ValueError(f"ModelConfig.experts_per_token must be in [1, num_experts={self.num_experts}], "
                                 f"got {self.experts_per_token!r}")
            if not isinstance(self.moe_intermediate_size, int) or self.moe_intermediate_size <= 0:
                raise ValueError("ModelConfig.moe_intermediate_size must be a positive int with experts, "
                                 f"got {self.moe_intermediate_size!r}")
            if self.expert_capacity < 0:
                raise ValueError(f"ModelConfig.expert_capacity must be >= 0, got {self.expert_capacity!r}")
        if self.lora is not None:
            self.lora.check(self)
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"ModelConfig.rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        if self.rope_type == "llama3" and not (isinstance(self.rope_scaling, tuple)
                                               and len(self.rope_scaling) == 4):
            raise ValueError("rope_type='llama3' needs rope_scaling=(factor, low_freq_factor, "
                             "high_freq_factor, original_max_position_embeddings)")
        if self.rope_type == "yarn" and not isinstance(self.rope_scaling, YarnScaling):
            raise ValueError("rope_type='yarn' needs rope_scaling=YarnScaling(factor, "
                             "original_max_position_embeddings, ...)")

    def __repr__(self) -> str:
        # fields added after runs were saved are left out at their default, so a saved
        # run's or warm start's identity (the repr of its model) still matches
        fields = (f for f in dataclasses.fields(self)
                  if not (f.name in _REPR_IF_SET and getattr(self, f.name) == f.default))
        return f"ModelConfig({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in fields)})"

    @property
    def has_o_bias(self) -> bool:
        """Whether the attention output projection has a bias."""
        return self.attention_bias if self.o_bias is None else self.o_bias

    @property
    def is_moe(self) -> bool:
        """Whether the layers' MLPs are mixtures of experts."""
        return self.num_experts > 0

    def _mlp_weights(self, *, active: bool) -> int:
        """Weights of one layer's MLP: a SwiGLU's 3 D F, or the router's D E plus 3 D F_e
        for each of the E experts (``active``: the k a token runs)."""
        d = self.hidden_size
        if not self.is_moe:
            return 3 * d * self.intermediate_size
        experts = self.experts_per_token if active else self.num_experts
        return d * self.num_experts + 3 * experts * d * self.moe_intermediate_size

    @property
    def num_groups(self) -> int:
        """Query heads served by each key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return DTYPES[self.param_dtype]

    def num_params(self) -> int:
        """Exact parameter count (embeddings included, counted once when tied)."""
        d, h, kv, hd = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.attention_bias:
            attn += h * hd + 2 * kv * hd
        if self.has_o_bias:
            attn += d
        norms = 2 * d + (2 * hd if self.qk_norm else 0)
        layer = attn + self._mlp_weights(active=False) + norms
        embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.num_layers * layer + embed + d

    def matmul_flops_per_token(self, context: int = 0) -> int:
        """Forward FLOPs of one token: 2 x (non-embedding weights it runs + head) plus
        attention over ``context`` keys (2 x 2 x heads x head_dim x context). With experts
        only the router and the token's k experts count (the active weights)."""
        d, h, kv, hd = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        weights = self.num_layers * (d * h * hd + 2 * d * kv * hd + h * hd * d + self._mlp_weights(active=True))
        weights += d * self.vocab_size  # output head
        attn = self.num_layers * 4 * h * hd * context
        return 2 * weights + attn

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


_REPR_IF_SET = ("o_bias", "num_experts", "experts_per_token", "moe_intermediate_size", "norm_topk_prob",
                "expert_capacity", "lora")


# Named presets. The ~1M and ~30M sizes are the benchmark sizes of bench/sampler.py.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "1m": ModelConfig(vocab_size=1024, hidden_size=128, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=32, intermediate_size=384),
    "30m": ModelConfig(vocab_size=8192, hidden_size=512, num_layers=8, num_heads=8,
                       num_kv_heads=4, head_dim=64, intermediate_size=1536),
}


def _qwen3(hidden: int, layers: int, heads: int, intermediate: int, tied: bool) -> ModelConfig:
    return ModelConfig(vocab_size=151936, hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=8, head_dim=128, intermediate_size=intermediate, rms_norm_eps=1e-6,
                       rope_theta=1_000_000.0, max_position_embeddings=40960, qk_norm=True,
                       tie_embeddings=tied, param_dtype="bfloat16", dtype="bfloat16")


# Qwen3 dense shapes (no weights: ``swarmjax plan`` and configs start from them), from the
# models' config.json files (huggingface.co/Qwen/Qwen3-0.6B, -1.7B, -4B, -8B, April 2025):
# vocab 151936, 8 kv heads of 128, RMSNorm eps 1e-6, RoPE theta 1e6, 40960 positions;
# 0.6B-4B tie the embedding, 8B does not. bfloat16 as released.
PRESETS.update({
    "qwen3-0.6b": _qwen3(1024, 28, 16, 3072, tied=True),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 6144, tied=True),
    "qwen3-4b": _qwen3(2560, 36, 32, 9728, tied=True),
    "qwen3-8b": _qwen3(4096, 36, 32, 12288, tied=False),
})


# Qwen3-30B-A3B (huggingface.co/Qwen/Qwen3-30B-A3B config.json, April 2025): 48 layers of
# 128 experts of 768, 8 a token (3.3B active of 30.5B), 4 kv heads, untied; the dense
# intermediate_size (6144) is unused (no dense layers: decoder_sparse_step 1).
PRESETS["qwen3-30b-a3b"] = _qwen3(2048, 48, 32, 6144, tied=False).replace(
    num_kv_heads=4, num_experts=128, experts_per_token=8, moe_intermediate_size=768, norm_topk_prob=True)


def preset(name: str) -> ModelConfig:
    """Look up a named preset; raises with the list of known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None
