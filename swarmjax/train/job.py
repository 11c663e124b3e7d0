"""``swarmjax train`` for the token world: warm start (SFT), then PARL, with evaluations,
checkpoints and a report, through the one loop (:func:`~swarmjax.train.loop.run_loop`),
every job's RL step (:func:`~swarmjax.train.agent_rl.rl_step`), evaluation
(:func:`~swarmjax.train.agent_eval.evaluate`) and summary table, on the token engine
(:class:`~swarmjax.train.engines.TokenEngine`: the jitted swarm's own program, its result
adapted onto the one result type).

Writes into ``workdir``: ``config.txt`` (the resolved job), ``metrics.jsonl`` (one
line per SFT / PARL step: every job's figures, ``accuracy`` the item-F1), ``eval.jsonl``
(per task size, per evaluation), ``traces.jsonl`` (a few test-split evaluation episodes
as orchestration traces, :mod:`swarmjax.traces.rollout`: every agent's turns and tool
calls, each PARL reward channel, the evaluation batch's measured wall time split over its
episodes), ``checkpoints/`` (orbax: train state, data-iterator state, counters),
``summary.json`` / ``summary.md`` (the warm start, "initial", vs the final policy on the
test split, overall and per task size; wall clock), ``curves.png`` (learning curves) and,
when ``tensorboardX`` is installed, TensorBoard event files under ``tb/``; on stderr, a
line every ``log_every`` PARL steps when progress bars are off. Tasks come from the TFDS
task set prepared under ``data_dir``: the train split feeds PARL, the validation split the
periodic evaluations (and so the choice of the best checkpoint), the test split only
the warm-start / final comparison of the summary.

Multi-host: every process runs this function; process 0 prepares the data first and
alone writes files; every process reads the same batches of the train split (the one
process's order) and passes the whole batch to the token engine, which rolls it out as
one global batch over the mesh (a mesh is required with several processes) and hands each
process its contiguous share of the episodes (whole groups) for the learner's global
batch: the run samples what one process would.

Resume (``resume=``, ``swarmjax train --resume MODE``): "latest" continues from the
newest finished checkpoint (an error if there is none), "auto" does that when there is
one and starts afresh otherwise (a run killed in its warm start, before its first
checkpoint: the logs and TensorBoard events of that attempt are discarded), "never"
(the default) refuses a workdir that holds checkpoints. A resumed run computes exactly
what an uninterrupted run would have: the PARL step drives every random key
(``fold_in(seed, step)``), the grain iterator state, the optimizer state and the train
state come from the checkpoint, and the JSONL logs are cut back to the checkpoint's
step before appending.

Preemption (:mod:`swarmjax.train.preemption`): on SIGTERM the job stops at the end of
the current step, with a checkpoint when that step is a PARL step (or the warm-start
checkpoint), and raises :class:`~swarmjax.train.preemption.Preempted` (the CLI exits
with 143); ``--resume auto`` continues. A second SIGTERM, or SIGKILL, stops at once.

Paths: ``workdir`` may be local or ``gs://...`` (``etils.epath``; orbax and TFDS
read and write object stores themselves).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import numpy as np
from etils import epath

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import Vocab
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import init_params
from swarmjax.sharding.mesh import MeshConfig, make_mesh
from swarmjax.traces.rollout import rollout_traces
from swarmjax.train.agent_eval import by_size, evaluate, mean_figures
from swarmjax.train.agent_job import agent_summary_table, labelled_figures
from swarmjax.train.agent_rl import collect, episode_rewards, learn
from swarmjax.train.async_rl import AsyncRollouts, split_devices
from swarmjax.train.distributed import check_processes, primary_first
from swarmjax.train.frame import CheckpointConfig, check_identity
from swarmjax.train.loop import JobRun
from swarmjax.train.logs import JobLog, curves, log_line, progress_bar, write_summary
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer
from swarmjax.train.preemption import Preempted, PreemptionWatch
from swarmjax.train.sft import SFTConfig, train_sft
from swarmjax.train.warm_start import load_warm_start, save_warm_start

@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The task set (TFDS builder ``swarmjax.data.builder``, read with grain)."""

    data_dir: str | None = None    # None: <workdir>/data
    train_size: int = 20000        # PARL draws its tasks from here (shuffled, repeated)
    validation_size: int = 2048    # periodic evaluations (first tasks of each size n); best checkpoint
    test_size: int = 2048          # the summary's warm-start vs final comparison
    seed: int = 0                  # generation seed of the task set (splits use disjoint streams)
    # PARL oversampling of large tasks: this fraction of the tasks comes from the train
    # tasks with n >= focus_min_n (the rest from all of them); evaluations stay uniform
    focus_fraction: float = 0.0
    focus_min_n: int | None = None

    def __post_init__(self):
        if min(self.train_size, self.validation_size, self.test_size) < 1:
            raise ValueError("data.train_size, data.validation_size and data.test_size must be >= 1")
        if not 0.0 <= self.focus_fraction < 1.0:
            raise ValueError(f"data.focus_fraction must be in [0, 1), got {self.focus_fraction}")
        if self.focus_fraction > 0 and self.focus_min_n is None:
            raise ValueError("data.focus_fraction > 0 needs data.focus_min_n")


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
    log_every: int = 10               # PARL steps between log lines when progress bars are off
    traces_per_eval: int = 2          # episodes per task size saved as traces
    seed: int = 0
    # the workdir of an earlier run with the same model, SFT settings, task and seed:
    # start from its warm start (<dir>/warm_start/) instead of running the SFT stage
    warm_start_from: str | None = None
    # the warm_identity fields that must match for that (a subset of model, sft, env,
    # seed): ("model",) transfers a warm start to a variant of the task
    warm_start_match: tuple[str, ...] = ("model", "sft", "env", "seed")

    def validate(self) -> None:
        """One-line errors for configs that cannot run, before anything compiles."""
        env = self.parl.rollout.env
        need = Vocab(env).size
        if self.model.vocab_size < need:
            raise ValueError(f"model.vocab_size {self.model.vocab_size} < the task vocabulary ({need} tokens)")
        bad = [n for n in self.eval_sizes if not env.min_task_size <= n <= env.max_task_size]
        if bad or not self.eval_sizes:
            raise ValueError(f"eval_sizes {list(self.eval_sizes)} must be non-empty and within the task sizes "
                             f"{env.min_task_size}..{env.max_task_size}")
        if min(self.parl_steps, self.eval_every, self.log_every) < 0 or self.eval_episodes < 1:
            raise ValueError("parl_steps, eval_every and log_every must be >= 0, eval_episodes >= 1")
        if env.budget is not None:
            need_steps = env.min_critical_steps(env.max_task_size)
            if env.budget < need_steps:
                raise ValueError(f"parl.rollout.env.budget {env.budget} is below {need_steps}, the fewest "
                                 f"critical steps any policy needs for a task of size {env.max_task_size} "
                                 f"(K = {env.max_subagents} sub-agents of at most {env.worker_capacity} lookups)")
        if "model" not in self.warm_start_match or not set(self.warm_start_match) <= {"model", "sft", "env", "seed"}:
            raise ValueError(f"warm_start_match {self.warm_start_match} must include 'model' and name only "
                             "model, sft, env, seed")
        procs = jax.process_count()
        acfg = self.parl.async_rollout
        acfg.check(jax.device_count(), procs)
        if acfg.rollout_devices and self.parl.batch % acfg.rollout_devices:
            raise ValueError(f"parl.tasks_per_step x parl.group_size = {self.parl.batch} is not divisible by "
                             f"parl.async_rollout.rollout_devices = {acfg.rollout_devices}")
        check_processes(self.mesh, ("parl.tasks_per_step", self.parl.tasks_per_step))
        if self.mesh is not None:
            self.mesh.check_batches(jax.device_count() - acfg.rollout_devices,
                                    {"parl.tasks_per_step x parl.group_size": self.parl.batch,
                                     "eval_episodes": self.eval_episodes})
        if self.data.focus_fraction > 0 and not env.min_task_size <= self.data.focus_min_n <= env.max_task_size:
            raise ValueError(f"data.focus_min_n {self.data.focus_min_n} is outside the task sizes "
                             f"{env.min_task_size}..{env.max_task_size}")
        if self.data.train_size < self.parl.tasks_per_step:
            raise ValueError(f"data.train_size {self.data.train_size} < parl.tasks_per_step")

    def identity(self) -> dict[str, str]:
        """The fields that define what a run computes, as reprs: a run may be resumed
        (or evaluated) with other step counts, evaluation settings, checkpoint policy,
        mesh, data directory or warm-start source (the same warm start, by its identity
        check), but not with another model, task set or training
        configuration."""
        same = dataclasses.replace(self, parl_steps=0, eval_sizes=(1,), eval_episodes=1, eval_every=0, log_every=0,
                                   traces_per_eval=0, checkpoint=CheckpointConfig(), mesh=None,
                                   warm_start_from=None,
                                   data=dataclasses.replace(self.data, data_dir=None))
        return {f.name: repr(getattr(same, f.name)) for f in dataclasses.fields(same)}

    def check_same_run(self, saved: dict[str, str], what: str) -> None:
        """Raise ValueError naming the fields that differ from the run's ``identity()``."""
        check_identity(self.identity(), saved, what, "step counts, evaluation, checkpoint, mesh and data_dir")


