"""``swarmjax train``: warm start (SFT), then PARL, with evaluations, checkpoints and a report.

Writes into ``workdir``: ``config.txt`` (the resolved job), ``metrics.jsonl`` (one
line per SFT / PARL step), ``eval.jsonl`` (per task size, per evaluation),
``traces.jsonl`` (a few evaluation episodes as orchestration traces),
``checkpoints/`` (orbax: train state, data-iterator state, counters),
``summary.json`` / ``summary.md`` (warm-start vs final policy per task size, wall
clock), ``curves.png`` (learning curves) and, when ``tensorboardX`` is installed,
TensorBoard event files under ``tb/``. Tasks come from the TFDS task set prepared
under ``data_dir`` (train split for PARL, test split for evaluation).

Resume: a run continues from its newest finished checkpoint with ``resume=True``
(``swarmjax train --resume``) and then computes exactly what an uninterrupted run
would have: the PARL step drives every random key (``fold_in(seed, step)``), the
grain iterator state and the train state come from the checkpoint, and the JSONL
logs are cut back to the checkpoint's step before appending.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import numpy as np

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import Vocab
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import init_params
from swarmjax.sharding.mesh import MeshConfig, make_mesh
from swarmjax.swarm.engine import SwarmRollout
from swarmjax.swarm.outcome import rollout_traces
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer, evaluate, greedy
from swarmjax.train.sft import SFTConfig, train_sft

EVAL_KEYS = ("item_f1", "critical_steps", "total_steps", "subagents", "no_spawn_fraction")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The task set (TFDS builder ``swarmjax.data.builder``, read with grain)."""

    data_dir: str | None = None    # None: <workdir>/data
    train_size: int = 20000        # PARL draws its tasks from here (shuffled, repeated)
    test_size: int = 2048          # held-out; evaluation takes the first tasks of each size n
    seed: int = 0                  # generation seed of the task set (splits use disjoint streams)

    def __post_init__(self):
        if self.train_size < 1 or self.test_size < 1:
            raise ValueError("data.train_size and data.test_size must be >= 1")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 50                # PARL steps between checkpoints (the last step is always saved)
    keep_last: int = 2             # plus the best one by mean eval item-F1
    async_save: bool = True

    def __post_init__(self):
        if self.every < 1 or self.keep_last < 1:
            raise ValueError("checkpoint.every and checkpoint.keep_last must be >= 1")


@dataclasses.dataclass(frozen=True)
class TrainJob:
    model: ModelConfig
    sft: SFTConfig = SFTConfig()
    parl: PARLTrainConfig = PARLTrainConfig()
    data: DataConfig = DataConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    mesh: MeshConfig | None = None    # None: one device; else rollouts and updates over this mesh
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
        if env.budget is not None:
            need_steps = env.min_critical_steps(env.max_task_size)
            if env.budget < need_steps:
                raise ValueError(f"parl.rollout.env.budget {env.budget} is below {need_steps}, the fewest "
                                 f"critical steps any policy needs for a task of size {env.max_task_size} "
                                 f"(K = {env.max_subagents} sub-agents of at most {env.worker_capacity} lookups)")
        if self.mesh is not None:
            shape = self.mesh.shape(jax.device_count())       # raises on an impossible mesh
            data = shape[0] * shape[1]
            for name, b in (("parl.tasks_per_step x parl.group_size", self.parl.batch),
                            ("eval_episodes", self.eval_episodes)):
                if b % data:
                    raise ValueError(f"{name} = {b} is not divisible by the mesh's data x fsdp = {data}")
        if self.data.train_size < self.parl.tasks_per_step * jax.process_count():
            raise ValueError(f"data.train_size {self.data.train_size} < parl.tasks_per_step x processes")


