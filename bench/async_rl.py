"""Synchronous against asynchronous PARL on one machine: wall clock per step, and reward
against steps and against wall clock.

    python bench/async_rl.py                              # 8 simulated CPU devices
    python bench/async_rl.py --warm runs/cpu --steps 60   # from a run's warm start
    python bench/async_rl.py --json

The token-world PARL trainer of ``configs/parl_widesearch_cpu.py`` (its model and batch:
8 tasks x 8 rollouts, GSPO, Muon) runs ``--steps`` steps in each mode, in this one
process, from the same params and task stream:

* ``sync``: roll out, then update, on a mesh of every device (the job's default path);
* ``async``: one batch in flight (``AsyncConfig(depth=1)``), rollout and learner on the
  same devices;
* ``async_split``: one batch in flight, the rollout on the last half of the devices, the
  learner on the first half (``rollout_devices``).

Per mode: the median seconds per step (the first two steps, which compile, left out)
and its ratio to ``sync`` measured in the same run, the median rollout and update
seconds, the learner's wait for a batch, and the mean training-batch reward over the
last half of the steps. ``--png`` draws reward against steps and against wall clock.
On a CPU the simulated devices share its cores, so the rollout and the update compete
for the same cores and overlap gains little; on an accelerator they do not.
``--warm DIR``: the params of a finished run's warm start (``DIR/warm_start``), else a
random init (timings are the same; rewards flat).
"""

from __future__ import annotations

import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops  # noqa: E402

from swarmjax.config_file import load_config  # noqa: E402
from swarmjax.envs import widesearch_jax as wsj  # noqa: E402
from swarmjax.models.transformer import init_params  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.sharding.mesh import MeshConfig, make_mesh  # noqa: E402
from swarmjax.train.agent_rl import collect, learn  # noqa: E402
from swarmjax.train.async_rl import AsyncConfig, AsyncRollouts  # noqa: E402
from swarmjax.train.agent_job import AgentJob  # noqa: E402
from swarmjax.train.parl import PARLTrainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("sync", "async", "async_split")


def warm_params(job: AgentJob, warm: str | None):
    """The warm start of the run in ``warm`` (its ``warm_start/``), or a random init."""
    init = lambda: init_params(job.model, jax.random.key(job.seed))   # noqa: E731
    if warm is None:
        return init()
    from swarmjax.train.warm_start import load_warm_start

    local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=local), jax.eval_shape(init))
    return load_warm_start(job, warm, abstract)[0]


def run_mode(mode: str, job: AgentJob, params, steps: int) -> dict:
    """``steps`` PARL steps in ``mode``; per step (seconds since the start, metrics)."""
    devices = jax.devices()
    half = len(devices) // 2
    split = mode == "async_split"
    mesh = make_mesh(MeshConfig(data=-1), devices[:half] if split else devices)
    rollout_mesh = make_mesh(MeshConfig(data=-1), devices[half:]) if split else None
    rl = job.rl.bound(job.task)
    parl = rl if mode == "sync" else dataclasses.replace(rl, async_rollout=AsyncConfig(depth=1))
    trainer = PARLTrainer(job.model, parl, mesh=mesh, rollout_mesh=rollout_mesh)   # async: mismatch logged
    copy = lambda tree: jax.tree.map(jax.numpy.copy, tree)     # noqa: E731
    state = trainer.init(Roles.both(copy(params)))
    key = jax.random.key(7)
    tasks_of = lambda j: wsj.problems(wsj.reset(jax.random.fold_in(key, j), job.task.cfg,  # noqa: E731
                                                rl.tasks_per_step))
    rows, t0 = [], time.perf_counter()
    if mode == "sync":
        for j in range(steps):
            state, m = trainer.step(state, jax.random.fold_in(key, 10_000 + j), step=j, tasks=tasks_of(j))
            rows.append((time.perf_counter() - t0, m))
        return {"rows": rows}

    drawn = {"j": 0}

    def draw():
        j = drawn["j"]
        drawn["j"] += 1
        return tasks_of(j), [str(j)]

    def collect_step(j, tasks, p, workers):
        return collect(trainer.engine, Roles(p, workers), tasks,
                       jax.random.split(jax.random.fold_in(key, 10_000 + j))[1],
                       parl, step=j)

    rollouts = AsyncRollouts(AsyncConfig(depth=1), draw=draw, stream_state=lambda: drawn["j"], collect=collect_step,
                             loss_mask=lambda c: np.asarray(c.batch.loss_mask), publish=trainer.publish)
    rollouts.begin(state.params, step=0, steps=steps, frozen=state.frozen["subagents"])
    try:
        for _ in range(steps):
            state, m = rollouts.step(state, functools.partial(learn, trainer.learner), untrained=lambda c: {})
            rows.append((time.perf_counter() - t0, m))
    finally:
        rollouts.close()
    return {"rows": rows}