def eval_tasks(source, sizes: tuple[int, ...], episodes: int, split: str = "test") -> list[dict[str, np.ndarray]]:
    """The first ``episodes`` tasks of each size n in ``sizes`` from a data source of task
    records (a held-out split), size by size: a problem list
    (:func:`~swarmjax.envs.widesearch_jax.problems`). Raises ValueError if a size is short."""
    picked: dict[int, list[dict]] = {n: [] for n in sizes}
    for i in range(len(source)):
        rec = source[i]
        n = int(rec["n"])
        if n in picked and len(picked[n]) < episodes:
            picked[n].append(rec)
            if all(len(v) == episodes for v in picked.values()):
                break
    out = []
    for n, recs in picked.items():
        if len(recs) < episodes:
            raise ValueError(f"the {split} split has {len(recs)} tasks of size {n}, eval_episodes is {episodes}: "
                             f"raise data.{split}_size")
        out += [{k: np.asarray(r[k], np.int32) for k in ("table", "entities", "n")} for r in recs]
    return out


def _prepare(job: TrainJob, workdir: str, progress: bool):
    """The task set's sources; process 0 prepares (or finds) it before the others open it."""
    from swarmjax.data import prepare

    if not progress or jax.process_index() != 0:
        import tensorflow_datasets as tfds
        tfds.disable_progress_bar()
    d = job.data
    args = dict(env=job.parl.rollout.env, data_dir=d.data_dir or str(epath.Path(workdir) / "data"),
                train_size=d.train_size, validation_size=d.validation_size, test_size=d.test_size, seed=d.seed)
    return primary_first("swarmjax: task set prepared", lambda: prepare(**args), lambda: prepare(**args))