class _Log:
    """JSONL logs (and TensorBoard scalars when ``tensorboardX`` is installed). On resume
    from PARL step ``s`` the logs keep the warm-start lines and everything before ``s``."""

    NAMES = ("metrics.jsonl", "eval.jsonl", "traces.jsonl")

    def __init__(self, workdir: str, resume_step: int | None):
        if resume_step is not None:
            for name in self.NAMES:
                _truncate(os.path.join(workdir, name), resume_step)
        mode = "a" if resume_step is not None else "w"
        self.files = {name: open(os.path.join(workdir, name), mode) for name in self.NAMES}
        try:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(os.path.join(workdir, "tb"))
        except ImportError:
            self.tb = None

    def write(self, name: str, record: dict) -> None:
        self.files[name].write(json.dumps(record) + "\n")
        self.files[name].flush()
        if self.tb is not None and name != "traces.jsonl":
            tag = record.get("stage") or f"eval/{record['policy']}/n{record['n']}"
            step = record["step"]
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self.tb.add_scalar(f"{tag}/{k}", v, step)

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        if self.tb is not None:
            self.tb.close()


def _keep_line(row: dict, step: int) -> bool:
    """Whether a log line was written before PARL step ``step`` was started."""
    if "stage" in row:                                    # metrics.jsonl
        return row["stage"] == "sft" or row["step"] < step
    if "policy" in row:                                   # eval.jsonl
        return row["policy"] == "warm_start" or row["step"] <= step
    parts = row["trace_id"].split("-")                    # traces: <label>-s<step>-n<n>-<b>
    return parts[0] == "warm_start" or int(parts[1][1:]) <= step


def _truncate(path: str, step: int) -> None:
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [line for line in f if line.strip() and _keep_line(json.loads(line), step)]
    with open(path, "w") as f:
        f.writelines(rows)


def _bar(total: int, desc: str, enabled: bool, initial: int = 0):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, leave=True)


def eval_tasks(source, sizes: tuple[int, ...], episodes: int) -> dict[int, wsj.Tasks]:
    """The first ``episodes`` held-out tasks of each size n in ``sizes`` (a data source
    of task records, e.g. the test split). Raises ValueError if a size is short."""
    picked: dict[int, list[dict]] = {n: [] for n in sizes}
    for i in range(len(source)):
        rec = source[i]
        n = int(rec["n"])
        if n in picked and len(picked[n]) < episodes:
            picked[n].append(rec)
            if all(len(v) == episodes for v in picked.values()):
                break
    out = {}
    for n, recs in picked.items():
        if len(recs) < episodes:
            raise ValueError(f"the test split has {len(recs)} tasks of size {n}, eval_episodes is {episodes}: "
                             f"raise data.test_size")
        out[n] = wsj.Tasks(*(np.stack([np.asarray(r[k], np.int32) for r in recs])
                             for k in ("table", "entities", "n")))
    return out


def _mean_f1(res: dict[int, dict[str, float]]) -> float:
    return float(np.mean([row["item_f1"] for row in res.values()]))


