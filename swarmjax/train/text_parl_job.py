"""``swarmjax train`` for the swarm in real text: a warm start, then PARL on the jitted text swarm.

    swarmjax train --config configs/parl_widesearch_text_cpu.py --workdir runs/text

The job runs the pieces of :mod:`swarmjax.train.text_parl` in order: the tokenizer
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
One process.
"""

from __future__ import annotations

import functools
import os
import random
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
from swarmjax.swarm.text_engine import TextSwarm
from swarmjax.train.checkpoint import Checkpointer, abstract_state
from swarmjax.train.frame import check_identity, end_step, run_checkpointed
from swarmjax.train.logs import (SignalWatch, TextJobLog, curves, log_line, progress_bar, summary_table,
                                 write_summary)
from swarmjax.train.policy import load_chat, task_chat
from swarmjax.train.preemption import Preempted, PreemptionWatch
from swarmjax.train.relay_demos import make_relay_demos
from swarmjax.train.subagents import refresh_subagents
from swarmjax.train.agent import evaluate, learn, rl_step
from swarmjax.train.agent_async import async_rollouts
from swarmjax.train.async_rl import logged_update
from swarmjax.train.engines import DeviceEngine
from swarmjax.train.text_parl import EVAL_STREAMS, TextPARLJob, eval_episodes, sample_episodes, size_rows, warm_start
from swarmjax.train.warm_start import load_warm_start, save_warm_start

__all__ = ["build_task", "evaluate_text_checkpoint", "headline", "make_engine", "run_evaluation",
           "run_text_parl_job", "text_parl_table"]


def build_task(job: TextPARLJob, workdir: str, *, train: bool = True) -> RelayTask:
    """The task on the run's tokenizer: trained on the task's corpus and saved to
    ``workdir/tokenizer``, or (``train=False``) loaded from there."""
    if train:
        chat = task_chat(relay_corpus(job.env, seed=job.seed), workdir, job.chat, job.tokenizer_vocab)
    else:
        chat = load_chat(workdir, job.chat)
    return RelayTask(job.env, chat, max_calls=job.max_calls, max_mentions=job.max_mentions,
                     max_pairs=job.max_pairs)


def make_engine(job: TextPARLJob, task: RelayTask, cfg: ModelConfig) -> DeviceEngine:
    """The job's swarm behind the engine call: PARL's rollouts, and (greedy, budget
    lifted) its evaluations, both at one batch size (a PARL step's episodes: one
    compiled program)."""
    swarm = TextSwarm(RelayDeviceTask(task), cfg, job.parl.rollout, chunk=job.parl.chunk,
                      wide_rows=job.parl.wide_rows, buckets=job.parl.buckets)
    return DeviceEngine(swarm, batch=job.parl.tasks_per_step * job.parl.group_size, size=lambda p: len(p.task))


def run_evaluation(engine: DeviceEngine, params: Any, warm: Any, tasks: dict[int, list[Episode]],
                   key: jax.Array) -> dict[int, dict[str, float]]:
    """:func:`~swarmjax.train.agent.evaluate` (greedy, budget lifted) of every size's
    held-out tasks together, as rows per size (:func:`size_rows`)."""
    episodes = [ep for eps in tasks.values() for ep in eps]
    t0 = time.perf_counter()
    per = evaluate(engine, params, warm, episodes, key)
    return size_rows(per, np.asarray([len(ep.task) for ep in episodes]), time.perf_counter() - t0)


def _restore(cfg: ModelConfig, learner: Learner, ckpt: Checkpointer, step: int) -> tuple[Any, dict]:
    """(TrainState, meta) of checkpoint ``step``, on the first device."""
    shapes = jax.eval_shape(lambda: learner.init(p := init_params(cfg, jax.random.key(0)), {"subagents": p}))
    return ckpt.restore(step, abstract_state(shapes, jax.sharding.SingleDeviceSharding(jax.devices()[0])))