def train_stream(job: TrainJob, sources):
    """PARL's stream of task batches from the task set's train split (every process: the
    whole batch, in the one process's order): a grain iterator of ``tasks_per_step``
    task records a batch, checkpointable (``get_state`` / ``set_state``)."""
    from swarmjax.data import task_iterator

    return task_iterator(sources["train"], job.parl.tasks_per_step, seed=job.seed, env=job.parl.rollout.env,
                         process_index=0, process_count=1,
                         focus_min_n=job.data.focus_min_n, focus_fraction=job.data.focus_fraction)


class TaskBatches:
    """The train split's grain iterator as a task stream (:mod:`swarmjax.train.streams`):
    :meth:`take` returns the next batch of ``tasks_per_step`` problems (every process
    the whole batch: the token engine rolls it out as one global batch); the state is the
    iterator's."""

    def __init__(self, iterator):
        self.iterator = iterator

    def take(self, count: int) -> list[dict[str, np.ndarray]]:
        return self.draw(count)[0]

    def draw(self, count: int) -> tuple[list[dict[str, np.ndarray]], list[str]]:
        """The next batch's problems and their task ids."""
        from swarmjax.data import to_tasks

        rec = next(self.iterator)
        problems = wsj.problems(to_tasks(rec))
        if len(problems) != count:
            raise ValueError(f"got {len(problems)} tasks, tasks_per_step is {count}")
        return problems, [bytes(t).decode() for t in np.asarray(rec["task_id"])]

    def state(self) -> dict:
        return self.iterator.get_state()

    def restore(self, state: dict) -> None:
        self.iterator.set_state(state)


