"""The jitted swarm rollout: an orchestrator and its frozen sub-agents decoding together.

One ``jax.jit`` runs a whole batch of wide-search episodes (docs/design.md section 11)
token by token, in a ``lax.while_loop`` of *ticks*. In a tick every agent that is
not waiting appends one token to its context:

* B orchestrator rows decode with the trainable params, KV cache ``[B, C + 1]``;
* B x K sub-agent slots (each runs at most once per episode) decode as one batch
  with the frozen params; a running slot holds one of ``L`` KV-cache lanes
  ``[L, W + 1]`` from a pool (:mod:`swarmjax.swarm.lanes`; ``L`` = ``subagent_lanes``
  per data shard, by default half its B x K slots), so the sub-agent forward costs
  what the running sub-agents need, not K per episode;
* tokens the environment says (tool replies, results, sub-agent task prompts)
  go through the model into the cache exactly like sampled ones, but are not
  sampled and are masked out of the loss;
* the environment's transition (:mod:`swarmjax.envs.widesearch_jax`) parses every
  emitted token; rows that wait or have ended are masked, and each model's
  forward is skipped (``lax.cond``) in ticks where none of its rows emits.

Rows write their own cache slot (``forward`` with per-row ``cache_index``); the
extra slot ``C`` / ``W`` is scratch for masked rows, so nothing is ever written
out of bounds. The loop ends when every episode has ended (answer, budget or
context); ``max_ticks`` is a proven upper bound, not a truncation: an episode it
cuts would come back with end reason ``running``, and ``cut_by_max_ticks`` counts
them (0 unless the bound is wrong; the tests and ``bench/fuzz.py`` check it). With
``RolloutConfig.check_indices`` the loop also counts, per episode, every index it
reads or writes out of range (:data:`INDEX_CHECKS`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import (KVCache, cache_logical_axes, forward, init_cache,
                                         param_logical_axes, rope_table, unstack_layers)
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig, select_tokens
from swarmjax.sharding.mesh import DEFAULT_RULES, batch_sharding, tree_shardings
from swarmjax.swarm import lanes as lanes_lib

Array = jax.Array

SAMPLE = -2     # a script entry the policy samples (a forced prefix, then the model)

# What ``RolloutConfig.check_indices`` counts (columns of ``RolloutResult.index_errors``):
# orch_slot      an orchestrator token written outside buffer columns / cache slots [0, C)
# worker_slot    a sub-agent token written outside [0, W)
# lane_id        a slot's lane outside [-1, Lg) or a lane's owner outside [-1, S)
# lane_owner     slot -> lane -> slot (or lane -> slot -> lane) is not the identity
# lane_missing   a sub-agent emits without holding a lane
# cache_slot     a lane's token fed to the sub-agent cache outside slots [0, W)
# spawn_slot     a spawn block's entity stored for a slot outside [0, K)
# result_slot    a result read from outside the stage's slots, or past its block
# answer_slot    an answered pair stored outside [0, C // 2), or its entity outside [0, E)
# return_slot    a returned pair stored outside [0, W), or its entity outside [0, E)
# prompt_entity  a sub-agent prompt entity read outside its block, or not an entity
# reply_slot     a tool reply token (orchestrator's or sub-agent's) read outside its queue [0, qlen <= 2)
INDEX_CHECKS = ("orch_slot", "worker_slot", "lane_id", "lane_owner", "lane_missing", "cache_slot",
                "spawn_slot", "result_slot", "answer_slot", "return_slot", "prompt_entity", "reply_slot")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Static rollout settings: the task sizes and how each role samples.
    (``max_new_tokens`` of the sampling configs is unused: contexts bound the decode.)"""

    env: WideSearchConfig | None = None    # the rules (a job's token engine: its task's, task.cfg)
    sampling: Roles[SamplingConfig] = Roles.both(SamplingConfig(temperature=1.0))
    subagent_lanes: int | None = None  # sub-agent KV-cache rows per data shard (None: half its B x K slots)
    check_indices: bool = False   # count out-of-range indices per episode (RolloutResult.index_errors)

    def __post_init__(self):
        if self.subagent_lanes is not None and self.subagent_lanes < 1:
            raise ValueError(f"subagent_lanes must be >= 1 (or None: half the sub-agent slots), "
                             f"got {self.subagent_lanes}")

    def lanes_per_group(self, slots: int) -> int:
        """Lanes of a group of ``slots`` sub-agent slots (a data shard's B x K)."""
        return math.ceil(slots / 2) if self.subagent_lanes is None else min(slots, self.subagent_lanes)

    def max_ticks(self, slots: int) -> int:
        """A bound, not a truncation. While an episode runs, each tick its orchestrator
        emits (<= C), books a stage (<= K), one of its sub-agents emits (<= K (W + 1)),
        or its sub-agents wait for lanes while every lane of the group emits
        (<= S (W + 1) / Lg ticks)."""
        e = self.env
        lanes = self.lanes_per_group(slots)
        return (e.contexts.orchestrator + e.max_subagents * (e.contexts.subagents + 2) + 2
                + math.ceil(slots * (e.contexts.subagents + 1) / lanes))