def _warm_start_stage(job: TextPARLJob, task: RelayTask, cfg: ModelConfig, key: jax.Array, progress: bool,
                      log: Callable[[str, dict], None], stop: Callable[[], bool], workdir: str) -> Any:
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
    params = warm_start(init_params(cfg, key), cfg, orch, work, job.sft, job.seed, on_sft)
    bar.close()
    return params


def run_text_parl_job(job: TextPARLJob, workdir: str, *, progress: bool = True, resume: bool | str = False,
                      handle_sigterm: bool = True) -> dict:
    """Tokenizer -> demonstrations -> warm start -> PARL -> summary, or the continuation
    of an unfinished run from its newest finished checkpoint (``resume``: "never" / False,
    "latest" / True or "auto"; module docstring). Returns the summary (``summary.json``).

    ``handle_sigterm``: stop at the next safe point on SIGTERM and raise
    :class:`~swarmjax.train.preemption.Preempted` once its checkpoint (if any) is on
    disk. The workdir must be local (the tokenizer is written with local file APIs)."""
    return run_checkpointed(job, workdir, resume,
                            lambda ckpt, latest, watch: _run(job, workdir, ckpt, latest, watch, progress),
                            best_metric="item_f1", handle_sigterm=handle_sigterm)


def _rows(evals: dict) -> dict[int, dict[str, float]]:
    """Evaluation rows by task size, from a checkpoint's JSON meta (string keys)."""
    return {int(n): row for n, row in evals.items()}