class TokenRun(JobRun):
    """The token world's pieces for the one loop (:func:`~swarmjax.train.loop.run_loop`):
    the TFDS task set (process 0 prepares it first), the jitted token swarm
    (:class:`~swarmjax.train.engines.TokenEngine`: its own rollout program, every
    episode's rows over the mesh as one global batch), the grain stream of training
    tasks, the held-out tasks per size. Its RL step, evaluation, result type and summary
    table are every job's (:mod:`swarmjax.train.agent_rl`, :mod:`swarmjax.train.agent_eval`)."""

    stage, title, start_label, start_splits = "parl", "PARL", "initial", ("test",)
    log_keys = ("reward", "accuracy", "critical_steps", "subagents")
    may_change = "step counts, evaluation, checkpoint, mesh and data_dir"
    frozen_start = True
    table = staticmethod(lambda summary: agent_summary_table(summary))
    checkpointing = staticmethod(lambda job: job.checkpoint)

    def __init__(self, job: TrainJob, workdir: str, *, fresh: bool = True, progress: bool = True):
        self.job, self.workdir, self.progress = job, epath.Path(workdir), progress
        self.primary = jax.process_index() == 0
        self.key = jax.random.key(job.seed)
        self.rl_key = jax.random.fold_in(self.key, 3)
        self.mesh, rollout_mesh = _meshes(job)
        if self.mesh is not None and jax.process_count() > 1:     # each process puts its rows on its devices
            shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
            if job.parl.tasks_per_step % shards:
                raise ValueError(f"parl.tasks_per_step={job.parl.tasks_per_step} does not split over the mesh's "
                                 f"{shards} batch shards (data x fsdp) on {jax.process_count()} processes: make "
                                 f"it a multiple of {shards}")
        sources = _prepare(job, workdir, progress)
        self.splits = {split: eval_tasks(sources[split], job.eval_sizes, job.eval_episodes, split)
                       for split in ("test", "validation")}
        self.stream = TaskBatches(train_stream(job, sources))
        self.trainer = PARLTrainer(job.model, job.parl, mesh=self.mesh, rollout_mesh=rollout_mesh,
                                   eval_batch=job.eval_episodes)
        self.learner, self.engine, self.rl, self.steps = self.trainer.learner, self.trainer.engine, job.parl, \
            job.parl_steps
        self.identity, self.eval_every, self.log_every = job.identity(), job.eval_every, job.log_every
        self.checkpoint_every = job.checkpoint.every

    def state_shapes(self) -> Any:
        return state_shapes(self.job, self.trainer)

    def start(self, log: JobLog, watch: PreemptionWatch) -> tuple[Any, dict]:
        return _warm_start(self.job, self.workdir, self.trainer, log, watch, self.key, self.progress)

    def rl_step(self, state: Any, step: int) -> tuple[Any, dict]:
        """One PARL step (:meth:`PARLTrainer.step`) on the stream's next batch; ``tok_s``:
        sampled tokens a second of the rollout."""
        state, m = self.trainer.step(state, jax.random.fold_in(self.rl_key, step), step=step,
                                     tasks=self.stream.take(self.rl.tasks_per_step))
        return state, _tok_s(m)

    def async_rollouts(self, state: Any, meta: dict) -> AsyncRollouts:
        """The rollout side of an asynchronous PARL stage (:mod:`swarmjax.train.async_rl`),
        begun at ``meta``'s step (the stream already at the oldest batch its checkpoint
        had not trained on); batch j is rolled out with the synchronous step's key."""
        trainer = self.trainer

        def collect_step(step, problems, params, workers):         # the synchronous step's key
            k_roll = jax.random.split(jax.random.fold_in(self.rl_key, step))[1]
            return collect(trainer.engine, params, workers, problems, k_roll, self.rl, step=step)

        rollouts = AsyncRollouts(self.rl.async_rollout, draw=lambda: self.stream.draw(self.rl.tasks_per_step),
                                 stream_state=self.stream.state, collect=collect_step,
                                 loss_mask=lambda c: np.asarray(c.batch.loss_mask), publish=trainer.publish)
        saved = meta.get("async", {})
        rollouts.begin(state.params, step=meta["step"], steps=self.steps, frozen=state.frozen["subagents"],
                       version=saved.get("version", 0), dropped=saved.get("dropped", 0),
                       regenerated=saved.get("regenerated", 0))
        return rollouts

    def async_step(self, rollouts: AsyncRollouts, state: Any) -> tuple[Any, dict]:
        state, m = rollouts.step(state, functools.partial(learn, self.learner), lambda c: dict(c.metrics))
        return state, _tok_s(m)

    def evaluate(self, step: int, label: str, state: Any, split: str, log: JobLog) -> dict:
        """Greedy, budget lifted, calls of ``eval_episodes`` (one size each): the figures
        per task size (a line each in ``eval.jsonl``); the test split's first episodes of
        each size as traces."""
        problems = self.splits[split]

        def traces(res, batch, first):
            # the reward channels as PARL step `step` would weigh them (budget lifted)
            reward, channels = episode_rewards(res, self.rl, step)
            n = int(batch[0]["n"])
            for tr in rollout_traces(self.rl.rollout.env, batch, res, rewards={"reward": reward, **channels},
                                     wall_clock_s=res.stats["seconds"], prefix=f"{label}-s{step}-n{n}",
                                     limit=self.job.traces_per_eval):
                log.write("traces.jsonl", tr)
        episodes = evaluate(self.engine, state.params, state.frozen["subagents"], problems,
                            jax.random.fold_in(self.key, 2), mesh=self.mesh,
                            on_result=traces if split == "test" and self.primary else None)
        rows = by_size(np.asarray([int(p["n"]) for p in problems]), episodes)
        for n, row in rows.items():
            log.write("eval.jsonl", {"policy": label, "split": split, "step": step, "n": int(n), **row})
        return {**mean_figures(episodes), "sizes": rows}

    def report(self, step: int, start: dict, final: dict, meta: dict, split: str, seconds: float) -> dict:
        """The warm start's and the checkpoint's figures, per task size."""
        return {**labelled_figures("initial", start), **labelled_figures("final", final),
                "held_out": {split: len(self.splits[split])}, "rl_steps": step, "wall_clock_s": seconds,
                "backend": jax.default_backend()}

    def score(self, evals: dict) -> dict[str, float]:
        """The accuracy (item-F1) over the evaluated sizes."""
        return {"accuracy": evals["accuracy"]}

    def postfix(self, m: dict) -> dict[str, str]:
        return {"reward": f"{m['reward']:.3f}", "f1": f"{m['accuracy']:.2f}", "crit": f"{m['critical_steps']:.1f}",
                "subagents": f"{m['subagents']:.2f}", "tok_s": f"{m['tok_s']:.0f}"}

    def summary(self, meta: dict, wall_clock_s: float) -> dict:
        job, evals = self.job, meta["evals"]
        summary = {"task": "widesearch-tokens", "role": "orchestrator", "seed": job.seed,
                   "model_params": job.model.num_params(), "vocab_size": job.model.vocab_size,
                   "held_out": {"test": len(self.splits["test"])}, "rl_steps": meta["step"],
                   "warm_start_steps": job.sft.steps, **labelled_figures("initial", evals["initial"]),
                   **labelled_figures("final", evals.get("final", evals["initial"])), "wall_clock_s": wall_clock_s,
                   "warm_start_s": meta["warm_start_s"], "warm_start_data": meta["sft_accuracy"],
                   "backend": jax.default_backend(), "device": jax.devices()[0].device_kind}
        if self.primary:
            write_summary(self.workdir, summary, agent_summary_table)
            curves(self.workdir, ("reward", "accuracy", "critical_steps", "subagents"))
        return summary


