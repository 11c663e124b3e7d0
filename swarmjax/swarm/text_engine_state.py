"""State of the jitted text swarm (:mod:`swarmjax.swarm.text_engine`): one model's agent
rows, the episodes (the engine's counts and the device task's state), the loop carry.
Shapes: B episodes, K sub-agents per episode, S = B x K sub-agent slots, R rows of a
model, X its context, C calls a turn, G fragments a response (the task's ``grid_width``).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import init_cache
from swarmjax.swarm.text_device import Rows
from swarmjax.text.device import answers as da
from swarmjax.text.device import calls as dc

Array = jax.Array
RUNNING_SLOT, ENDED_SLOT = 1, 2        # Episode.slot: 0 unused


@flax.struct.dataclass
class Trace:
    """Each row's conversation as heard and said: ids [R, X] int32, sampled [R, X] bool,
    logprobs / model_logprobs [R, X] f32, turn [R, X] int32 (0: prompt), length [R]."""

    ids: Array
    sampled: Array
    logprobs: Array
    model_logprobs: Array
    turn: Array
    length: Array

    @classmethod
    def init(cls, rows: int, width: int) -> Trace:
        z = lambda dt: jnp.zeros((rows, width), dt)
        return cls(ids=z(jnp.int32), sampled=z(bool), logprobs=z(jnp.float32), model_logprobs=z(jnp.float32),
                   turn=z(jnp.int32), length=jnp.zeros((rows,), jnp.int32))

    def hear(self, mask: Array, ids: Array, count: Array, turn: Array) -> Trace:
        """Append ``ids[r, :count[r]]`` ([R, Q]) to the rows in ``mask`` [R] (turn [R])."""
        R, Q = ids.shape
        col = self.length[:, None] + jnp.arange(Q)[None, :]                       # [R, Q]
        ok = mask[:, None] & (jnp.arange(Q)[None, :] < count[:, None])
        col = jnp.where(ok, col, self.ids.shape[1])                                  # out of range: dropped
        row = jnp.broadcast_to(jnp.arange(R)[:, None], (R, Q))
        put = lambda buf, val: buf.at[row, col].set(val, mode="drop")
        return self.replace(ids=put(self.ids, ids), sampled=put(self.sampled, jnp.zeros_like(ok)),
                            logprobs=put(self.logprobs, jnp.zeros(ids.shape, jnp.float32)),
                            model_logprobs=put(self.model_logprobs, jnp.zeros(ids.shape, jnp.float32)),
                            turn=put(self.turn, jnp.broadcast_to(turn[:, None], (R, Q))),
                            length=self.length + jnp.where(mask, count, 0))

    def say(self, mask: Array, tok: Array, lp: Array, mlp: Array, turn: Array) -> Trace:
        """Append one sampled id per row in ``mask`` [R]."""
        R = tok.shape[0]
        col = jnp.where(mask, self.length, self.ids.shape[1])
        put = lambda buf, val: buf.at[jnp.arange(R), col].set(val, mode="drop")
        return self.replace(ids=put(self.ids, tok), sampled=put(self.sampled, jnp.ones_like(mask)),
                            logprobs=put(self.logprobs, lp), model_logprobs=put(self.model_logprobs, mlp),
                            turn=put(self.turn, turn), length=self.length + mask)


@flax.struct.dataclass
class Agents:
    """One model's rows: the cache (:class:`Rows`), what they said and heard
    (:class:`Trace`), the parsers of the open turn and the turn's bookkeeping.

    turning [R] bool: the row's turn is open (it samples once it has heard everything:
    ``rows.pos == trace.length``); turn_len / limit [R]: ids sampled this turn / most it
    may sample; steps [R]: turns finished.
    """

    rows: Rows
    trace: Trace
    calls: dc.ParserState
    answers: da.AnswerState | None
    turning: Array
    turn_len: Array
    limit: Array
    steps: Array

    @classmethod
    def init(cls, cfg: ModelConfig, grammar: dc.CallGrammar, answers: da.AnswerGrammar | None, rows: int,
             slots: int, chunk: int, *, trace_width: int) -> Agents:
        """``rows`` rows with caches of ``slots + chunk`` slots (room for a chunk's padding)
        and traces of ``trace_width`` ids."""
        z = jnp.zeros((rows,), jnp.int32)
        r = Rows(cache=init_cache(cfg, rows, slots + chunk), logits=jnp.zeros((rows, cfg.vocab_size), jnp.float32),
                 pos=z, offset=z)
        return cls(rows=r, trace=Trace.init(rows, trace_width), calls=dc.init(grammar, rows),
                   answers=None if answers is None else da.init(answers, rows), turning=jnp.zeros((rows,), bool),
                   turn_len=z, limit=z, steps=z)


@flax.struct.dataclass
class Episodes:
    """Per episode [B] (and per sub-agent slot [S]) what the engine counts, and the
    task's own state.

    end [B] END_* (0 running); critical / total / spawned / finished [B]; the open
    stage: waiting [B] bool, grid [B, C+1, G] (its turn's responses, filled when it is
    over), responses [B], stage_agent [B, C] (agent k or -1), stage_slot [B, C] (slot s
    or -1), cut [B] (the turn that opened it was cut); per slot: slot [S] (0 unused,
    1 running, 2 ended), agent [S] (its name k), reason [S] R_*; task: the device task's
    state (:mod:`swarmjax.envs.device_api`).
    """

    end: Array
    critical: Array
    total: Array
    spawned: Array
    finished: Array
    waiting: Array
    grid: Array
    responses: Array
    stage_agent: Array
    stage_slot: Array
    cut: Array
    slot: Array
    agent: Array
    reason: Array
    task: Any

    @classmethod
    def init(cls, task: Any, batch: int, *, max_subagents: int, max_calls: int, grid_width: int) -> Episodes:
        B, K, C = batch, max_subagents, max_calls
        z = jnp.zeros((B,), jnp.int32)
        zs = jnp.zeros((B * K,), jnp.int32)
        return cls(end=z, critical=z, total=z, spawned=z, finished=z, waiting=jnp.zeros((B,), bool),
                   grid=jnp.zeros((B, C + 1, grid_width), jnp.int32), responses=z,
                   stage_agent=jnp.full((B, C), -1, jnp.int32), stage_slot=jnp.full((B, C), -1, jnp.int32),
                   cut=jnp.zeros((B,), bool), slot=zs, agent=zs, reason=zs, task=task)


@flax.struct.dataclass
class Carry:
    """The tick loop's carry."""

    tick: Array
    key: Array
    orch: Agents
    work: Agents
    eps: Episodes
    greedy: Array          # [] bool: both roles take the argmax (an evaluation)
    budget: Array          # [] int32: the critical-step budget (a large number: lifted)
