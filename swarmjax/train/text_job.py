"""``swarmjax train`` for text tasks: a locally trained tokenizer, a warm start on
demonstrations played through the task's host environment, then GRPO/GSPO on
host-driven text rollouts, evaluated before and after RL.

    swarmjax train --config configs/arith_tools_cpu.py --workdir runs/arith

1. **Tokenizer.** A byte-level BPE trained on the task's corpus with the chat family's
   special tokens (nothing is downloaded), saved to ``workdir/tokenizer``.
2. **Warm start.** Demonstrations are scripted turns *played through the environment*
   (:func:`swarmjax.envs.arith.play`): the ids are exactly those a rollout that sampled
   the turns builds; the loss is the masked next-token NLL on the agent's own ids.
3. **RL.** Per step, ``tasks_per_step`` problems x ``group_size`` rollouts
   (:class:`~swarmjax.swarm.text_rollout.TextRollout`, temperature 1); reward =
   ``r_perf - turn_cost * turns`` (+ DAPO's overlong penalty on the episode's sampled
   tokens with ``rl.overlong``); group advantages; optional dynamic sampling; one
   :class:`~swarmjax.rl.update.Learner` update on the rollout's ids, loss mask and
   sampler log-probs (token-in-token-out).
4. **Evaluation** (greedy, held-out problems): accuracy, mean tool calls and turns, of
   the warm start and of the final policy, in ``summary.json`` / ``summary.md``;
   every ``eval_every`` RL steps in ``eval.jsonl`` (each step's line in ``metrics.jsonl``).
5. **Checkpoints, resume, preemption** (:func:`run_text_job`): as the text PARL job
   (:mod:`swarmjax.train.text_parl_job`): a checkpoint after the warm start's
   evaluation, at every evaluation, on SIGTERM and at the end; ``--resume auto`` /
   ``latest`` continue bit for bit (the logs cut back, the task stream restored).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from swarmjax.envs.arith import ArithConfig, ArithTask, corpus, play
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import init_params
from swarmjax.optim import OptimConfig, make_optimizer
from swarmjax.rl.advantages import ADVANTAGES, compute_advantages, overlong_penalty, uniform_groups
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.trajectory import TrajectoryBatch
from swarmjax.rl.update import Learner, UpdateConfig
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.swarm.text_rollout import END_ANSWER, TextRollout, TextRolloutConfig, TextRolloutResult
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import CHAT_FORMATS, ChatFormat, chat_format
from swarmjax.text.runner import ToolRunner
from swarmjax.text.tokenizer import TextTokenizer
from swarmjax.train.checkpoint import Checkpointer, abstract_state
from swarmjax.train.demos import pack_rows
from swarmjax.train.job import check_identity, check_resume, resume_mode
from swarmjax.train.logs import TextJobLog, progress_bar, write_summary
from swarmjax.train.preemption import Preempted, PreemptionWatch
from swarmjax.train.sft import role_stats


@dataclasses.dataclass(frozen=True)
class TextSFTConfig:
    steps: int = 600
    batch: int = 32
    demos: int = 4096
    bucket: int = 64               # batches are cut to a multiple of this length
    optim: OptimConfig = OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=600)

    def __post_init__(self):
        if min(self.steps, self.batch, self.demos, self.bucket) < 1:
            raise ValueError("sft steps, batch, demos and bucket must be >= 1")


@dataclasses.dataclass(frozen=True)
class OverlongConfig:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, section 3.4).

    With ``L`` the tokens the policy sampled in an episode (all its orchestrator turns:
    the ones the loss trains on), ``L_max = max_length`` and ``L_cache = cache_length``
    (the buffer before ``L_max``), the episode's reward gets

        0                                  if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max   (0 -> -1)
        -1                                 if L > L_max

    (:func:`swarmjax.rl.advantages.overlong_penalty`), so long answers lose reward
    gradually instead of being cut off with no signal.
    """

    max_length: int = 256
    cache_length: int = 64

    def __post_init__(self):
        if not 0 < self.cache_length <= self.max_length:
            raise ValueError(f"overlong: need 0 < cache_length ({self.cache_length}) <= "
                             f"max_length ({self.max_length})")