def state_shapes(job: TrainJob, trainer: PARLTrainer) -> Any:
    """The PARL state's shapes (the orchestrator, its optimizer state, the frozen
    sub-agents) to restore a checkpoint into (:func:`swarmjax.train.loop.restore`)."""
    key = jax.random.key(0)
    return jax.eval_shape(lambda: trainer.init(init_params(job.model, key), init_params(job.model, key)))


def _tok_s(m: dict) -> dict:
    """``m`` with ``tok_s``: the step's sampled tokens a second of its rollout."""
    return {**m, "tok_s": m["sampled_tokens"] / max(m["rollout_s"], 1e-9)}


def _meshes(job: TrainJob):
    """(the learner's mesh, the rollout's): one mesh over every device (or None: one
    device) unless an asynchronous job gives its rollout devices of its own
    (``parl.async_rollout.rollout_devices``: the rollout's mesh is data-parallel over
    the last ones, the learner's ``job.mesh`` over the rest)."""
    learner_devices, rollout_devices = split_devices(job.parl.async_rollout)
    mesh = None if job.mesh is None else make_mesh(job.mesh, learner_devices)
    if rollout_devices is None:
        return mesh, mesh
    return mesh, make_mesh(MeshConfig(data=len(rollout_devices)), rollout_devices)


