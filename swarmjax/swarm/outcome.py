"""From the token engine's :class:`~swarmjax.swarm.engine.RolloutResult` to the one
result type of every engine (:func:`text_result`:
:class:`~swarmjax.swarm.text_types.TextRolloutResult`, the verifier's item-F1 and PARL's
counts as its reward terms), and to per-episode
:class:`~swarmjax.envs.widesearch.Outcome` records (the reference simulator's format)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import Episode, Outcome, Vocab, WideSearchConfig
from swarmjax.envs.scoring import item_f1
from swarmjax.swarm.engine import RolloutResult
from swarmjax.swarm.text_types import AgentTrace, TextRolloutResult

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


@jax.jit
def token_terms(result: RolloutResult) -> dict[str, Array]:
    """The verifier's and PARL's per-episode terms [B] of a token rollout: ``r_perf``
    (item-F1, 0 without an answer), the counts of :func:`~swarmjax.rl.parl.parl_reward`
    (``novel``, ``returned``, ``parallel``, ``n`` = the task size) and ``tool_calls``
    (the orchestrator's own ``<lookup>`` turns)."""
    f1 = item_f1(result.correct, result.answered, result.truth, result.end_reason == wsj.END_ANSWER)
    lookups = jnp.sum((result.tokens == wsj.T["<lookup>"]) & result.loss_mask, axis=1)
    return {"r_perf": f1, "novel": novel_subagents(result), "returned": returned_entities(result),
            "parallel": parallel_entities(result), "n": result.truth, "tool_calls": lookups}


def text_result(cfg: WideSearchConfig, result: RolloutResult, rows: slice | None = None) -> TextRolloutResult:
    """The token rollout's episodes ``rows`` (None: all) as the one result type of every
    engine (host numpy): the orchestrator's ids, loss mask and log-probs as they are
    (C = ``cfg.contexts.orchestrator``), each agent as an :class:`AgentTrace` (sub-agents in spawn
    order; their sampler log-probs are not kept: zeros), :func:`token_terms` as the
    rewards, answers as ``"e3 v5 e1 v0"`` text. ``result`` may be a global array over
    several processes' devices (every process fetches it whole, then keeps ``rows``).
    ``stats``: ``sampled_tokens`` (both roles'), ``cut_by_max_ticks`` (of ``rows``) and
    ``ticks``."""
    from swarmjax.envs.widesearch_tokens import pairs_text

    terms = token_terms(result)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        r, terms = multihost_utils.process_allgather((result, terms), tiled=True)
    else:
        r, terms = jax.device_get((result, terms))
    keep = slice(None) if rows is None else rows
    r = jax.tree.map(lambda x: np.asarray(x)[keep] if np.ndim(x) else np.asarray(x), r)
    vocab = Vocab(cfg)
    orchs, subs, answers = [], [], []
    for b in range(r.length.shape[0]):
        end = wsj.END_REASONS[int(r.end_reason[b])]
        answer = pairs_text(vocab, [(int(e), int(v)) for e, v in r.answer[b, :r.answer_len[b]]]) \
            if end == "answer" else None
        L = int(r.length[b])
        orch = AgentTrace("orchestrator", steps=int(r.orch_steps[b]), ok=end == "answer", reason=end, answer=answer)
        orch.ids, orch.sampled, orch.turn = [r.tokens[b, :L]], [r.loss_mask[b, :L]], [r.stage_ids[b, :L]]
        orch.logprobs, orch.model_logprobs = [r.logprobs[b, :L]], [r.model_logprobs[b, :L]]
        own = []
        for k in range(int(r.spawned[b])):
            n, ok = int(r.worker_length[b, k]), bool(r.worker_ok[b, k])
            ret = r.worker_return[b, k, :r.worker_return_len[b, k]]
            t = AgentTrace(f"subagent_{k}", steps=int(r.worker_steps[b, k]), stage=int(r.worker_stage[b, k]), ok=ok,
                           reason="returned" if ok else "limit",
                           answer=pairs_text(vocab, list(zip((ret[0::2] - vocab.entity_base).tolist(),
                                                             (ret[1::2] - vocab.value_base).tolist()))) if ok else None)
            t.append(r.worker_tokens[b, k, :n], sampled=False, turn=0)
            t.sampled = [r.worker_sampled[b, k, :n]]
            own.append(t)
        orchs.append(orch)
        subs.append(own)
        answers.append(answer)
    rewards = {k: np.asarray(v)[keep].astype(np.float32) for k, v in terms.items()}
    stats = {"sampled_tokens": int(r.loss_mask.sum() + r.worker_sampled.sum()),
             "cut_by_max_ticks": int(np.sum(r.end_reason == wsj.RUNNING)), "ticks": int(r.ticks)}
    return TextRolloutResult(
        tokens=r.tokens, length=r.length, loss_mask=r.loss_mask, logprobs=r.logprobs,
        model_logprobs=r.model_logprobs, stage_ids=r.stage_ids, orch_steps=r.orch_steps,
        critical_steps=r.critical_steps, total_steps=r.total_steps, spawned=r.spawned, finished=r.finished,
        end_reason=r.end_reason, rewards=rewards, answers=answers, orchestrators=orchs, subagents=subs, stats=stats)


def episodes(tasks: wsj.Tasks) -> list[Episode]:
    """The tasks as reference-simulator episodes (host lists): each problem's
    :func:`~swarmjax.envs.widesearch_token_task.episode`."""
    from swarmjax.envs.widesearch_token_task import episode

    return [episode(p) for p in wsj.problems(tasks)]


def to_outcomes(cfg: WideSearchConfig, res: TextRolloutResult) -> list[Outcome]:
    """Per-episode :class:`Outcome` (host objects, for traces, printing and tests) of a
    token rollout's result (:func:`text_result`)."""
    from swarmjax.envs.widesearch_tokens import parse_pairs

    vocab = Vocab(cfg)
    outs = []
    for b, orch in enumerate(res.orchestrators):
        a = orch.arrays()
        tokens, stage_ids, sampled = a["ids"], a["turn"], a["sampled"]
        subs = res.subagents[b]
        results = [parse_pairs(vocab, t.answer) if t.ok else None for t in subs]
        stages = []
        for i in range(1, int(res.orch_steps[b]) + 1):
            first = int(tokens[np.argmax((stage_ids == i) & sampled)])
            ks = [k for k, t in enumerate(subs) if t.stage == i]
            stages.append({"kind": vocab.symbol(first), "worker_steps": [subs[k].steps for k in ks],
                           "results": [results[k] for k in ks]})
        end = wsj.END_REASONS[int(res.end_reason[b])]
        answer = parse_pairs(vocab, res.answers[b]) if end == "answer" else None
        outs.append(Outcome(
            orch_tokens=[int(t) for t in tokens], sampled=[bool(s) for s in sampled], answer=answer,
            end_reason=end, orch_steps=int(res.orch_steps[b]), critical_steps=int(res.critical_steps[b]),
            total_steps=int(res.total_steps[b]), spawned=len(subs), finished=int(res.finished[b]), stages=stages,
            worker_tokens=[[int(x) for x in t.arrays()["ids"]] for t in subs],
            worker_sampled=[[bool(x) for x in t.arrays()["sampled"]] for t in subs]))
    return outs
