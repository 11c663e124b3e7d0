"""Does PARL's learning rate decide whether the context experiment's swarm keeps its items?

    python experiments/context_lr_probe.py --lr 5e-5 --base /work/runs/context --runs runs/context_probe

A probe, not a table: one seed's warm start (``--seed``, its PARL run at the old learning
rate finished in ``--base``: ``parl_s<seed>`` with its checkpoints every 10 steps, as
``experiments/context.py --parl-lr 2e-4`` leaves it), PARL again from the same warm start at
``--lr`` over the same 100-step schedule, the same task stream and keys, stopped after
``--steps`` steps. Both runs' checkpoints are evaluated greedily on ``--episodes`` tasks of
``--n`` entities drawn with another seed's stream (``--task-seed``: not the experiment's
held-out tasks): the warm start (step 0), the old run at ``--steps`` and at its end, the new
run at ``--steps``. Prints item-F1, critical steps, the share delegated, the sub-agents'
return F1 and the copy fidelity, and the two runs' training batches step by step; writes
``<runs>/probe.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import time

import context as C
from common import rl_rows


def _train(job, workdir):
    from swarmjax.train.jobs import run_job

    run_job(job, workdir, progress=False, resume="auto")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--old-lr", type=float, default=C.OLD_LR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--base", required=True, help="the experiment's runs directory holding parl_s<seed> (old rate)")
    p.add_argument("--runs", default="runs/context_probe")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--episodes", type=int, default=48)
    p.add_argument("--task-seed", type=int, default=7)
    args = p.parse_args()
    from swarmjax.train.agent_job import evaluate_agent_checkpoint

    old = C._jobs([], args.seed, args.base, 100, parl_lr=args.old_lr)["parl"]
    new = C._jobs([], args.seed, args.runs, 100, parl_lr=args.lr)["parl"]
    if not os.path.exists(os.path.join(old[1], "checkpoints", str(args.steps))):
        raise SystemExit(f"{old[1]} has no checkpoint at step {args.steps}: run experiments/context.py "
                         f"--seeds {args.seed} --parl-lr {args.old_lr:g} --runs {args.base} first")
    warm = os.path.join(args.runs, f"warm_s{args.seed}", "hf")
    if not os.path.exists(os.path.join(warm, "config.json")):
        shutil.copytree(os.path.join(args.base, f"warm_s{args.seed}", "hf"), warm)
    stop = os.path.join(new[1], "checkpoints", str(args.steps))
    if not os.path.exists(stop):                 # the 100-step schedule, stopped (SIGTERM checkpoints) at --steps
        proc = mp.get_context("spawn").Process(target=_train, args=new)
        proc.start()
        while not os.path.exists(stop) and proc.is_alive():
            time.sleep(5)
        time.sleep(20)
        os.kill(proc.pid, signal.SIGTERM)
        proc.join()
    problems = C._problems(old[0], args.n, args.episodes, args.task_seed)
    keys = ("accuracy", "critical_steps", "delegated", "return_f1", "copy_fidelity")
    out = {"args": vars(args), "arms": {}}
    for name, (job, workdir), which in (("warm start", old, "0"), (f"lr {args.old_lr:g} @ {args.steps}", old,
                                         str(args.steps)), (f"lr {args.old_lr:g} @ end", old, "latest"),
                                        (f"lr {args.lr:g} @ {args.steps}", new, str(args.steps))):
        got = evaluate_agent_checkpoint(job, workdir, which=which, problems=problems)["episodes"]
        out["arms"][name] = {k: C._mean(got[k]) for k in keys if k in got}
    print(f"greedy, {args.episodes} tasks of n = {args.n} (task seed {args.task_seed}), warm start of seed {args.seed}:")
    print(f"{'':22}" + "".join(f"{k:>15}" for k in keys))
    for name, r in out["arms"].items():
        print(f"{name:22}" + "".join(f"{r.get(k, float('nan')):15.3f}" for k in keys))
    a, b = rl_rows(old[1]), rl_rows(new[1])
    out["batches"] = [{"step": x["step"], "old": {k: x.get(k) for k in ("accuracy", "delegated")},
                       "new": {k: y.get(k) for k in ("accuracy", "delegated")}} for x, y in zip(a, b)]
    print("training batches (the same tasks and keys), item-F1 / delegated: old -> new")
    print("; ".join(f"{r['step']}: {r['old']['accuracy']:.2f}/{r['old']['delegated']:.2f} -> "
                    f"{r['new']['accuracy']:.2f}/{r['new']['delegated']:.2f}" for r in out["batches"][:args.steps]))
    with open(os.path.join(args.runs, "probe.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
