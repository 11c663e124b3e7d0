"""The RL step of every text job (:mod:`swarmjax.train.agent`: its config,
:class:`~swarmjax.train.agent.TextRLConfig`): a batch of problems rolled out on an engine
(:mod:`swarmjax.train.engines`), each episode's reward (:func:`episode_rewards`: the
verifier's term, the PARL reward for orchestrators, a turn cost, the overlong penalty),
group advantages, the rows the learner trains on (the orchestrator's segments and, with
co-trained sub-agents, theirs), one :class:`~swarmjax.rl.update.Learner` update.
:func:`rl_step` = :func:`collect` (the rollout half: this process's share of the
problems) then :func:`learn` (every process's rows, one update)."""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.task import reward_terms
from swarmjax.models.lora import over_base
from swarmjax.rl.advantages import compute_advantages, overlong_penalty, uniform_groups
from swarmjax.rl.parl import parl_reward
from swarmjax.rl.trajectory import TrajectoryBatch, shared_head
from swarmjax.rl.update import Learner, TrainState
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import TextRolloutResult
from swarmjax.train.agent import SEGMENT_WEIGHTS, TextRLConfig
from swarmjax.train.agent_eval import _rollout_params, episode_figures, mean_figures
from swarmjax.train.distributed import allgather, global_rows, share
from swarmjax.train.engines import Engine


def rollout_params(state: TrainState) -> Roles:
    """The params a rollout decodes with: the trained ones for the orchestrator; for the
    sub-agents the frozen copy ``state.frozen["subagents"]`` when the state has one, else
    the trained ones (co-trained sub-agents; a single agent has none). With LoRA the
    frozen copy is adapters alone, over the trained params' base (the same arrays)."""
    if state.frozen and "subagents" in state.frozen:
        return Roles(state.params, over_base(state.frozen["subagents"], state.params))
    return Roles(state.params, state.params)


