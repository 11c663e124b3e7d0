"""``swarmjax sample``: generate from token-id prompts with a HF checkpoint or a random model."""

from __future__ import annotations

import argparse
import dataclasses
import time

from swarmjax.cli import register
from swarmjax.models.config import PRESETS, ModelConfig
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.sharding.mesh import MeshConfig


@dataclasses.dataclass(frozen=True)
class SampleJob:
    """What ``swarmjax sample`` runs. ``hf_path=None`` builds a random model from ``model``."""

    model: ModelConfig = PRESETS["1m"]
    sampling: SamplingConfig = SamplingConfig(temperature=0.8, top_k=50, top_p=0.95,
                                              max_new_tokens=32)
    mesh: MeshConfig = MeshConfig()
    hf_path: str | None = None
    prompts: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (5, 6), (7,), (8, 9, 10))
    stop_tokens: tuple[int, ...] = ()
    seed: int = 0


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
    p.add_argument("--preset", choices=sorted(PRESETS), help="random model size when no --hf")
    p.add_argument("--prompt", action="append", type=_parse_ids,
                   help="token ids, e.g. '1 2 3' (repeat for a batch)")
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
    if args.batch:
        if args.batch < 1:
            raise ValueError("--batch must be >= 1")
        job = dataclasses.replace(job, prompts=tuple(
            job.prompts[i % len(job.prompts)] for i in range(args.batch)))
    return job


def run(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    from swarmjax.models.hf import from_hf
    from swarmjax.models.transformer import init_params
    from swarmjax.sampling.sampler import Sampler, pad_prompts
    from swarmjax.sharding.mesh import make_mesh, shard_tree

    job = job_from_args(args)
    mesh = make_mesh(job.mesh)
    if job.hf_path:
        cfg, params = from_hf(job.hf_path)
        source = job.hf_path
    else:
        cfg = job.model
        params = init_params(cfg, jax.random.key(job.seed))
        source = "random weights"
    print(f"model: {cfg.num_params() / 1e6:.2f}M params ({source}), mesh {dict(mesh.shape)}")

    sampler = Sampler(cfg, job.sampling, mesh=mesh)
    params = shard_tree(params, sampler.param_shardings(params))
    tokens, mask = pad_prompts(job.prompts)
    stops = None
    if job.stop_tokens:
        stops = np.tile(np.asarray(job.stop_tokens, np.int32), (len(job.prompts), 1))
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
        print(f"[{b}] prompt {list(prompt)} -> {gen}  (logprob {out.logprobs[b].sum():.2f})")
    n = int(out.lengths.sum())
    print(f"generated {n} tokens in {steady:.3f}s: {n / steady:.1f} tokens/s "
          f"(first call incl. compile {first:.2f}s)")
    return 0


register("sample", "generate tokens from token-id prompts")((add_arguments, run))
