"""``swarmjax train`` for the swarm in real text: a warm start, then PARL on the jitted text swarm.

    swarmjax train --config configs/parl_widesearch_text_cpu.py --workdir runs/text

The token world's recipe (:mod:`swarmjax.train.job`) on the canonical text wide-search
(:mod:`swarmjax.envs.widesearch_relay`), with a byte-level BPE trained on the task's
text and the Qwen3 chat format:

1. **Tokenizer.** A byte-level BPE trained here on the task's corpus and the chat
   format's fixed texts (nothing is downloaded), saved to ``workdir/tokenizer``.
2. **Warm start.** Demonstrations played through the host twin
   (:mod:`swarmjax.train.relay_demos`: mostly serial orchestrators, a share that
   delegates the whole task over random chunks); every step trains both roles, one
   orchestrator batch (cut to its length bucket) and one sub-agent batch, the masked
   next-token NLL of each averaged (:func:`swarmjax.train.sft.sft_loss`).
3. **PARL.** Per step ``tasks_per_step`` fresh tasks (a ``focus_fraction`` of them with
   n >= ``focus_min_n``) x ``group_size`` samples, one jitted rollout of the whole swarm
   (:class:`~swarmjax.swarm.text_engine.TextSwarm`: tool calls parsed and answered on
   the device; the orchestrator trained, the sub-agents frozen at the warm start), the
   PARL reward :func:`swarmjax.rl.parl.parl_reward` from the rollout's counts, group
   advantages, and one :class:`~swarmjax.rl.update.Learner` update on exactly the
   rollout's ids, loss mask and sampler log-probs.
   The warm start is saved to ``workdir/warm_start/`` (:mod:`swarmjax.train.warm_start`);
   ``warm_start_from=<workdir>`` reuses one made with the same model, SFT config, task,
   tokenizer and seed (PARL ablations skip the demonstrations and the SFT).
4. **Evaluation** (greedy, both roles, budget lifted, fresh tasks from a seed stream
   of their own) per task size: item-F1, critical / total steps, sub-agents,
   the no-spawn fraction, of the warm start, every ``eval_every`` PARL steps and of
   the final policy: ``eval.jsonl``, ``summary.json`` / ``summary.md``, ``curves.png``.

Checkpoints (:class:`~swarmjax.train.checkpoint.Checkpointer`, ``workdir/checkpoints/``):
the PARL :class:`~swarmjax.rl.update.TrainState` at every evaluation and at the end,
scored by the item-F1 at the largest n (the last two and the best are kept). One
process; no resume yet (``--resume auto`` starts afresh).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from swarmjax.envs.widesearch import Episode, WideSearchConfig
from swarmjax.envs.widesearch_jax import END_ANSWER
from swarmjax.envs.widesearch_relay import RelayTask, relay_corpus
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import init_params
from swarmjax.optim import OptimConfig, make_optimizer
from swarmjax.rl.advantages import ADVANTAGES, compute_advantages, uniform_groups
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig, parl_reward
from swarmjax.rl.trajectory import TrajectoryBatch, shared_head
from swarmjax.rl.update import Learner, TrainState, UpdateConfig
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.swarm.text_engine import TextSwarm
from swarmjax.swarm.text_types import TextRolloutConfig, TextRolloutResult
from swarmjax.text.chat import CHAT_FORMATS, chat_format
from swarmjax.text.tokenizer import TextTokenizer
from swarmjax.train.checkpoint import Checkpointer, abstract_state
from swarmjax.train.demos import Demos
from swarmjax.train.logs import curves, progress_bar, summary_table
from swarmjax.train.relay_demos import make_relay_demos
from swarmjax.train.sft import length_buckets, prefix_role_stats, sample_bucketed
from swarmjax.train.text_job import start_text_workdir, task_chat
from swarmjax.train.warm_start import load_warm_start, save_warm_start


@dataclasses.dataclass(frozen=True)
class RelayWarmStartConfig:
    """The warm start (module docstring, 2.): ``steps`` of ``batch`` orchestrator rows
    and ``batch`` sub-agent rows, drawn from ``demos`` played episodes."""

    steps: int = 600
    batch: int = 16
    demos: int = 4096
    spawn_fraction: float = 0.3
    max_chunk: int = 2
    bucket: int = 128              # orchestrator batches are cut to a multiple of this length
    optim: OptimConfig = OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=600)

    def __post_init__(self):
        if min(self.steps, self.batch, self.demos, self.bucket, self.max_chunk) < 1:
            raise ValueError("warm start steps, batch, demos, bucket and max_chunk must be >= 1")
        if not 0.0 <= self.spawn_fraction <= 1.0:
            raise ValueError(f"spawn_fraction must be in [0, 1], got {self.spawn_fraction}")


@dataclasses.dataclass(frozen=True)
class TextPARLConfig:
    """The PARL stage (module docstring, 3.).

    chunk, wide_rows, buckets: :class:`TextSwarm`'s prefill width, share of rows per
      tick and row / window sizes each tick's forwards are compiled for (1: every row over
      the whole cache, the fewest compiles).
    bucket: learner batches are cut to a multiple of this length (one compile each).
    head_multiple: the ids every learner row opens with (system turn, tool schemas) run
    once per forward (``Learner.update(head=)``), cut to a multiple of this; 0: off.
    """

    steps: int = 100
    tasks_per_step: int = 8
    group_size: int = 8
    advantage: str = "grpo"
    dynamic_sampling: bool = True
    focus_fraction: float = 0.5
    focus_min_n: int = 12
    parl: PARLConfig = PARLConfig(parallel="parallel", parallel_target=16, critical_cost=0.004)
    update: UpdateConfig = UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4)
    rollout: TextRolloutConfig = TextRolloutConfig(orch_context=2048, worker_context=384, max_turn_tokens=640,
                                                   subagent_turns=4, budget=None)
    chunk: int = 16
    wide_rows: float = 0.25
    buckets: int = 3
    bucket: int = 256
    head_multiple: int = 64

    def __post_init__(self):
        if self.head_multiple < 0:
            raise ValueError(f"head_multiple must be >= 0, got {self.head_multiple}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"unknown advantage {self.advantage!r}; known: {sorted(ADVANTAGES)}")
        if min(self.tasks_per_step, self.group_size, self.bucket, self.buckets) < 1 or self.steps < 0:
            raise ValueError("parl tasks_per_step, group_size, bucket and buckets must be >= 1, steps >= 0")
        if not 0.0 <= self.focus_fraction <= 1.0:
            raise ValueError(f"focus_fraction must be in [0, 1], got {self.focus_fraction}")
        per = self.update.num_minibatches * self.update.num_microbatches
        if (self.tasks_per_step * self.group_size) % per:
            raise ValueError(f"tasks_per_step x group_size = {self.tasks_per_step * self.group_size} is not "
                             f"divisible by num_minibatches x num_microbatches = {per}")


@dataclasses.dataclass(frozen=True)
class TextPARLJob:
    """A PARL job in text. ``model.vocab_size`` is replaced by the tokenizer's;
    ``max_calls`` / ``max_mentions`` / ``max_pairs``: :class:`RelayTask`'s limits."""

    env: WideSearchConfig = WideSearchConfig(num_entities=32, num_values=32, min_task_size=1, max_task_size=16,
                                             max_subagents=8, subagent_steps=4, budget=None)
    chat: str = "qwen3"
    tokenizer_vocab: int = 1000
    max_calls: int = 16
    max_mentions: int = 16
    max_pairs: int = 16
    model: ModelConfig = ModelConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                                     intermediate_size=384)
    sft: RelayWarmStartConfig = RelayWarmStartConfig()
    parl: TextPARLConfig = TextPARLConfig()
    eval_sizes: tuple[int, ...] = (1, 4, 8, 16)
    eval_episodes: int = 32
    eval_every: int = 25
    seed: int = 0
    parl_seed: int | None = None           # the PARL stage's tasks and sampling (None: seed); seeds of the
                                           # RL stage can share one warm start (tokenizer and held-out tasks: seed)
    warm_start_from: str | None = None     # a workdir whose warm start to reuse (skips demos and SFT)
    warm_start_match: tuple[str, ...] = ("model", "sft", "env", "tokenizer", "seed")

    def warm_identity(self) -> dict[str, str]:
        """What determines the warm start (:mod:`swarmjax.train.warm_start`): model, SFT
        config, task, tokenizer (it is retrained from the task's corpus) and seed."""
        return {"model": repr(self.model), "sft": repr(self.sft), "env": repr(self.env),
                "tokenizer": repr((self.chat, self.tokenizer_vocab, self.max_calls, self.max_mentions,
                                   self.max_pairs)), "seed": repr(self.seed)}

    def validate(self) -> None:
        if self.chat not in CHAT_FORMATS:
            raise ValueError(f"unknown chat format {self.chat!r}; known: {sorted(CHAT_FORMATS)}")
        if self.eval_episodes < 1 or self.tokenizer_vocab < 300 or self.eval_every < 0:
            raise ValueError("eval_episodes must be >= 1, tokenizer_vocab >= 300 (bytes + merges), eval_every >= 0")
        env = self.env
        bad = [n for n in self.eval_sizes if not env.min_task_size <= n <= env.max_task_size]
        if bad or not self.eval_sizes:
            raise ValueError(f"eval_sizes {self.eval_sizes}: need sizes in {env.min_task_size}.."
                             f"{env.max_task_size}")
        if env.max_task_size > min(self.max_pairs, self.max_mentions):
            raise ValueError(f"max_task_size {env.max_task_size} is above max_pairs {self.max_pairs} or "
                             f"max_mentions {self.max_mentions}: answers would be cut")
        if self.parl.focus_fraction > 0 and self.parl.focus_min_n > env.max_task_size:
            raise ValueError(f"focus_min_n {self.parl.focus_min_n} is above max_task_size {env.max_task_size}")


