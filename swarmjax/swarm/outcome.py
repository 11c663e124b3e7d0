"""From a :class:`~swarmjax.swarm.engine.RolloutResult` to rewards, metrics and
per-episode :class:`~swarmjax.envs.widesearch.Outcome` records (the reference
simulator's format, which traces are exported from)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import Episode, Outcome, Vocab, WideSearchConfig
from swarmjax.envs.scoring import item_f1
from swarmjax.rl.parl import PARLConfig, parl_reward
from swarmjax.swarm.engine import RolloutResult

Array = jax.Array


def _asked(result: RolloutResult, tok: Array) -> Array:
    """Whether each token of ``tok`` [B, ...] is an entity the episode asked for (the
    ``e..`` of the orchestrator prompt ``<orch> <task> e.. </task>``, n = ``truth``)."""
    task = result.tokens[:, 2:result.tokens.shape[1]]                            # [B, C - 2]
    task_ok = jnp.arange(task.shape[1])[None] < result.truth[:, None]
    flat = tok.reshape(tok.shape[0], -1)
    hit = jnp.any((flat[..., None] == task[:, None, :]) & task_ok[:, None, :], -1)
    return hit.reshape(tok.shape)


def novel_subagents(result: RolloutResult) -> Array:
    """Sub-agents per episode [B] whose spawn block holds at least one asked-for entity
    that no earlier sub-agent of the episode was given (the count ``r_parallel`` uses).

    A sub-agent's block is the ``e..`` of its prompt ``<worker> <task> e.. </task>``
    (worker_tokens [B, K, W]); the task is the orchestrator prompt's ``e..``
    (tokens[:, 2 : 2 + n], n = ``truth``)."""
    B, K, W = result.worker_tokens.shape
    tok = result.worker_tokens                                                  # [B, K, W]
    w = jnp.arange(W)
    close = jnp.argmax(tok == wsj.T["</task>"], axis=-1)                        # [B, K]
    live = jnp.arange(K)[None] < result.spawned[:, None]                        # [B, K]
    block = (w >= 2) & (w < close[..., None]) & live[..., None]                 # [B, K, W]
    asked = _asked(result, tok)                                                 # [B, K, W]
    same = tok[:, :, :, None, None] == tok[:, None, None, :, :]                 # [B, K, W, K', W']
    earlier = jnp.arange(K)[None, :] < jnp.arange(K)[:, None]                   # [K, K']: k' < k
    seen = jnp.any(same & block[:, None, None] & earlier[None, :, None, :, None], axis=(-2, -1))
    return jnp.sum(jnp.any(block & asked & ~seen, axis=-1), axis=-1).astype(jnp.int32)


def returned_entities(result: RolloutResult) -> Array:
    """Distinct asked-for entities per episode [B] that finished sub-agents returned
    (the ``e`` of each ``e v`` pair of worker_return [B, K, W] of ``worker_ok`` slots)."""
    B, K, W = result.worker_return.shape
    j = jnp.arange(W)
    ok = result.worker_ok & (jnp.arange(K)[None] < result.spawned[:, None])            # [B, K]
    pair = (j % 2 == 0) & (j + 1 < result.worker_return_len[..., None]) & ok[..., None]  # [B, K, W]
    ent = jnp.where(pair, result.worker_return, -1).reshape(B, K * W)                   # [B, KW]
    asked = _asked(result, ent) & (ent >= 0)                                     # [B, KW]
    first = ~jnp.any((ent[:, :, None] == ent[:, None, :]) & jnp.tril(jnp.ones((K * W,) * 2, bool), -1)[None],
                     -1)                                                                 # no earlier copy
    return jnp.sum(asked & first, -1).astype(jnp.int32)


def parallel_entities(result: RolloutResult) -> Array:
    """Asked-for entities per episode [B] that sub-agents returned *beside* their
    stage's busiest sub-agent: sum over stages of (distinct asked-for entities the
    stage's finished sub-agents returned - the most any one of them returned). The
    work that ran off the critical path (``r_parallel = "parallel"``); 0 for every
    delegation of a one-entity task. An entity counts for the first sub-agent (spawn
    order) that returned it."""
    B, K, W = result.worker_return.shape
    j = jnp.arange(W)
    live = jnp.arange(K)[None] < result.spawned[:, None]                                # [B, K]
    ok = result.worker_ok & live
    pair = (j % 2 == 0) & (j + 1 < result.worker_return_len[..., None]) & ok[..., None]  # [B, K, W]
    ent = jnp.where(pair, result.worker_return, -1).reshape(B, K * W)
    asked = _asked(result, ent) & (ent >= 0)
    first = ~jnp.any((ent[:, :, None] == ent[:, None, :]) & jnp.tril(jnp.ones((K * W,) * 2, bool), -1)[None], -1)
    own = jnp.sum((asked & first).reshape(B, K, W), -1)                                  # [B, K]
    same = (result.worker_stage[:, :, None] == result.worker_stage[:, None, :]) & live[:, :, None] & live[:, None, :]
    busiest = jnp.max(jnp.where(same, own[:, None, :], 0), -1)                           # [B, K] its stage's max
    # one leader per stage: the first sub-agent holding the stage's max
    ties = same & (own[:, None, :] == busiest[:, :, None]) & (jnp.arange(K)[None, None, :] < jnp.arange(K)[None, :, None])
    leader = live & (own == busiest) & ~jnp.any(ties, -1)
    return jnp.sum(jnp.where(live & ~leader, own, 0), -1).astype(jnp.int32)


def episode_rewards(result: RolloutResult, pcfg: PARLConfig, step: Array | int) -> tuple[Array, dict]:
    """PARL reward [B] and each channel [B] (``r_perf`` = item-F1, ``r_parallel``,
    ``r_finish``, ``cost``, ``lambda1``, ``lambda2``) at training step ``step``."""
    f1 = item_f1(result.correct, result.answered, result.truth, result.end_reason == wsj.END_ANSWER)
    counts = {"novel": novel_subagents(result), "returned": returned_entities(result), "n": result.truth,
              "parallel": parallel_entities(result)}
    return parl_reward(f1, result.spawned, result.finished, result.total_steps, step, pcfg, counts,
                       critical_steps=result.critical_steps)


def episodes(tasks: wsj.Tasks) -> list[Episode]:
    """The tasks as reference-simulator episodes (host lists)."""
    table, ents, n = jax.device_get((tasks.table, tasks.entities, tasks.n))
    return [Episode(table=[int(v) for v in table[b]], task=[int(e) for e in ents[b, :n[b]]])
            for b in range(len(n))]


def to_outcomes(cfg: WideSearchConfig, result: RolloutResult) -> list[Outcome]:
    """Per-episode :class:`Outcome` (host objects, for traces, printing and tests)."""
    vocab = Vocab(cfg)
    r = jax.tree.map(np.asarray, jax.device_get(result))
    outs = []
    for b in range(r.length.shape[0]):
        L = int(r.length[b])
        tokens, stage_ids, sampled = r.tokens[b, :L], r.stage_ids[b, :L], r.loss_mask[b, :L]
        spawned = int(r.spawned[b])
        results = []
        for k in range(spawned):
            ret = r.worker_return[b, k, :r.worker_return_len[b, k]]
            results.append([(int(ret[i]) - vocab.entity_base, int(ret[i + 1]) - vocab.value_base)
                            for i in range(0, len(ret), 2)] if r.worker_ok[b, k] else None)
        stages = []
        for i in range(1, int(r.orch_steps[b]) + 1):
            first = int(tokens[np.argmax((stage_ids == i) & sampled)])
            ks = [k for k in range(spawned) if r.worker_stage[b, k] == i]
            stages.append({"kind": vocab.symbol(first), "worker_steps": [int(r.worker_steps[b, k]) for k in ks],
                           "results": [results[k] for k in ks]})
        end = wsj.END_REASONS[int(r.end_reason[b])]
        answer = ([(int(e), int(v)) for e, v in r.answer[b, :r.answer_len[b]]] if end == "answer" else None)
        outs.append(Outcome(
            orch_tokens=[int(t) for t in tokens], sampled=[bool(s) for s in sampled], answer=answer,
            end_reason=end, orch_steps=int(r.orch_steps[b]), critical_steps=int(r.critical_steps[b]),
            total_steps=int(r.total_steps[b]), spawned=spawned, finished=int(r.finished[b]), stages=stages,
            worker_tokens=[[int(t) for t in r.worker_tokens[b, k, :r.worker_length[b, k]]]
                           for k in range(spawned)],
            worker_sampled=[[bool(x) for x in r.worker_sampled[b, k, :r.worker_length[b, k]]]
                            for k in range(spawned)]))
    return outs

