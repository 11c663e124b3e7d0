"""Hugging Face checkpoint interchange for Qwen3, Qwen3-MoE, Qwen2 / Qwen2.5 and Llama
(config.json + safetensors), RoPE default, llama3 or YaRN. Qwen3-MoE experts are read
per expert (``mlp.experts.{j}.gate_proj.weight``, the Hub's layout, which
``save_pretrained`` writes) or fused (``mlp.experts.gate_up_proj`` [E, 2F, D] and
``mlp.experts.down_proj`` [E, D, F], transformers' in-memory layout), written per expert.

``from_hf(path)`` reads a checkpoint directory (single ``model.safetensors`` or a
sharded ``model.safetensors.index.json``) into a :class:`ModelConfig` and a
parameter pytree; ``to_hf(cfg, params, path)`` writes one that
``transformers.AutoModelForCausalLM.from_pretrained`` loads. Reading uses
``safetensors`` directly (no torch, no transformers); every problem found in a
checkpoint raises :class:`CheckpointError` naming the tensor or file and what
is wrong with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from etils import epath
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from swarmjax.models.config import DTYPES, ModelConfig, YarnScaling
from swarmjax.models.transformer import abstract_params

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GENERATION_CONFIG = "generation_config.json"


class CheckpointError(ValueError):
    """A checkpoint that does not match what the config says it should hold."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What differs between the supported HF decoder families."""

    hf_name: str         # config.json "architectures"[0]
    model_type: str      # config.json "model_type"
    qk_norm: bool
    # None: config.json's "attention_bias" biases q, k, v and o; else the family's fixed
    # biases, (q/k/v, o) (Qwen2: q, k, v only; it has no "attention_bias" field)
    fixed_bias: tuple[bool, bool] | None = None
    moe: bool = False    # every layer's MLP a mixture of experts

    def matches(self, cfg: ModelConfig) -> bool:
        """Whether this family can hold ``cfg``'s architecture."""
        if self.qk_norm != cfg.qk_norm or self.moe != cfg.is_moe:
            return False
        if self.fixed_bias is None:
            return cfg.has_o_bias == cfg.attention_bias
        return (cfg.attention_bias, cfg.has_o_bias) == self.fixed_bias


ARCHITECTURES: dict[str, Architecture] = {
    a.hf_name: a for a in (
        Architecture("Qwen3ForCausalLM", "qwen3", qk_norm=True),
        Architecture("Qwen3MoeForCausalLM", "qwen3_moe", qk_norm=True, moe=True),
        Architecture("Qwen2ForCausalLM", "qwen2", qk_norm=False, fixed_bias=(True, False)),
        Architecture("LlamaForCausalLM", "llama", qk_norm=False),
    )
}