# ------------------------------------------------------------------------ tasks


def sample_episodes(env: WideSearchConfig, rng: random.Random, count: int, *, focus_fraction: float = 0.0,
                    focus_min_n: int = 1) -> list[Episode]:
    """``count`` fresh tasks; each with probability ``focus_fraction`` of a size drawn from
    ``focus_min_n..max_task_size``, else from the config's whole range."""
    out = []
    for _ in range(count):
        n = rng.randint(focus_min_n, env.max_task_size) if rng.random() < focus_fraction else None
        out.append(Episode.sample(env, rng, n))
    return out


def eval_episodes(job: TextPARLJob) -> dict[int, list[Episode]]:
    """``eval_episodes`` tasks per size, from a seed stream the training tasks never use
    (tables of E values out of V: 32^32 of them, so no training table repeats)."""
    return {n: [Episode.sample(job.env, random.Random(f"eval-{job.seed}-{n}-{i}"), n)
                for i in range(job.eval_episodes)] for n in job.eval_sizes}


# ------------------------------------------------------------------------ warm start


def warm_start(params: Any, cfg: ModelConfig, orch: Demos, work: Demos, scfg: RelayWarmStartConfig, seed: int,
               on_step: Callable[[int, dict[str, float]], None] | None = None) -> Any:
    """Both roles each step: ``batch`` orchestrator rows of one length bucket and
    ``batch`` sub-agent rows (cut to their longest), loss = orchestrator NLL + sub-agent
    NLL (per-role means over the agent's own ids, as :func:`swarmjax.train.sft.sft_loss`).
    Each role's rows open with the same ids (system turn, tool schemas: ~540 of an
    orchestrator's ~1000): that head runs once per step
    (:func:`~swarmjax.train.sft.prefix_role_stats`, the same loss and gradients).
    Metrics: loss, ``orch_nll``/``orch_acc``/``worker_nll``/``worker_acc``."""
    opt = make_optimizer(scfg.optim)
    opt_state = opt.init(params)
    heads = {name: d.tokens[0, :shared_head(d.tokens, d.token_mask, d.loss_mask)]
             for name, d in (("orch", orch), ("worker", work))}

    def loss_fn(params, batches):
        loss, metrics = 0.0, {}
        for name, batch in batches.items():
            nll, count, right = prefix_role_stats(params, cfg, jnp.asarray(heads[name]), *batch)
            count = jnp.maximum(count, 1.0)
            metrics[f"{name}_nll"], metrics[f"{name}_acc"] = nll / count, right / count
            loss = loss + metrics[f"{name}_nll"]
        return loss, metrics

    @jax.jit
    def step(params, opt_state, batches):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batches)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, **metrics}

    rng = np.random.default_rng(seed)
    buckets = length_buckets(orch, scfg.bucket)
    W = int(work.token_mask.sum(1).max())
    take = lambda d, idx, P, L: tuple(jnp.asarray(x[idx, P:L]) for x in (d.tokens, d.token_mask, d.loss_mask))
    for i in range(scfg.steps):
        io, L = sample_bucketed(buckets, scfg.batch, rng)
        iw = rng.integers(0, len(work), scfg.batch)
        batches = {"orch": take(orch, io, len(heads["orch"]), L), "worker": take(work, iw, len(heads["worker"]), W)}
        params, opt_state, m = step(params, opt_state, batches)
        if on_step is not None:
            on_step(i, {k: float(v) for k, v in m.items()})
    return params