def _warm_start(job: TrainJob, workdir: epath.Path, trainer: PARLTrainer, log: JobLog, watch: PreemptionWatch,
                key, progress: bool) -> tuple[Any, dict]:
    """Stage 1: the SFT warm start (or the one ``job.warm_start_from`` names), saved to
    ``<workdir>/warm_start``. Returns (PARL train state, checkpoint meta).
    Raises Preempted at the end of an SFT step after a SIGTERM (nothing saved)."""
    clock = time.perf_counter()
    env = job.parl.rollout.env
    init = lambda: init_params(job.model, jax.random.fold_in(key, 0))    # noqa: E731
    if job.warm_start_from:
        from swarmjax.train.checkpoint import abstract_state

        local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])     # as train_sft returns it
        warm, warm_meta = load_warm_start(job, job.warm_start_from,
                                          abstract_state(jax.eval_shape(init), local))
        sft_accuracy, warm_id = warm_meta["sft_accuracy"], warm_meta["identity"]
    else:
        bar = progress_bar(job.sft.steps, "warm start (SFT)", progress)

        def on_sft(i, m):
            log.write("metrics.jsonl", {"stage": "sft", "step": i, **m})
            bar.set_postfix(loss=f"{m['loss']:.3f}", orch_acc=f"{m['orch_acc']:.2f}",
                            worker_acc=f"{m['worker_acc']:.2f}")
            bar.update()
            log_line(progress, job.log_every * 10, i, job.sft.steps, "warm start", m,
                     ("loss", "orch_acc", "worker_acc"))
            if watch.reached():                       # safe point: nothing to save yet
                bar.close()
                raise Preempted(None, str(workdir))
        # budget lifted: the demonstrations are serial-heavy
        warm, sft_report = train_sft(init(), job.model, dataclasses.replace(env, budget=None), job.sft, on_sft)
        bar.close()
        sft_accuracy = {k: v for k, v in sft_report["after"].items() if k.endswith("_acc")}
        warm_id = None
    state = trainer.init(warm, worker_params=warm)
    # every run's workdir holds its warm start: the frozen sub-agents, laid out on the
    # trainer's mesh (global arrays: every process writes its shards)
    save_warm_start(job, str(workdir), state.frozen["subagents"], sft_accuracy, identity=warm_id)
    return state, {"seed": job.seed, "job": job.identity(), "sft_accuracy": sft_accuracy,
                   "warm_start_s": time.perf_counter() - clock}