@flax.struct.dataclass
class Scripts:
    """Forced choices (for tests and replays): each agent's *sampled* tokens in order,
    ``-1``-padded; once a script runs out the agent says ``<eos>``. An entry
    :data:`SAMPLE` lets the policy sample that token (e.g. a forced prefix, then the model).
    orch [B, Lo]; workers [B, K, Lw] (slot = spawn order in the episode)."""

    orch: Array
    workers: Array


@flax.struct.dataclass
class RolloutResult:
    """Token-in-token-out output for B episodes (C, W: context sizes; K: slots).

    tokens [B, C] int32        the orchestrator's whole context (``<pad>`` after length)
    length [B] int32
    loss_mask [B, C] bool      True only on tokens the orchestrator sampled
    logprobs [B, C] f32        sampler log-prob of those tokens (sampling distribution)
    model_logprobs [B, C] f32  same under the plain temperature-1 model
    stage_ids [B, C] int32     orchestrator step a token belongs to (0: the prompt)
    worker_tokens [B, K, W], worker_length [B, K], worker_sampled [B, K, W]
    worker_steps [B, K], worker_stage [B, K] (spawning orchestrator step), worker_ok [B, K]
    worker_return [B, K, W] the "e v .." tokens each sub-agent returned, worker_return_len [B, K]
    answer [B, A, 2] (entity, value) pairs, answer_len [B]
    correct, answered, truth [B]: verifier counts (distinct answered pairs)
    orch_steps, critical_steps, total_steps, spawned, finished [B]
    end_reason [B]: index into ``widesearch_jax.END_REASONS``
    ticks []: loop iterations run
    cut_by_max_ticks [] int32: episodes still running when the loop stopped at ``max_ticks``
      (end reason ``running``); 0, since ``max_ticks`` is a bound
    index_errors [B, len(INDEX_CHECKS)] int32: ticks in which each check of
      :data:`INDEX_CHECKS` found an index out of range (None unless ``check_indices``)
    """

    tokens: Array
    length: Array
    loss_mask: Array
    logprobs: Array
    model_logprobs: Array
    stage_ids: Array
    worker_tokens: Array
    worker_length: Array
    worker_sampled: Array
    worker_steps: Array
    worker_stage: Array
    worker_ok: Array
    worker_return: Array
    worker_return_len: Array
    answer: Array
    answer_len: Array
    correct: Array
    answered: Array
    truth: Array
    orch_steps: Array
    critical_steps: Array
    total_steps: Array
    spawned: Array
    finished: Array
    end_reason: Array
    ticks: Array
    cut_by_max_ticks: Array
    index_errors: Array | None


@flax.struct.dataclass
class RolloutBuffers:
    """Per-token outputs the rollout loop writes (B episodes, C / W: orchestrator /
    sub-agent context, K: sub-agent slots per episode). Fields in the sorted order of
    the dict this replaced, so the loop's flattened carry (and program) is unchanged.

    logprobs:       [B, C] f32      sampler log-prob of the orchestrator's sampled tokens (0 elsewhere).
    loss_mask:      [B, C] bool     True on tokens the orchestrator sampled.
    model_logprobs: [B, C] f32      same under the plain temperature-1 model.
    stage_ids:      [B, C] int32    orchestrator step a token belongs to (0: the prompt).
    tokens:         [B, C] int32    the orchestrator's context (``<pad>`` after its length).
    worker_sampled: [B * K, W] bool True on tokens a sub-agent sampled.
    worker_tokens:  [B * K, W] int32 each sub-agent slot's context (``<pad>`` after it).
    """

    logprobs: Array
    loss_mask: Array
    model_logprobs: Array
    stage_ids: Array
    tokens: Array
    worker_sampled: Array
    worker_tokens: Array