# Tensors some checkpoints carry that hold nothing we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One HF tensor <-> one (per-layer slice of a) swarmjax parameter.

    ``to_ours`` maps the HF array to our layout; ``to_hf`` is its inverse.
    """

    hf: str                       # name, with {i} for the layer index (and {j} for the expert)
    ours: tuple[str, ...]         # path in the params dict
    to_ours: Callable[[np.ndarray, ModelConfig], np.ndarray]
    to_hf: Callable[[np.ndarray, ModelConfig], np.ndarray]


def _ident(x, c):
    return x


def _t(x, c):  # Linear weight [out, in] <-> [in, out]
    return x.T


def _heads_in(n: Callable[[ModelConfig], int]):
    """[n H, D] -> [D, n, H] and back (n: the N query or K kv heads, H the head dim)."""
    return (lambda x, c: x.T.reshape(c.hidden_size, n(c), c.head_dim),
            lambda x, c: x.reshape(c.hidden_size, -1).T)


def _heads_bias(n: Callable[[ModelConfig], int]):
    return (lambda x, c: x.reshape(n(c), c.head_dim), lambda x, c: x.reshape(-1))


_Q, _KV = (lambda c: c.num_heads), (lambda c: c.num_kv_heads)


def _tensor_table(cfg: ModelConfig) -> list[_Tensor]:
    L = "model.layers.{i}."
    table = [
        _Tensor("model.embed_tokens.weight", ("embed",), _ident, _ident),
        _Tensor("model.norm.weight", ("final_norm", "scale"), _ident, _ident),
        _Tensor(L + "input_layernorm.weight", ("layers", "input_norm", "scale"), _ident, _ident),
        _Tensor(L + "post_attention_layernorm.weight", ("layers", "post_attn_norm", "scale"),
                _ident, _ident),
        _Tensor(L + "self_attn.q_proj.weight", ("layers", "attn", "q_proj"), *_heads_in(_Q)),
        _Tensor(L + "self_attn.k_proj.weight", ("layers", "attn", "k_proj"), *_heads_in(_KV)),
        _Tensor(L + "self_attn.v_proj.weight", ("layers", "attn", "v_proj"), *_heads_in(_KV)),
        _Tensor(L + "self_attn.o_proj.weight", ("layers", "attn", "o_proj"),
                lambda x, c: x.T.reshape(c.num_heads, c.head_dim, c.hidden_size),
                lambda x, c: x.reshape(-1, c.hidden_size).T),
    ]
    if cfg.is_moe:
        table += [_Tensor(L + "mlp.gate.weight", ("layers", "mlp", "router"), _t, _t)] + [
            _Tensor(L + "mlp.experts.{j}." + hf + ".weight", ("layers", "mlp", ours), _t, _t)
            for hf, ours in (("gate_proj", "expert_gate"), ("up_proj", "expert_up"), ("down_proj", "expert_down"))]
    else:
        table += [_Tensor(L + f"mlp.{name}.weight", ("layers", "mlp", name), _t, _t)
                  for name in ("gate_proj", "up_proj", "down_proj")]
    if cfg.qk_norm:
        table += [
            _Tensor(L + "self_attn.q_norm.weight", ("layers", "attn", "q_norm", "scale"), _ident, _ident),
            _Tensor(L + "self_attn.k_norm.weight", ("layers", "attn", "k_norm", "scale"), _ident, _ident),
        ]
    if cfg.attention_bias:
        table += [
            _Tensor(L + "self_attn.q_proj.bias", ("layers", "attn", "q_bias"), *_heads_bias(_Q)),
            _Tensor(L + "self_attn.k_proj.bias", ("layers", "attn", "k_bias"), *_heads_bias(_KV)),
            _Tensor(L + "self_attn.v_proj.bias", ("layers", "attn", "v_bias"), *_heads_bias(_KV)),
        ]
    if cfg.has_o_bias:
        table.append(_Tensor(L + "self_attn.o_proj.bias", ("layers", "attn", "o_bias"), _ident, _ident))
    if not cfg.tie_embeddings:
        table.append(_Tensor("lm_head.weight", ("lm_head",), _t, _t))
    return table


# ----------------------------------------------------------------------------- config


def _field(hf: dict[str, Any], key: str, source: str, *, where: str = ""):
    """``hf[key]``, or a :class:`CheckpointError` naming the field and ``source``."""
    value = hf.get(key)
    if value is None:
        raise CheckpointError(f"{source}: lacks required field {where}{key!r}")
    return value


def config_from_hf(hf: dict[str, Any], *, param_dtype: str = "float32",
                   dtype: str | None = None,
                   source: str = CONFIG_FILE) -> tuple[ModelConfig, Architecture]:
    """Translate a parsed ``config.json`` into a :class:`ModelConfig`.

    Raises :class:`CheckpointError` for a missing required field, an invalid value, or an
    architecture or option we do not implement; every message starts with ``source``
    (the file the dict was read from).
    """
    if not isinstance(hf, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    archs = hf.get("architectures") or []
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(f"{source}: unknown architecture "
                              f"{archs or hf.get('model_type')!r}; supported: {sorted(ARCHITECTURES)}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: unsupported hidden_act {act!r} (only 'silu' / SwiGLU)")
    if hf.get("mlp_bias"):
        raise CheckpointError(f"{source}: unsupported option mlp_bias=true")
    if hf.get("use_sliding_window"):
        raise CheckpointError(f"{source}: unsupported option use_sliding_window=true")
    moe = _moe_from_hf(hf, source) if arch.moe else {}

    rope = dict(hf.get("rope_parameters") or {})          # transformers >= 5
    legacy = hf.get("rope_scaling") or {}                  # transformers 4.x
    rope.setdefault("rope_theta", hf.get("rope_theta", 10_000.0))
    for k, v in legacy.items():
        rope.setdefault(k, v)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if partial is not None and partial != 1:
        raise CheckpointError(f"{source}: unsupported option partial_rotary_factor={partial!r} "
                              "(RoPE on the whole head only)")
    rope_scaling = None
    if rope_type == "llama3":
        rope_scaling = tuple(_field(rope, k, source, where="rope_scaling.") for k in (
            "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
    elif rope_type != "default" and rope_type != "yarn":
        raise CheckpointError(f"{source}: unsupported rope_type {rope_type!r}; "
                              "supported: default, llama3, yarn")

    def field(key):
        return _field(hf, key, source)

    heads = field("num_attention_heads")
    max_positions = hf.get("max_position_embeddings", 4096)
    try:
        if rope_type == "llama3":
            f, lo, hi, old = rope_scaling
            rope_scaling = (float(f), float(lo), float(hi), int(old))
        elif rope_type == "yarn":
            rope_scaling = _yarn_from_hf(rope, hf, max_positions)
        qkv_bias, o_bias = arch.fixed_bias or (bool(hf.get("attention_bias", False)),) * 2
        cfg = ModelConfig(
            vocab_size=field("vocab_size"), hidden_size=field("hidden_size"),
            num_layers=field("num_hidden_layers"), num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or field("hidden_size") // heads,
            intermediate_size=field("intermediate_size"), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope["rope_theta"]), rope_type=rope_type, rope_scaling=rope_scaling,
            max_position_embeddings=max_positions,
            qk_norm=arch.qk_norm, attention_bias=qkv_bias,
            o_bias=None if arch.fixed_bias is None else o_bias,
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            param_dtype=param_dtype, dtype=dtype or param_dtype, **moe)
    except CheckpointError:
        raise
    except (TypeError, ValueError, ZeroDivisionError) as e:  # a field of the wrong type/value
        raise CheckpointError(f"{source}: {e}") from None
    return cfg, arch


def _moe_from_hf(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """A Qwen3-MoE config.json's expert fields as :class:`ModelConfig` keywords. Only the
    layout with experts in every layer is implemented (``decoder_sparse_step`` 1, no
    ``mlp_only_layers``), as every released Qwen3-MoE has. ``norm_topk_prob`` defaults to
    False, transformers' default; ``num_local_experts`` is the name transformers 5 writes."""
    step = hf.get("decoder_sparse_step", 1)
    if step != 1:
        raise CheckpointError(f"{source}: unsupported option decoder_sparse_step={step!r} "
                              "(experts in every layer only)")
    if hf.get("mlp_only_layers"):
        raise CheckpointError(f"{source}: unsupported option mlp_only_layers={hf['mlp_only_layers']!r} "
                              "(experts in every layer only)")
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    if experts is None:
        raise CheckpointError(f"{source}: lacks required field 'num_experts'")
    return dict(num_experts=experts, experts_per_token=_field(hf, "num_experts_per_tok", source),
                moe_intermediate_size=_field(hf, "moe_intermediate_size", source),
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)))