@dataclasses.dataclass(frozen=True)
class TextRLConfig:
    """The RL stage of a text job (module docstring, 3.).

    steps, tasks_per_step, group_size: RL steps; problems per step; rollouts per problem
      (one advantage group).
    advantage: estimator, a key of :data:`swarmjax.rl.advantages.ADVANTAGES`.
    dynamic_sampling: groups whose rewards are all equal get no loss tokens (DAPO).
    turn_cost: reward -= turn_cost * orchestrator turns.
    overlong: None (default) leaves the reward as is; an :class:`OverlongConfig` adds
      DAPO's soft overlong penalty on each episode's sampled-token count to its reward
      before the advantages (:func:`episode_rewards`).
    update, rollout: the learner's and the rollout's settings.
    """

    steps: int = 60
    tasks_per_step: int = 8
    group_size: int = 8
    advantage: str = "grpo"        # key of rl.advantages.ADVANTAGES
    dynamic_sampling: bool = True  # groups whose rewards are all equal get no loss tokens
    turn_cost: float = 0.0         # reward -= turn_cost * orchestrator turns
    overlong: OverlongConfig | None = None   # DAPO soft overlong penalty on sampled tokens
    update: UpdateConfig = UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                        optim=OptimConfig(learning_rate=3e-4))
    rollout: TextRolloutConfig = TextRolloutConfig(orch_context=512, worker_context=64, max_turn_tokens=48,
                                                   worker_lanes=1, subagent_turns=1)

    def __post_init__(self):
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"unknown advantage {self.advantage!r}; known: {sorted(ADVANTAGES)}")
        B, per = self.tasks_per_step * self.group_size, self.update.num_minibatches * self.update.num_microbatches
        if min(self.steps, self.tasks_per_step, self.group_size) < 0 or B % per:
            raise ValueError(f"tasks_per_step x group_size = {B} must be divisible by "
                             f"num_minibatches x num_microbatches = {per}")


@dataclasses.dataclass(frozen=True)
class TextToolJob:
    """A text tool-use job. ``model.vocab_size`` is replaced by the tokenizer's."""

    task: str = "arith"            # key of TEXT_TASKS
    arith: ArithConfig = ArithConfig()
    chat: str = "qwen3"
    tokenizer_vocab: int = 1024
    model: ModelConfig = ModelConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                                     intermediate_size=384)
    sft: TextSFTConfig = TextSFTConfig()
    rl: TextRLConfig = TextRLConfig()
    eval_episodes: int = 128
    eval_every: int = 20
    seed: int = 0

    def identity(self) -> dict[str, str]:
        """What a run computes, as reprs: a run may be resumed with another RL step count
        or evaluation cadence, not with another task, tokenizer, model, warm start, RL
        configuration, seed or held-out set."""
        same = dataclasses.replace(self, rl=dataclasses.replace(self.rl, steps=0), eval_every=0)
        return {f.name: repr(getattr(same, f.name)) for f in dataclasses.fields(same)}

    def validate(self) -> None:
        if self.task not in TEXT_TASKS:
            raise ValueError(f"unknown text task {self.task!r}; known: {sorted(TEXT_TASKS)}")
        if self.eval_episodes < 1 or self.tokenizer_vocab < 300 or self.eval_every < 0:
            raise ValueError("eval_episodes must be >= 1, tokenizer_vocab >= 300 (bytes + merges), eval_every >= 0")


# name -> (corpus(job), task(job, chat, runner))
TEXT_TASKS: dict[str, tuple[Callable, Callable]] = {
    "arith": (lambda job: corpus(job.arith, seed=job.seed),
              lambda job, chat, runner: ArithTask(job.arith, chat, runner)),
}


