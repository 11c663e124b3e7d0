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
   the warm start and of the final policy, in ``summary.json`` / ``summary.md``.
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
from swarmjax.train.demos import pack_rows
from swarmjax.train.logs import progress_bar
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

    def validate(self) -> None:
        if self.task not in TEXT_TASKS:
            raise ValueError(f"unknown text task {self.task!r}; known: {sorted(TEXT_TASKS)}")
        if self.eval_episodes < 1 or self.tokenizer_vocab < 300:
            raise ValueError("eval_episodes must be >= 1 and tokenizer_vocab >= 300 (bytes + merges)")


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


def start_text_workdir(workdir: str, resume: bool | str) -> None:
    """Check a text job's ``workdir`` and ``resume`` (no resume yet: "latest" / True is
    refused, "never" / False / "auto" start afresh; a local path; no finished run in
    it) and create it."""
    if resume is True or resume == "latest":
        raise ValueError("--resume is not supported for text jobs yet: "
                         "start a fresh workdir, or pass --resume auto to start afresh")
    if resume not in (False, None, "never", "auto"):
        raise ValueError(f"resume must be never, latest or auto, got {resume!r}")
    if "://" in str(workdir):
        raise ValueError(f"text jobs need a local workdir (the tokenizer is saved with local file APIs), "
                         f"got {workdir!r}")
    if os.path.exists(os.path.join(workdir, "summary.json")):
        raise ValueError(f"workdir {workdir!r} already holds a finished run; choose another")
    os.makedirs(workdir, exist_ok=True)


def run_text_job(job: TextToolJob, workdir: str, *, progress: bool = True, resume: bool | str = False) -> dict:
    """Tokenizer -> warm start -> RL -> summary (module docstring). Returns the summary.

    This job keeps no checkpoints yet: ``resume`` "never" / False and "auto" (no
    checkpoint, so: start afresh, overwriting an unfinished attempt's files) run the
    job; "latest" / True is refused. SIGTERM is not intercepted (its default action
    ends the job). The workdir must be local (the tokenizer is written with local file
    APIs)."""
    job.validate()
    start_text_workdir(workdir, resume)
    t_start = time.perf_counter()
    make_corpus, make_task = TEXT_TASKS[job.task]
    chat = task_chat(make_corpus(job), workdir, job.chat, job.tokenizer_vocab)
    cfg = job.model.replace(vocab_size=chat.tokenizer.vocab_size)
    runner = ToolRunner([], max_workers=16, timeout_s=10.0)
    task = make_task(job, chat, runner)
    rng = np.random.default_rng(job.seed)
    test = task.sample(np.random.default_rng(job.seed + 1_000_003), job.eval_episodes)
    key = jax.random.key(job.seed)
    params = init_params(cfg, key)
    greedy = dataclasses.replace(job.rl.rollout, orch_sampling=SamplingConfig(temperature=0.0),
                                 worker_sampling=SamplingConfig(temperature=0.0))
    eval_rollout = TextRollout(cfg, greedy, stop_ids=chat.stop_ids, pad_id=chat.ids[chat.pad_token][0])
    train_rollout = TextRollout(cfg, job.rl.rollout, stop_ids=chat.stop_ids, pad_id=chat.ids[chat.pad_token][0])
    metrics_file = open(os.path.join(workdir, "metrics.jsonl"), "w")
    log = lambda rec: (metrics_file.write(json.dumps(rec) + "\n"), metrics_file.flush())

    data = demonstrations(task, task.sample(rng, job.sft.demos), rng)
    bar = progress_bar(job.sft.steps, "warm start", progress)

    def on_sft(i, m):
        log({"stage": "sft", "step": i, **m})
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['acc']:.3f}")
    params = warm_start(params, cfg, data, job.sft, job.seed, on_sft)
    bar.close()
    t_sft = time.perf_counter()
    before = evaluate(eval_rollout, params, task, test, jax.random.fold_in(key, 1))
    log({"stage": "eval", "step": 0, "policy": "warm_start", **before})

    learner = Learner(cfg, job.rl.update)
    state = learner.init(jax.tree.map(jnp.copy, params))
    bar = progress_bar(job.rl.steps, "RL", progress)
    for step in range(job.rl.steps):
        problems = task.sample(rng, job.rl.tasks_per_step)
        state, m = rl_step(learner, state, train_rollout, task, problems, jax.random.fold_in(key, 100 + step),
                           job.rl)
        log({"stage": "rl", "step": step, **m})
        bar.update(1)
        bar.set_postfix(reward=f"{m['reward']:.3f}", tools=f"{m['tool_calls']:.2f}")
        if job.eval_every and (step + 1) % job.eval_every == 0 and step + 1 < job.rl.steps:
            log({"stage": "eval", "step": step + 1, "policy": "rl",
                 **evaluate(eval_rollout, state.params, task, test, jax.random.fold_in(key, 1))})
    bar.close()
    after = evaluate(eval_rollout, state.params, task, test, jax.random.fold_in(key, 1))
    log({"stage": "eval", "step": job.rl.steps, "policy": "final", **after})
    metrics_file.close()
    runner.close()
    summary = {"task": job.task, "model_params": cfg.num_params(), "vocab_size": cfg.vocab_size,
               "eval_episodes": job.eval_episodes, "rl_steps": job.rl.steps, "warm_start": before,
               "final": after, "wall_clock_s": time.perf_counter() - t_start,
               "warm_start_s": t_sft - t_start, "backend": jax.default_backend()}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(text_summary_table(summary) + "\n")
    return summary


def text_summary_table(summary: dict) -> str:
    """The before/after table of a text job's summary (markdown)."""
    keys = ("accuracy", "tool_calls", "tool_errors", "turns", "answered", "truncated")
    rows = ["| policy | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name in ("warm_start", "final"):
        rows.append(f"| {name.replace('_', ' ')} | " + " | ".join(f"{summary[name][k]:.3f}" for k in keys) + " |")
    rows.append(f"\n{summary['eval_episodes']} held-out problems, greedy; {summary['rl_steps']} RL steps; "
                f"wall clock {summary['wall_clock_s']:.0f} s on {summary['backend']}")
    return "\n".join(rows)