def summarise(rows: list) -> dict:
    t = [r[0] for r in rows]
    per_step = np.diff([0.0] + t)[2:]
    ms = [r[1] for r in rows]
    half = len(ms) // 2
    return {"s_per_step": statistics.median(per_step), "rollout_s": statistics.median(m["rollout_s"] for m in ms[2:]),
            "update_s": statistics.median(m["update_s"] for m in ms[2:]),
            "wait_s": statistics.median(m.get("async/wait_s", m["rollout_s"]) for m in ms[2:]),
            "reward_last_half": float(np.mean([m["reward"] for m in ms[half:]])),
            "staleness": float(np.mean([m.get("async/staleness", 0) for m in ms])),
            "mismatch_kl": float(np.mean([m.get("learner/mismatch_kl", 0.0) for m in ms])),
            "total_s": t[-1]}


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for mode, res in results.items():
        t = [r[0] for r in res["rows"]]
        reward = [r[1]["reward"] for r in res["rows"]]
        axes[0].plot(range(1, len(reward) + 1), reward, label=mode)
        axes[1].plot(t, reward, label=mode)
    axes[0].set_xlabel("PARL step")
    axes[1].set_xlabel("wall clock (s)")
    for ax in axes:
        ax.set_ylabel("training-batch reward")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warm", default=None, help="a finished run's workdir: its warm start's params")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--png", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.steps < 4:
        p.error("--steps must be >= 4 (the first two compile)")
    job = load_config(os.path.join(ROOT, "configs", "parl_widesearch_cpu.py"), AgentJob)
    params = warm_params(job, args.warm)
    peak = matmul_peak_flops()
    results = {mode: run_mode(mode, job, params, args.steps) for mode in args.modes}
    peak = max(peak, matmul_peak_flops())
    table = {mode: summarise(res["rows"]) for mode, res in results.items()}
    base = table.get("sync")
    for row in table.values():
        row["vs_sync"] = row["s_per_step"] / base["s_per_step"] if base else float("nan")
    if args.png:
        plot(results, args.png)
    if args.json:
        print(json.dumps({"device": jax.devices()[0].device_kind, "devices": jax.device_count(),
                          "matmul_peak_flops": peak, "steps": args.steps, "modes": table}))
        return
    print(f"{jax.device_count()} x {jax.devices()[0].device_kind}, matmul peak {peak / 1e9:.1f} GFLOP/s, "
          f"{args.steps} PARL steps per mode ({job.rl.batch} episodes a step)")
    print("| mode | s / step | vs sync | rollout s | update s | learner wait s | staleness | mismatch KL "
          "| reward (last half) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, r in table.items():
        print(f"| {mode} | {r['s_per_step']:.3f} | {r['vs_sync']:.2f} | {r['rollout_s']:.3f} | {r['update_s']:.3f} "
              f"| {r['wait_s']:.3f} | {r['staleness']:.2f} | {r['mismatch_kl']:.2e} | {r['reward_last_half']:.3f} |")


if __name__ == "__main__":
    main()