@flax.struct.dataclass
class TickCarry:
    """The ``lax.while_loop`` carry of :func:`rollout` (B episodes, K slots, L lanes,
    C / W contexts, V vocabulary).

    t:             [] int32 ticks run so far.
    key:           PRNG key.
    o:             :class:`~swarmjax.envs.widesearch_jax.OrchState`, env state, leaves [B, ...].
    w:             :class:`~swarmjax.envs.widesearch_jax.WorkerState`, env state, leaves [B, K, ...].
    o_cache:       orchestrator :class:`KVCache`, B rows, C + 1 slots (slot C: scratch).
    w_cache:       sub-agent :class:`KVCache`, L lanes, W + 1 slots (slot W: scratch).
    o_logits:      [B, V] f32 orchestrator logits for its next token.
    w_logits:      [L, V] f32 sub-agent logits per lane for its next token.
    bufs:          :class:`RolloutBuffers`, the token outputs written so far.
    orch_cursor:   [B] int32 orchestrator tokens sampled so far (script position).
    worker_cursor: [B * K] int32 tokens each sub-agent slot sampled so far (script position).
    pool:          :class:`~swarmjax.swarm.lanes.Lanes` (D lane groups, S = B K / D slots and
                   Lg = L / D lanes each): lane_of [D, S] int32, owner [D, Lg] int32.
    index_errors:  [B, len(INDEX_CHECKS)] int32 ticks with an index out of range, per check
                   (None unless ``check_indices``).
    """

    t: Array
    key: Array
    o: wsj.OrchState
    w: wsj.WorkerState
    o_cache: KVCache
    w_cache: KVCache
    o_logits: Array
    w_logits: Array
    bufs: RolloutBuffers
    orch_cursor: Array
    worker_cursor: Array
    pool: lanes_lib.Lanes
    index_errors: Array | None


def _choose(logits: Array, key: Array, scfg: SamplingConfig, script: Array | None,
            cursor: Array) -> tuple[Array, Array, Array]:
    """Tokens [R] with their sampler and model log-probs, from logits [R, V]: sampled,
    or read from the script [R, Ls] at ``cursor`` [R]: a forced token (both log-probs
    are the model's), a :data:`SAMPLE` entry (sampled; skipped when no row has one),
    ``<eos>`` at ``-1`` or past the script's end."""
    if script is None:
        return select_tokens(logits, key, scfg)
    L = script.shape[1]
    entry = jnp.take_along_axis(script, jnp.clip(cursor, 0, L - 1)[:, None], axis=1)[:, 0]
    entry = jnp.where(cursor < L, entry, -1)
    forced = jnp.where(entry >= 0, entry, wsj.T["<eos>"]).astype(jnp.int32)
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), forced[:, None], 1)[:, 0]
    draw = entry == SAMPLE
    tok, s_lp, s_mlp = lax.cond(jnp.any(draw), lambda: select_tokens(logits, key, scfg),
                                lambda: (forced, lp, lp))
    return jnp.where(draw, tok, forced), jnp.where(draw, s_lp, lp), jnp.where(draw, s_mlp, lp)


def _in_range(x: Array, lo: Array | int, hi: Array | int) -> Array:
    return (x >= lo) & (x < hi)


