"""The stages of every text job, for any task plug-in (:mod:`swarmjax.envs.task`): the
warm start on played demonstrations, the reward, the RL step and the greedy evaluation,
on either rollout engine (:mod:`swarmjax.train.engines`: the host-driven
``TextRollout`` that runs any task's Python tools, or the jitted ``TextSwarm``). The
jobs that run them with checkpoints and resume: :mod:`swarmjax.train.agent_job` (any
task, host engine) and :mod:`swarmjax.train.text_parl_job` (the relay task's device
twin, device engine).

Roles: a single agent, or an orchestrator whose sub-agents are **frozen** (a copy of
the params taken when RL starts, carried in ``TrainState.frozen["subagents"]`` and never
updated) or **shared** (the params being trained: their sampled ids join the loss as
rows of their own, with per-role advantages).

Reward of an episode (:func:`episode_rewards`), with ``r_perf`` the verifier's term
(0 for an episode that never answered: ended by its context or budget)::

    r = r_perf - turn_cost * orchestrator turns (+ DAPO's overlong penalty)
    orchestrator with ``parl``: r_perf is replaced by the PARL reward
        (swarmjax.rl.parl.parl_reward: r_parallel, r_finish, step and critical costs)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.api import Played, play
from swarmjax.envs.task import ROLES, EnvContext, demonstration, make_env, reward_terms
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.advantages import compute_advantages, overlong_penalty, uniform_groups
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig, parl_reward
from swarmjax.rl.trajectory import TrajectoryBatch, shared_head
from swarmjax.rl.update import Learner, TrainState, UpdateConfig, check_group_batch
from swarmjax.swarm.text_rollout import END_ANSWER, END_CONTEXT, TextRolloutConfig, TextRolloutResult
from swarmjax.train.async_rl import AsyncConfig
from swarmjax.train.demos import Demos, pack_rows
from swarmjax.train.subagents import SubagentRefresh
from swarmjax.train.distributed import allgather, global_rows, local_replica, share
from swarmjax.train.engines import Engine
from swarmjax.train.sft import RoleRows, sft_step, warm_start_loop

SUBAGENTS = ("frozen", "shared")
OVERLONG = ("error", "skip")           # what the warm start does with a demonstration longer than its context
SEGMENT_WEIGHTS = ("segment", "episode")


@dataclasses.dataclass(frozen=True)
class TextSFTConfig:
    """The warm start: ``steps`` batches of ``batch`` rows from ``demos`` played
    episodes (every agent's conversation a row), cut to a multiple of ``bucket``.

    mix: more ways of working whose demonstrations of the same problems join the job's
      own (:func:`demonstrations`), each ``"single"`` or ``"orchestrator"``, with
      ``"+summary"`` for the ``summarize`` tool (e.g. ``("single+summary",
      "orchestrator")``): one policy for several roles and context strategies.
    overlong: a demonstration with a conversation longer than its context: ``"error"``,
      or ``"skip"`` (left out; the agent job prints the count and keeps it in its summary,
      ``warm_start_data``).
    """

    steps: int = 600
    batch: int = 32
    demos: int = 4096
    bucket: int = 64
    optim: OptimConfig = OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=600)
    mix: tuple[str, ...] = ()
    overlong: str = "error"

    def __post_init__(self):
        if min(self.steps, self.batch, self.demos, self.bucket) < 1:
            raise ValueError("sft steps, batch, demos and bucket must be >= 1")
        if self.overlong not in OVERLONG:
            raise ValueError(f"unknown sft.overlong {self.overlong!r}; known: {', '.join(OVERLONG)}")
        for way in self.mix:
            mix_context(way, None)


def mix_context(way: str, ctx: EnvContext | None) -> EnvContext | None:
    """The :class:`EnvContext` of a ``TextSFTConfig.mix`` entry (``"<role>[+summary]"``)
    over ``ctx``'s chat and runner (None: only check the entry)."""
    role, _, extra = way.partition("+")
    if role not in ROLES or extra not in ("", "summary"):
        raise ValueError(f"unknown sft.mix entry {way!r}: '<role>' or '<role>+summary' with role in {', '.join(ROLES)}")
    return None if ctx is None else dataclasses.replace(ctx, role=role, summarize=extra == "summary")


@dataclasses.dataclass(frozen=True)
class OverlongConfig:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, section 3.4).

    With ``L`` the tokens the policy sampled in an episode (all its orchestrator turns:
    the ones the loss trains on), ``L_max = max_length`` and ``L_cache = cache_length``::

        0                                  if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max   (0 -> -1)
        -1                                 if L > L_max
    """

    max_length: int = 256
    cache_length: int = 64

    def __post_init__(self):
        if not 0 < self.cache_length <= self.max_length:
            raise ValueError(f"overlong: need 0 < cache_length ({self.cache_length}) <= "
                             f"max_length ({self.max_length})")


@dataclasses.dataclass(frozen=True)
class TextRLConfig:
    """The RL stage.

    steps, tasks_per_step, group_size: RL steps; problems per step; rollouts per problem
      (one advantage group).
    advantage: estimator, a key of :data:`swarmjax.rl.advantages.ADVANTAGES`.
    dynamic_sampling: groups whose rewards are all equal get no loss tokens (DAPO).
    turn_cost: reward -= turn_cost * orchestrator turns.
    overlong: DAPO's soft overlong penalty on each episode's sampled-token count (None: off).
    parl: the PARL reward for orchestrators (None: ``r_perf`` alone); its
      ``r_parallel`` form must be one whose counts the task's verifier reports
      (``"spawned"`` needs none).
    update, rollout: the learner's and the rollout's settings.
    bucket: learner rows are cut to a multiple of this length (one compile each).
    head_multiple: the ids every learner row opens with (system turn, tool schemas) run
      once per forward (``Learner.update(head=)``), cut to a multiple of this; 0: off.
    segment_weight: how the rows of an episode a context strategy split into K + 1
      segments count in the loss (:func:`segment_weights`): ``"segment"`` (each a row of
      weight 1, as ReSum-GRPO trains them) or ``"episode"`` (each 1 / (K + 1): under a
      per-sequence aggregation the episode counts as much as one that never compacted).
    async_rollout: rollouts overlapped with updates (:mod:`swarmjax.train.async_rl`;
      depth 0: roll out, then update).
    refresh_subagents: when frozen sub-agents become a copy of the policy
      (:mod:`swarmjax.train.subagents`; default never).
    """

    steps: int = 60
    tasks_per_step: int = 8
    group_size: int = 8
    advantage: str = "grpo"
    dynamic_sampling: bool = True
    turn_cost: float = 0.0
    overlong: OverlongConfig | None = None
    parl: PARLConfig | None = None
    update: UpdateConfig = UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                        optim=OptimConfig(learning_rate=3e-4))
    rollout: TextRolloutConfig = TextRolloutConfig(orch_context=512, worker_context=256, max_turn_tokens=48,
                                                   worker_lanes=8, subagent_turns=3)
    bucket: int = 64
    head_multiple: int = 0
    segment_weight: str = "segment"
    async_rollout: AsyncConfig = AsyncConfig()
    refresh_subagents: SubagentRefresh = SubagentRefresh()

    def __post_init__(self):
        if self.segment_weight not in SEGMENT_WEIGHTS:
            raise ValueError(f"unknown segment_weight {self.segment_weight!r}; known: {', '.join(SEGMENT_WEIGHTS)}")
        if self.bucket < 1 or self.head_multiple < 0:
            raise ValueError(f"bucket must be >= 1 and head_multiple >= 0, got {self.bucket}, {self.head_multiple}")
        if min(self.steps, self.tasks_per_step, self.group_size) < 0:
            raise ValueError("rl steps, tasks_per_step and group_size must be >= 0")
        check_group_batch(self.advantage, self.tasks_per_step, self.group_size, self.update)
        if self.async_rollout.rollout_devices > 1:
            raise ValueError("a text rollout decodes on one device: async_rollout.rollout_devices must be 0 or 1")


# ------------------------------------------------------------------------ warm start


def demonstrations(task: Any, problems: list, ctx: EnvContext, rng: np.random.Generator,
                   limits: TextRolloutConfig | None = None, *, mix: Sequence[EnvContext] = (),
                   overlong: str = "error") -> Demos | None:
    """Every agent's conversation of the task's demonstrations of ``problems`` in
    ``ctx.role`` (with the ``summarize`` tool when ``ctx.summarize``: each segment of a
    conversation a summary restarted is a row of its own), played through fresh
    environments (:func:`swarmjax.envs.api.play`: the ids a rollout that sampled those
    turns builds), as rows [N, T] right-padded with the pad id; None when the task has no
    demonstrations for the role. ``mix``: more contexts (another role, the ``summarize``
    tool) whose demonstrations of the same problems join the rows: one policy warm-started
    for several ways of working.

    With ``limits`` (the RL rollout's config) a turn longer than ``max_turn_tokens`` is an
    error (the rollout could never produce it), and so is a conversation longer than its
    role's context, unless ``overlong="skip"``: then that demonstration is left out and
    counted (``Demos.skipped``)."""
    if overlong not in OVERLONG:
        raise ValueError(f"unknown overlong {overlong!r}; known: {', '.join(OVERLONG)}")
    rows, skipped = [], 0
    for c in (ctx, *mix):
        for p in problems:
            demo = demonstration(task, p, c.chat, rng, c.role, summarize=c.summarize)
            if demo is None:
                continue
            if limits is not None:
                longest = max(len(t) for t in [*demo.turns, *(t for w in demo.workers for t in w)])
                if longest > limits.max_turn_tokens:
                    raise ValueError(f"a demonstration turn holds {longest} ids, more than rl.rollout."
                                     f"max_turn_tokens={limits.max_turn_tokens}: the rollout would cut it; raise it")
            mine, over = _played_rows(play(make_env(task, p, c), p, demo.turns, workers=demo.workers), limits,
                                      role=c.role)
            if over is not None and overlong == "error":
                raise ValueError(f"a demonstration's {over}: raise it, or summarise sooner, or set sft.overlong="
                                 "'skip' (nothing is cut)")
            skipped += over is not None
            rows += mine if over is None else []
    if not rows:
        return None
    pad = int(ctx.chat.ids[ctx.chat.pad_token][0])
    return pack_rows(rows, max(len(ids) for ids, _ in rows), pad=pad, skipped=skipped)


def _played_rows(played: Played, limits: TextRolloutConfig | None, *, role: str = "orchestrator"
                 ) -> tuple[list, str | None]:
    """The (ids, own-ids mask) rows of a played demonstration (every agent, every segment)
    and, when one exceeds its role's context in ``limits``, what (else None; the top
    agent named by its ``role``: "single" or "orchestrator")."""
    rows, over, stack = [], None, [(played, True)]
    while stack:
        agent, orch = stack.pop()
        context = None if limits is None else limits.orch_context if orch else limits.worker_context
        for ids, mask in [*agent.segments, (agent.ids, agent.mask)]:         # each segment a row of its own
            if context is not None and len(ids) > context and over is None:
                who = ("single agent's" if role == "single" else "orchestrator") if orch else "sub-agent"
                over = (f"{who} conversation holds {len(ids)} ids, more than "
                        f"its context ({context}, rl.rollout.{'orch' if orch else 'worker'}_context)")
            rows.append((ids, mask))
        stack.extend((sub, False) for sub in agent.subagents)
    return rows, over


def warm_start(params: Any, cfg: ModelConfig, data: Demos, scfg: TextSFTConfig, seed: int,
               on_step: Callable[[int, dict], None] | None = None, *, mesh: Any = None) -> Any:
    """Masked next-token training on ``data`` (the agent's own ids) with the one
    warm-start step (:func:`swarmjax.train.sft.sft_step`, one role ``"agent"``: metrics
    ``loss``, ``agent_acc``; QK-Clip after every step with ``optim.qk_clip_tau > 0``):
    batches of ``batch`` rows drawn uniformly, cut to the longest row's length bucket (a
    multiple of ``bucket``).

    ``mesh``: params and optimizer state sharded as the learner shards them, batch rows
    over the data axes (every process passes the same ``params`` and ``data``, and they
    step together). Returns the params (sharded over ``mesh`` when given)."""
    params, opt_state, step = sft_step(params, cfg, scfg.optim, roles=("agent",), mesh=mesh)
    return warm_start_loop(params, step, opt_state, (RoleRows(data, scfg.batch, scfg.bucket),), scfg.steps,
                           np.random.default_rng(seed), on_step, mesh=mesh)


# ------------------------------------------------------------------------ RL


def subagent_params(state: TrainState) -> Any:
    """The params the sub-agents decode with: the frozen copy ``state.frozen["subagents"]``
    when the state has one, else the trained ones (co-trained sub-agents; a single agent
    has none)."""
    return state.frozen["subagents"] if state.frozen and "subagents" in state.frozen else state.params


def episode_rewards(res: TextRolloutResult, rcfg: TextRLConfig, step: int = 0
                    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Reward [B] of each episode of ``res`` and its channels [B] (module docstring).
    ``L`` of the overlong penalty is ``res.loss_mask.sum(1)``, the ids the policy sampled."""
    B = len(res.length)
    terms = reward_terms(res.rewards, B)
    channels: dict[str, np.ndarray] = {"r_perf": terms["r_perf"],
                                       **{k: terms[k] for k in terms if k == "r_verifier" or k.startswith("judge")}}
    base = terms["r_perf"]
    if rcfg.parl is not None:
        counts = {k: terms[k] for k in ("novel", "returned", "parallel", "n") if k in terms}
        base, parl = parl_reward(jnp.asarray(terms["r_perf"]), jnp.asarray(res.spawned), jnp.asarray(res.finished),
                                 jnp.asarray(res.total_steps), jnp.asarray(step, jnp.int32), rcfg.parl, counts,
                                 critical_steps=jnp.asarray(res.critical_steps))
        base = np.asarray(base)
        channels.update({k: np.asarray(v) for k, v in parl.items() if k != "r_perf"})
    reward = base - rcfg.turn_cost * res.orch_steps
    if rcfg.overlong is not None:
        sampled = np.asarray(res.loss_mask).sum(axis=1)
        reward = reward + np.asarray(overlong_penalty(sampled, rcfg.overlong.max_length, rcfg.overlong.cache_length))
    return np.asarray(reward), channels