def _run(job: TextPARLJob, workdir: str, ckpt: Checkpointer, latest: int | None, watch: PreemptionWatch,
         progress: bool) -> dict:
    """:func:`run_text_parl_job` once the checkpoints are open."""
    clock = time.perf_counter()
    task = build_task(job, workdir, train=latest is None)      # a resumed run keeps its tokenizer
    cfg = job.model.replace(vocab_size=task.chat.tokenizer.vocab_size)
    key = jax.random.key(job.seed)
    learner = Learner(cfg, logged_update(job.parl.update, job.parl.async_rollout))
    rollouts = None
    parl_seed = job.seed if job.parl_seed is None else job.parl_seed
    big, steps = max(job.eval_sizes), job.parl.steps
    if latest is not None:
        state, meta = _restore(cfg, learner, ckpt, latest)
        check_identity(job.identity(), meta.get("job", {}), "--resume",
                       "parl.steps, eval_every and warm_start_from")
        # a run that had finished keeps its final evaluation lines (nothing recomputes them)
        log = TextJobLog(workdir, meta["parl_step"], keep_final="final_eval" in meta and meta["parl_step"] >= steps)
    else:
        log = TextJobLog(workdir, None)
    try:
        if latest is not None:
            warm = jax.tree.map(jnp.copy, state.frozen["subagents"])   # the learner donates its state
        else:
            if job.warm_start_from:
                warm, _ = load_warm_start(job, job.warm_start_from, jax.eval_shape(lambda: init_params(cfg, key)))
            else:
                warm = _warm_start_stage(job, task, cfg, key, progress, log.write, watch.reached, workdir)
                save_warm_start(job, workdir, warm, {})
            state = learner.init(jax.tree.map(jnp.copy, warm), frozen={"subagents": jax.tree.map(jnp.copy, warm)})
            warm = jax.tree.map(jnp.copy, state.frozen["subagents"])    # placed as a resumed run's
            meta = {"parl_step": 0, "parl_seed": parl_seed, "eval_n": big, "identity": job.warm_identity(),
                    "job": job.identity(), "warm_start_s": time.perf_counter() - clock, "wall_clock_s": 0.0}

        engine = make_engine(job, task, cfg)
        held_out, eval_key = {s: eval_episodes(job, s) for s in EVAL_STREAMS}, jax.random.fold_in(key, 1)

        def run_eval(step: int, label: str, params: Any, split: str) -> dict[str, dict[str, float]]:
            res = run_evaluation(engine, params, warm, held_out[split], eval_key)
            for n, r in res.items():
                log.write("eval.jsonl", {"step": step, "policy": label, "split": split, "n": n, **r})
            return {str(n): r for n, r in res.items()}

        def run_evals(step: int, label: str, params: Any) -> dict[str, dict[str, float]]:
            """Validation (the checkpoint's score); after the last step the test split too."""
            res = run_eval(step, label, params, "validation")
            if label == "final":
                meta["final_eval"] = run_eval(step, label, params, "test")   # in the last checkpoint: finished
            return res

        def save(step: int, state: Any, evals: dict | None) -> None:
            """The state after ``step`` PARL steps (scored by the item-F1 at the largest n
            when evaluated), its logs first: a finished checkpoint has its lines."""
            nonlocal clock
            now = time.perf_counter()
            meta.update(parl_step=step, wall_clock_s=meta["wall_clock_s"] + now - clock)
            if rollouts is not None:                    # its stream position is the step: replayed on resume
                meta["async"] = {k: v for k, v in rollouts.checkpoint().items() if k != "stream"}
            clock = now
            log.sync()
            scores = None if evals is None else {k: evals[str(big)][k] for k in ("item_f1", "critical_steps")}
            ckpt.save(step, state, meta, metrics=scores, force=True)

        if latest is None:
            meta["warm_eval"] = run_eval(0, "warm_start", warm, "test")
            save(0, state, None)                        # the warm start survives a crash in PARL
            if steps > 0 and watch.reached():           # safe point
                raise Preempted(0, workdir)

        parl_key, rng = jax.random.key(parl_seed), random.Random(f"parl-{parl_seed}")
        draw = lambda: sample_episodes(job.env, rng, job.parl.tasks_per_step,  # noqa: E731
                                       focus_fraction=job.parl.focus_fraction, focus_min_n=job.parl.focus_min_n)
        start = meta["parl_step"]
        for _ in range(start):                          # the stream of training tasks, to where it stopped
            draw()
        drawn = start
        if job.parl.async_rollout.enabled:              # the oldest batch not trained on is always `start`
            def draw_ids():
                nonlocal drawn
                drawn += 1
                return draw(), [f"train/{(drawn - 1) * job.parl.tasks_per_step + i}"
                                for i in range(job.parl.tasks_per_step)]
            rollouts = async_rollouts(job.parl, engine, state, draw=draw_ids, stream_state=lambda: drawn,
                                      key=parl_key, step=start, saved=meta.get("async"))
        bar = progress_bar(steps, "PARL", progress, initial=min(start, steps))
        no_signal = SignalWatch()
        with bar:                                       # closed on a preemption too
            for step in range(start, steps):
                if rollouts is None:
                    state, m = rl_step(learner, state, engine, draw(), jax.random.fold_in(parl_key, 100 + step),
                                       job.parl, step=step)
                else:
                    state, m = rollouts.step(state, functools.partial(learn, learner), lambda c: dict(c.metrics))
                log.write("metrics.jsonl", {"stage": "parl", "step": step, **m})
                no_signal(step, m)
                bar.update(1)
                bar.set_postfix(f1=f"{m['accuracy']:.3f}", crit=f"{m['critical_steps']:.1f}",
                                subs=f"{m['subagents']:.1f}")
                log_line(progress, job.log_every, step, steps, "PARL", m,
                         ("reward", "accuracy", "critical_steps", "subagents"))
                if job.parl.refresh_subagents.due(step + 1):   # the sub-agents become the policy from here on
                    state = refresh_subagents(state, "subagents")
                    warm = jax.tree.map(jnp.copy, state.frozen["subagents"])    # the evaluations' too
                    if rollouts is not None:
                        rollouts.refresh(state.frozen["subagents"])
                end_step(step + 1, steps, job.eval_every, run_eval=lambda i, label: run_evals(i, label, state.params),
                         save=lambda i, evals: save(i, state, evals), stop=watch.reached, label="parl",
                         preempted=lambda i: Preempted(i, workdir))
    finally:
        if rollouts is not None:
            rollouts.close()
        log.close()
    curves(workdir, ("reward", "accuracy", "critical_steps", "subagents"))
    before, after = _rows(meta["warm_eval"]), _rows(meta.get("final_eval", meta["warm_eval"]))
    summary = {"task": "widesearch_relay", "model_params": cfg.num_params(), "vocab_size": cfg.vocab_size,
               "eval_episodes": job.eval_episodes, "parl_steps": meta["parl_step"], "seed": job.seed,
               "parl_seed": parl_seed, "warm_start": before, "final": after, "headline": headline(before, after, big),
               "wall_clock_s": meta["wall_clock_s"] + time.perf_counter() - clock,
               "warm_start_s": meta["warm_start_s"], "device": f"{jax.default_backend()} x{jax.device_count()}"}
    write_summary(workdir, summary, text_parl_table)
    return summary


