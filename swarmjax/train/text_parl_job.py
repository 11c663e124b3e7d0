"""``swarmjax train`` for the swarm in real text: a warm start, then PARL on the jitted text swarm.

    swarmjax train --config configs/parl_widesearch_text_cpu.py --workdir runs/text

The one loop (:func:`~swarmjax.train.loop.run_loop` over :class:`TextPARLRun`) runs the
pieces of :mod:`swarmjax.train.text_parl` in order: the tokenizer
(trained on the task's corpus, saved to ``workdir/tokenizer``), the demonstrations and
the warm start (saved to ``workdir/warm_start``, or reused from ``warm_start_from``),
the warm start's evaluation, PARL with an evaluation every ``eval_every`` steps, the
final evaluation; ``metrics.jsonl``, ``eval.jsonl``, ``summary.json`` / ``summary.md``,
``curves.png`` (and TensorBoard events in ``tb/`` when ``tensorboardX`` is installed); a
log line every ``log_every`` PARL steps when progress bars are off.

Checkpoints (:class:`~swarmjax.train.checkpoint.Checkpointer`, ``workdir/checkpoints/``):
the PARL :class:`~swarmjax.rl.update.TrainState` (the trained orchestrator, its
optimizer state, the frozen sub-agents) right after the warm start's evaluation (step
0), at every evaluation and at the end, scored by the validation item-F1 at the largest
n (the last two and the best are kept), with what the run needs to continue (the warm start's
and the final evaluations, the wall clock so far, the job's identity).

Resume (``resume=``, ``swarmjax train --resume MODE``), as the token world's job
(:mod:`swarmjax.train.job`): "latest" continues from the newest finished checkpoint
(an error without one), "auto" continues when there is one and starts afresh when
there is none, "never" (the default) refuses a workdir that holds checkpoints or a
finished run. A resumed run computes exactly what an uninterrupted one does: the
logs are cut back to the checkpoint's step and continue with the same lines, the
training tasks' stream is replayed to where it stopped, each step's sampling key is
derived from its step number. Only the PARL step count and the evaluation cadence may
change between attempts (:meth:`TextPARLJob.identity`).

Preemption (:mod:`swarmjax.train.preemption`): on SIGTERM the job stops at the next
safe point, the end of a warm-start step (nothing kept: the rerun trains the warm
start again), the step-0 checkpoint or the end of a PARL step (a checkpoint there),
and raises :class:`~swarmjax.train.preemption.Preempted` (the CLI exits with 143).
Meshes and processes (``mesh``): the warm start, the learner and the swarm's rows over a
``(data, fsdp, tensor)`` mesh; over several processes (``swarmjax train --coordinator
...``, ``parl.swarm.episode_keys=True``) process 0 writes the tokenizer, the logs and the
summary, and each process decodes its share of a step's episodes on its first device
(:meth:`~swarmjax.train.engines.DeviceEngine.over`): the figures of one device to float32
rounding (tested over two processes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.widesearch import Episode
from swarmjax.envs.widesearch_relay import RelayTask, relay_corpus
from swarmjax.envs.widesearch_relay_device import RelayDeviceTask
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import init_params
from swarmjax.rl.update import Learner
from swarmjax.sharding.mesh import make_mesh
from swarmjax.train.loop import JobRun
from swarmjax.train.logs import (JobLog, curves, log_line, progress_bar, summary_table,
                                 write_summary)
from swarmjax.train.policy import load_chat, task_chat
from swarmjax.train.preemption import Preempted, PreemptionWatch
from swarmjax.train.relay_demos import make_relay_demos
from swarmjax.train.agent_eval import evaluate
from swarmjax.train.agent_rl import subagent_params
from swarmjax.train.async_rl import logged_update
from swarmjax.train.distributed import primary_first
from swarmjax.train.engines import DeviceEngine
from swarmjax.train.text_parl import EVAL_STREAMS, TextPARLJob, eval_episodes, sample_episodes, size_rows, warm_start
from swarmjax.train.streams import ReplayStream
from swarmjax.train.warm_start import load_warm_start, save_warm_start

__all__ = ["TextPARLRun", "build_task", "headline", "make_engine", "run_evaluation"]


def build_task(job: TextPARLJob, workdir: str, *, train: bool = True) -> RelayTask:
    """The task on the run's tokenizer: trained on the task's corpus and saved to
    ``workdir/tokenizer``, or (``train=False``) loaded from there."""
    if train:
        chat = task_chat(relay_corpus(job.env, seed=job.seed), workdir, job.chat, job.tokenizer_vocab)
    else:
        chat = load_chat(workdir, job.chat)
    return RelayTask(job.env, chat, max_calls=job.max_calls, max_mentions=job.max_mentions,
                     max_pairs=job.max_pairs)


def make_engine(job: TextPARLJob, task: RelayTask, cfg: ModelConfig, mesh: Any = None) -> DeviceEngine:
    """The job's swarm behind the engine call: PARL's rollouts, and (greedy, budget
    lifted) its evaluations, both at one batch size (a PARL step's episodes: one
    compiled program), its rows over ``mesh``'s batch axes. With several processes each
    decodes its share of a step's episodes on its first device (a local copy of the
    params; ``parl.swarm.episode_keys``: the ids of one process)."""
    p = job.parl                             # swarm.episode_keys False: one key a tick (the published runs)
    return DeviceEngine.over(RelayDeviceTask(task), cfg, p.rollout, episodes=p.tasks_per_step * p.group_size,
                             size=lambda ep: len(ep.task), mesh=mesh, swarm=p.swarm)


def run_evaluation(engine: DeviceEngine, params: Any, warm: Any, tasks: dict[int, list[Episode]],
                   key: jax.Array, *, mesh: Any = None) -> dict[int, dict[str, float]]:
    """:func:`~swarmjax.train.agent_eval.evaluate` (greedy, budget lifted) of every size's
    held-out tasks together, as rows per size (:func:`size_rows`)."""
    episodes = [ep for eps in tasks.values() for ep in eps]
    t0 = time.perf_counter()
    per = evaluate(engine, params, warm, episodes, key, mesh=mesh)
    return size_rows(per, np.asarray([len(ep.task) for ep in episodes]), time.perf_counter() - t0)


def _warm_start_stage(job: TextPARLJob, task: RelayTask, cfg: ModelConfig, key: jax.Array, progress: bool,
                      log: Callable[[str, dict], None], stop: Callable[[], bool], workdir: str, mesh: Any) -> Any:
    """Demonstrations, then :func:`warm_start` from fresh params (progress bars, SFT log
    lines); raises :class:`Preempted` at the end of the SFT step where ``stop()``."""
    pad = task.chat.tokenizer.token_id(task.chat.pad_token)
    bar = progress_bar(job.sft.demos, "demonstrations", progress)
    orch, work = make_relay_demos(task, job.sft.demos, job.seed, spawn_fraction=job.sft.spawn_fraction,
                                  max_chunk=job.sft.max_chunk, pad=pad, on_episode=lambda: bar.update(1))
    bar.close()
    rc = job.parl.rollout
    if orch.tokens.shape[1] > rc.orch_context or work.tokens.shape[1] > rc.worker_context:
        raise ValueError(f"the demonstrations need orch_context >= {orch.tokens.shape[1]} and worker_context >= "
                         f"{work.tokens.shape[1]} (have {rc.orch_context}, {rc.worker_context})")
    bar = progress_bar(job.sft.steps, "warm start", progress)

    def on_sft(i, m):
        log("metrics.jsonl", {"stage": "sft", "step": i, **m})
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.3f}", orch_acc=f"{m['orch_acc']:.3f}")
        log_line(progress, job.log_every * 10, i, job.sft.steps, "warm start", m, ("loss", "orch_acc", "worker_acc"))
        if stop():
            bar.close()
            raise Preempted(None, workdir)
    params = warm_start(init_params(cfg, key), cfg, orch, work, job.sft, job.seed, on_sft, mesh=mesh)
    bar.close()
    return params


def _rows(evals: dict) -> dict[int, dict[str, float]]:
    """Evaluation rows by task size, from a checkpoint's JSON meta (string keys)."""
    return {int(n): row for n, row in evals.items()}


