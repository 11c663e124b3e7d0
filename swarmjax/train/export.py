"""A training run's policy as a Hugging Face checkpoint directory (``swarmjax export``).

    swarmjax export --workdir runs/units --checkpoint best --out exported/ [--dtype bfloat16]

writes, from the run's ``policy.json``, ``tokenizer/`` and the chosen checkpoint's params:

* ``config.json`` and ``model.safetensors`` (:func:`swarmjax.models.hf.to_hf`), with the
  chat format's stop ids as ``eos_token_id``;
* the tokenizer files (``tokenizer.json``, ``tokenizer_config.json`` with the chat
  template and its ``eos_token``);
* ``generation_config.json``: ``eos_token_id`` (every stop id of the chat format, e.g.
  Qwen3's ``<|im_end|>`` and ``<|endoftext|>``) and ``pad_token_id``, so
  ``transformers``' ``generate`` stops where a swarmjax rollout stops.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath

from swarmjax.models.config import DTYPES, LoraConfig, ModelConfig
from swarmjax.models.hf import CONFIG_FILE, GENERATION_CONFIG, from_hf, to_hf
from swarmjax.models.lora import merge
from swarmjax.models.peft_io import write_peft
from swarmjax.models.transformer import init_params
from swarmjax.text.chat import ChatFormat
from swarmjax.train.checkpoint import Checkpointer
from swarmjax.train.policy import TOKENIZER_DIR, copy_tokenizer, read_policy
from swarmjax.train.warm_start import read_warm_params


def export_run(workdir: str, out: str, *, which: str = "latest", dtype: str | None = None,
               adapter: bool = False) -> dict[str, Any]:
    """Write checkpoint ``which`` ("latest", "best" or a step) of the text run in
    ``workdir`` to ``out`` as a Hugging Face checkpoint (module docstring), the params cast
    to ``dtype`` ("float32", "bfloat16"; None: as trained). A LoRA run's checkpoint (its
    adapters alone) is merged into its base (the run's ``hf_path``, or its seed's random
    model); with ``adapter`` it is written as a PEFT adapter directory instead
    (:func:`swarmjax.models.peft_io.write_peft`, over the run's ``hf_path``). Returns what
    was written: ``step``, ``eos_token_id``, ``dtype``, ``files``."""
    cfg, chat = read_policy(workdir)
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
    directory = epath.Path(workdir) / "checkpoints"
    if not directory.exists():
        raise ValueError(f"no checkpoints in {workdir}")
    with Checkpointer(str(directory), save_every=1, read_only=True) as ckpt:
        step = ckpt.step_of(which)
        state, meta = ckpt.read(step)
    params, lora = state["params"], meta.get("lora")
    lcfg = None if lora is None else LoraConfig.from_json(lora["config"])
    if adapter:
        if lora is None:
            raise ValueError(f"--adapter: the run in {workdir} trained the whole model, not LoRA adapters")
        if lora.get("warm_start"):
            raise ValueError(f"--adapter: the run in {workdir} adapted its own warm start, not a checkpoint an "
                             "adapter loads onto: export its step 0 merged (--checkpoint 0: the warm start) "
                             "for the base, or this step merged")
        if lora["hf_path"] is None:
            raise ValueError(f"--adapter: the run in {workdir} adapted a random model (no hf_path), which no "
                             "adapter can be loaded onto: export the merged model")
        files = write_peft(cfg.replace(lora=lcfg), params["lora"], out, base_model=lora["hf_path"])
        copy_tokenizer(str(epath.Path(workdir) / TOKENIZER_DIR), str(out))
        return {"step": step, "eos_token_id": [int(i) for i in chat.stop_ids], "dtype": "float32",
                "files": sorted({*files, *(p.name for p in epath.Path(out).iterdir())})}
    if lora is not None:
        params = merge({**_lora_base(cfg, lora, workdir), "lora": params["lora"]}, cfg.replace(lora=lcfg))
    if dtype is not None:
        cfg = cfg.replace(param_dtype=dtype)
        params = jax.tree.map(lambda x: jnp.asarray(x, DTYPES[dtype]), params)
    return {"step": step, **write_hf_checkpoint(cfg, params, chat, str(epath.Path(workdir) / TOKENIZER_DIR), out)}


def _lora_base(cfg: ModelConfig, lora: dict[str, Any], workdir: str) -> dict[str, Any]:
    """The frozen base a LoRA run adapted (its checkpoint meta's ``lora``): its own warm
    start (``lora.warm_start=False``: ``<workdir>/warm_start``), its ``hf_path``'s weights,
    or its seed's random model (as the job made it)."""
    if lora.get("warm_start"):
        return read_warm_params(workdir, jax.eval_shape(lambda: init_params(cfg.replace(lora=None), jax.random.key(0))))
    if lora["hf_path"] is not None:
        base_cfg, params = from_hf(lora["hf_path"], param_dtype=cfg.param_dtype)
        if base_cfg.replace(lora=None) != cfg.replace(lora=None):
            raise ValueError(f"the run's base {lora['hf_path']} is no longer the model it trained on "
                             "(its config differs)")
        return params
    return init_params(cfg.replace(lora=None), jax.random.key(lora["seed"]))


def write_hf_checkpoint(cfg: ModelConfig, params: Any, chat: ChatFormat, tokenizer_dir: str, out: str
                        ) -> dict[str, Any]:
    """Write ``params`` of model ``cfg`` with the tokenizer files of ``tokenizer_dir`` to
    ``out`` as a Hugging Face checkpoint (module docstring; ``chat``: its stop and pad
    ids). Returns ``eos_token_id``, ``dtype``, ``files``."""
    epath.Path(out).mkdir(parents=True, exist_ok=True)
    to_hf(cfg, params, str(out))
    copy_tokenizer(tokenizer_dir, str(out))
    eos = [int(i) for i in chat.stop_ids]
    pad = int(chat.ids[chat.pad_token][0])
    config_file = epath.Path(out) / CONFIG_FILE
    config = json.loads(config_file.read_text())
    config.update(eos_token_id=eos[0] if len(eos) == 1 else eos, pad_token_id=pad)
    config_file.write_text(json.dumps(config, indent=2))
    generation = {"eos_token_id": eos, "pad_token_id": pad}
    if chat.bos_token is not None:
        generation["bos_token_id"] = chat.tokenizer.token_id(chat.bos_token)
    (epath.Path(out) / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2))
    return {"eos_token_id": eos, "dtype": cfg.param_dtype, "files": sorted(p.name for p in epath.Path(out).iterdir())}