def index_errors(ecfg: WideSearchConfig, o: wsj.OrchState, w: wsj.WorkerState, pool: lanes_lib.Lanes,
                 orch: tuple[Array, Array, Array], workers: tuple[Array, Array, Array],
                 cache_bad: Array) -> Array:
    """One tick's out-of-range indices, [B, len(INDEX_CHECKS)] bool (the checks are
    listed at :data:`INDEX_CHECKS`).

    o, w: the environment states the tick started from (leaves [B, ...] / [B, K, ...]);
    pool: the lanes after this tick's allocation (D groups of S = B K / D slots);
    orch: (token, emitted, position) [B] and workers: the same [B, K], as
    :func:`~swarmjax.envs.widesearch_jax.episode_tick` returned them;
    cache_bad [B, K]: slots whose lane fed the sub-agent cache outside slots [0, W).
    A slot index is in range when ``0 <= i < size``; a lane-pool error is charged to
    every episode of its group."""
    K, C, W, E = ecfg.max_subagents, ecfg.contexts.orchestrator, ecfg.contexts.subagents, ecfg.num_entities
    vocab = wsj.Vocab(ecfg)
    (ot, oe, opos), (wt, we, wpos) = orch, workers
    B = ot.shape[0]
    is_e = lambda t: _in_range(t, vocab.entity_base, vocab.value_base)
    is_v = lambda t: _in_range(t, vocab.value_base, vocab.size)
    bad_id, bad_owner = (x.reshape(B, K) for x in lanes_lib.errors(pool))
    # the result being heard: token res_j of slot res_k's block (size ret_len + 2, or 3 for <fail>)
    k = jnp.clip(o.res_k, 0, K - 1)[:, None]
    size = jnp.where(jnp.take_along_axis(w.ok, k, 1)[:, 0], jnp.take_along_axis(w.ret_len, k, 1)[:, 0] + 2, 3)
    stage_end = o.stage_first + o.stage_n
    result_ok = _in_range(o.res_k, o.stage_first, stage_end) & (stage_end <= K) & _in_range(o.res_j, 0, size)
    add_ent = (o.phase == wsj.O_SPAWN_ENT) & oe & is_e(ot) & (o.nents < ecfg.max_block_entities)
    ans_pair = (o.phase == wsj.O_ANS_V) & oe & is_v(ot)
    ret_pair = (w.phase == wsj.W_RET_V) & we & is_v(wt)
    prompt_ent = (w.phase == wsj.W_PROMPT) & we & _in_range(w.cursor, 2, w.ntask + 2)
    reply_ok = lambda q: _in_range(q.qpos, 0, q.qlen) & (q.qlen <= 2)
    checks = {
        "orch_slot": oe & ~_in_range(opos, 0, C),
        "worker_slot": jnp.any(we & ~_in_range(wpos, 0, W), -1),
        "lane_id": jnp.any(bad_id, -1),
        "lane_owner": jnp.any(bad_owner, -1),
        "lane_missing": jnp.any(we & (pool.lane_of.reshape(B, K) < 0), -1),
        "cache_slot": jnp.any(cache_bad, -1),
        "spawn_slot": add_ent & ~_in_range(o.spawned + o.nblocks - 1, 0, K),
        "result_slot": (o.phase == wsj.O_RESULTS) & oe & ~result_ok,
        "answer_slot": ans_pair & ~(_in_range(o.ans_len, 0, o.answer.shape[1]) & _in_range(o.ans_e, 0, E)),
        "return_slot": jnp.any(ret_pair & ~(_in_range(w.ret_len, 0, W - 1) & _in_range(w.ret_e, 0, E)), -1),
        "prompt_entity": jnp.any(prompt_ent & ~(_in_range(w.cursor - 2, 0, ecfg.max_block_entities)
                                                & is_e(wt)), -1),
        "reply_slot": ((o.phase == wsj.O_ENV) & oe & ~reply_ok(o))
                      | jnp.any((w.phase == wsj.W_ENV) & we & ~reply_ok(w), -1),
    }
    return jnp.stack([checks[name] for name in INDEX_CHECKS], axis=-1)


def _put(buf: Array, pos: Array, value: Array, where: Array) -> Array:
    """buf[r, pos[r]] = value[r] on rows where ``where``; buf [R, S], the rest [R]."""
    rows = jnp.arange(buf.shape[0])
    return buf.at[rows, jnp.where(where, pos, buf.shape[1])].set(value.astype(buf.dtype), mode="drop")


def _step_model(params, cfg: ModelConfig, cache: KVCache, logits: Array, tok: Array, pos: Array,
                emit: Array) -> tuple[KVCache, Array]:
    """Feed one token per row at its own slot; keep old logits on rows that did not emit.
    Skipped entirely when no row emits."""
    def run(args):
        cache, logits = args
        slot = jnp.where(emit, pos, cache.max_len - 1)          # scratch slot for masked rows
        # RoPE looked up in a table of the cache's slots (a constant: 5-8% off a tick,
        # measured); rows that emit sit at pos = slot < max_len, the clamp only touches
        # idle rows, whose outputs are dropped
        out = forward(params, cfg, tok[:, None],
                      positions=jnp.minimum(pos, cache.max_len - 1)[:, None], token_mask=emit[:, None],
                      cache=cache, cache_index=slot, rope_table=rope_table(cfg, cache.max_len))
        return out.cache, jnp.where(emit[:, None], out.logits[:, 0], logits)
    return lax.cond(jnp.any(emit), run, lambda args: args, (cache, logits))