def episode_rewards(res: TextRolloutResult, rcfg: TextRLConfig, step: int = 0
                    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Reward [B] of each episode of ``res`` and its channels [B] (module docstring).
    ``L`` of the overlong penalty is ``res.loss_mask.sum(1)``, the ids the policy sampled."""
    reward, channels, _, _ = shaped_rewards(res, rcfg, step, np.zeros(len(res.length), np.int32))
    return reward, channels


def shaped_rewards(res: TextRolloutResult, rcfg: TextRLConfig, step: int, groups: np.ndarray
                   ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(reward [B], its channels [B], group advantages [B], whether the episode's group
    ``groups`` [B] carries a signal [B]: its rewards differ) of ``res``'s episodes at RL
    step ``step``. The PARL reward and the advantages each run as one XLA program (as a
    jitted rollout's own reward would: the token engine's figures are those it computed
    on the device)."""
    B = len(res.length)
    terms = reward_terms(res.rewards, B)
    channels: dict[str, np.ndarray] = {"r_perf": terms["r_perf"],
                                       **{k: terms[k] for k in terms if k == "r_verifier" or k.startswith("judge")}}
    base = terms["r_perf"]
    if rcfg.parl is not None:
        counts = {k: terms[k] for k in ("novel", "returned", "parallel", "n") if k in terms}
        base, parl = jax.device_get(_parl_reward(terms["r_perf"], res.spawned, res.finished, res.total_steps,
                                                 res.critical_steps, counts, jnp.asarray(step, jnp.int32),
                                                 pcfg=rcfg.parl))
        base = np.asarray(base)
        channels.update({k: np.asarray(v) for k, v in parl.items() if k != "r_perf"})
    reward = base - rcfg.turn_cost * res.orch_steps
    if rcfg.overlong is not None:
        sampled = np.asarray(res.loss_mask).sum(axis=1)
        reward = reward + np.asarray(overlong_penalty(sampled, rcfg.overlong.max_length, rcfg.overlong.cache_length))
    adv, signal = jax.device_get(_advantages(jnp.asarray(reward), jnp.asarray(groups), advantage=rcfg.advantage))
    return np.asarray(reward), channels, np.asarray(adv), np.asarray(signal)


@functools.partial(jax.jit, static_argnames=("pcfg",))
def _parl_reward(r_perf, spawned, finished, total_steps, critical_steps, counts, step, *, pcfg):
    """:func:`~swarmjax.rl.parl.parl_reward` [B] and its channels, one program."""
    return parl_reward(r_perf, spawned, finished, total_steps, step, pcfg, counts, critical_steps=critical_steps)


@functools.partial(jax.jit, static_argnames=("advantage",))
def _advantages(reward, groups, *, advantage):
    """Group advantages [B] and whether each episode's group carries a signal [B]."""
    return compute_advantages(advantage, reward, groups), ~uniform_groups(reward, groups)


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
    params = rollout_params(state)
    if not engine.whole_batch:        # each process decodes its share with a local copy
        params = _rollout_params(params, learner.mesh)
    return learn(learner, state, collect(engine, params, problems, key, rcfg, step=step,
                                         subagents=subagents, mesh=learner.mesh))


class TextCollected(NamedTuple):
    """A rolled-out, rewarded text batch waiting for the learner (this process's rows)."""

    batch: TrajectoryBatch       # [R, W] host rows (orchestrator, segment and sub-agent rows)
    head: Any                    # [P] ids every row opens with, or None
    metrics: dict[str, float]    # the step's figures but the learner's and update_s


def collect(engine: Engine, params: Roles, problems: list, key: jax.Array, rcfg: TextRLConfig,
            *, step: int = 0, subagents: str = "frozen", mesh: Any = None) -> TextCollected:
    """The rollout half of :func:`rl_step`: this process's share of ``problems`` rolled
    out ``group_size`` times with ``params`` (a ``Roles``), rewarded
    (:func:`episode_rewards`) as step ``step``, group advantages, the learner's rows on
    exactly the rollout's ids, loss mask and sampler log-probs; a context strategy's
    earlier segments are rows of their own with their episode's advantage
    (:func:`_segment_rows`; weighted by ``rcfg.segment_weight``). Rows are cut to a
    :func:`row_width` of the longest (few shapes to compile); with ``rcfg.head_multiple``
    the ids every row opens with run once per forward (``Learner.update(head=)``)."""
    G = rcfg.group_size
    start, stop = share(len(problems))
    mine = problems[start:stop]
    episodes = [p for p in mine for _ in range(G)]
    t0 = time.perf_counter()
    if engine.whole_batch:       # the whole step's episodes on every process, its rows kept
        episodes = [p for p in problems for _ in range(G)]
    res = engine(params, episodes, key, episode_ids=range(start * G, stop * G))
    t1 = time.perf_counter()
    local = np.repeat(np.arange(len(mine)), G)             # this process's episodes, whole groups
    groups = local + start
    reward, channels, adv, signal = shaped_rewards(res, rcfg, step, local)
    adv = adv * segment_weights([len(t.segments) for t in res.orchestrators], rcfg.segment_weight)
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
    W = row_width(rows["tokens"].shape[1], rcfg.bucket, res.tokens.shape[1])
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
                                                        if k != "r_perf" or "r_verifier" in channels},
                             # what PARL's r_parallel counts, as the verifier reported it
                             **{f"parl/{k}": np.asarray(res.rewards[k], np.float32)
                                for k in PARL_COUNTS if rcfg.parl is not None and k in res.rewards}})
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


# the verifier's PARL counts logged per step (parl/<count>): sub-agents given an asked-for entity no
# earlier one had, distinct asked-for entities returned, those returned beside each stage's busiest
PARL_COUNTS = ("novel", "returned", "parallel")

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



def row_width(width: int, bucket: int, cap: int) -> int:
    """The learner's row width for rows of ``width`` ids: the least ``bucket * 2**k`` that
    holds them, but no more than ``max(width, cap)`` (``cap``: the rollout's full width).

    Episode lengths change every step; a width per multiple of ``bucket`` compiled a new
    update whenever the longest episode crossed one (up to ``cap / bucket`` programs, each
    seconds on a CPU and a minute at 0.6B on a GPU). Doubling widths bound the job to
    ``log2(cap / bucket) + 1`` programs, for at most 2x padded ids (masked: the loss is the
    same at any width)."""
    w = bucket
    while w < width:
        w *= 2
    return min(w, max(width, cap))


def _pad_to(x: np.ndarray, width: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, width - x.shape[1]))) if x.shape[1] < width else x[:, :width]


def _stack_rows(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    W = max(a["tokens"].shape[1], b["tokens"].shape[1])
    return {k: np.concatenate([_pad_to(a[k], W), _pad_to(b[k], W)]) if a[k].ndim == 2
            else np.concatenate([a[k], b[k]]) for k in a}
