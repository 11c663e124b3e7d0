"""``swarmjax train``: warm start (SFT), then PARL, with evaluations and a report.

Writes into ``workdir``: ``config.txt`` (the resolved job), ``metrics.jsonl`` (one
line per SFT / PARL step), ``eval.jsonl`` (per task size, per evaluation),
``traces.jsonl`` (a few evaluation episodes as orchestration traces),
``summary.json`` / ``summary.md`` (warm-start vs final policy per task size, wall
clock) and ``curves.png`` (learning curves).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax

from swarmjax.envs.widesearch import Vocab
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import init_params
from swarmjax.swarm.engine import SwarmRollout
from swarmjax.swarm.outcome import rollout_traces
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer, evaluate, greedy
from swarmjax.train.sft import SFTConfig, train_sft

EVAL_KEYS = ("item_f1", "critical_steps", "total_steps", "subagents", "no_spawn_fraction")


@dataclasses.dataclass(frozen=True)
class TrainJob:
    model: ModelConfig
    sft: SFTConfig = SFTConfig()
    parl: PARLTrainConfig = PARLTrainConfig()
    parl_steps: int = 200
    eval_sizes: tuple[int, ...] = (1, 4, 8, 16)
    eval_episodes: int = 32
    eval_every: int = 50              # PARL steps between evaluations (0: only at the end)
    traces_per_eval: int = 2          # episodes per task size saved as traces
    seed: int = 0

    def validate(self) -> None:
        """One-line errors for configs that cannot run, before anything compiles."""
        env = self.parl.rollout.env
        need = Vocab(env).size
        if self.model.vocab_size < need:
            raise ValueError(f"model.vocab_size {self.model.vocab_size} < the task vocabulary ({need} tokens)")
        bad = [n for n in self.eval_sizes if not 1 <= n <= env.max_task_size]
        if bad:
            raise ValueError(f"eval_sizes {bad} outside the task sizes 1..{env.max_task_size}")
        if self.parl_steps < 0 or self.eval_episodes < 1:
            raise ValueError("parl_steps must be >= 0 and eval_episodes >= 1")


class _Log:
    def __init__(self, workdir: str):
        self.files = {name: open(os.path.join(workdir, name), "w")
                      for name in ("metrics.jsonl", "eval.jsonl", "traces.jsonl")}

    def write(self, name: str, record: dict) -> None:
        self.files[name].write(json.dumps(record) + "\n")
        self.files[name].flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, leave=True)


def run_job(job: TrainJob, workdir: str, progress: bool = True) -> dict[str, Any]:
    """Run the job; returns the summary (also written to ``workdir``)."""
    job.validate()
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.txt"), "w") as f:
        f.write(repr(job) + "\n")
    t_start = time.perf_counter()
    log = _Log(workdir)
    env = job.parl.rollout.env
    key = jax.random.key(job.seed)
    params = init_params(job.model, jax.random.fold_in(key, 0))

    # stage 1: warm start on demonstrations (budget lifted: demonstrations are serial-heavy)
    bar = _bar(job.sft.steps, "warm start (SFT)", progress)

    def on_sft(i, m):
        log.write("metrics.jsonl", {"stage": "sft", "step": i, **m})
        bar.set_postfix(loss=f"{m['loss']:.3f}", orch_acc=f"{m['orch_acc']:.2f}", worker_acc=f"{m['worker_acc']:.2f}")
        bar.update()
    warm, sft_report = train_sft(params, job.model, dataclasses.replace(env, budget=None), job.sft, on_sft)
    bar.close()

    eval_engine = SwarmRollout(greedy(job.parl.rollout), job.model)
    eval_key = jax.random.fold_in(key, 2)

    def run_eval(policy, label: str, step: int) -> dict[int, dict[str, float]]:
        kept: dict = {}
        res = evaluate(eval_engine, policy, warm, list(job.eval_sizes), job.eval_episodes, eval_key, kept)
        for n, row in res.items():
            log.write("eval.jsonl", {"policy": label, "step": step, "n": n, **row})
            tasks, result = kept[n]
            for tr in rollout_traces(eval_engine.rcfg.env, tasks, result, prefix=f"{label}-s{step}-n{n}",
                                     limit=job.traces_per_eval):
                log.write("traces.jsonl", tr)
        return res

    warm_eval = run_eval(warm, "warm_start", 0)

    # stage 2: PARL with the warm start frozen as sub-agents
    trainer = PARLTrainer(job.model, job.parl)
    state = trainer.init(warm, worker_params=warm)
    bar = _bar(job.parl_steps, "PARL", progress)
    final_eval = warm_eval
    for i in range(job.parl_steps):
        state, m = trainer.step(state, jax.random.fold_in(jax.random.fold_in(key, 3), i))
        m["tok_s"] = m["sampled_tokens"] / max(m["rollout_s"], 1e-9)
        log.write("metrics.jsonl", {"stage": "parl", "step": i, **m})
        bar.set_postfix(reward=f"{m['reward']:.3f}", f1=f"{m['item_f1']:.2f}", crit=f"{m['critical_steps']:.1f}",
                        subagents=f"{m['subagents']:.2f}", tok_s=f"{m['tok_s']:.0f}")
        bar.update()
        if job.eval_every and (i + 1) % job.eval_every == 0 and i + 1 < job.parl_steps:
            run_eval(state.params, "parl", i + 1)
    bar.close()
    if job.parl_steps:
        final_eval = run_eval(state.params, "final", job.parl_steps)
    log.close()

    summary = {
        "warm_start": {str(n): {k: row[k] for k in EVAL_KEYS} for n, row in warm_eval.items()},
        "final": {str(n): {k: row[k] for k in EVAL_KEYS} for n, row in final_eval.items()},
        "sft_accuracy": {k: v for k, v in sft_report["after"].items() if k.endswith("_acc")},
        "wall_clock_s": time.perf_counter() - t_start,
        "parl_steps": job.parl_steps, "device": jax.devices()[0].device_kind,
    }
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(summary_table(summary) + "\n")
    _curves(workdir)
    return summary


def summary_table(summary: dict[str, Any]) -> str:
    """Markdown: per task size, warm start vs final policy."""
    lines = ["| n | policy | item-F1 | critical steps | total steps | sub-agents | no-spawn |",
             "|---|---|---|---|---|---|---|"]
    for n in summary["warm_start"]:
        for label in ("warm_start", "final"):
            r = summary[label][n]
            lines.append(f"| {n} | {label.replace('_', ' ')} | {r['item_f1']:.3f} | {r['critical_steps']:.2f} | "
                         f"{r['total_steps']:.2f} | {r['subagents']:.2f} | {r['no_spawn_fraction']:.2f} |")
    lines.append(f"\nwall clock {summary['wall_clock_s']:.0f} s on {summary['device']}, "
                 f"{summary['parl_steps']} PARL steps")
    return "\n".join(lines)


def _curves(workdir: str) -> None:
    """curves.png: PARL reward, item-F1, critical steps and sub-agents per step."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    parl = [r for r in rows if r["stage"] == "parl"]
    sft = [r for r in rows if r["stage"] == "sft"]
    fig, axes = plt.subplots(1, 5, figsize=(20, 3.4))
    axes[0].plot([r["step"] for r in sft], [r["loss"] for r in sft])
    axes[0].set_title("SFT loss")
    for ax, k in zip(axes[1:], ("reward", "item_f1", "critical_steps", "subagents")):
        ax.plot([r["step"] for r in parl], [r[k] for r in parl])
        ax.set_title(f"PARL {k}")
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(os.path.join(workdir, "curves.png"), dpi=100)
    plt.close(fig)