def rollout(params: Roles, cfgs: Roles[ModelConfig], rcfg: RolloutConfig, tasks: wsj.Tasks, key: Array, *,
            scripts: Scripts | None = None, constrain=None, groups: int = 1) -> RolloutResult:
    """Run B episodes to the end (traceable; :class:`SwarmRollout` jits it).

    Args:
      params: the orchestrator's (trainable) and the sub-agents' (frozen) parameters
        (``Roles``; both may be the same tree); cfgs: their model configs.
      tasks: :class:`~swarmjax.envs.widesearch_jax.Tasks` with batch B.
      key: PRNG key for sampling.
      scripts: optional forced choices (tests, replays).
      constrain: optional ``(name, tree) -> tree`` sharding constraint hook.
      groups: independent lane pools (one per data shard; must divide B).
    """
    ecfg = rcfg.env
    B = tasks.n.shape[0]
    K, C, W = ecfg.max_subagents, ecfg.contexts.orchestrator, ecfg.contexts.subagents
    if B % groups:
        raise ValueError(f"batch {B} is not divisible into {groups} lane groups")
    D, S = groups, B * K // groups                                      # groups, slots per group
    Lg = rcfg.lanes_per_group(S)
    L = D * Lg
    constrain = constrain or (lambda name, tree: tree)
    orch_params, worker_params = unstack_layers(params.orchestrator), unstack_layers(params.subagents)
    orch_cfg, worker_cfg = cfgs.orchestrator, cfgs.subagents
    asked = jnp.zeros((B, ecfg.num_entities), bool).at[
        jnp.arange(B)[:, None], jnp.where(tasks.entities >= 0, tasks.entities, ecfg.num_entities)].set(
        True, mode="drop")

    # the orchestrator's prompt, prefilled (right-padded: token j sits at slot j)
    prompt, pmask = wsj.orch_prompt(ecfg, tasks)                        # [B, N + 3]
    P = prompt.shape[1]
    o_cache = constrain("orch_cache", init_cache(orch_cfg, B, C + 1))
    pre = forward(orch_params, orch_cfg, prompt, positions=jnp.broadcast_to(jnp.arange(P), (B, P)),
                  token_mask=pmask, cache=o_cache, cache_index=0)
    o_logits = jnp.take_along_axis(pre.logits, (tasks.n + 2)[:, None, None], axis=1)[:, 0]   # [B, V]
    w_cache = constrain("worker_cache", init_cache(worker_cfg, L, W + 1))
    w_logits = jnp.zeros((L, worker_cfg.vocab_size), jnp.float32)
    pool = lanes_lib.init_lanes(D, S, Lg)
    o, w = wsj.init_state(ecfg, tasks)

    pad = jnp.full((B, C - P), wsj.T["<pad>"], jnp.int32)
    bufs = RolloutBuffers(
        tokens=jnp.concatenate([prompt, pad], axis=1),
        loss_mask=jnp.zeros((B, C), bool), logprobs=jnp.zeros((B, C), jnp.float32),
        model_logprobs=jnp.zeros((B, C), jnp.float32), stage_ids=jnp.zeros((B, C), jnp.int32),
        worker_tokens=jnp.full((B * K, W), wsj.T["<pad>"], jnp.int32),
        worker_sampled=jnp.zeros((B * K, W), bool))
    tick_fn = jax.vmap(lambda o, w, table, asked, so, sw, ready: wsj.episode_tick(
        ecfg, o, w, table, asked, so, sw, ready))

    def body(c: TickCarry) -> TickCarry:
        with jax.named_scope("swarm_tick"):
            return tick(c)

    def tick(c: TickCarry) -> TickCarry:
        key, ko, kw = jax.random.split(c.key, 3)
        w, w_cache = c.w, c.w_cache
        # running sub-agents without a lane get one (fresh lanes start with an empty cache)
        running = (w.phase != wsj.W_IDLE) & (w.phase != wsj.W_DONE)             # [B, K]
        pool, fresh = lanes_lib.allocate(c.pool, running.reshape(D, S))
        w_cache = w_cache.replace(valid=jnp.where(fresh.reshape(L, 1), False, w_cache.valid))
        ready = (pool.lane_of >= 0).reshape(B, K)
        slot_logits = lanes_lib.to_slots(c.w_logits.reshape(D, Lg, -1), pool).reshape(B * K, -1)
        s_o, lp_o, mlp_o = _choose(c.o_logits, ko, rcfg.sampling.orchestrator,
                                   None if scripts is None else scripts.orch, c.orch_cursor)
        s_w, _, _ = _choose(slot_logits, kw, rcfg.sampling.subagents,
                            None if scripts is None else scripts.workers.reshape(B * K, -1),
                            c.worker_cursor)
        o, w, (ot, oe, osm, opos), (wt, we, wsm, wpos) = tick_fn(
            c.o, w, tasks.table, asked, s_o, s_w.reshape(B, K), ready)
        wt, we, wsm, wpos = (x.reshape(B * K) for x in (wt, we, wsm, wpos))
        b = c.bufs
        bufs = RolloutBuffers(
            tokens=_put(b.tokens, opos, ot, oe),
            loss_mask=_put(b.loss_mask, opos, osm, oe),
            logprobs=_put(b.logprobs, opos, jnp.where(osm, lp_o, 0.0), oe),
            model_logprobs=_put(b.model_logprobs, opos, jnp.where(osm, mlp_o, 0.0), oe),
            stage_ids=_put(b.stage_ids, opos, o.orch_steps, oe),
            worker_tokens=_put(b.worker_tokens, wpos, wt, we),
            worker_sampled=_put(b.worker_sampled, wpos, wsm, we))
        o_cache, o_logits = _step_model(orch_params, orch_cfg, c.o_cache, c.o_logits, ot, opos, oe)
        lane = lambda x: lanes_lib.to_lanes(x.reshape(D, S), pool).reshape(L)
        lane_emit, lane_pos = lane(we) & (pool.owner.reshape(L) >= 0), lane(wpos)
        w_cache, w_logits = _step_model(worker_params, worker_cfg, w_cache, c.w_logits, lane(wt),
                                        lane_pos, lane_emit)
        errors = c.index_errors
        if rcfg.check_indices:
            cache_bad = (lanes_lib.to_slots((lane_emit & ~_in_range(lane_pos, 0, W)).reshape(D, Lg), pool)
                         & (pool.lane_of >= 0))
            errors = errors + index_errors(
                ecfg, c.o, c.w, pool, (ot, oe, opos), (wt.reshape(B, K), we.reshape(B, K), wpos.reshape(B, K)),
                cache_bad.reshape(B, K)).astype(jnp.int32)
        pool = lanes_lib.release(pool, (w.phase == wsj.W_DONE).reshape(D, S))
        return TickCarry(t=c.t + 1, key=key, o=o, w=w, o_cache=o_cache, w_cache=w_cache,
                         o_logits=o_logits, w_logits=w_logits, bufs=bufs,
                         orch_cursor=c.orch_cursor + osm, worker_cursor=c.worker_cursor + wsm,
                         pool=pool, index_errors=errors)

    def cond(c: TickCarry):
        return (c.t < rcfg.max_ticks(S)) & jnp.any(c.o.end == wsj.RUNNING)

    carry = TickCarry(t=jnp.int32(0), key=key, o=o, w=w, o_cache=pre.cache, w_cache=w_cache,
                      o_logits=o_logits, w_logits=w_logits, bufs=bufs,
                      orch_cursor=jnp.zeros((B,), jnp.int32),
                      worker_cursor=jnp.zeros((B * K,), jnp.int32), pool=pool,
                      index_errors=(jnp.zeros((B, len(INDEX_CHECKS)), jnp.int32) if rcfg.check_indices
                                    else None))
    carry = lax.while_loop(cond, body, carry)
    t, o, w, bufs = carry.t, carry.o, carry.w, carry.bufs
    return RolloutResult(
        tokens=bufs.tokens, length=o.ctx_len, loss_mask=bufs.loss_mask,
        logprobs=bufs.logprobs, model_logprobs=bufs.model_logprobs, stage_ids=bufs.stage_ids,
        worker_tokens=bufs.worker_tokens.reshape(B, K, W), worker_length=w.ctx_len,
        worker_sampled=bufs.worker_sampled.reshape(B, K, W), worker_steps=w.steps,
        worker_stage=w.stage, worker_ok=w.ok & (w.phase == wsj.W_DONE), worker_return=w.ret,
        worker_return_len=w.ret_len, answer=o.answer,
        answer_len=o.ans_len, correct=o.correct, answered=o.answered, truth=tasks.n,
        orch_steps=o.orch_steps, critical_steps=o.critical, total_steps=o.total, spawned=o.spawned,
        finished=o.finished, end_reason=o.end, ticks=t,
        cut_by_max_ticks=jnp.sum(o.end == wsj.RUNNING, dtype=jnp.int32), index_errors=carry.index_errors)