def run_job(job: TrainJob, workdir: str, progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """Run the job (or continue it from its newest checkpoint with ``resume``); returns
    the summary (also written to ``workdir``)."""
    from swarmjax.data import prepare, task_iterator, to_tasks
    from swarmjax.train.checkpoint import Checkpointer

    job.validate()
    os.makedirs(workdir, exist_ok=True)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), save_every=job.checkpoint.every,
                        keep_last=job.checkpoint.keep_last, best_metric="item_f1",
                        async_save=job.checkpoint.async_save)
    latest = ckpt.latest_step()
    if latest is not None and not resume:
        ckpt.close()
        raise ValueError(f"{workdir} already holds checkpoints (newest: PARL step {latest}); "
                         "pass --resume to continue that run, or use a new --workdir")
    if resume and latest is None:
        ckpt.close()
        raise ValueError(f"--resume: no finished checkpoint in {os.path.join(workdir, 'checkpoints')}")
    with open(os.path.join(workdir, "config.txt"), "w") as f:
        f.write(repr(job) + "\n")
    t_start = time.perf_counter()
    env = job.parl.rollout.env
    key = jax.random.key(job.seed)
    mesh = None if job.mesh is None else make_mesh(job.mesh)

    data_dir = job.data.data_dir or os.path.join(workdir, "data")
    sources = prepare(env, data_dir, train_size=job.data.train_size, validation_size=0,
                      test_size=job.data.test_size, seed=job.data.seed)
    held_out = eval_tasks(sources["test"], job.eval_sizes, job.eval_episodes)
    train_iter = task_iterator(sources["train"], job.parl.tasks_per_step, seed=job.seed, env=env)

    trainer = PARLTrainer(job.model, job.parl, mesh=mesh)
    eval_engine = SwarmRollout(greedy(job.parl.rollout), job.model, mesh=mesh)
    eval_key = jax.random.fold_in(key, 2)

    if latest is None:                                # stage 1: warm start
        log = _Log(workdir, None)
        params = init_params(job.model, jax.random.fold_in(key, 0))
        bar = _bar(job.sft.steps, "warm start (SFT)", progress)

        def on_sft(i, m):
            log.write("metrics.jsonl", {"stage": "sft", "step": i, **m})
            bar.set_postfix(loss=f"{m['loss']:.3f}", orch_acc=f"{m['orch_acc']:.2f}",
                            worker_acc=f"{m['worker_acc']:.2f}")
            bar.update()
        # budget lifted: the demonstrations are serial-heavy
        warm, sft_report = train_sft(params, job.model, dataclasses.replace(env, budget=None), job.sft, on_sft)
        bar.close()
        state = trainer.init(warm, worker_params=warm)
        meta = {"parl_step": 0, "seed": job.seed, "wall_clock_s": 0.0, "data": None,
                "sft_accuracy": {k: v for k, v in sft_report["after"].items() if k.endswith("_acc")}}
    else:                                             # resume: the warm start is in the checkpoint
        state, meta = _restore(job, trainer, ckpt, latest)
        train_iter.set_state(meta["data"])
        log = _Log(workdir, meta["parl_step"])
        warm = jax.tree.map(jax.numpy.copy, state.frozen["workers"])   # the learner donates its state

    def run_eval(policy, label: str, step: int) -> dict[int, dict[str, float]]:
        kept: dict = {}
        res = evaluate(eval_engine, policy, warm, held_out, eval_key, kept)
        for n, row in res.items():
            log.write("eval.jsonl", {"policy": label, "step": step, "n": n, **row})
            tasks, result = kept[n]
            for tr in rollout_traces(eval_engine.rcfg.env, tasks, result, prefix=f"{label}-s{step}-n{n}",
                                     limit=job.traces_per_eval):
                log.write("traces.jsonl", tr)
        return res

    if latest is None:
        meta["warm_eval"] = {str(n): row for n, row in run_eval(warm, "warm_start", 0).items()}
    warm_eval = {int(n): row for n, row in meta["warm_eval"].items()}

    # stage 2: PARL with the warm start frozen as sub-agents
    start = meta["parl_step"]
    final_eval = {int(n): row for n, row in meta.get("last_eval", meta["warm_eval"]).items()}
    bar = _bar(job.parl_steps, "PARL", progress, initial=min(start, job.parl_steps))
    for i in range(start, job.parl_steps):
        tasks = to_tasks(next(train_iter))
        state, m = trainer.step(state, jax.random.fold_in(jax.random.fold_in(key, 3), i), step=i, tasks=tasks)
        m["tok_s"] = m["sampled_tokens"] / max(m["rollout_s"], 1e-9)
        log.write("metrics.jsonl", {"stage": "parl", "step": i, **m})
        bar.set_postfix(reward=f"{m['reward']:.3f}", f1=f"{m['item_f1']:.2f}", crit=f"{m['critical_steps']:.1f}",
                        subagents=f"{m['subagents']:.2f}", tok_s=f"{m['tok_s']:.0f}")
        bar.update()
        done = i + 1
        metrics = None
        if done == job.parl_steps or (job.eval_every and done % job.eval_every == 0):
            final_eval = run_eval(state.params, "parl", done)
            metrics = {"item_f1": _mean_f1(final_eval)}
            meta["last_eval"] = {str(n): row for n, row in final_eval.items()}
        meta.update(parl_step=done, data=train_iter.get_state(),
                    wall_clock_s=meta["wall_clock_s"] + time.perf_counter() - t_start)
        t_start = time.perf_counter()
        ckpt.save(done, state, meta, metrics=metrics, force=done == job.parl_steps)
    bar.close()
    if job.parl_steps == 0 or start >= job.parl_steps:
        ckpt.save(max(start, job.parl_steps), state, meta, force=True)
    ckpt.close()
    log.close()

    wall = meta["wall_clock_s"] + time.perf_counter() - t_start
    summary = {
        "warm_start": {str(n): {k: row[k] for k in EVAL_KEYS} for n, row in warm_eval.items()},
        "final": {str(n): {k: row[k] for k in EVAL_KEYS} for n, row in final_eval.items()},
        "sft_accuracy": meta["sft_accuracy"],
        "wall_clock_s": wall,
        "parl_steps": job.parl_steps, "device": jax.devices()[0].device_kind,
    }
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(summary_table(summary) + "\n")
    _curves(workdir)
    return summary