def _yarn_from_hf(rope: dict[str, Any], hf: dict[str, Any], max_positions: int) -> YarnScaling:
    """YaRN's parameters with transformers' defaults: ``original_max_position_embeddings``
    from the top level of config.json if there, else ``rope_scaling``, else
    ``max_position_embeddings``; a missing ``factor`` is the ratio of the two lengths;
    beta_fast / beta_slow None or 0 are 32 / 1; truncate defaults to True."""
    old = hf.get("original_max_position_embeddings") or \
        rope.get("original_max_position_embeddings") or max_positions
    factor = rope.get("factor")
    if factor is None:
        factor = max_positions / old

    def optional(key):
        value = rope.get(key)
        return None if value is None else float(value)

    return YarnScaling(factor=float(factor), original_max_position_embeddings=int(old),
                       beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
                       mscale=optional("mscale"), mscale_all_dim=optional("mscale_all_dim"),
                       attention_factor=optional("attention_factor"),
                       truncate=bool(rope.get("truncate", True)))


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` dict for ``cfg``: Qwen3 when qk_norm, Qwen2 for biases on q, k
    and v only, else Llama. Raises :class:`CheckpointError` for a bias set no family has."""
    arch = next((a for a in ARCHITECTURES.values() if a.matches(cfg)), None)
    if arch is None:
        raise CheckpointError(
            f"no Hugging Face family has qk_norm={cfg.qk_norm} with q/k/v biases "
            f"{cfg.attention_bias} and an o_proj bias {cfg.has_o_bias}")
    rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
    if cfg.rope_type == "llama3":
        f, lo, hi, old = cfg.rope_scaling
        rope.update(factor=f, low_freq_factor=lo, high_freq_factor=hi,
                    original_max_position_embeddings=old)
    elif cfg.rope_type == "yarn":
        y = cfg.rope_scaling
        rope.update(factor=y.factor, original_max_position_embeddings=y.original_max_position_embeddings,
                    beta_fast=y.beta_fast, beta_slow=y.beta_slow)
        rope.update({k: getattr(y, k) for k in ("mscale", "mscale_all_dim", "attention_factor")
                     if getattr(y, k) is not None})
        if not y.truncate:
            rope["truncate"] = False
    family: dict[str, Any] = {"attention_bias": cfg.attention_bias}
    if arch.model_type == "qwen2":   # biases fixed by the family; no sliding window here
        family = {"use_sliding_window": False}
    if arch.moe:
        family.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
                      moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
                      decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False)
    return {
        "architectures": [arch.hf_name], "model_type": arch.model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size, "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu", "max_position_embeddings": cfg.max_position_embeddings,
        **family, "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        # both spellings, so transformers 4.x and 5.x read the same RoPE
        "rope_parameters": rope, "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_type == "default" else rope,
        "dtype": cfg.param_dtype, "torch_dtype": cfg.param_dtype,
    }


# ----------------------------------------------------------------------------- reading


def _tensor_files(path: str) -> dict[str, str]:
    """tensor name -> safetensors file for a checkpoint directory."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    single = os.path.join(path, WEIGHTS_FILE)
    if not os.path.exists(single):
        raise CheckpointError(f"{path}: neither {WEIGHTS_FILE} nor {INDEX_FILE} found")
    return {name: single for name in _keys_of(single)}


def _keys_of(file: str) -> list[str]:
    try:
        with safe_open(file, framework="numpy") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: unreadable safetensors file ({e})") from None


def _slices(entry: _Tensor, cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The HF tensor names of one table entry, each with the index of its slice of our
    array: () for a whole array, (i,) for layer i, (i, j) for expert j of layer i."""
    if "{j}" in entry.hf:
        return [(entry.hf.format(i=i, j=j), (i, j)) for i in range(cfg.num_layers)
                for j in range(cfg.num_experts)]
    if "{i}" in entry.hf:
        return [(entry.hf.format(i=i), (i,)) for i in range(cfg.num_layers)]
    return [(entry.hf, ())]


class _Reader:
    """Reads tensors by name, keeping each shard file open once. ``virtual`` names are
    parts of a stored tensor, read without the rest of it: name -> (stored name, index
    of the part, a leading length-1 axis dropped)."""

    def __init__(self, files: dict[str, str]):
        self.files, self.handles, self.used = files, {}, set()
        self.virtual: dict[str, tuple[str, tuple[slice, ...]]] = {}

    def get(self, name: str) -> np.ndarray:
        stored, part = self.virtual[name] if name not in self.files and name in self.virtual else (name, None)
        if stored not in self.files:
            raise CheckpointError(f"missing tensor {stored!r}")
        file = self.files[stored]
        try:
            if file not in self.handles:
                if not os.path.exists(file):
                    raise CheckpointError(f"tensor {stored!r}: shard file {file} does not exist")
                self.handles[file] = safe_open(file, framework="numpy").__enter__()
            self.used.add(stored)
            if part is None:
                return self.handles[file].get_tensor(stored)
            return self.handles[file].get_slice(stored)[part][0]
        except SafetensorError as e:
            raise CheckpointError(f"tensor {name!r} in {file}: unreadable ({e})") from None

    def close(self):
        for h in self.handles.values():
            h.__exit__(None, None, None)


def _fused_experts(reader: _Reader, cfg: ModelConfig) -> None:
    """Let ``reader`` serve the per-expert names from fused expert tensors where a layer
    stores them so: ``mlp.experts.gate_up_proj`` [E, 2F, D] (gate rows first) and
    ``mlp.experts.down_proj`` [E, D, F]; each expert's part is read on its own."""
    F = cfg.moe_intermediate_size
    for i in range(cfg.num_layers):
        base = f"model.layers.{i}.mlp.experts."
        if base + "gate_up_proj" not in reader.files:
            continue
        for j in range(cfg.num_experts):
            e = slice(j, j + 1)
            reader.virtual[f"{base}{j}.gate_proj.weight"] = (base + "gate_up_proj", (e, slice(0, F)))
            reader.virtual[f"{base}{j}.up_proj.weight"] = (base + "gate_up_proj", (e, slice(F, 2 * F)))
            reader.virtual[f"{base}{j}.down_proj.weight"] = (base + "down_proj", (e,))


def _set(tree: dict, path: tuple[str, ...], value):
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def hf_config(path: str, *, param_dtype: str = "float32", dtype: str | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of checkpoint directory ``path`` (its ``config.json``; no
    weights read; local or an object store). Raises CheckpointError when the file is
    missing, not JSON or lacks a field."""
    raw = _json_file(path, CONFIG_FILE)
    if raw is None:
        raise CheckpointError(f"{path}: no {CONFIG_FILE} (not a Hugging Face checkpoint directory)")
    return config_from_hf(raw, param_dtype=param_dtype, dtype=dtype,
                          source=str(epath.Path(path) / CONFIG_FILE))[0]


def _json_file(path: str, name: str) -> dict[str, Any] | None:
    """The JSON object in file ``name`` of checkpoint directory ``path`` (None when there
    is no such file); CheckpointError when it is not valid JSON."""
    file = epath.Path(path) / name
    if not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None


def from_hf(path: str, *, param_dtype: str = "float32", dtype: str | None = None,
            shardings: Any = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Load a Qwen3, Qwen3-MoE, Qwen2 / Qwen2.5 or Llama HF checkpoint directory.

    Args:
      path: directory with ``config.json`` and safetensors weights.
      param_dtype: dtype the parameters are stored in here ("float32" / "bfloat16").
      dtype: compute dtype (default: ``param_dtype``).
      shardings: optional pytree of ``NamedSharding`` (see
        :func:`swarmjax.sharding.tree_shardings`) to place each parameter with.

    Returns:
      (config, params) with params in the layout of :func:`swarmjax.models.init_params`.

    Raises:
      CheckpointError: unknown architecture, a field missing from ``config.json``,
        missing/unexpected tensor, wrong shape, unreadable file -- the message names
        the field or tensor and the file.
    """
    cfg = hf_config(path, param_dtype=param_dtype, dtype=dtype)
    target = abstract_params(cfg)
    np_dtype = np.dtype(DTYPES[param_dtype])
    reader = _Reader(_tensor_files(path))
    if cfg.is_moe:
        _fused_experts(reader, cfg)
    params: dict[str, Any] = {}
    try:
        for entry in _tensor_table(cfg):
            want = _get(target, entry.ours).shape
            slices = _slices(entry, cfg)
            lead = len(slices[0][1])                       # leading [L] or [L, E] axes
            expected = entry.to_hf(np.zeros(want[lead:], np.float32), cfg).shape
            value = np.empty(want, np_dtype)
            for name, index in slices:
                hf_arr = reader.get(name)
                if tuple(hf_arr.shape) != tuple(expected):
                    raise CheckpointError(f"tensor {name!r} has shape {tuple(hf_arr.shape)}, "
                                          f"expected {tuple(expected)}")
                value[index] = entry.to_ours(hf_arr, cfg).astype(np_dtype)
            _set(params, entry.ours, value)
        leftover = sorted(n for n in set(reader.files) - reader.used
                          if not n.endswith(_IGNORED_SUFFIXES)
                          and not (cfg.tie_embeddings and n == "lm_head.weight"))
        if leftover:
            raise CheckpointError(f"unexpected tensor {leftover[0]!r} ({len(leftover)} unexpected "
                                  f"in all) for {cfg.num_layers}-layer config in {path}")
    finally:
        reader.close()
    if shardings is None:
        params = jax.tree.map(jax.numpy.asarray, params)
    else:
        params = jax.tree.map(jax.device_put, params, shardings)
    return cfg, params


def eos_ids(path: str) -> tuple[int, ...]:
    """The ids generation stops at in checkpoint directory ``path``: ``eos_token_id`` (an
    int or a list) of ``generation_config.json``, else of ``config.json``; () when
    neither names one. Raises CheckpointError for a file that is not JSON or an id that
    is not an integer."""
    for name in (GENERATION_CONFIG, CONFIG_FILE):
        value = (_json_file(path, name) or {}).get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise CheckpointError(f"{epath.Path(path) / name}: eos_token_id must be a non-negative int or a list "
                                  f"of them, got {value!r}")
        return tuple(ids)
    return ()


# ----------------------------------------------------------------------------- writing


def to_hf(cfg: ModelConfig, params: dict[str, Any], path: str,
          max_shard_bytes: int | None = None) -> None:
    """Write ``cfg`` and ``params`` as an HF checkpoint directory.

    ``max_shard_bytes`` splits the weights into ``model-0000k-of-0000n.safetensors``
    files with a ``model.safetensors.index.json`` (as ``save_pretrained`` does).
    """
    os.makedirs(path, exist_ok=True)
    host = jax.tree.map(np.asarray, jax.device_get(params))
    tensors: dict[str, np.ndarray] = {}
    for entry in _tensor_table(cfg):
        arr = _get(host, entry.ours)
        for name, index in _slices(entry, cfg):
            tensors[name] = np.ascontiguousarray(entry.to_hf(arr[index], cfg))
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(config_to_hf(cfg), f, indent=2)
    meta = {"format": "pt"}
    if max_shard_bytes is None:
        save_file(tensors, os.path.join(path, WEIGHTS_FILE), metadata=meta)
        return
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, arr in tensors.items():
        if shards[-1] and size + arr.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = arr
        size += arr.nbytes
    weight_map = {}
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, file), metadata=meta)
        weight_map.update({name: file for name in shard})
    total = sum(a.nbytes for a in tensors.values())
    with open(os.path.join(path, INDEX_FILE), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