# ------------------------------------------------------------------------ PARL


def episode_rewards(res: TextRolloutResult, episodes: list[Episode], pcfg: PARLConfig, step: int
                    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """PARL reward [B] and channels [B] of a text rollout (:func:`parl_reward` with the
    rollout's counts: ``novel``, ``returned``, ``parallel``, ``n``)."""
    r = res.rewards
    counts = {"novel": r["novel"], "returned": r["returned"], "parallel": r["parallel"],
              "n": np.array([len(ep.task) for ep in episodes], np.float32)}
    reward, channels = parl_reward(jnp.asarray(r["r_perf"]), jnp.asarray(res.spawned), jnp.asarray(res.finished),
                                   jnp.asarray(res.total_steps), jnp.asarray(step, jnp.int32), pcfg, counts,
                                   critical_steps=jnp.asarray(res.critical_steps))
    return np.asarray(reward), {k: np.asarray(v) for k, v in channels.items()}


def parl_step(learner: Learner, state: TrainState, swarm: TextSwarm, tasks: list[Episode], key: jax.Array,
              step: int, pcfg: TextPARLConfig) -> tuple[TrainState, dict[str, float]]:
    """One PARL step on ``tasks`` (each sampled ``group_size`` times): rollout, reward,
    advantages, update. Returns the new state and the step's metrics."""
    G = pcfg.group_size
    episodes = [ep for ep in tasks for _ in range(G)]
    t0 = time.perf_counter()
    res = swarm(state.params, state.frozen["workers"], episodes, key)
    t1 = time.perf_counter()
    reward, channels = episode_rewards(res, episodes, pcfg.parl, step)
    groups = jnp.repeat(jnp.arange(len(tasks)), G)
    adv = compute_advantages(pcfg.advantage, jnp.asarray(reward), groups)
    keep = ~uniform_groups(jnp.asarray(reward), groups) if pcfg.dynamic_sampling else jnp.ones(len(episodes), bool)
    L = min(res.tokens.shape[1], -(-int(res.length.max()) // pcfg.bucket) * pcfg.bucket)
    token_mask = np.arange(L)[None] < res.length[:, None]
    batch = TrajectoryBatch.create(res.tokens[:, :L], jnp.asarray(res.loss_mask[:, :L]) & keep[:, None], adv,
                                   token_mask=token_mask, sampler_logprobs=res.logprobs[:, :L],
                                   group_ids=groups, rewards=reward)
    P = shared_head(res.tokens[:, :L], token_mask, res.loss_mask[:, :L], multiple=pcfg.head_multiple) \
        if pcfg.head_multiple else 0
    head, batch = batch.split_head(P) if P else (None, batch)
    state, learn = learner.update(state, batch, head=head)
    learn = jax.device_get(learn)
    r = res.rewards
    metrics = {k: float(np.mean(v)) for k, v in channels.items()}
    metrics.update(reward=float(np.mean(reward)), item_f1=float(np.mean(r["r_perf"])),
                   critical_steps=float(np.mean(res.critical_steps)), total_steps=float(np.mean(res.total_steps)),
                   subagents=float(np.mean(res.spawned)), finished_subagents=float(np.mean(res.finished)),
                   parallel=float(np.mean(r["parallel"])), answered=float(np.mean(res.end_reason == END_ANSWER)),
                   spawned_f1=_mean_where(r["r_perf"], res.spawned > 0),
                   serial_f1=_mean_where(r["r_perf"], res.spawned == 0),
                   kept_groups=float(jnp.mean(keep)), cut_by_max_ticks=res.stats["cut_by_max_ticks"],
                   rollout_s=t1 - t0, update_s=time.perf_counter() - t1, orch_tokens=int(res.length.sum()),
                   shared_head=P)
    metrics.update({f"learner/{k}": float(np.mean(v)) for k, v in learn.items()})
    return state, metrics


def _mean_where(x: np.ndarray, mask: np.ndarray) -> float:
    """Mean of ``x`` over ``mask`` (-1 when empty: a JSON-safe "none")."""
    return float(np.mean(x[mask])) if mask.any() else -1.0


def evaluate(swarm: TextSwarm, params: Any, worker_params: Any, tasks: dict[int, list[Episode]],
             key: jax.Array) -> dict[int, dict[str, float]]:
    """Per task size n: ``item_f1``, ``critical_steps``, ``total_steps``, ``subagents``,
    ``finished_subagents``, ``no_spawn_fraction``, ``answered`` (means over the tasks),
    ``seconds`` (the rollout's wall time)."""
    out = {}
    for n, eps in tasks.items():
        t0 = time.perf_counter()
        r = swarm(params, worker_params, eps, jax.random.fold_in(key, n))
        out[n] = {"item_f1": float(np.mean(r.rewards["r_perf"])), "critical_steps": float(np.mean(r.critical_steps)),
                  "total_steps": float(np.mean(r.total_steps)), "subagents": float(np.mean(r.spawned)),
                  "finished_subagents": float(np.mean(r.finished)),
                  "no_spawn_fraction": float(np.mean(r.spawned == 0)),
                  "answered": float(np.mean(r.end_reason == END_ANSWER)), "seconds": time.perf_counter() - t0}
    return out


# ------------------------------------------------------------------------ the job


def build_task(job: TextPARLJob, workdir: str, *, train: bool = True) -> RelayTask:
    """The task on the run's tokenizer: trained on the task's corpus and saved to
    ``workdir/tokenizer``, or (``train=False``) loaded from there."""
    if train:
        chat = task_chat(relay_corpus(job.env, seed=job.seed), workdir, job.chat, job.tokenizer_vocab)
    else:
        tok_dir = os.path.join(workdir, "tokenizer")
        if not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
            raise ValueError(f"{workdir} holds no tokenizer ({tok_dir}): not a text PARL run's workdir")
        chat = chat_format(job.chat, TextTokenizer.from_dir(tok_dir))
    return RelayTask(job.env, chat, max_calls=job.max_calls, max_mentions=job.max_mentions,
                     max_pairs=job.max_pairs)


def _warm_start_stage(job: TextPARLJob, task: RelayTask, cfg: ModelConfig, key: jax.Array, progress: bool,
                      log: Callable[[str, dict], None]) -> Any:
    """Demonstrations, then :func:`warm_start` from fresh params (progress bars, SFT log lines)."""
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
    params = warm_start(init_params(cfg, key), cfg, orch, work, job.sft, job.seed, on_sft)
    bar.close()
    return params


def run_text_parl_job(job: TextPARLJob, workdir: str, *, progress: bool = True, resume: bool | str = False
                      ) -> dict:
    """Tokenizer -> demonstrations -> warm start -> PARL -> summary (module docstring).
    Returns the summary (``summary.json``)."""
    job.validate()
    start_text_workdir(workdir, resume)
    t_start = time.perf_counter()
    task = build_task(job, workdir)
    cfg = job.model.replace(vocab_size=task.chat.tokenizer.vocab_size)
    key = jax.random.key(job.seed)
    files = {name: open(os.path.join(workdir, name), "w") for name in ("metrics.jsonl", "eval.jsonl")}

    def log(name: str, rec: dict) -> None:
        files[name].write(json.dumps(rec) + "\n")
        files[name].flush()

    rc = job.parl.rollout
    if job.warm_start_from:
        params, _ = load_warm_start(job, job.warm_start_from, jax.eval_shape(lambda: init_params(cfg, key)))
    else:
        params = _warm_start_stage(job, task, cfg, key, progress, log)
        save_warm_start(job, workdir, params, {})
    t_sft = time.perf_counter()

    eval_swarm = greedy_swarm(job, task, cfg)
    train_swarm = TextSwarm(task, cfg, rc, chunk=job.parl.chunk, wide_rows=job.parl.wide_rows,
                            buckets=job.parl.buckets)
    tests = eval_episodes(job)
    eval_key = jax.random.fold_in(key, 1)

    def run_eval(step: int, label: str, p) -> dict:
        res = evaluate(eval_swarm, p, params, tests, eval_key)
        for n, r in res.items():
            log("eval.jsonl", {"step": step, "policy": label, "n": n, **r})
        return res
    before = run_eval(0, "warm_start", params)

    learner = Learner(cfg, job.parl.update)
    state = learner.init(jax.tree.map(jnp.copy, params), frozen={"workers": jax.tree.map(jnp.copy, params)})
    parl_seed = job.seed if job.parl_seed is None else job.parl_seed
    parl_key, rng = jax.random.key(parl_seed), random.Random(f"parl-{parl_seed}")
    big = max(job.eval_sizes)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if os.path.isdir(ckpt_dir):     # an unfinished attempt's: this run starts afresh (no resume yet)
        print(f"removing the checkpoints of an earlier unfinished attempt in {ckpt_dir}", file=sys.stderr)
        shutil.rmtree(ckpt_dir)
    ckpt = Checkpointer(ckpt_dir, save_every=1, keep_last=2, best_metric="item_f1")   # saved when evaluated

    def save(step: int, evals: dict) -> None:
        """The PARL state after ``step`` steps, scored by the item-F1 at the largest n."""
        ckpt.save(step, state, {"parl_step": step, "parl_seed": parl_seed, "eval_n": big,
                                "identity": job.warm_identity()},
                  metrics={k: evals[big][k] for k in ("item_f1", "critical_steps")})
    bar = progress_bar(job.parl.steps, "PARL", progress)
    for step in range(job.parl.steps):
        tasks = sample_episodes(job.env, rng, job.parl.tasks_per_step, focus_fraction=job.parl.focus_fraction,
                                focus_min_n=job.parl.focus_min_n)
        state, m = parl_step(learner, state, train_swarm, tasks, jax.random.fold_in(parl_key, 100 + step), step,
                             job.parl)
        log("metrics.jsonl", {"stage": "parl", "step": step, **m})
        bar.update(1)
        bar.set_postfix(f1=f"{m['item_f1']:.3f}", crit=f"{m['critical_steps']:.1f}", subs=f"{m['subagents']:.1f}")
        if job.eval_every and (step + 1) % job.eval_every == 0 and step + 1 < job.parl.steps:
            save(step + 1, run_eval(step + 1, "parl", state.params))
    bar.close()
    after = before
    if job.parl.steps:
        after = run_eval(job.parl.steps, "final", state.params)
        save(job.parl.steps, after)
    ckpt.close()
    for f in files.values():
        f.close()
    curves(workdir)
    summary = {"task": "widesearch_relay", "model_params": cfg.num_params(), "vocab_size": cfg.vocab_size,
               "eval_episodes": job.eval_episodes, "parl_steps": job.parl.steps, "seed": job.seed,
               "parl_seed": parl_seed, "warm_start": before,
               "final": after, "headline": headline(before, after, big), "wall_clock_s": time.perf_counter() - t_start,
               "warm_start_s": t_sft - t_start, "device": f"{jax.default_backend()} x{jax.device_count()}"}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(text_parl_table(summary) + "\n")
    return summary


def greedy_swarm(job: TextPARLJob, task: RelayTask, cfg: ModelConfig) -> TextSwarm:
    """The evaluations' swarm: both roles greedy, the critical-step budget lifted."""
    greedy = SamplingConfig(temperature=0.0)
    rc = dataclasses.replace(job.parl.rollout, budget=None, orch_sampling=greedy, worker_sampling=greedy)
    return TextSwarm(task, cfg, rc, chunk=job.parl.chunk, wide_rows=job.parl.wide_rows,
                     buckets=job.parl.buckets)


def evaluate_text_checkpoint(job: TextPARLJob, workdir: str, *, which: str = "latest") -> dict:
    """Evaluate a PARL checkpoint of the text run in ``workdir`` (``which``: "latest",
    "best" or a PARL step) and its frozen warm start, greedy with the budget lifted, on
    ``job.eval_episodes`` held-out tasks per size of ``job.eval_sizes`` (the run's own
    seed stream: the first ``eval_episodes`` of the run's are the same tasks). Opens the
    checkpoints read-only. Returns ``{"step", "warm_start": {n: row}, "final": {n: row},
    "headline"}`` (:func:`text_parl_table` prints it)."""
    job.validate()
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        raise ValueError(f"no checkpoints in {workdir}")
    task = build_task(job, workdir, train=False)
    cfg = job.model.replace(vocab_size=task.chat.tokenizer.vocab_size)
    learner = Learner(cfg, job.parl.update)
    shapes = jax.eval_shape(lambda: learner.init(p := init_params(cfg, jax.random.key(0)), {"workers": p}))
    with Checkpointer(directory, save_every=1, read_only=True) as ckpt:
        step = ckpt.step_of(which)
        state, meta = ckpt.restore(step, abstract_state(shapes, jax.sharding.SingleDeviceSharding(jax.devices()[0])))
    made = meta.get("identity", {})
    differ = [k for k in ("model", "env", "tokenizer", "seed") if made.get(k) != job.warm_identity()[k]]
    if differ:
        raise ValueError(f"the checkpoint in {workdir} was made by a job with another {', '.join(differ)}")
    swarm = greedy_swarm(job, task, cfg)
    tests, key, warm = eval_episodes(job), jax.random.fold_in(jax.random.key(job.seed), 1), state.frozen["workers"]
    out = {"step": step, "warm_start": evaluate(swarm, warm, warm, tests, key),
           "final": evaluate(swarm, state.params, warm, tests, key)}
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
    line = (f"\nat n = {h['n']}: critical steps {h['critical_reduction']:.2f}x below the warm start, "
            f"item-F1 {h['item_f1']:.3f}")
    if "n1_no_spawn" in h:
        line += f"; n = 1 episodes without a sub-agent: {h['n1_no_spawn']:.2f}"
    return summary_table(summary) + line