class SwarmRollout:
    """:func:`rollout` jitted once per batch shape, optionally over a mesh.

    >>> engine = SwarmRollout(RolloutConfig(env=WideSearchConfig()), model_cfg)
    >>> result = engine(Roles.both(params), wsj.reset(key, env_cfg, 64), key)

    With ``mesh``, episodes (and their K sub-agent slots) are split over the mesh's
    data axes, weights follow the logical rule table, the caches are constrained
    batch-sharded; results come back sharded the same way.
    """

    _jitted: dict[tuple, Any] = {}      # class-wide cache of compiled rollouts

    def __init__(self, rcfg: RolloutConfig, cfg: ModelConfig | Roles[ModelConfig], *,
                 mesh: Mesh | None = None, rules=DEFAULT_RULES):
        if rcfg.env is None:
            raise ValueError("RolloutConfig.env is None: give the rules (a WideSearchConfig)")
        self.rcfg, self.cfgs = rcfg, Roles.of(cfg)
        self.mesh, self.rules = mesh, rules
        for name, cfg in (("orchestrator", self.cfgs.orchestrator), ("sub-agent", self.cfgs.subagents)):
            if cfg.vocab_size < wsj.Vocab(rcfg.env).size:
                raise ValueError(f"{name} model vocab_size {cfg.vocab_size} is smaller than the task "
                                 f"vocabulary ({wsj.Vocab(rcfg.env).size} tokens)")

    def groups(self, batch: int) -> int:
        """Lane pools: one per data shard when the batch splits evenly, else one."""
        if self.mesh is None:
            return 1
        shard = batch_sharding(self.mesh, 1, rules=self.rules, batch_size=batch)
        n = batch // shard.shard_shape((batch,))[0]
        return n if batch % n == 0 else 1

    def _constrain(self, batch: int):
        def fn(name, tree):
            if self.mesh is None:
                return tree
            cfg = self.cfgs.orchestrator if name == "orch_cache" else self.cfgs.subagents
            shards = tree_shardings(cache_logical_axes(cfg), tree, self.mesh, self.rules)
            return jax.lax.with_sharding_constraint(tree, shards)
        return fn

    def _compile(self, params: Roles, batch: int, scripted: bool):
        # shared by every engine with equal configs, so re-creating one does not recompile
        sig = (self.rcfg, self.cfgs, self.mesh, repr(self.rules), batch, scripted)
        if sig not in self._jitted:
            groups = self.groups(batch)

            def fn(params, tasks, key, scripts):
                return rollout(params, self.cfgs, self.rcfg, tasks, key,
                               scripts=scripts, constrain=self._constrain(batch), groups=groups)
            if self.mesh is None:
                self._jitted[sig] = jax.jit(fn)
            else:
                rows = lambda nd: batch_sharding(self.mesh, nd, rules=self.rules, batch_size=batch)
                shard = lambda cfg, p: tree_shardings(param_logical_axes(cfg), p, self.mesh, self.rules)
                task_sh = wsj.Tasks(table=rows(2), entities=rows(2), n=rows(1))
                script_sh = Scripts(orch=rows(2), workers=rows(3)) if scripted else None
                self._jitted[sig] = jax.jit(fn, in_shardings=(
                    self.cfgs.map(shard, params), task_sh,
                    NamedSharding(self.mesh, PartitionSpec()), script_sh))
        return self._jitted[sig]

    def __call__(self, params: Roles, tasks: wsj.Tasks, key: Array, *,
                 scripts: Scripts | None = None) -> RolloutResult:
        """The episodes of ``tasks`` (batch B) rolled out with ``params`` (a ``Roles``)."""
        batch = int(tasks.n.shape[0])
        fn = self._compile(params, batch, scripts is not None)
        return fn(params, tasks, key, scripts)