def _state_shapes(cfg: ModelConfig, learner: Learner) -> Any:
    """The PARL state's shapes: the trained orchestrator and the frozen sub-agents."""
    return jax.eval_shape(lambda: learner.init(p := init_params(cfg, jax.random.key(0)), {"subagents": p}))


class TextPARLRun(JobRun):
    """The text PARL recipe's pieces for the one loop: the tokenizer trained on the
    task's corpus (a resumed run keeps its own), the relay task and its jitted swarm,
    the focus stream of training tasks (:func:`sample_episodes` from
    ``random.Random("parl-<parl_seed>")``), the held-out tasks per size."""

    stage, title, start_label, start_splits = "parl", "PARL", "warm_start", ("test",)
    log_keys = ("reward", "accuracy", "critical_steps", "subagents")
    may_change = "parl.steps, eval_every and warm_start_from"
    best_metric, frozen_start = "item_f1", True
    # an evaluation may change the held-out set's size and sizes, not the policy or the task
    checked = ("env", "chat", "tokenizer_vocab", "max_calls", "max_mentions", "max_pairs", "model", "seed")
    table = staticmethod(summary_table)

    def __init__(self, job: TextPARLJob, workdir: str, *, fresh: bool = True, progress: bool = True):
        self.job, self.workdir, self.progress = job, workdir, progress
        self.primary = jax.process_index() == 0
        # process 0 trains and writes the tokenizer, the others read it
        self.task = primary_first("swarmjax-text-parl-tokenizer", lambda: build_task(job, workdir, train=fresh),
                                  lambda: build_task(job, workdir, train=False))
        self.cfg = job.model.replace(vocab_size=self.task.chat.tokenizer.vocab_size)
        self.key = jax.random.key(job.seed)
        self.mesh = None if job.mesh is None else make_mesh(job.mesh)
        self.learner = Learner(self.cfg, logged_update(job.parl.update, job.parl.async_rollout), mesh=self.mesh)
        self.parl_seed = job.seed if job.parl_seed is None else job.parl_seed
        self.rl, self.rl_key, self.identity = job.parl, jax.random.key(self.parl_seed), job.identity()
        self.eval_every, self.log_every = job.eval_every, job.log_every
        self.steps = self.rl.steps
        self.stream = ReplayStream(lambda rng: sample_episodes(job.env, rng, 1, focus_fraction=job.parl.focus_fraction,
                                                               focus_min_n=job.parl.focus_min_n)[0],
                                   f"parl-{self.parl_seed}")
        self.engine = make_engine(job, self.task, self.cfg, self.mesh)
        self.held_out = {s: eval_episodes(job, s) for s in EVAL_STREAMS}
        self.frozen_start = not job.parl.refresh_subagents.enabled    # the frozen copy is the warm start

    def state_shapes(self) -> Any:
        return _state_shapes(self.cfg, self.learner)

    def start(self, log: JobLog, watch: PreemptionWatch) -> tuple[Any, dict]:
        """The warm start (or the one ``warm_start_from`` names), saved to
        ``workdir/warm_start``; the sub-agents frozen at it."""
        job, clock = self.job, time.perf_counter()
        if job.warm_start_from:
            warm, _ = load_warm_start(job, job.warm_start_from,
                                      jax.eval_shape(lambda: init_params(self.cfg, self.key)))
        else:
            warm = _warm_start_stage(job, self.task, self.cfg, self.key, self.progress, log.write, watch.reached,
                                     self.workdir, self.mesh)
            save_warm_start(job, self.workdir, warm, {})
        state = self.learner.init(jax.tree.map(jnp.copy, warm), frozen={"subagents": jax.tree.map(jnp.copy, warm)})
        return state, {"parl_seed": self.parl_seed, "eval_n": max(job.eval_sizes), "identity": job.warm_identity(),
                       "job": self.identity, "warm_start_s": time.perf_counter() - clock}

    def evaluate(self, step: int, label: str, state: Any, split: str, log: JobLog) -> dict:
        """Greedy, budget lifted, every size's held-out tasks of ``split`` together: rows by size."""
        res = run_evaluation(self.engine, state.params, subagent_params(state), self.held_out[split],
                             jax.random.fold_in(self.key, 1), mesh=self.mesh)
        for n, r in res.items():
            log.write("eval.jsonl", {"step": step, "policy": label, "split": split, "n": n, **r})
        return {str(n): r for n, r in res.items()}

    def report(self, step: int, start: dict, final: dict, meta: dict, split: str, seconds: float) -> dict:
        """The warm start's and the checkpoint's rows per task size, the headline."""
        before, after = _rows(start), _rows(final)
        return {"warm_start": before, "final": after, "headline": headline(before, after, max(self.job.eval_sizes))}

    def score(self, evals: dict) -> dict[str, float]:
        """The item-F1 and critical steps at the largest size."""
        return {k: evals[str(max(self.job.eval_sizes))][k] for k in ("item_f1", "critical_steps")}

    def postfix(self, m: dict) -> dict[str, str]:
        return {"f1": f"{m['accuracy']:.3f}", "crit": f"{m['critical_steps']:.1f}", "subs": f"{m['subagents']:.1f}"}

    def summary(self, meta: dict, wall_clock_s: float) -> dict:
        job, big = self.job, max(self.job.eval_sizes)
        evals = meta["evals"]
        before, after = _rows(evals["warm_start"]), _rows(evals.get("final", evals["warm_start"]))
        summary = {"task": "widesearch_relay", "model_params": self.cfg.num_params(),
                   "vocab_size": self.cfg.vocab_size, "eval_episodes": job.eval_episodes, "parl_steps": meta["step"],
                   "seed": job.seed, "parl_seed": self.parl_seed, "warm_start": before, "final": after,
                   "headline": headline(before, after, big), "wall_clock_s": wall_clock_s,
                   "warm_start_s": meta["warm_start_s"], "device": f"{jax.default_backend()} x{jax.device_count()}"}
        if self.primary:
            curves(self.workdir, ("reward", "accuracy", "critical_steps", "subagents"))
            write_summary(self.workdir, summary, summary_table)
        return summary


def headline(before: dict, after: dict, n: int) -> dict[str, float]:
    """The issue's targets at the largest size n: critical steps of the warm start over
    the final policy's, the final item-F1, and the n = 1 no-spawn fraction (when
    evaluated)."""
    out = {"n": n, "critical_reduction": before[n]["critical_steps"] / max(after[n]["critical_steps"], 1e-9),
           "item_f1": after[n]["item_f1"]}
    if 1 in after:
        out["n1_no_spawn"] = after[1]["no_spawn_fraction"]
    return out
