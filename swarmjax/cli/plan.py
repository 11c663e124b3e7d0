"""``swarmjax plan``: per-device memory of a training job on a mesh, before booking it.

    swarmjax plan --model qwen3-8b --mesh 1,64,1 --batch 64 --seq 4096 --remat block
    swarmjax plan --model qwen3-1.7b --mesh 1,8,1 --batch 32 --seq 2048 --json
    swarmjax plan --hf ~/ckpt/Qwen3-0.6B --mesh 1,4,1 --batch 16 --seq 2048   # its config.json
    swarmjax plan --model qwen3-8b --mesh 1,64,1 --batch 64 --seq 4096 --judge-batch 64 --judge-model qwen3-1.7b
    swarmjax plan --hf ~/ckpt/Qwen3-0.6B --mesh 8,1,1 --batch 16 --seq 1024 --warm-batch 16   # and the warm start
    swarmjax plan --model qwen3-0.6b,qwen3-8b --mesh 1,64,1 --batch 64 --seq 4096 --subagents 8,32 \
        --subagent-context 4096 --remat block      # the whole RL step with the swarm rollout, a table
    swarmjax plan --model qwen3-8b --mesh 1,8,1 --batch 32 --seq 2048 --subagents 8 --lora 16   # LoRA beside full
    swarmjax plan --model qwen3-8b --mesh 1,8,1 --mesh 1,16,1 --batch 16 --seq 4096 --lora 16   # the smallest slice

Compiles the learner update, the rollout (and with --warm-batch the warm start's step) ahead of time from
abstract shapes on simulated CPU devices (as many as the mesh has; nothing is allocated) and prints
XLA's per-device memory: params, optimizer state, temporaries, KV cache, and whether
the total fits v5e / v5p / v6e / H100 (:mod:`swarmjax.train.plan`). With ``--subagents``
the swarm rollout too: B orchestrator rows and B x K sub-agent rows (or a pool of
``--subagent-lanes``), their caches, the frozen sub-agent weights and one tick of their
decoding (:mod:`swarmjax.train.plan_swarm`). Several models or K give one plan each and
a summary table. ``--lora R`` adds LoRA training of rank R beside each (the optimizer
state of the adapters alone; frozen sub-agents as adapters over the same base weights).
``--mesh`` given several times plans each mesh (on as many simulated devices as the largest
has) and ends with the fewest devices of each chip kind that hold each job
(:func:`~swarmjax.train.plan.format_slices`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys

from swarmjax.cli import register


def _mesh(text: str) -> tuple[int, int, int]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--mesh takes data,fsdp,tensor as three positive ints, got {text!r}")
    return sizes


def add_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a model preset (swarmjax.models.config.PRESETS), e.g. qwen3-8b; "
                                       "several comma-separated")
    which.add_argument("--hf", dest="hf_path",
                       help="a Hugging Face checkpoint directory: the shape of its config.json (no weights read)")
    p.add_argument("--mesh", type=_mesh, required=True, action="append",
                   help="data,fsdp,tensor sizes, e.g. 1,64,1; given several times, each mesh is planned and "
                        "a table gives the fewest devices of each chip kind that hold the job")
    p.add_argument("--batch", type=int, required=True, help="trajectories per learner update")
    p.add_argument("--seq", type=int, required=True, help="tokens per trajectory (and KV slots per rollout row)")
    p.add_argument("--remat", default="dots",
                   help="the learner's and warm start's rematerialisation: dots (the default: keep the weight "
                        "matmuls' outputs), none, block, or a jax.checkpoint_policies name")
    p.add_argument("--prompt", type=int, help="prompt tokens of a rollout row (default seq / 2)")
    p.add_argument("--rollout-batch", type=int, help="rows decoded at once (default --batch)")
    p.add_argument("--dtype", help="override the preset's compute and param dtype (float32, bfloat16)")
    p.add_argument("--optimizer", choices=("muon", "adamw"), default="muon")
    p.add_argument("--lora", type=_ints, default=(),
                   help="also plan LoRA training of these ranks (adapters on every linear map, AdamW), "
                        "beside full training; several comma-separated")
    p.add_argument("--loss", default="gspo", help="a loss preset (swarmjax.rl.losses.loss_preset), e.g. gspo, grpo")
    p.add_argument("--minibatches", type=int, default=4, help="optimizer steps per update")
    p.add_argument("--microbatches", type=int, default=1, help="gradient accumulation per minibatch")
    p.add_argument("--judge-batch", type=int, default=0,
                   help="an LLM judge scoring this many answers at once (0: none)")
    p.add_argument("--judge-model", help="the judge: a model preset or a Hugging Face checkpoint directory "
                                         "(default: a frozen copy of the policy)")
    p.add_argument("--judge-prompt", type=int, default=512, help="ids of a judge prompt (task, answer, rubric)")
    p.add_argument("--subagents", type=_ints, default=(),
                   help="plan the swarm rollout with K sub-agent slots an episode; several comma-separated")
    p.add_argument("--subagent-context", type=int, help="a sub-agent's cache slots (default --seq)")
    p.add_argument("--subagent-lanes", type=int, default=0,
                   help="sub-agent rows with a cache, shared by the slots (default 0: one per slot)")
    p.add_argument("--subagent-model", help="the sub-agents: a model preset or a Hugging Face checkpoint "
                                            "directory (default: a frozen copy of the policy)")
    p.add_argument("--warm-batch", type=int, default=0,
                   help="also plan the warm start's step on this many rows of --seq ids a role (default 0: not)")
    p.add_argument("--warm-roles", type=int, default=1,
                   help="roles the warm start trains in one step (2: an orchestrator's and a sub-agent's batch)")
    p.add_argument("--chunk", type=int, default=16, help="ids a swarm row is fed in one tick (the engine's chunk)")
    p.add_argument("--buffers", type=int, default=0,
                   help="also list each program's N largest arrays (what the temporaries are made of)")
    p.add_argument("--json", action="store_true", help="print one JSON object a plan (bytes per device)")
    p.add_argument("--device", action="append", default=[], metavar="CHIP",
                   help="v5e, v5p, v6e or h100: warn when a plan does not fit this chip (90%% of its memory), naming the settings that "
                        "shrink it (repeatable)")


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative ints, got {text!r}")
    return out


def _simulated_cpu_devices(count: int) -> None:
    """Ask JAX for ``count`` CPU devices and the CPU backend only; must run before
    anything touches a backend (``swarmjax plan`` is its own process)."""
    import jax

    try:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as e:      # the backend was already initialised with other settings
        raise ValueError(f"cannot simulate {count} CPU devices in this process ({e}); run "
                         f"'swarmjax plan' in a fresh process") from None


def run(args: argparse.Namespace) -> int:
    devices = max(math.prod(m) for m in args.mesh)
    _simulated_cpu_devices(devices)
    import jax

    from swarmjax.models.config import LoraConfig, preset
    from swarmjax.models.hf import hf_config
    from swarmjax.optim import OptimConfig
    from swarmjax.rl.losses import loss_preset
    from swarmjax.rl.update import UpdateConfig
    from swarmjax.sharding.mesh import MeshConfig, make_mesh
    from swarmjax.train.plan import fit_advice, format_plan, format_slices, format_summary, plan_memory
    from swarmjax.train.plan_swarm import plan_swarm

    if len(jax.devices()) < devices:
        raise ValueError(f"the mesh needs {devices} devices but JAX has {len(jax.devices())}")
    from swarmjax.train.plan import DEVICE_MEMORY
    unknown = [d for d in args.device if d not in DEVICE_MEMORY]
    if unknown:
        raise ValueError(f"--device {unknown[0]!r}: known chips are {', '.join(sorted(DEVICE_MEMORY))}")
    load = lambda ref: hf_config(ref) if os.path.isdir(ref) else preset(ref)
    models = [(args.hf_path, hf_config(args.hf_path))] if args.hf_path else \
        [(name, preset(name)) for name in args.model.split(",")]
    judge = args.judge_model and load(args.judge_model)
    sub = args.subagent_model and load(args.subagent_model)
    if args.dtype:
        cast = lambda c: c and c.replace(dtype=args.dtype, param_dtype=args.dtype)
        models, judge, sub = [(n, cast(c)) for n, c in models], cast(judge), cast(sub)
    update = UpdateConfig(loss=loss_preset(args.loss), optim=OptimConfig(name=args.optimizer),
                          num_minibatches=args.minibatches, num_microbatches=args.microbatches, remat=args.remat)
    if args.batch % (args.minibatches * args.microbatches):
        raise ValueError(f"--batch {args.batch} is not divisible by minibatches x microbatches "
                         f"= {args.minibatches * args.microbatches}")
    plans = []                                       # (model name, K, MemoryPlan) of every mesh
    if any(r < 1 for r in args.lora):
        raise ValueError(f"--lora ranks must be >= 1, got {args.lora}")
    models = [(f"{name} LoRA r{r}" if r else name, cfg.replace(lora=LoraConfig(rank=r)) if r else cfg)
              for name, cfg in models for r in (0, *args.lora)]
    meshes = [make_mesh(MeshConfig(data=d, fsdp=f, tensor=t), devices=jax.devices()[:d * f * t])
              for d, f, t in args.mesh]
    for mesh, (name, cfg) in itertools.product(meshes, models):
        plan = plan_memory(cfg, mesh, batch=args.batch, seq=args.seq, update=update,
                           rollout_batch=args.rollout_batch, prompt=args.prompt,
                           judge_batch=args.judge_batch, judge_prompt=args.judge_prompt if args.judge_batch else 0,
                           judge_model=judge, warm_batch=args.warm_batch,
                           warm_roles=args.warm_roles, warm_optim=update.optim, largest=args.buffers)
        for k in args.subagents or (None,):
            if k is not None:
                swarm = plan_swarm(cfg, mesh, episodes=args.batch, subagents=k, context=args.seq,
                                   subagent_context=args.subagent_context, lanes=args.subagent_lanes,
                                   chunk=args.chunk, subagent_model=sub, resident=plan.opt_state + plan.frozen)
                plan = dataclasses.replace(plan, swarm=swarm)
            title = (f"{name} ({cfg.num_params() / 1e9:.2f}B params, {cfg.dtype}), batch {args.batch} x "
                     f"{args.seq} tokens, remat {args.remat}" + ("" if k is None else f", K = {k} sub-agents"))
            if args.json:
                print(json.dumps({"model": name, "batch": args.batch, "seq": args.seq, "remat": args.remat,
                                  "dtype": cfg.dtype, "subagents": k, **plan.as_dict()}), flush=True)
            else:
                print(format_plan(plan, title=title) + "\n", flush=True)
            for device in args.device:
                for line in fit_advice(plan, device):
                    print(f"warning: {name}{'' if k is None else f' K = {k}'} on {plan.devices} devices {line}",
                          file=sys.stderr, flush=True)
            plans.append((name, k, plan))
    if len(plans) > 1 and not args.json:
        print(format_summary([(n if len(meshes) == 1 else f"{n} @{p.devices}", k, p) for n, k, p in plans]))
    if len(meshes) > 1 and not args.json:
        print("\n" + format_slices([{"model": n, "subagents": k, **p.as_dict()} for n, k, p in plans]))
    return 0


register("plan", "per-device memory of the learner update and the rollout on a mesh, before booking it")(
    (add_arguments, run))
