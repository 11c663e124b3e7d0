"""``swarmjax sample``: generate with a Hugging Face checkpoint or a random model.

    swarmjax sample --hf DIR --chat "How many legs has a spider?" --temperature 0
    swarmjax sample --prompt "1 2 3" --prompt "4 5"        # token ids, a random model

With ``--chat`` the texts are rendered as user turns with the checkpoint's chat template
(:mod:`swarmjax.text.chat`, the format read from the template or named by
``--chat-format``), generation stops at the checkpoint's eos ids (``generation_config.json``,
else ``config.json``; ``--stop`` adds more), and the replies are decoded.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from swarmjax.cli import register
from swarmjax.models.config import PRESETS, ModelConfig
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.sharding.mesh import MeshConfig


@dataclasses.dataclass(frozen=True)
class SampleJob:
    """What ``swarmjax sample`` runs. ``hf_path=None`` builds a random model from ``model``.

    chat: user texts rendered with the chat template of ``tokenizer_path`` (default:
      ``hf_path``'s tokenizer) in place of ``prompts``; ``system`` an optional system turn;
      ``chat_format`` a key of ``CHAT_FORMATS`` (None: read from the template);
      ``thinking``: Qwen3's ``enable_thinking``.
    adapter: a PEFT LoRA adapter directory over ``hf_path`` (``swarmjax export --adapter``,
      or one ``peft`` wrote), decoded as adapters over the base (not merged).
    """

    model: ModelConfig = PRESETS["1m"]
    sampling: SamplingConfig = SamplingConfig(temperature=0.8, top_k=50, top_p=0.95,
                                              max_new_tokens=32)
    mesh: MeshConfig = MeshConfig()
    hf_path: str | None = None
    prompts: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (5, 6), (7,), (8, 9, 10))
    stop_tokens: tuple[int, ...] = ()
    seed: int = 0
    chat: tuple[str, ...] = ()
    system: str | None = None
    tokenizer_path: str | None = None
    chat_format: str | None = None
    thinking: bool = False
    adapter: str | None = None


def _parse_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(t) for t in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"prompt must be integer token ids, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("empty prompt")
    return ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="Python file whose get_config() returns a SampleJob")
    p.add_argument("--hf", dest="hf_path", help="Hugging Face checkpoint directory (Qwen3/Llama)")
    p.add_argument("--adapter", help="a PEFT LoRA adapter directory over the --hf checkpoint")
    p.add_argument("--preset", choices=sorted(PRESETS), help="random model size when no --hf")
    p.add_argument("--prompt", action="append", type=_parse_ids,
                   help="token ids, e.g. '1 2 3' (repeat for a batch)")
    p.add_argument("--chat", action="append", metavar="TEXT",
                   help="a user message, rendered with the chat template (repeat for a batch)")
    p.add_argument("--system", help="a system message before each --chat text")
    p.add_argument("--tokenizer", dest="tokenizer_path", help="tokenizer directory (default: the --hf one)")
    p.add_argument("--chat-format", help="the chat format by name (default: read from the template)")
    p.add_argument("--thinking", action="store_true", help="Qwen3: enable_thinking=True")
    p.add_argument("--batch", type=int, help="repeat the prompts to this many rows")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--stop", type=int, action="append", help="stop token id (repeatable)")
    p.add_argument("--mesh", help="data,fsdp,tensor sizes, e.g. '-1,1,1'")
    p.add_argument("--seed", type=int)


def job_from_args(args: argparse.Namespace) -> SampleJob:
    """Config file (if any), then command-line flags on top."""
    from swarmjax.config_file import load_config

    job = load_config(args.config, SampleJob) if args.config else SampleJob()
    sampling = {k: v for k, v in dict(max_new_tokens=args.max_new_tokens,
                                      temperature=args.temperature, top_k=args.top_k,
                                      top_p=args.top_p).items() if v is not None}
    changes: dict = {"sampling": dataclasses.replace(job.sampling, **sampling)}
    if args.hf_path:
        changes["hf_path"] = args.hf_path
    if args.preset:
        changes["model"] = PRESETS[args.preset]
    if args.prompt:
        changes["prompts"] = tuple(args.prompt)
    for name in ("chat", "system", "tokenizer_path", "chat_format", "adapter"):
        if getattr(args, name):
            changes[name] = tuple(args.chat) if name == "chat" else getattr(args, name)
    if args.thinking:
        changes["thinking"] = True
    if args.stop:
        changes["stop_tokens"] = tuple(args.stop)
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.mesh:
        try:
            data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
        except ValueError:
            raise ValueError(f"--mesh takes three integers 'data,fsdp,tensor', got {args.mesh!r}")
        changes["mesh"] = MeshConfig(data, fsdp, tensor)
    job = dataclasses.replace(job, **changes)
    if job.chat and args.prompt:
        raise ValueError("give --chat texts or --prompt ids, not both")
    if job.adapter and not job.hf_path:
        raise ValueError("--adapter adapts a checkpoint: give its base with --hf DIR")
    if job.chat and not (job.tokenizer_path or job.hf_path):
        raise ValueError("--chat needs a tokenizer: --hf DIR (its tokenizer) or --tokenizer DIR")
    if args.batch:
        if args.batch < 1:
            raise ValueError("--batch must be >= 1")
        field = "chat" if job.chat else "prompts"
        rows = getattr(job, field)
        job = dataclasses.replace(job, **{field: tuple(rows[i % len(rows)] for i in range(args.batch))})
    return job


def read_chat(hf_path: str | None, tokenizer_path: str | None = None, *, chat_format: str | None = None,
              thinking: bool = False, stop_tokens: tuple[int, ...] = ()) -> tuple[Any, tuple[int, ...]]:
    """(chat format, stop ids) of a checkpoint: its tokenizer (``tokenizer_path``, else
    ``hf_path``'s), the format named or read from its template, and the stop ids: the
    checkpoint's eos ids, the chat format's when it names none, then ``stop_tokens``."""
    from swarmjax.models.hf import eos_ids
    from swarmjax.text.chat import chat_format as make_format
    from swarmjax.text.chat import detect_chat_format
    from swarmjax.train.policy import read_tokenizer

    tokenizer = read_tokenizer(tokenizer_path or hf_path, what="--tokenizer" if tokenizer_path else "--hf")
    chat = make_format(chat_format or detect_chat_format(tokenizer), tokenizer, thinking=thinking)
    eos = eos_ids(hf_path) if hf_path else ()
    stops = eos or tuple(int(i) for i in chat.stop_ids)
    return chat, tuple(dict.fromkeys(stops + tuple(stop_tokens)))


def chat_prompts(job: SampleJob) -> tuple[Any, tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """(chat format, the ``chat`` texts rendered as prompts, the stop ids: :func:`read_chat`)."""
    chat, stops = read_chat(job.hf_path, job.tokenizer_path, chat_format=job.chat_format, thinking=job.thinking,
                            stop_tokens=job.stop_tokens)
    system = [] if job.system is None else [{"role": "system", "content": job.system}]
    prompts = tuple(tuple(int(i) for i in chat.prompt_ids([*system, {"role": "user", "content": text}]))
                    for text in job.chat)
    return chat, prompts, stops


def run(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    from swarmjax.models.hf import from_hf
    from swarmjax.models.transformer import init_params
    from swarmjax.sampling.sampler import Sampler, pad_prompts
    from swarmjax.sharding.mesh import make_mesh, shard_tree

    job = job_from_args(args)
    chat, stop_tokens = None, job.stop_tokens
    if job.chat:
        chat, prompts, stop_tokens = chat_prompts(job)
        job = dataclasses.replace(job, prompts=prompts)
        print(f"chat format {chat.name}, stops at ids {list(stop_tokens)}")
    mesh = make_mesh(job.mesh)
    if job.hf_path:
        cfg, params = from_hf(job.hf_path)
        source = job.hf_path
        if job.adapter:
            from swarmjax.models.peft_io import read_peft

            lora, params["lora"] = read_peft(job.adapter, cfg)
            cfg = cfg.replace(lora=lora)
            source += f" + LoRA adapter {job.adapter} (rank {lora.rank}, {', '.join(lora.targets)})"
    else:
        cfg = job.model
        params = init_params(cfg, jax.random.key(job.seed))
        source = "random weights"
    print(f"model: {cfg.num_params() / 1e6:.2f}M params ({source}), mesh {dict(mesh.shape)}")

    sampler = Sampler(cfg, job.sampling, mesh=mesh)
    params = shard_tree(params, sampler.param_shardings(params))
    tokens, mask = pad_prompts(job.prompts)
    stops = None
    if stop_tokens:
        stops = np.tile(np.asarray(stop_tokens, np.int32), (len(job.prompts), 1))
    key = jax.random.key(job.seed)

    t0 = time.perf_counter()
    out = jax.block_until_ready(sampler(params, tokens, prompt_mask=mask, key=key, stop_tokens=stops))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(sampler(params, tokens, prompt_mask=mask, key=key, stop_tokens=stops,
                                        cache=out.cache))
    steady = time.perf_counter() - t0

    out = jax.device_get(out)
    for b, prompt in enumerate(job.prompts):
        gen = out.tokens[b, :out.lengths[b]].tolist()
        if chat is None:
            print(f"[{b}] prompt {list(prompt)} -> {gen}  (logprob {out.logprobs[b].sum():.2f})")
            continue
        ended = "stop id %d" % gen[-1] if gen and gen[-1] in stop_tokens else f"{len(gen)} tokens (the limit)"
        reply = chat.tokenizer.decode([i for i in gen if i not in stop_tokens])
        print(f"[{b}] {job.chat[b]!r}\n -> {reply!r}  (ended: {ended}; logprob {out.logprobs[b].sum():.2f})")
    n = int(out.lengths.sum())
    print(f"generated {n} tokens in {steady:.3f}s: {n / steady:.1f} tokens/s "
          f"(first call incl. compile {first:.2f}s)")
    return 0


register("sample", "generate from chat texts or token-id prompts")((add_arguments, run))