def evaluate_text_checkpoint(job: TextPARLJob, workdir: str, *, which: str = "latest", split: str = "test") -> dict:
    """Evaluate a PARL checkpoint of the text run in ``workdir`` (``which``: "latest",
    "best" by validation item-F1, or a PARL step) and its frozen warm start, greedy with
    the budget lifted, on ``job.eval_episodes`` held-out tasks per size of
    ``job.eval_sizes`` from ``split`` (the run's own seed streams: the first
    ``eval_episodes`` of the run's are the same tasks). Opens the
    checkpoints read-only. Returns ``{"step", "warm_start": {n: row}, "final": {n: row},
    "headline"}`` (:func:`text_parl_table` prints it)."""
    job.validate()
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        raise ValueError(f"no checkpoints in {workdir}")
    task = build_task(job, workdir, train=False)
    cfg = job.model.replace(vocab_size=task.chat.tokenizer.vocab_size)
    with Checkpointer(directory, save_every=1, read_only=True) as ckpt:
        step = ckpt.step_of(which)
        state, meta = _restore(cfg, Learner(cfg, job.parl.update), ckpt, step)
    made = meta.get("identity", {})
    differ = [k for k in ("model", "env", "tokenizer", "seed") if made.get(k) != job.warm_identity()[k]]
    if differ:
        raise ValueError(f"the checkpoint in {workdir} was made by a job with another {', '.join(differ)}")
    engine = make_engine(job, task, cfg)
    tests, key = eval_episodes(job, split), jax.random.fold_in(jax.random.key(job.seed), 1)
    warm = state.frozen["subagents"]
    out = {"step": step, "warm_start": run_evaluation(engine, warm, warm, tests, key),
           "final": run_evaluation(engine, state.params, warm, tests, key)}
    out["headline"] = headline(out["warm_start"], out["final"], max(job.eval_sizes))
    return out


def headline(before: dict, after: dict, n: int) -> dict[str, float]:
    """The issue's targets at the largest size n: critical steps of the warm start over
    the final policy's, the final item-F1, and the n = 1 no-spawn fraction (when
    evaluated)."""
    out = {"n": n, "critical_reduction": before[n]["critical_steps"] / max(after[n]["critical_steps"], 1e-9),
           "item_f1": after[n]["item_f1"]}
    if 1 in after:
        out["n1_no_spawn"] = after[1]["no_spawn_fraction"]
    return out


def text_parl_table(summary: dict) -> str:
    """:func:`swarmjax.train.logs.summary_table` plus the headline line."""
    h = summary["headline"]
    x = h["critical_reduction"]                    # warm start's critical steps / the final policy's
    moved = f"{x:.2f}x fewer than" if x >= 1 else f"{1 / max(x, 1e-9):.2f}x more than"
    line = f"\nat n = {h['n']}: critical steps {moved} the warm start's, final item-F1 {h['item_f1']:.3f}"
    if "n1_no_spawn" in h:
        line += f"; n = 1 episodes without a sub-agent: {h['n1_no_spawn']:.2f}"
    return summary_table(summary) + line