def _restore(job: TrainJob, trainer: PARLTrainer, ckpt, step: int):
    """(TrainState, meta) of checkpoint ``step``, placed on the trainer's mesh (any mesh:
    checkpoints do not depend on the mesh that wrote them)."""
    from swarmjax.train.checkpoint import abstract_state

    key = jax.random.key(0)
    shapes = jax.eval_shape(lambda: trainer.init(init_params(job.model, key), init_params(job.model, key)))
    shardings = (trainer.learner.state_shardings(shapes) if trainer.learner.mesh is not None
                 else jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    return ckpt.restore(step, abstract_state(shapes, shardings))


def evaluate_checkpoint(job: TrainJob, workdir: str, which: str = "latest",
                        sizes: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Evaluate a checkpoint of ``workdir`` (``which``: "latest", "best" or a PARL step)
    and its frozen warm start on the held-out tasks, budget lifted. Returns
    ``{"step": s, "warm_start": {n: row}, "final": {n: row}}`` (rows as in the summary)."""
    from swarmjax.data import prepare
    from swarmjax.train.checkpoint import Checkpointer

    job.validate()
    sizes = tuple(sizes or job.eval_sizes)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), save_every=job.checkpoint.every)
    try:
        step = {"latest": ckpt.latest_step, "best": ckpt.best_step}.get(which, lambda: None)()
        if step is None and which not in ("latest", "best"):
            if not which.isdigit():
                raise ValueError(f"checkpoint must be 'latest', 'best' or a step number, got {which!r}")
            step = int(which)
        if step is None:
            raise ValueError(f"no {which} checkpoint in {os.path.join(workdir, 'checkpoints')}")
        mesh = None if job.mesh is None else make_mesh(job.mesh)
        trainer = PARLTrainer(job.model, job.parl, mesh=mesh)
        state, _ = _restore(job, trainer, ckpt, step)
    finally:
        ckpt.close()
    sources = prepare(job.parl.rollout.env, job.data.data_dir or os.path.join(workdir, "data"),
                      train_size=job.data.train_size, validation_size=0, test_size=job.data.test_size,
                      seed=job.data.seed)
    tasks = eval_tasks(sources["test"], sizes, job.eval_episodes)
    engine = SwarmRollout(greedy(job.parl.rollout), job.model, mesh=mesh)
    key = jax.random.fold_in(jax.random.key(job.seed), 2)
    warm = state.frozen["workers"]
    out = {"step": step}
    for label, params in (("warm_start", warm), ("final", state.params)):
        out[label] = {str(n): {k: row[k] for k in EVAL_KEYS}
                      for n, row in evaluate(engine, params, warm, tasks, key).items()}
    return out


def summary_table(summary: dict[str, Any]) -> str:
    """Markdown: per task size, warm start vs final policy."""
    lines = ["| n | policy | item-F1 | critical steps | total steps | sub-agents | no-spawn |",
             "|---|---|---|---|---|---|---|"]
    for n in summary["warm_start"]:
        for label in ("warm_start", "final"):
            r = summary[label][n]
            lines.append(f"| {n} | {label.replace('_', ' ')} | {r['item_f1']:.3f} | {r['critical_steps']:.2f} | "
                         f"{r['total_steps']:.2f} | {r['subagents']:.2f} | {r['no_spawn_fraction']:.2f} |")
    if "wall_clock_s" in summary:
        lines.append(f"\nwall clock {summary['wall_clock_s']:.0f} s on {summary['device']}, "
                     f"{summary['parl_steps']} PARL steps")
    return "\n".join(lines)


def _curves(workdir: str) -> None:
    """curves.png: SFT loss; PARL reward, item-F1, critical steps and sub-agents per step."""
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
