"""LoRA adapters as a PEFT adapter directory, and back.

PEFT (Hugging Face's ``peft``, ``PeftModel.from_pretrained(base, dir)``) stores an
adapter as two files:

* ``adapter_config.json``: ``peft_type`` "LORA", ``task_type`` "CAUSAL_LM",
  ``base_model_name_or_path``, ``r``, ``lora_alpha``, ``lora_dropout``,
  ``target_modules``; the update is ``W x + (lora_alpha / r) B A x``;
* ``adapter_model.safetensors``: per layer ``l`` and target ``t`` (``q_proj`` ... in
  ``self_attn``, ``gate_proj`` ... in ``mlp``)
  ``base_model.model.model.layers.{l}.{self_attn|mlp}.{t}.lora_A.weight`` [R, in] and
  ``...lora_B.weight`` [out, R], ``in``/``out`` flattened as the Hugging Face linear
  weight [out, in] flattens them (:mod:`swarmjax.models.hf`: heads major, head dim minor).

swarmjax's adapters (:mod:`swarmjax.models.lora`: a [L, A, in..., R], b [L, A, R, out...],
scale alpha / R) map onto these one adapter ``A`` index at a time. QK-Clip's per-head
factors (``q_clip``, ``k_clip``) have no PEFT form: an adapter whose heads QK-Clip lowered
is exported merged instead (:func:`swarmjax.models.lora.merge`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from swarmjax.models.config import LORA_TARGETS, LoraConfig, ModelConfig
from swarmjax.models.lora import clip_factors, target_shapes

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "read_peft", "write_peft"]

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_MODULES = {"attn": "self_attn", "mlp": "mlp"}


def _key(layer: int, target: str, ab: str) -> str:
    module = _MODULES[LORA_TARGETS[target][0]]
    return f"base_model.model.model.layers.{layer}.{module}.{target}.lora_{ab}.weight"


def write_peft(cfg: ModelConfig, lora: dict[str, Any], out: str, *, base_model: str, index: int = 0) -> list[str]:
    """Write adapter ``index`` of ``lora`` (``params["lora"]`` of ``cfg``, whose
    ``cfg.lora`` names rank, alpha, dropout and targets) to the directory ``out`` as a
    PEFT LoRA adapter over ``base_model`` (its ``base_model_name_or_path``). Returns the
    files written. ValueError when QK-Clip has rescaled heads (no PEFT form)."""
    from safetensors.numpy import save_file

    lcfg = cfg.lora
    clipped = [k for k in ("q_clip", "k_clip") if not np.all(np.asarray(lora["attn"][k]) == 1)]
    if clipped:
        raise ValueError(f"QK-Clip rescaled heads of this adapter ({', '.join(clipped)} != 1), which a PEFT "
                         "adapter cannot hold: export the merged model instead")
    tensors = {}
    for t in lcfg.targets:
        ab = lora[LORA_TARGETS[t][0]][t]
        a, b = np.asarray(ab["a"][:, index], np.float32), np.asarray(ab["b"][:, index], np.float32)
        L, R = a.shape[0], a.shape[-1]
        for layer in range(L):
            tensors[_key(layer, t, "A")] = np.ascontiguousarray(a[layer].reshape(-1, R).T)   # [R, in]
            tensors[_key(layer, t, "B")] = np.ascontiguousarray(b[layer].reshape(R, -1).T)   # [out, R]
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": lcfg.rank, "lora_alpha": lcfg.alpha, "lora_dropout": lcfg.dropout,
              "target_modules": list(lcfg.targets), "bias": "none", "fan_in_fan_out": False,
              "use_rslora": False, "inference_mode": True}
    with open(os.path.join(out, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]


def read_peft(path: str, cfg: ModelConfig, *, dtype: Any = None) -> tuple[LoraConfig, dict[str, Any]]:
    """The PEFT LoRA adapter in directory ``path`` over a base of model ``cfg``: (its
    :class:`LoraConfig`, its adapters as ``params["lora"]`` with one adapter, QK-Clip's
    factors 1). One-line ValueErrors: not a LoRA adapter, options swarmjax does not
    implement (rsLoRA, DoRA, per-module ranks, biases), a target or a shape that does not
    match ``cfg`` (an adapter made for another base)."""
    import jax.numpy as jnp
    from safetensors.numpy import load_file

    config_file, weights = os.path.join(path, ADAPTER_CONFIG), os.path.join(path, ADAPTER_WEIGHTS)
    if not (os.path.isfile(config_file) and os.path.isfile(weights)):
        raise ValueError(f"{path} is not a PEFT adapter directory ({ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    config = json.load(open(config_file))
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: a {config.get('peft_type')} adapter; swarmjax reads LoRA adapters")
    unsupported = [k for k in ("use_rslora", "use_dora") if config.get(k)] + \
        [k for k in ("rank_pattern", "alpha_pattern") if config.get(k)] + \
        ([f"bias={config['bias']!r}"] if config.get("bias", "none") != "none" else [])
    if unsupported:
        raise ValueError(f"{path}: adapter options swarmjax does not implement: {', '.join(unsupported)}")
    targets = config.get("target_modules")
    targets = tuple(sorted(targets, key=list(LORA_TARGETS).index) if isinstance(targets, list) and
                    set(targets) <= set(LORA_TARGETS) else ())
    if not targets:
        raise ValueError(f"{path}: target_modules {config.get('target_modules')!r}: swarmjax adapts "
                         f"{', '.join(LORA_TARGETS)}")
    lcfg = LoraConfig(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                      dropout=float(config.get("lora_dropout", 0.0)), targets=targets)
    lcfg.check(cfg)
    tensors = load_file(weights)
    dtype = cfg.jnp_param_dtype if dtype is None else dtype
    L, R = cfg.num_layers, lcfg.rank
    lora = clip_factors(cfg, dtype)
    for t in targets:
        module, (ins, outs) = LORA_TARGETS[t][0], target_shapes(cfg, t)
        a, b = [], []
        for layer in range(L):
            ka, kb = _key(layer, t, "A"), _key(layer, t, "B")
            if ka not in tensors or kb not in tensors:
                raise ValueError(f"{path}: no {ka if ka not in tensors else kb} (an adapter for a model of "
                                 f"{L} layers?)")
            if tensors[ka].shape != (R, math.prod(ins)) or tensors[kb].shape != (math.prod(outs), R):
                raise ValueError(f"{path}: {t} of layer {layer} is A {tensors[ka].shape}, B {tensors[kb].shape}; "
                                 f"the base wants A ({R}, {math.prod(ins)}), B ({math.prod(outs)}, {R}): "
                                 "an adapter made for another base model")
            a.append(tensors[ka].T.reshape(*ins, R))
            b.append(tensors[kb].T.reshape(R, *outs))
        lora.setdefault(module, {})[t] = {"a": jnp.asarray(np.stack(a)[:, None], dtype),
                                          "b": jnp.asarray(np.stack(b)[:, None], dtype)}
    return lcfg, lora
