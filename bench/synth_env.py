"""A generated environment's tools: host Python against the device twin, and against a
decode tick of the model that calls them.

    python bench/synth_env.py            # table
    python bench/synth_env.py --json     # one JSON object

Workload: the task set of ``configs/synth_tools_cpu.py`` (generated here, nothing
downloaded); the recorded calls of its training tasks (first calls of each part: the
reads, computes and writes of real trajectories), each on its task's initial state.

* ``host``: :func:`swarmjax.envs.synth.generator.valid_arguments` (the schema check every
  call gets) and :func:`swarmjax.envs.synth.world.execute`, one call after the other: what
  the host-driven rollout spends per call, besides parsing and tokenising;
* ``device``: :func:`swarmjax.envs.synth.device.step` jitted and vmapped over ``B`` rows,
  each row its own state and call (``B`` in ``--batch``): per call;
* ``model tick``: one decode step of the config's model (1M parameters) for ``B`` rows
  over a KV cache of ``--context`` ids (the forward a jitted rollout runs every tick), to
  put the environment's share of a tick in proportion.

Ratios are against the host's time per call measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, time_best  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256, 1024])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import functools

    from swarmjax.config_file import load_config
    from swarmjax.envs.synth import device
    from swarmjax.envs.synth.generator import generate, valid_arguments
    from swarmjax.envs.synth.world import ToolError, execute, initial_state
    from swarmjax.models.transformer import forward, init_cache, init_params
    from swarmjax.train.agent_job import AgentJob

    job = load_config(os.path.join(ROOT, "configs", "synth_tools_cpu.py"), AgentJob)
    data = generate(job.task.cfg)
    env = next(e for e in data.envs if e.name in data.split_envs["train"])
    records = [r for r in data.splits["train"] + data.splits["seen"] if r["env"] == env.name]
    calls = [(initial_state(env, r["state_seed"]), p["calls"][0]) for r in records for p in r["parts"]]
    peak = matmul_peak_flops()

    def host_pass():
        for state, call in calls:
            spec = env.tool(call["name"])
            valid_arguments(env, spec, call["arguments"])
            try:
                execute(env, spec, state, call["arguments"])
            except ToolError:
                pass
    host_pass()
    host_s = time_best(host_pass, args.repeats) / len(calls)

    dev = device.DeviceEnv.build(env, spare=4)
    run = jax.jit(jax.vmap(functools.partial(device.step, dev)))
    mcfg = dataclasses.replace(job.model, vocab_size=job.tokenizer_vocab)
    params = init_params(mcfg, jax.random.key(0))
    rows = []
    for B in args.batch:
        pick = [calls[i % len(calls)] for i in range(B)]
        tables = jax.tree.map(lambda *x: jnp.stack(x), *[device.encode_state(dev, s) for s, _ in pick])
        tools = jnp.asarray([dev.tool_index(c["name"]) for _, c in pick], jnp.int32)
        encs = jnp.asarray(np.stack([device.encode_args(dev, c["name"], c["arguments"]) for _, c in pick]))
        jax.block_until_ready(run(tables, tools, encs))
        dev_s = time_best(lambda: jax.block_until_ready(run(tables, tools, encs)), args.repeats) / B

        cache = init_cache(mcfg, B, args.context)
        tok = jnp.zeros((B, 1), jnp.int32)
        tick = jax.jit(lambda p, c: forward(p, mcfg, tok, cache=c, cache_index=args.context - 1).logits)
        jax.block_until_ready(tick(params, cache))
        tick_s = time_best(lambda: jax.block_until_ready(tick(params, cache)), args.repeats)
        rows.append({"batch": B, "host_us_per_call": host_s * 1e6, "device_us_per_call": dev_s * 1e6,
                     "device_speedup": host_s / dev_s, "model_tick_ms": tick_s * 1e3,
                     "env_step_share_of_tick": dev_s * B / (dev_s * B + tick_s)})
    out = {"backend": jax.default_backend(), "matmul_peak_gflops": peak / 1e9, "env": env.name,
           "tools": len(env.tools), "calls": len(calls), "context": args.context, "rows": rows,
           "jax": jax.__version__, "time": time.strftime("%Y-%m-%d %H:%M")}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{env.name}: {len(env.tools)} tools, {len(calls)} recorded calls; {out['backend']}, matmul peak "
          f"{out['matmul_peak_gflops']:.0f} GFLOP/s; model tick over a {args.context}-id cache")
    print("| rows | host us/call | device us/call | device / host speed | model tick ms | env share of a tick |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['host_us_per_call']:.1f} | {r['device_us_per_call']:.2f} | "
              f"{r['device_speedup']:.1f}x | {r['model_tick_ms']:.2f} | {100 * r['env_step_share_of_tick']:.1f}% |")


if __name__ == "__main__":
    main()
