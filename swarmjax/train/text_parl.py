"""PARL in real text, the pieces: the job's configs, its tasks, the two-role warm start
and the evaluation table (the job that runs them, with checkpoints and resume:
:mod:`swarmjax.train.text_parl_job`, ``swarmjax train --config
configs/parl_widesearch_text_cpu.py --workdir runs/text``).

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
   (:class:`~swarmjax.swarm.text_engine.TextSwarm` behind
   :class:`~swarmjax.train.engines.DeviceEngine`: tool calls parsed and answered on the
   device; the orchestrator trained, the sub-agents frozen at the warm start), then the
   RL step of every text job (:func:`swarmjax.train.agent_rl.rl_step`: the PARL reward
   :func:`swarmjax.rl.parl.parl_reward` from the rollout's counts, group advantages, one
   :class:`~swarmjax.rl.update.Learner` update on exactly the rollout's ids, loss mask
   and sampler log-probs).
   The warm start is saved to ``workdir/warm_start/`` (:mod:`swarmjax.train.warm_start`);
   ``warm_start_from=<workdir>`` reuses one made with the same model, SFT config, task,
   tokenizer and seed (PARL ablations skip the demonstrations and the SFT).
4. **Evaluation** (:func:`swarmjax.train.agent_eval.evaluate`: greedy, both roles, budget
   lifted, held-out tasks from seed streams of their own), per task size
   (:func:`size_rows`): item-F1, critical / total steps, sub-agents, the no-spawn
   fraction. The **validation** split every ``eval_every`` PARL steps and at the end
   (the checkpoints' score: the best one), the **test** split for the warm start and
   the final policy (the summary's table): ``eval.jsonl``, ``summary.json`` /
   ``summary.md``, ``curves.png``.

"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax
import numpy as np

from swarmjax.envs.widesearch import Episode, WideSearchConfig
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.trajectory import shared_head
from swarmjax.rl.update import UpdateConfig
from swarmjax.sharding.mesh import MeshConfig
from swarmjax.swarm.text_types import SwarmConfig, TextRolloutConfig
from swarmjax.text.chat import CHAT_FORMATS
from swarmjax.train.agent import TextRLConfig
from swarmjax.train.demos import Demos
from swarmjax.train.distributed import check_processes
from swarmjax.train.sft import RoleRows, sft_step, warm_start_loop


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
class TextPARLConfig(TextRLConfig):
    """The PARL stage (module docstring, 3.): :class:`~swarmjax.train.agent.TextRLConfig`
    (steps, groups, advantage, dynamic sampling, the reward's ``parl`` / ``turn_cost`` /
    ``overlong`` terms, the learner's and the rollout's settings) with PARL's defaults, plus:

    focus_fraction, focus_min_n: the share of each step's tasks drawn with n >= focus_min_n.
    swarm: the jitted swarm's settings; ``episode_keys`` off by default (the published
      runs' sampling: one key a tick for the batch; several processes need it on).
    """

    steps: int = 100
    parl: PARLConfig | None = PARLConfig(parallel="parallel", parallel_target=16, critical_cost=0.004)
    update: UpdateConfig = UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4)
    rollout: TextRolloutConfig = TextRolloutConfig(orch_context=2048, worker_context=384, max_turn_tokens=640,
                                                   subagent_turns=4, budget=None)
    focus_fraction: float = 0.5
    focus_min_n: int = 12
    swarm: SwarmConfig = SwarmConfig(episode_keys=False)
    bucket: int = 256
    head_multiple: int = 64

    def __post_init__(self):
        super().__post_init__()
        if self.parl is None:
            raise ValueError("a text PARL stage needs its PARL reward (parl=PARLConfig(...))")
        if min(self.tasks_per_step, self.group_size) < 1:
            raise ValueError("parl tasks_per_step and group_size must be >= 1")
        if not 0.0 <= self.focus_fraction <= 1.0:
            raise ValueError(f"focus_fraction must be in [0, 1], got {self.focus_fraction}")


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
    log_every: int = 10                    # PARL steps between log lines when progress bars are off
    seed: int = 0
    parl_seed: int | None = None           # the PARL stage's tasks and sampling (None: seed); seeds of the
                                           # RL stage can share one warm start (tokenizer and held-out tasks: seed)
    warm_start_from: str | None = None     # a workdir whose warm start to reuse (skips demos and SFT)
    warm_start_match: tuple[str, ...] = ("model", "sft", "env", "tokenizer", "seed")
    mesh: MeshConfig | None = None         # the warm start's, the learner's and the swarm's (data, fsdp, tensor)
                                           # mesh over this process's devices (None: one device)

    def warm_identity(self) -> dict[str, str]:
        """What determines the warm start (:mod:`swarmjax.train.warm_start`): model, SFT
        config, task, tokenizer (it is retrained from the task's corpus) and seed."""
        return {"model": repr(self.model), "sft": repr(self.sft), "env": repr(self.env),
                "tokenizer": repr((self.chat, self.tokenizer_vocab, self.max_calls, self.max_mentions,
                                   self.max_pairs)), "seed": repr(self.seed)}

    def identity(self) -> dict[str, str]:
        """What a run computes, as reprs: a run may be resumed with another PARL step
        count, evaluation cadence, warm-start source (the same warm start, by its identity
        check) or mesh, not with another model, task, tokenizer, warm start, PARL
        configuration, seed or held-out set (``log_every`` may change too)."""
        same = dataclasses.replace(self, parl=dataclasses.replace(self.parl, steps=0), eval_every=0, log_every=0,
                                   parl_seed=self.seed if self.parl_seed is None else self.parl_seed,
                                   warm_start_from=None, warm_start_match=())
        return {f.name: repr(getattr(same, f.name)) for f in dataclasses.fields(same) if f.name != "mesh"}

    def validate(self) -> None:
        if self.chat not in CHAT_FORMATS:
            raise ValueError(f"unknown chat format {self.chat!r}; known: {sorted(CHAT_FORMATS)}")
        if self.eval_episodes < 1 or self.tokenizer_vocab < 300 or min(self.eval_every, self.log_every) < 0:
            raise ValueError("eval_episodes must be >= 1, tokenizer_vocab >= 300 (bytes + merges), eval_every and "
                             "log_every >= 0")
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
        self.parl.async_rollout.check(jax.device_count(), jax.process_count())
        check_processes(self.mesh, ("parl.tasks_per_step", self.parl.tasks_per_step), [
            ("parl.swarm.episode_keys=True (each process samples its episodes as one process would)",
             not self.parl.swarm.episode_keys)])
        if self.mesh is not None:
            self.mesh.check_batches(jax.device_count(), {
                "parl.tasks_per_step x parl.group_size": self.parl.tasks_per_step * self.parl.group_size,
                "sft.batch": self.sft.batch})


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


EVAL_STREAMS = {"validation": "validation", "test": "eval"}     # split -> its seed stream's prefix


def eval_episodes(job: TextPARLJob, split: str = "test") -> dict[int, list[Episode]]:
    """``eval_episodes`` held-out tasks per size of ``split`` ("validation": the periodic
    evaluations and the best checkpoint; "test": the warm start's and the final table),
    each split from a seed stream of its own that the training tasks never use (tables of
    E values out of V: 32^32 of them, so no training table repeats)."""
    if split not in EVAL_STREAMS:
        raise ValueError(f"unknown split {split!r}; known: {sorted(EVAL_STREAMS)}")
    return {n: [Episode.sample(job.env, random.Random(f"{EVAL_STREAMS[split]}-{job.seed}-{n}-{i}"), n)
                for i in range(job.eval_episodes)] for n in job.eval_sizes}


# ------------------------------------------------------------------------ warm start


def warm_start(params: Any, cfg: ModelConfig, orch: Demos, work: Demos, scfg: RelayWarmStartConfig, seed: int,
               on_step: Callable[[int, dict[str, float]], None] | None = None, *, mesh: Any = None) -> Any:
    """Both roles each step: ``batch`` orchestrator rows of one length bucket and
    ``batch`` sub-agent rows (cut to their longest), loss = orchestrator NLL + sub-agent
    NLL (per-role means over the agent's own ids: the one warm-start step,
    :func:`swarmjax.train.sft.sft_step`, with two roles; QK-Clip after it with
    ``optim.qk_clip_tau > 0``). Each role's rows open with the same ids (system turn,
    tool schemas: ~540 of an orchestrator's ~1000): that head runs once per step
    (:func:`~swarmjax.train.sft.prefix_role_stats`, the same loss and gradients).
    ``mesh``: the params, optimizer state and rows over it (:func:`~swarmjax.train.sft.sft_step`).
    Metrics: loss, ``orch_nll``/``orch_acc``/``worker_nll``/``worker_acc`` (and
    ``max_attn_logit``, ``qk_clip_heads`` with QK-Clip)."""
    heads = tuple(jnp.asarray(d.tokens[0, :shared_head(d.tokens, d.token_mask, d.loss_mask)]) for d in (orch, work))
    params, opt_state, step = sft_step(params, cfg, scfg.optim, heads=heads, mesh=mesh)
    W = int(work.token_mask.sum(1).max())              # sub-agent rows: cut to the longest
    roles = (RoleRows(orch, scfg.batch, scfg.bucket, bucketed=True, head=len(heads[0])),
             RoleRows(work, scfg.batch, W, head=len(heads[1])))
    return warm_start_loop(params, step, opt_state, roles, scfg.steps, np.random.default_rng(seed), on_step,
                           mesh=mesh)


# ------------------------------------------------------------------------ evaluation


def size_rows(per_episode: dict[str, np.ndarray], sizes: np.ndarray, seconds: float = 0.0
              ) -> dict[int, dict[str, float]]:
    """The evaluation table's rows per task size n from the episodes' figures
    (:func:`swarmjax.train.agent_eval.evaluate`; ``sizes`` [N] each episode's n): ``item_f1``
    (the verifier's score), ``critical_steps``, ``total_steps``, ``subagents``,
    ``finished_subagents``, ``no_spawn_fraction``, ``answered`` (means over the tasks),
    ``seconds`` (``seconds``, each size its share by episodes)."""
    out = {}
    for n in dict.fromkeys(sizes.tolist()):
        a = {k: v[sizes == n] for k, v in per_episode.items()}
        out[int(n)] = {"item_f1": float(np.mean(a["accuracy"])), "critical_steps": float(np.mean(a["critical_steps"])),
                       "total_steps": float(np.mean(a["total_steps"])), "subagents": float(np.mean(a["subagents"])),
                       "finished_subagents": float(np.mean(a["finished_subagents"])),
                       "no_spawn_fraction": float(np.mean(a["subagents"] == 0)),
                       "answered": float(np.mean(a["answered"])), "seconds": seconds * float(np.mean(sizes == n))}
    return out