def demonstrations(task: Any, problems: list, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Play each problem's scripted turns through a fresh environment: ids [N, T],
    token mask [N, T] and the agent's-own-ids mask [N, T] (right-padded)."""
    played = [play(task.env(p), p, task.demonstration(p, rng)) for p in problems]
    d = pack_rows(played, max(len(ids) for ids, _ in played), pad=0)
    return d.tokens, d.token_mask, d.loss_mask


def warm_start(params, cfg: ModelConfig, data, scfg: TextSFTConfig, seed: int,
               on_step: Callable[[int, dict], None] | None = None):
    """Masked next-token training on the demonstrations; batches of one length bucket
    (a multiple of ``bucket``), so short episodes are not padded to the longest."""
    ids, tmask, lmask = data
    opt = make_optimizer(scfg.optim)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def loss(p):
            nll, count, right = role_stats(p, cfg, *batch)
            return nll / jnp.maximum(count, 1.0), right / jnp.maximum(count, 1.0)
        (value, acc), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": value, "acc": acc}

    lengths = tmask.sum(1)
    rounded = np.minimum(-(-lengths // scfg.bucket) * scfg.bucket, ids.shape[1])
    rng = np.random.default_rng(seed)
    for i in range(scfg.steps):
        idx = rng.integers(0, len(ids), scfg.batch)
        L = int(rounded[idx].max())
        batch = tuple(jnp.asarray(x[idx, :L]) for x in (ids, tmask, lmask))
        params, opt_state, metrics = step(params, opt_state, batch)
        if on_step is not None:
            on_step(i, {k: float(v) for k, v in metrics.items()})
    return params


def _cut(x: np.ndarray, length: int, bucket: int = 64) -> np.ndarray:
    return x[:, :min(x.shape[1], -(-int(length) // bucket) * bucket)]


def evaluate(rollout: TextRollout, params, task, problems: list, key) -> dict[str, float]:
    """Greedy episodes on ``problems``: accuracy (mean ``r_perf``), tool calls, turns,
    the fraction that answered and the fraction whose answer was cut."""
    res = rollout(params, params, [task.env(p) for p in problems], problems, key)
    r = res.rewards
    return {"accuracy": float(np.mean(r.get("r_perf", 0.0))), "tool_calls": float(np.mean(r["tool_calls"])),
            "tool_errors": float(np.mean(r["tool_errors"])), "turns": float(np.mean(res.orch_steps)),
            "answered": float(np.mean(res.end_reason == END_ANSWER)), "truncated": float(np.mean(r["truncated"]))}


def episode_rewards(res: TextRolloutResult, rcfg: TextRLConfig) -> np.ndarray:
    """[B] reward of each episode of ``res``:

        r = r_perf - turn_cost * orch_steps  (+ overlong_penalty(L) with ``rcfg.overlong``)

    where L [B] = ``res.loss_mask.sum(1)``, the tokens the policy sampled in the episode.
    """
    reward = res.rewards["r_perf"] - rcfg.turn_cost * res.orch_steps
    if rcfg.overlong is not None:
        sampled = np.asarray(res.loss_mask).sum(axis=1)
        reward = reward + np.asarray(overlong_penalty(
            sampled, rcfg.overlong.max_length, rcfg.overlong.cache_length))
    return reward


def rl_step(learner: Learner, state, rollout: TextRollout, task, problems: list, key, rcfg: TextRLConfig):
    """One RL step (module docstring, 3.); returns the new state and the step's metrics."""
    G = rcfg.group_size
    episodes = [p for p in problems for _ in range(G)]
    t0 = time.perf_counter()
    res = rollout(state.params, state.params, [task.env(p) for p in episodes], episodes, key)
    t1 = time.perf_counter()
    reward = episode_rewards(res, rcfg)
    groups = jnp.repeat(jnp.arange(len(problems)), G)
    adv = compute_advantages(rcfg.advantage, jnp.asarray(reward), groups)
    keep = ~uniform_groups(jnp.asarray(reward), groups) if rcfg.dynamic_sampling else jnp.ones(len(episodes), bool)
    L = int(res.length.max())
    tokens, loss_mask, logprobs = (_cut(x, L) for x in (res.tokens, res.loss_mask, res.logprobs))
    token_mask = np.arange(tokens.shape[1])[None] < res.length[:, None]
    batch = TrajectoryBatch.create(tokens, jnp.asarray(loss_mask) & keep[:, None], adv, token_mask=token_mask,
                                   sampler_logprobs=logprobs, group_ids=groups, rewards=reward)
    state, learn = learner.update(state, batch)
    learn = jax.device_get(learn)
    metrics = {"reward": float(np.mean(reward)), "accuracy": float(np.mean(res.rewards["r_perf"])),
               "tool_calls": float(np.mean(res.rewards["tool_calls"])), "turns": float(np.mean(res.orch_steps)),
               "kept_groups": float(jnp.mean(keep)), "rollout_s": t1 - t0, "update_s": time.perf_counter() - t1,
               "segments": res.stats["segments"], "sampled_tokens": res.stats["sampled_tokens"],
               "orch_sampled_tokens": float(np.mean(res.loss_mask.sum(axis=1)))}
    metrics.update({f"learner/{k}": float(np.mean(v)) for k, v in learn.items()})
    return state, metrics


def task_chat(corpus: list[str], workdir: str, chat: str, vocab_size: int) -> ChatFormat:
    """A byte-level BPE trained on ``corpus`` plus the chat format's fixed texts (tool
    preamble, ...: merged into few ids), saved to ``workdir/tokenizer``; its chat format."""
    fixed = [v for k, v in vars(CHAT_FORMATS[chat]).items() if k.isupper() and isinstance(v, str)]
    tok_dir = train_bpe_tokenizer(corpus + fixed * 50, os.path.join(workdir, "tokenizer"),
                                  vocab_size=vocab_size, chat_format=chat)
    return chat_format(chat, TextTokenizer.from_dir(tok_dir))


def check_text_workdir(workdir: str, mode: str) -> None:
    """Check a text job's ``workdir`` for resume ``mode`` ("never", "latest" or "auto",
    :func:`~swarmjax.train.job.resume_mode`): a local path (the tokenizer is written with
    local file APIs), and under "never" no finished run in it; then create it."""
    if "://" in str(workdir):
        raise ValueError(f"text jobs need a local workdir (the tokenizer is saved with local file APIs), "
                         f"got {workdir!r}")
    if mode == "never" and os.path.exists(os.path.join(workdir, "summary.json")):
        raise ValueError(f"workdir {workdir!r} already holds a finished run; choose another "
                         "(--resume auto reads its summary back)")
    os.makedirs(workdir, exist_ok=True)


def load_chat(workdir: str, chat: str) -> ChatFormat:
    """The chat format over the tokenizer a run saved in ``workdir/tokenizer`` (a resumed
    run keeps its tokenizer: :func:`task_chat` trained it)."""
    tok_dir = os.path.join(workdir, "tokenizer")
    if not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
        raise ValueError(f"{workdir} holds no tokenizer ({tok_dir}): not a text run's workdir")
    return chat_format(chat, TextTokenizer.from_dir(tok_dir))


def run_checkpointed(job: Any, workdir: str, resume: bool | str,
                     run: Callable[[Checkpointer, int | None, PreemptionWatch], dict], *, best_metric: str,
                     handle_sigterm: bool, stage: str = "PARL") -> dict:
    """A text job's frame: ``resume`` read (:func:`~swarmjax.train.job.resume_mode`), the
    job validated, its workdir checked (:func:`check_text_workdir`), its checkpoints opened
    (``workdir/checkpoints``: the last two and the best by ``best_metric`` kept), the
    newest finished step (None: none) checked against the mode
    (:func:`~swarmjax.train.job.check_resume`; ``stage`` names the training stage in its
    errors), then ``run(ckpt, latest, watch)`` under a SIGTERM watch; the checkpoints are
    closed after it (waiting for a save in flight)."""
    mode = resume_mode(resume)
    job.validate()
    check_text_workdir(workdir, mode)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), save_every=1, keep_last=2, best_metric=best_metric)
    try:
        latest = ckpt.latest_step()
        check_resume(mode, latest, workdir, ckpt.directory, stage=stage)
        with PreemptionWatch(enabled=handle_sigterm) as watch:
            return run(ckpt, latest, watch)
    finally:
        ckpt.close()


def end_step(done: int, steps: int, eval_every: int, *, run_eval: Callable[[int, str], dict],
             save: Callable[[int, dict | None], None], stop: Callable[[], bool], label: str,
             preempted: Callable[[int], Exception]) -> None:
    """After a training step (``done`` steps of ``steps``): the final evaluation after the
    last one, a ``label`` evaluation every ``eval_every`` (0: none); a checkpoint when
    evaluated or when ``stop()`` (a preemption notice; the last step just finishes),
    then ``preempted(done)`` is raised. The text jobs' end of step."""
    evals = None
    if done == steps:
        evals = run_eval(done, "final")
    elif eval_every and done % eval_every == 0:
        evals = run_eval(done, label)
    halt = done < steps and stop()                  # safe point
    if evals is not None or halt:
        save(done, evals)
    if halt:
        raise preempted(done)


def run_text_job(job: TextToolJob, workdir: str, *, progress: bool = True, resume: bool | str = False,
                 handle_sigterm: bool = True) -> dict:
    """Tokenizer -> warm start -> RL -> summary (module docstring), or the continuation of
    an unfinished run from its newest finished checkpoint. Returns the summary.

    Checkpoints (``workdir/checkpoints``, the last two and the best by accuracy kept): the
    RL :class:`~swarmjax.rl.update.TrainState` right after the warm start's evaluation
    (step 0), at every evaluation, on SIGTERM and at the end, with the warm start's and
    the final evaluations, the wall clock so far, the task stream's generator state and
    the job's identity (:meth:`TextToolJob.identity`: only ``rl.steps`` and
    ``eval_every`` may change between attempts). ``resume``: "never" / False (default:
    refuses a workdir holding checkpoints or a finished run), "latest" / True (continue;
    an error without a checkpoint) or "auto" (continue when there is one); a resumed run
    cuts its logs back to the checkpoint and computes what an uninterrupted one does.
    ``handle_sigterm``: on SIGTERM stop at the next safe point (the end of a warm-start
    step: nothing kept; the step-0 checkpoint; the end of an RL step: a checkpoint there)
    and raise :class:`~swarmjax.train.preemption.Preempted`. The workdir must be local."""
    return run_checkpointed(job, workdir, resume,
                            lambda ckpt, latest, watch: _run(job, workdir, ckpt, latest, watch, progress),
                            best_metric="accuracy", handle_sigterm=handle_sigterm, stage="RL")


def held_out(job: TextToolJob, chat: ChatFormat, cfg: ModelConfig, runner: ToolRunner
             ) -> tuple[Any, list, TextRollout]:
    """The task (its tools on ``runner``), the run's ``eval_episodes`` held-out problems
    (a seed stream training never draws from) and the greedy rollout that evaluates them."""
    task = TEXT_TASKS[job.task][1](job, chat, runner)
    test = task.sample(np.random.default_rng(job.seed + 1_000_003), job.eval_episodes)
    greedy = dataclasses.replace(job.rl.rollout, orch_sampling=SamplingConfig(temperature=0.0),
                                 worker_sampling=SamplingConfig(temperature=0.0))
    return task, test, TextRollout(cfg, greedy, stop_ids=chat.stop_ids, pad_id=chat.ids[chat.pad_token][0])


def _restore(cfg: ModelConfig, learner: Learner, ckpt: Checkpointer, step: int) -> tuple[Any, dict]:
    """(TrainState, meta) of checkpoint ``step``, on the first device."""
    shapes = jax.eval_shape(lambda: learner.init(init_params(cfg, jax.random.key(0))))
    return ckpt.restore(step, abstract_state(shapes, jax.sharding.SingleDeviceSharding(jax.devices()[0])))


def _run(job: TextToolJob, workdir: str, ckpt: Checkpointer, latest: int | None, watch: PreemptionWatch,
         progress: bool) -> dict:
    """:func:`run_text_job` once the checkpoints are open."""
    clock = time.perf_counter()
    chat = task_chat(TEXT_TASKS[job.task][0](job), workdir, job.chat, job.tokenizer_vocab) if latest is None else \
        load_chat(workdir, job.chat)
    cfg = job.model.replace(vocab_size=chat.tokenizer.vocab_size)
    key = jax.random.key(job.seed)
    learner = Learner(cfg, job.rl.update)
    steps = job.rl.steps
    if latest is not None:
        state, meta = _restore(cfg, learner, ckpt, latest)
        check_identity(job.identity(), meta.get("job", {}), "--resume", "rl.steps and eval_every")
        rng = np.random.default_rng()
        rng.bit_generator.state = json.loads(meta["rng"])      # the task stream, where it stopped
        log = TextJobLog(workdir, meta["rl_step"], keep_final="final" in meta and meta["rl_step"] >= steps)
    else:
        rng = np.random.default_rng(job.seed)
        log = TextJobLog(workdir, None)
    runner = ToolRunner([], max_workers=16, timeout_s=10.0)
    try:
        task, test, eval_rollout = held_out(job, chat, cfg, runner)
        train_rollout = TextRollout(cfg, job.rl.rollout, stop_ids=chat.stop_ids, pad_id=chat.ids[chat.pad_token][0])

        def run_eval(step: int, label: str, params: Any) -> dict[str, float]:
            res = evaluate(eval_rollout, params, task, test, jax.random.fold_in(key, 1))
            log.write("eval.jsonl", {"step": step, "policy": label, "split": "test", **res})
            if label == "final":
                meta["final"] = res                     # in the last checkpoint: a finished run
            return res

        def save(step: int, state: Any, evals: dict | None) -> None:
            """The state after ``step`` RL steps, its log lines first (scored by accuracy
            when evaluated)."""
            nonlocal clock
            now = time.perf_counter()
            meta.update(rl_step=step, wall_clock_s=meta["wall_clock_s"] + now - clock,
                        rng=json.dumps(rng.bit_generator.state))
            clock = now
            log.sync()
            ckpt.save(step, state, meta, metrics=None if evals is None else {"accuracy": evals["accuracy"]},
                      force=True)

        if latest is None:
            data = demonstrations(task, task.sample(rng, job.sft.demos), rng)
            bar = progress_bar(job.sft.steps, "warm start", progress)

            def on_sft(i, m):
                log.write("metrics.jsonl", {"stage": "sft", "step": i, **m})
                bar.update(1)
                bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['acc']:.3f}")
                if watch.reached():
                    bar.close()
                    raise Preempted(None, workdir)
            params = warm_start(init_params(cfg, key), cfg, data, job.sft, job.seed, on_sft)
            bar.close()
            meta = {"rl_step": 0, "job": job.identity(), "warm_start_s": time.perf_counter() - clock,
                    "wall_clock_s": 0.0}
            meta["warm_start"] = run_eval(0, "warm_start", params)
            state = learner.init(jax.tree.map(jnp.copy, params))
            save(0, state, None)                        # the warm start survives a crash in RL
            if steps > 0 and watch.reached():           # safe point
                raise Preempted(0, workdir, stage="RL")

        start = meta["rl_step"]
        bar = progress_bar(steps, "RL", progress, initial=min(start, steps))
        with bar:                                       # closed on a preemption too
            for step in range(start, steps):
                problems = task.sample(rng, job.rl.tasks_per_step)
                state, m = rl_step(learner, state, train_rollout, task, problems, jax.random.fold_in(key, 100 + step),
                                   job.rl)
                log.write("metrics.jsonl", {"stage": "rl", "step": step, **m})
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward']:.3f}", tools=f"{m['tool_calls']:.2f}")
                end_step(step + 1, steps, job.eval_every, run_eval=lambda i, label: run_eval(i, label, state.params),
                         save=lambda i, evals: save(i, state, evals), stop=watch.reached, label="rl",
                         preempted=lambda i: Preempted(i, workdir, stage="RL"))
    finally:
        log.close()
        runner.close()
    summary = {"task": job.task, "model_params": cfg.num_params(), "vocab_size": cfg.vocab_size,
               "eval_episodes": job.eval_episodes, "rl_steps": meta["rl_step"], "warm_start": meta["warm_start"],
               "final": meta.get("final", meta["warm_start"]),
               "wall_clock_s": meta["wall_clock_s"] + time.perf_counter() - clock,
               "warm_start_s": meta["warm_start_s"], "backend": jax.default_backend()}
    write_summary(workdir, summary, text_summary_table)
    return summary


def evaluate_text_job_checkpoint(job: TextToolJob, workdir: str, *, which: str = "latest") -> dict:
    """Evaluate checkpoint ``which`` ("latest", "best" by accuracy, or an RL step) of the
    text tool run in ``workdir``: greedy, on ``job.eval_episodes`` held-out problems of the
    run's seed (the run's own are the first ones). The checkpoint holds the trained policy
    only: the warm start's row is the run's own evaluation, given when ``eval_episodes``
    is the run's. Returns what :func:`text_summary_table` prints, with ``step``."""
    job.validate()
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        raise ValueError(f"no checkpoints in {workdir}")
    chat = load_chat(workdir, job.chat)
    cfg = job.model.replace(vocab_size=chat.tokenizer.vocab_size)
    with Checkpointer(directory, save_every=1, read_only=True) as ckpt:
        step = ckpt.step_of(which)
        state, meta = _restore(cfg, Learner(cfg, job.rl.update), ckpt, step)
    made, mine = meta.get("job", {}), job.identity()
    differ = [k for k in ("task", "arith", "chat", "tokenizer_vocab", "model", "seed") if made.get(k) != mine[k]]
    if differ:
        raise ValueError(f"the checkpoint in {workdir} was made by a job with another {', '.join(differ)}")
    runner = ToolRunner([], max_workers=16, timeout_s=10.0)
    t0 = time.perf_counter()
    try:
        task, test, rollout = held_out(job, chat, cfg, runner)
        final = evaluate(rollout, state.params, task, test, jax.random.fold_in(jax.random.key(job.seed), 1))
    finally:
        runner.close()
    out = {"step": step, "final": final, "eval_episodes": job.eval_episodes, "rl_steps": step,
           "wall_clock_s": time.perf_counter() - t0, "backend": jax.default_backend()}
    if made.get("eval_episodes") == mine["eval_episodes"]:
        out["warm_start"] = meta["warm_start"]
    return out


def text_summary_table(summary: dict) -> str:
    """The before/after table of a text job's summary (markdown; the rows it has)."""
    keys = ("accuracy", "tool_calls", "tool_errors", "turns", "answered", "truncated")
    rows = ["| policy | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name in ("warm_start", "final"):
        if name not in summary:
            continue
        rows.append(f"| {name.replace('_', ' ')} | " + " | ".join(f"{summary[name][k]:.3f}" for k in keys) + " |")
    rows.append(f"\n{summary['eval_episodes']} held-out problems, greedy; {summary['rl_steps']} RL steps; "
                f"wall clock {summary['wall_clock_s']:.0f} s on {summary['backend']}")
    return "\n".join(rows)