def _trace_rows(traces: list[tuple[int, dict[str, np.ndarray]]], count: int, reward: np.ndarray,
                groups: np.ndarray, keep: np.ndarray, multiple: int) -> dict[str, np.ndarray]:
    """Conversations (episode b, :meth:`~swarmjax.swarm.text_types.AgentTrace.arrays`) as
    training rows: ids, the conversation's own sampled ids as the loss mask (none in a
    group dynamic sampling dropped), the sampler's log-probs, the episode's reward and
    group; padded with empty rows (groups of their own) to ``count`` rounded up to a
    multiple of ``multiple``. The caller adds the advantages."""
    S = -(-count // multiple) * multiple
    W = max([len(a["ids"]) for _, a in traces], default=1)
    out = {"tokens": np.zeros((S, W), np.int32), "token_mask": np.zeros((S, W), bool),
           "loss_mask": np.zeros((S, W), bool), "logprobs": np.zeros((S, W), np.float32),
           "reward": np.zeros((S,), np.float32), "group": groups.max() + 1 + np.arange(S, dtype=groups.dtype)}
    for i, (b, a) in enumerate(traces):
        n = len(a["ids"])
        out["tokens"][i, :n], out["token_mask"][i, :n] = a["ids"], True
        out["loss_mask"][i, :n] = a["sampled"] & bool(keep[b])
        out["logprobs"][i, :n] = a["logprobs"]
        out["reward"][i], out["group"][i] = reward[b], groups[b]
    return out


def segment_weights(segments: np.ndarray, mode: str) -> np.ndarray:
    """The loss weight [B] of each row of an episode whose conversation a context strategy
    split into ``segments`` [B] + 1 rows (:mod:`swarmjax.swarm.context`): 1 (``"segment"``)
    or ``1 / (segments + 1)`` (``"episode"``).

    The weight is folded into the advantage: the clipped objectives are positively
    homogeneous in it (``min(r wA, clip(r) wA) = w min(r A, clip(r) A)`` for ``w > 0``, per
    token and per sequence), so the row's term of ``J`` is scaled by exactly ``w``. With
    the per-sequence aggregations (``seq_mean_token_mean``: GRPO, GSPO)::

        J = sum_b w_b sum_{s <= K_b} mean_t o_{b,s,t} / N_rows

    ``"episode"`` makes an episode's rows weigh 1 together, the normaliser ``N_rows``
    still counts rows; with ``token_mean`` (DAPO) every token counts once whatever the
    split, so ``"segment"`` is the one that keeps that. A ``kl_beta`` penalty is not
    weighted. An episode without a compaction has weight 1 under both: exactly the plain
    GRPO / GSPO row."""
    segments = np.asarray(segments)
    if mode not in SEGMENT_WEIGHTS:
        raise ValueError(f"unknown segment_weight {mode!r}; known: {', '.join(SEGMENT_WEIGHTS)}")
    return np.ones(segments.shape, np.float32) if mode == "segment" else (1.0 / (segments + 1)).astype(np.float32)


def _segment_rows(res: TextRolloutResult, adv: np.ndarray, reward: np.ndarray, groups: np.ndarray,
                  keep: np.ndarray, multiple: int) -> dict[str, np.ndarray] | None:
    """The orchestrators' earlier segments (a context strategy compacted their episodes:
    :mod:`swarmjax.swarm.context`) as training rows of their own (:func:`_trace_rows`)
    with their episode's advantage (group statistics are over episodes; every segment of
    an episode shares its advantage, as ReSum-GRPO does). The same row count on every
    process; None when no process has any."""
    segs = res.segment_rows()
    count = int(allgather(np.asarray([len(segs)], np.int64)).max())
    if count == 0:
        return None
    out = _trace_rows(segs, count, reward, groups, keep, multiple)
    out["advantages"] = np.zeros(out["reward"].shape, np.float32)
    out["advantages"][:len(segs)] = adv[[b for b, _ in segs]]
    return out


def _subagent_rows(res: TextRolloutResult, reward: np.ndarray, groups: np.ndarray, keep: np.ndarray, rcfg: TextRLConfig,
                   multiple: int) -> dict[str, np.ndarray] | None:
    """The sub-agents' conversations as training rows (co-trained sub-agents,
    :func:`_trace_rows`) with per-role advantages (the episode rewards normalised over
    the sub-agent rows of each group). None without sub-agents."""
    traces = [(b, t.arrays()) for b, subs in enumerate(res.subagents) for t in subs]
    if not traces:
        return None
    out = _trace_rows(traces, len(traces), reward, groups, keep, multiple)
    n = len(traces)
    out["advantages"] = np.zeros(out["reward"].shape, np.float32)
    out["advantages"][:n] = np.asarray(compute_advantages(rcfg.advantage, jnp.asarray(out["reward"][:n]),
                                                          jnp.asarray(out["group"][:n])))
    return out


def rl_step(learner: Learner, state: TrainState, engine: Engine, problems: list, key: jax.Array,
            rcfg: TextRLConfig, *, step: int = 0, subagents: str = "frozen") -> tuple[TrainState, dict[str, float]]:
    """One RL step on ``problems`` (each rolled out ``group_size`` times by ``engine``,
    :mod:`swarmjax.train.engines`): :func:`collect` with the state's params, then
    :func:`learn`. Returns the new state and the step's metrics: the episodes'
    :func:`episode_figures`, reward channels, the rollout's counts (:data:`COUNTS`),
    timings and the learner's figures (``learner/``).

    With several processes every one passes the same ``problems``, rolls out its share
    (whole groups; its tools run locally) with a local copy of the params, and the
    learner updates on the global batch. Episode ``e`` of the step draws the same tokens
    whichever process runs it (host engine), so the metrics are those of one process
    (the ``segments`` count aside: each process decodes its own)."""
    orch, workers = _rollout_params(state.params, subagent_params(state), learner.mesh)
    return learn(learner, state, collect(engine, orch, workers, problems, key, rcfg, step=step,
                                         subagents=subagents, mesh=learner.mesh))


class TextCollected(NamedTuple):
    """A rolled-out, rewarded text batch waiting for the learner (this process's rows)."""

    batch: TrajectoryBatch       # [R, W] host rows (orchestrator, segment and sub-agent rows)
    head: Any                    # [P] ids every row opens with, or None
    metrics: dict[str, float]    # the step's figures but the learner's and update_s


def collect(engine: Engine, params: Any, worker_params: Any, problems: list, key: jax.Array, rcfg: TextRLConfig,
            *, step: int = 0, subagents: str = "frozen", mesh: Any = None) -> TextCollected:
    """The rollout half of :func:`rl_step`: this process's share of ``problems`` rolled
    out ``group_size`` times with ``params`` (sub-agents: ``worker_params``), rewarded
    (:func:`episode_rewards`) as step ``step``, group advantages, the learner's rows on
    exactly the rollout's ids, loss mask and sampler log-probs; a context strategy's
    earlier segments are rows of their own with their episode's advantage
    (:func:`_segment_rows`; weighted by ``rcfg.segment_weight``). Rows are cut to a
    multiple of ``rcfg.bucket`` ids (few shapes to compile); with ``rcfg.head_multiple``
    the ids every row opens with run once per forward (``Learner.update(head=)``)."""
    G = rcfg.group_size
    start, stop = share(len(problems))
    mine = problems[start:stop]
    episodes = [p for p in mine for _ in range(G)]
    t0 = time.perf_counter()
    res = engine(params, worker_params, episodes, key, episode_ids=range(start * G, stop * G))
    t1 = time.perf_counter()
    reward, channels = episode_rewards(res, rcfg, step)
    local = np.repeat(np.arange(len(mine)), G)
    groups = local + start
    adv = np.asarray(compute_advantages(rcfg.advantage, jnp.asarray(reward), jnp.asarray(local)))
    adv = adv * segment_weights([len(t.segments) for t in res.orchestrators], rcfg.segment_weight)
    signal = ~np.asarray(uniform_groups(jnp.asarray(reward), jnp.asarray(local)))   # rewards differ in the group
    keep = signal if rcfg.dynamic_sampling else np.ones(len(episodes), bool)
    L = int(allgather(res.length.max(initial=1)[None]).max())           # one width on every process
    rows = {"tokens": res.tokens[:, :L], "token_mask": np.arange(L)[None] < res.length[:, None],
            "loss_mask": res.loss_mask[:, :L] & keep[:, None], "logprobs": res.logprobs[:, :L],
            "advantages": adv, "group": groups, "reward": reward}
    segs = _segment_rows(res, adv, reward, groups, keep, rcfg.update.splits)
    if segs is not None:
        rows = _stack_rows(rows, segs)
    subs = _subagent_rows(res, reward, groups, keep, rcfg, rcfg.update.splits) if subagents == "shared" else None
    if subs is not None:
        rows = _stack_rows(rows, subs)
    W = rows["tokens"].shape[1]
    W = min(-(-W // rcfg.bucket) * rcfg.bucket, max(W, res.tokens.shape[1]))   # few distinct widths to compile
    rows = {k: _pad_to(v, W) if v.ndim == 2 else v for k, v in rows.items()}
    P = _shared_head(rows, rcfg.head_multiple) if rcfg.head_multiple else 0
    batch = TrajectoryBatch.create(rows["tokens"], rows["loss_mask"], rows["advantages"],
                                   token_mask=rows["token_mask"], sampler_logprobs=rows["logprobs"],
                                   group_ids=rows["group"], rewards=rows["reward"])
    head, batch = batch.split_head(P) if P else (None, batch)
    per_episode = allgather({"reward": reward.astype(np.float32), "kept_groups": keep.astype(np.float32),
                             "signal_groups": signal.astype(np.float32),
                             "orch_sampled_tokens": res.loss_mask.sum(axis=1).astype(np.float32),
                             **episode_figures(res), **{f"reward/{k}": np.asarray(v, np.float32)
                                                        for k, v in channels.items()
                                                        if k != "r_perf" or "r_verifier" in channels}})
    metrics = {**mean_figures(per_episode), **_rollout_counts(res), "rollout_s": t1 - t0, "update_s": 0.0,
               "subagent_rows": 0 if subs is None else int((subs["group"] < stop).sum())}
    if rcfg.parl is not None:                       # how the episodes that delegated did against the rest
        spawned = per_episode["subagents"] > 0
        metrics.update(spawned_accuracy=_mean_where(per_episode["accuracy"], spawned),
                       serial_accuracy=_mean_where(per_episode["accuracy"], ~spawned))
    if rcfg.head_multiple:
        metrics["shared_head"] = P
    return TextCollected(batch, head, metrics)


def learn(learner: Learner, state: TrainState, collected: TextCollected) -> tuple[TrainState, dict[str, float]]:
    """The update half of :func:`rl_step`: one learner update on the global batch of
    every process's collected rows; the step's metrics with ``update_s`` and the
    learner's figures (``learner/``)."""
    t1 = time.perf_counter()
    state, learn_m = learner.update(state, global_rows(collected.batch, learner.mesh), head=collected.head)
    learn_m = jax.device_get(learn_m)
    metrics = dict(collected.metrics, update_s=time.perf_counter() - t1)
    metrics.update({f"learner/{k}": float(np.mean(v)) for k, v in learn_m.items()})
    return state, metrics


# a rollout's counts (TextRolloutResult.stats) in the step's metrics: how they combine over processes
COUNTS = {"segments": np.max, "sampled_tokens": np.sum, "cut_by_max_ticks": np.sum, "ticks": np.max,
          "judge_unparseable": np.sum}


def _rollout_counts(res: TextRolloutResult) -> dict[str, int]:
    """The rollout's counts (:data:`COUNTS` the engine reports), combined over processes."""
    keys = [k for k in COUNTS if k in res.stats]
    if not keys:
        return {}
    got = allgather(np.asarray([[res.stats[k] for k in keys]], np.int64))
    return {k: int(COUNTS[k](got[:, i])) for i, k in enumerate(keys)}


def _mean_where(x: np.ndarray, mask: np.ndarray) -> float:
    """Mean of ``x`` over ``mask`` (-1 when empty: a JSON-safe "none")."""
    return float(np.mean(x[mask])) if mask.any() else -1.0


def _shared_head(rows: dict[str, np.ndarray], multiple: int) -> int:
    """:func:`~swarmjax.rl.trajectory.shared_head` of the global batch's rows: the local
    rows' head, cut to what the first rows of every process share."""
    P = shared_head(rows["tokens"], rows["token_mask"], rows["loss_mask"], multiple=multiple)
    if jax.process_count() == 1:
        return P
    firsts = allgather(np.asarray(rows["tokens"][:1]))                 # [procs, W]
    heads = allgather(np.asarray([P], np.int64))
    same = np.all(firsts == firsts[:1], axis=0)
    common = same.shape[0] if same.all() else int(np.argmin(same))
    P = min(int(heads.min()), common)
    return max(0, P - P % multiple)


def _rollout_params(params: Any, worker_params: Any, mesh: Any) -> tuple[Any, Any]:
    """The local replicas a process's rollout decodes with (:func:`local_replica`); the
    sub-agents' are the orchestrator's when they decode with the trained params (one
    gather, not two)."""
    orch = local_replica(params, mesh)
    return orch, orch if worker_params is params else local_replica(worker_params, mesh)


def _pad_to(x: np.ndarray, width: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, width - x.shape[1]))) if x.shape[1] < width else x[:, :width]


def _stack_rows(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    W = max(a["tokens"].shape[1], b["tokens"].shape[1])
    return {k: np.concatenate([_pad_to(a[k], W), _pad_to(b[k], W)]) if a[k].ndim == 2
            else np.concatenate([a[k], b[k]]) for k in a}


# the figures of an evaluation and of every RL step
# with a judge: its score, judge - verifier (> 0: it overrates), and whether its verdict
# (score > 0.5) is the verifier's (score > 0.5)
JUDGE_FIGURES = ("judge", "judge_gap", "judge_agreement")
FIGURES = ("accuracy", "tool_calls", "tool_errors", "turns", "answered", "truncated", "context_ended",
           "subagents", "finished_subagents", "critical_steps", "total_steps", "compactions", "context_dropped",
           "peak_context", "subagent_peak_context")


def evaluate(engine: Engine, params: Any, worker_params: Any, problems: list, key: jax.Array, *,
             mesh: Any = None, on_result: Callable[[TextRolloutResult, list, int], None] | None = None
             ) -> dict[str, np.ndarray]:
    """Greedy episodes of ``problems``: :func:`episode_figures` of each [N], in order
    (:func:`mean_figures` averages them). Calls of ``engine.batch`` episodes when it has
    one (the last filled up with repeats of its first problem, dropped from the figures):
    the training rollout's compiled program. With several processes each runs a share
    (episode ``e`` keyed as on one process) and every process gets all the figures
    (``params`` global arrays over ``mesh``). ``on_result(res, problems, first)``: called
    with each call's result, its problems (repeats left out) and the index of its first
    one (e.g. to export traces)."""
    procs, n = jax.process_count(), len(problems)
    per = -(-n // procs)
    start = min(jax.process_index() * per, n)
    mine = problems[start:start + per]
    figures = {k: np.full((per,), np.nan, np.float32) for k in FIGURES}
    if getattr(engine, "judge", None) is not None:          # a judged engine: its score beside the truth
        figures.update({k: np.full((per,), np.nan, np.float32) for k in JUDGE_FIGURES})
    orch, workers = _rollout_params(params, worker_params, mesh)
    size = engine.batch or max(len(mine), 1)
    for c, at in enumerate(range(0, len(mine), size)):
        call = mine[at:at + size]
        res = engine(orch, workers, call + call[:1] * (size - len(call)), jax.random.fold_in(key, c),
                     episode_ids=range(start + at, start + at + size), greedy=True)
        for k, v in episode_figures(res).items():
            if k in figures:
                figures[k][at:at + len(call)] = v[:len(call)]
        if on_result is not None:
            on_result(res, call, start + at)
    figures = allgather(figures)                                       # [procs, per]
    return {k: v.reshape(-1)[:n] for k, v in figures.items()}


def episode_figures(res: TextRolloutResult) -> dict[str, np.ndarray]:
    """Each episode's figures [B] float32 (:data:`FIGURES`): accuracy (the verifier's
    score: item-F1 in wide search; ``r_perf``, or ``r_verifier`` where a judge's reward is
    mixed in, then with :data:`JUDGE_FIGURES`), tool calls and errors, orchestrator turns,
    whether it answered, whether its answer was cut by the turn limit, whether it ran out
    of context; sub-agents started and finished (returned before their turn limit),
    critical and total steps; the orchestrator's compactions (:mod:`swarmjax.swarm.context`),
    the ids they took out of its conversation, its longest segment (ids), and its
    sub-agents' longest conversation (0 without any)."""
    r = reward_terms(res.rewards, len(res.length))
    out = {"accuracy": r.get("r_verifier", r["r_perf"]), "tool_calls": r["tool_calls"], "tool_errors": r["tool_errors"],
           "turns": res.orch_steps, "answered": res.end_reason == END_ANSWER, "truncated": r["truncated"],
           "context_ended": res.end_reason == END_CONTEXT, "subagents": res.spawned,
           "finished_subagents": res.finished, "critical_steps": res.critical_steps,
           "total_steps": res.total_steps, "compactions": [len(t.segments) for t in res.orchestrators],
           "context_dropped": [t.dropped for t in res.orchestrators],
           "peak_context": [t.peak for t in res.orchestrators],
           "subagent_peak_context": [max([len(t) for t in subs], default=0) for subs in res.subagents]}
    if "judge" in r:                    # a judged engine's episodes: the judge's score and its gap to the truth
        truth = r.get("r_verifier", r["r_perf"])
        out.update(judge=r["judge"], judge_gap=r["judge"] - truth, judge_agreement=(r["judge"] > 0.5) == (truth > 0.5))
    return {k: np.asarray(out[k], np.float32) for k in FIGURES + (JUDGE_FIGURES if "judge" in r else ())}


def mean_figures(per_episode: dict[str, np.ndarray]) -> dict[str, float]:
    """The mean over episodes of each figure."""
    return {k: float(np.mean(v)) for k, v in per_episode.items()}


def rollout_figures(res: TextRolloutResult) -> dict[str, float]:
    """Means over a rollout's episodes of :func:`episode_figures`."""
    return mean_figures(episode_figures(res))
