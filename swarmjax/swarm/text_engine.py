"""The jitted text swarm: orchestrators and their frozen sub-agents decode together in
one XLA program, tool calls parsed and answered on the device.

The host-driven :class:`~swarmjax.swarm.text_rollout.TextRollout` returns to Python at
every turn boundary to parse, run tools and tokenise replies. Here the whole rollout of
a batch of episodes of a *device task* (:mod:`swarmjax.envs.device_api`: the canonical
text wide-search :mod:`swarmjax.envs.widesearch_relay_device`, a generated tool
environment :mod:`swarmjax.envs.synth.device_task`) is one ``lax.while_loop`` of
*ticks*, with no host round trip:

* **rows.** B orchestrator rows (trainable params) and S = B x K sub-agent slots
  (frozen params; slot ``b K + j`` is episode b's j-th assignment). A row's conversation
  is its :class:`~swarmjax.swarm.text_engine_state.Trace` (what it heard and said, in
  order) and its KV cache holds the first ``pos`` ids of it.
* **a tick.** Every row whose turn is open and that has heard everything samples one id
  (written to its trace and fed to the device tool-call parser
  :mod:`swarmjax.text.device.calls` and answer-line parser
  :mod:`swarmjax.text.device.answers`); then each model runs ONE forward over its rows,
  feeding every row the ids of its trace it has not yet fed: 1 for a row that just
  sampled, up to ``chunk`` (F) environment ids for a row that was just answered (a
  chunked prefill; a tick where no row has more than one pending id runs the 1-wide
  forward instead, and a model with nothing to feed is skipped;
  :mod:`swarmjax.swarm.text_engine_feed`).
* **turn ends** (a stop id, or the turn's limit) are answered on the device by the
  task: the calls' responses are joined from token fragments and written to the trace
  (fed in the next ticks); calls that start sub-agents start them in their slots with
  prompts the task builds; when a stage's sub-agents have all ended, the task fills
  the orchestrator's pending responses with their results; an answer (a turn without
  calls) ends the agent. A task without sub-agents (K = 0) runs the orchestrator rows
  alone.

Counting and limits are :class:`TextRollout`'s exactly (its docstring): a turn is one
step; a stage costs 1 + its longest sub-agent on the critical path; an orchestrator turn
starts only while ``critical + 1 <= budget``; a sub-agent is stopped after
``subagent_turns`` turns; ids a context cannot hold (with one more) end the agent; a
turn samples at most ``min(max_turn_tokens, context - length)`` ids. So with a task's
host twin in a ``TextRollout`` (one sub-agent lane per slot) the two give the same
trajectories (tests/test_text_engine.py, tests/test_synth_engine.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from swarmjax.envs.device_api import R_ANSWER, R_CONTEXT, R_TURNS, DeviceTask
from swarmjax.envs.widesearch_jax import END_ANSWER, END_BUDGET, END_CONTEXT, RUNNING
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import cache_logical_axes, param_logical_axes
from swarmjax.roles import Roles
from swarmjax.swarm.text_device import agent_keys, choose, make_prefix, position_keys
from swarmjax.swarm.text_engine_feed import RoleModel, feed
from swarmjax.swarm.text_engine_state import ENDED_SLOT, RUNNING_SLOT, Agents, Carry, Episodes
from swarmjax.swarm.text_types import AgentTrace, SwarmConfig, TextRolloutConfig, TextRolloutResult, check_budget
from swarmjax.sharding.mesh import DEFAULT_RULES, batch_sharding, tree_shardings
from swarmjax.text.device import answers as da
from swarmjax.text.device import calls as dc
from swarmjax.text.fragments import render

Array = jax.Array
_NO_BUDGET = 2 ** 30          # the budget argument when it is lifted: never reached


class TextSwarm:
    """Jitted rollouts of a device task's episodes.

    Args:
      task: the :class:`~swarmjax.envs.device_api.DeviceTask` (a task plug-in's device
        twin: :func:`swarmjax.envs.task.device_twin`).
      cfg: the model config of both roles, or a ``Roles`` of the two (the same
        architecture as a rule).
      rcfg: the :class:`TextRolloutConfig` (contexts, turn limit, sub-agent turns,
        budget, sampling; ``subagent_lanes`` and the host rollout's bucketing are unused:
        every slot has its own row).
      swarm: the :class:`~swarmjax.swarm.text_types.SwarmConfig` (prefill chunk, the
        share of rows fed a chunk a tick, the row and window sizes each tick's forwards are
        compiled for, per-episode keys). ``buckets`` applies without a mesh only: on a mesh
        the rows stay where they are sharded (buckets = 1).
      mesh: optional mesh: episodes (and their sub-agent slots, ``b K + j``) are split
        over its batch axes (``data`` x ``fsdp``), weights follow the logical rules, the
        caches are constrained batch-sharded.
    """

    def __init__(self, task: DeviceTask, cfg: ModelConfig | Roles[ModelConfig], rcfg: TextRolloutConfig, *,
                 swarm: SwarmConfig = SwarmConfig(),
                 mesh: Mesh | None = None, rules=DEFAULT_RULES):
        if rcfg.context.strategy != "none":
            raise ValueError(f"context strategy {rcfg.context.strategy!r}: the device swarm has none (its "
                             "sub-agents are its context management); use the host rollout (TextRollout)")
        if not isinstance(task, DeviceTask):
            raise TypeError(f"TextSwarm runs a DeviceTask, got {type(task).__name__} (a task plug-in's device twin: "
                            "swarmjax.envs.task.device_twin)")
        self.buckets = 1 if mesh is not None else swarm.buckets
        cfgs = Roles.of(cfg)
        for name, c in (("orchestrator", cfgs.orchestrator), ("sub-agent", cfgs.subagents)):
            if c.vocab_size < task.chat.tokenizer.vocab_size:
                raise ValueError(f"{name} model vocab_size {c.vocab_size} is smaller than the tokenizer's "
                                 f"({task.chat.tokenizer.vocab_size} ids)")
        self.task, self.rcfg, self.chunk, self.wide_rows = task, rcfg, swarm.chunk, swarm.wide_rows
        self.K = task.max_subagents
        self.answers = task.answer_grammar
        self.orch = RoleModel(cfgs.orchestrator, task.grammar("orchestrator"), rcfg.contexts.orchestrator,
                              rcfg.sampling.orchestrator)
        self.work = RoleModel(cfgs.subagents, task.grammar("worker") if self.K else None,
                              rcfg.contexts.subagents, rcfg.sampling.subagents)
        self.stop_ids = jnp.asarray(task.chat.stop_ids)
        self.pad_id = task.chat.tokenizer.token_id(task.chat.pad_token)
        self.mesh, self.rules, self.episode_keys = mesh, rules, swarm.episode_keys
        self._jitted: dict[int, Any] = {}
        self._heads = {role: np.asarray(task.head_ids(role), np.int32)
                       for role in ("orchestrator",) + (("worker",) if self.K else ())}

    def _compiled(self, params: Roles, arrays: Any, batch: int):
        """The rollout jitted for ``batch`` episodes (over the mesh's batch axes, if any)."""
        if batch not in self._jitted:
            if self.mesh is None:
                self._jitted[batch] = jax.jit(self._rollout)
            else:
                rows = lambda nd: batch_sharding(self.mesh, nd, rules=self.rules, batch_size=batch)  # noqa: E731
                shard = lambda cfg, p: tree_shardings(param_logical_axes(cfg), p, self.mesh, self.rules)  # noqa: E731
                one = NamedSharding(self.mesh, PartitionSpec())
                self._jitted[batch] = jax.jit(self._rollout, in_shardings=(
                    Roles(shard(self.orch.cfg, params.orchestrator),
                          shard(self.work.cfg, params.subagents) if self.K else None),
                    jax.tree.map(lambda x: rows(np.ndim(x)), arrays), rows(2), rows(1), one, rows(1), rows(3),
                    rows(3), one, one))
        return self._jitted[batch]

    def _agents(self, params: Any, m: RoleModel, role: str, rows: int) -> Agents:
        """``rows`` fresh rows of ``role`` attending over the role's shared prefix: the
        prompt's head (system turn, tool schemas, the user turn's opening), prefilled
        once (:func:`~swarmjax.swarm.text_device.make_prefix`, cascade attention as in
        the host rollout), so each row's cache holds only what follows it."""
        head = self._heads[role]
        P = len(head)
        prefix = make_prefix(params, m.cfg, jnp.asarray(head), jnp.int32(P))
        a = Agents.init(m.cfg, m.grammar, self.answers, rows, m.context - P, self.chunk, trace_width=m.context)
        a = a.replace(rows=a.rows.replace(prefix=prefix, offset=jnp.full((rows,), P, jnp.int32)))
        return self._constrain(m.cfg, a)

    def _constrain(self, cfg: ModelConfig, a: Agents) -> Agents:
        if self.mesh is None:
            return a
        cache = a.rows.cache
        cache = jax.lax.with_sharding_constraint(
            cache, tree_shardings(cache_logical_axes(cfg), cache, self.mesh, self.rules))
        return a.replace(rows=a.rows.replace(cache=cache))

    # ------------------------------------------------------------------ host entry point

    def __call__(self, params: Roles, problems: Sequence[Any], key: Array, *,
                 scripts: Any = None, greedy: bool = False, budget: int | None | str = "config",
                 episode_ids: Sequence[int] | None = None) -> TextRolloutResult:
        """Run ``len(problems)`` episodes to their end with ``params`` (a ``Roles`` of the
        orchestrator's and the sub-agents' params); ``scripts`` an optional
        :class:`~swarmjax.swarm.text_types.TextScripts` of forced turns (ids -1: sample);
        ``episode_ids`` [B] the episodes' ids for their keys (``episode_keys``; default
        ``0..B-1``).

        ``greedy``: both roles take the argmax (an evaluation); ``budget``: the critical-step
        budget, "config" for ``rcfg.budget``, None lifted. Both are arguments of the one
        compiled program, so a training rollout and a greedy, budget-lifted evaluation of
        the same batch size share it."""
        if budget == "config":
            budget = self.rcfg.budget
        check_budget(budget)
        if not problems:
            raise ValueError("no episodes")
        arrays, prompts = self.task.batch(list(problems))
        head, X = self._heads["orchestrator"], self.rcfg.contexts.orchestrator
        ids = np.zeros((len(prompts), X), np.int32)
        for b, p in enumerate(prompts):
            if len(p) + 1 > X:
                raise ValueError(f"a prompt of {len(p)} ids does not fit contexts.orchestrator={X}")
            if not np.array_equal(p[:len(head)], head):
                raise ValueError(f"episode {b}: its prompt does not open with the task's shared head")
            ids[b, :len(p)] = p
        lens = np.asarray([len(p) for p in prompts], np.int32)
        eids = np.arange(len(problems), dtype=np.int32) if episode_ids is None else np.asarray(episode_ids, np.int32)
        if eids.shape != (len(problems),):
            raise ValueError(f"episode_ids: {len(eids)} ids for {len(problems)} episodes")
        o_script, w_script = self._scripts(scripts, len(problems))
        params = Roles(params.orchestrator, params.subagents if self.K else None)
        run = self._compiled(params, arrays, len(problems))
        out = jax.device_get(run(params, arrays, jnp.asarray(ids),
                                 jnp.asarray(lens), key, jnp.asarray(eids), o_script, w_script,
                                 jnp.asarray(greedy, bool),
                                 jnp.asarray(_NO_BUDGET if budget is None else budget, jnp.int32)))
        return self._result(list(problems), out)

    def _scripts(self, scripts, B: int) -> tuple[Array, Array]:
        """[B, NT, T] / [S, NTw, T] int32 forced ids (-1: sample; a turn's length is its
        ids >= 0 run; an all -1 turn is not scripted)."""
        T, K = self.rcfg.max_turn_tokens, self.K
        orch = [list(scripts.orch[b]) if scripts is not None and b < len(scripts.orch) else [] for b in range(B)]
        work = [[] for _ in range(B * K)]
        if scripts is not None:
            for b, per in enumerate(scripts.workers[:B]):
                for j, turns in enumerate(per[:K]):
                    work[b * K + j] = list(turns)

        def pack(rows):
            nt = max([len(r) for r in rows] + [1])
            out = np.full((len(rows), nt, T), -1, np.int32)
            for i, turns in enumerate(rows):
                for k, ids in enumerate(turns):
                    ids = np.asarray(ids, np.int32)[:T]
                    out[i, k, :len(ids)] = ids
            return jnp.asarray(out)
        return pack(orch), pack(work)

    # ------------------------------------------------------------------ the device program

    def _open(self, m: RoleModel, a: Agents, mask: Array, script: Array) -> Agents:
        """Open a turn on the rows in ``mask``: limit = min(T, context - length, scripted length)."""
        T = self.rcfg.max_turn_tokens
        k = jnp.minimum(a.steps, script.shape[1] - 1)
        ids = script[jnp.arange(script.shape[0]), k]                                        # [R, T]
        slen = jnp.where(a.steps < script.shape[1], jnp.sum(jnp.cumprod(ids >= 0, axis=1), axis=1), 0)
        limit = jnp.minimum(T, m.context - a.trace.length)
        limit = jnp.where(slen > 0, jnp.minimum(limit, slen), limit)
        answers = a.answers if self.answers is None else da.reset(self.answers, a.answers, mask)
        return a.replace(turning=a.turning | mask, turn_len=jnp.where(mask, 0, a.turn_len),
                         limit=jnp.where(mask, limit, a.limit), calls=dc.reset_turn(m.grammar, a.calls, mask),
                         answers=answers)

    def _sample(self, params: Any, m: RoleModel, a: Agents, alive: Array, key: Array, script: Array, greedy: Array
                ) -> tuple[Agents, Array, Array]:
        """One id for every row whose turn is open and which has heard everything.
        Returns the agents and the rows whose turn ended: (ended [R], cut [R])."""
        go = a.turning & alive & (a.rows.offset + a.rows.pos == a.trace.length)
        k = jnp.minimum(a.steps, script.shape[1] - 1)
        forced = jnp.where(a.steps < script.shape[1],
                           script[jnp.arange(script.shape[0]), k, jnp.minimum(a.turn_len, script.shape[2] - 1)], -1)
        tok, lp, mlp = choose(a.rows.logits, key, m.sampling, forced, greedy=greedy)
        trace = a.trace.say(go, tok, lp, mlp, a.steps + 1)
        turn_len = a.turn_len + go
        calls = dc.step(m.grammar, a.calls, tok, go)
        stopped = go & jnp.any(tok[:, None] == self.stop_ids[None, :], axis=1)
        ended = stopped | (go & (turn_len >= a.limit))
        cut = ended & ~stopped
        calls = dc.finish(m.grammar, dc.drain(m.grammar, calls, stopped), cut)
        answers = a.answers
        if self.answers is not None:
            answers = da.finish(self.answers, da.step(self.answers, answers, tok, go), ended)
        return a.replace(trace=trace, turn_len=turn_len, calls=calls, answers=answers,
                         turning=a.turning & ~ended), ended, cut

    def _reply(self, m: RoleModel, a: Agents, mask: Array, grid: Array, responses: Array, cut: Array
               ) -> tuple[Agents, Array]:
        """Write the responses of each row in ``mask`` to its trace if its context holds
        them and one more id. Returns the agents and which rows heard them."""
        seq = jax.vmap(self.task.reply_seq)(grid, responses, cut)
        width = self.task.widths["reply" if m is self.orch else "worker_reply"]
        ids, n = render(self.task.frags, seq, width=width)
        fits = mask & (a.trace.length + n + 1 <= m.context)
        return a.replace(trace=a.trace.hear(fits, ids, n, a.steps)), fits

    def _orch_turns(self, c: Carry, ended: Array, cut: Array, script: Array, w_script: Array) -> Carry:
        """Orchestrator turns that ended: answer, immediate responses, or a stage."""
        o, e, K = c.orch, c.eps, self.K
        B = ended.shape[0]
        o = o.replace(steps=o.steps + ended)
        e = e.replace(critical=e.critical + ended, total=e.total + ended)
        count = o.calls.count
        answer = ended & (count == 0)
        state = self.task.orch_answer(e.task, o.answers, answer)
        e = e.replace(end=jnp.where(answer, END_ANSWER, e.end))
        acted = ended & (count > 0)
        state, turn = self.task.orch_turn(state, dc.call_record(self.orch.grammar, o.calls), count, acted)
        runs = acted[:, None] & (turn.spawn >= 0)                                           # [B, C]
        rank = jnp.cumsum(runs, axis=1) - 1
        slot_of = jnp.where(runs, jnp.arange(B)[:, None] * K + e.spawned[:, None] + rank, -1)
        stage = jnp.any(runs, axis=1)
        keep = lambda new, old: jnp.where(acted.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
        e = e.replace(spawned=e.spawned + runs.sum(1), waiting=e.waiting | stage,
                      grid=keep(turn.grid, e.grid), responses=keep(turn.responses, e.responses),
                      stage_agent=keep(jnp.where(runs, turn.spawn, -1), e.stage_agent),
                      stage_slot=keep(slot_of, e.stage_slot), cut=keep(cut, e.cut), task=state)
        c = c.replace(orch=o, eps=e)
        if K:
            # sub-agents of the new stages: slot s runs the call whose slot_of is s
            S = B * K
            flat = slot_of.reshape(-1)                                                       # [B C]
            start = jnp.zeros((S,), bool).at[jnp.maximum(flat, 0)].max(flat >= 0)
            src = jnp.zeros((S,), jnp.int32).at[jnp.maximum(flat, 0)].max(
                jnp.where(flat >= 0, jnp.arange(flat.shape[0]), 0))
            args = turn.args.reshape(flat.shape[0], -1)[src]                                 # [S, M]
            c = c.replace(eps=e.replace(agent=jnp.where(start, turn.spawn.reshape(-1)[src], e.agent)))
            c = self._start_workers(c, start, args, w_script)
        return self._orch_reply(c, acted & ~stage, script)

    def _start_workers(self, c: Carry, start: Array, args: Array, script: Array) -> Carry:
        """Reset the slots in ``start`` [S] and say their prompts (from args [S, M]); a
        prompt their context cannot hold ends them at once (reason context)."""
        w, e = c.work, c.eps
        ids, n = render(self.task.frags, self.task.worker_prompt(args), width=self.task.widths["worker"])
        fits = start & (n + 1 <= self.work.context)
        rows = w.rows
        rows = rows.replace(pos=jnp.where(start, 0, rows.pos),
                            cache=rows.cache.replace(valid=jnp.where(start[:, None], False, rows.cache.valid)))
        trace = w.trace.replace(length=jnp.where(start, 0, w.trace.length))
        w = w.replace(rows=rows, trace=trace.hear(fits, ids, n, jnp.zeros_like(n)),
                      steps=jnp.where(start, 0, w.steps), turning=w.turning & ~start)
        w = self._open(self.work, w, fits, script)
        e = e.replace(slot=jnp.where(fits, RUNNING_SLOT, jnp.where(start, ENDED_SLOT, e.slot)),
                      reason=jnp.where(start & ~fits, R_CONTEXT, jnp.where(start, R_ANSWER, e.reason)))
        return c.replace(work=w, eps=e)

    def _orch_reply(self, c: Carry, mask: Array, script: Array) -> Carry:
        """Responses to the rows in ``mask``; then the next turn, budget permitting."""
        o, e = c.orch, c.eps
        o, heard = self._reply(self.orch, o, mask, e.grid, e.responses, e.cut)
        over = heard & (e.critical + 1 > c.budget)
        e = e.replace(end=jnp.where(mask & ~heard, END_CONTEXT, jnp.where(over, END_BUDGET, e.end)))
        o = self._open(self.orch, o, heard & ~over, script)
        return c.replace(orch=o, eps=e)

    def _worker_turns(self, c: Carry, ended: Array, cut: Array, script: Array) -> Carry:
        """Sub-agent turns that ended: an answer (relayed), the turn limit, or responses."""
        w, e = c.work, c.eps
        w = w.replace(steps=w.steps + ended)
        count = w.calls.count
        answer = ended & (count == 0)
        stopped = ended & ~answer & (w.steps >= self.rcfg.subagent_turns)
        acted = ended & ~answer & ~stopped
        state = self.task.worker_answer(e.task, w.answers, answer)
        state, turn = self.task.worker_turn(state, dc.call_record(self.work.grammar, w.calls), count, acted)
        w, heard = self._reply(self.work, w, acted, turn.grid, turn.responses, cut)
        w = self._open(self.work, w, heard, script)
        gone = answer | stopped | (acted & ~heard)
        reason = jnp.select([answer, stopped], [R_ANSWER, R_TURNS], R_CONTEXT)
        e = e.replace(slot=jnp.where(gone, ENDED_SLOT, e.slot), reason=jnp.where(gone, reason, e.reason), task=state)
        return c.replace(work=w, eps=e)

    def _stages(self, c: Carry, script: Array) -> Carry:
        """Stages whose sub-agents have all ended: count them, let the task fill in
        their results, reply."""
        e, w = c.eps, c.work
        slot = jnp.maximum(e.stage_slot, 0)                                                  # [B, C]
        member = e.stage_slot >= 0
        over = e.waiting & jnp.all(~member | (e.slot[slot] == ENDED_SLOT), axis=1)
        steps = jnp.where(member, w.steps[slot], 0)
        ok = member & (e.reason[slot] == R_ANSWER)
        state, grid = self.task.stage_over(e.task, over, e.grid, e.stage_agent, slot,
                                           jnp.where(member, e.reason[slot], R_ANSWER))
        e = e.replace(critical=e.critical + jnp.where(over, steps.max(1), 0),
                      total=e.total + jnp.where(over, steps.sum(1), 0),
                      finished=e.finished + jnp.where(over, ok.sum(1), 0),
                      waiting=e.waiting & ~over, grid=grid, task=state,
                      stage_slot=jnp.where(over[:, None], -1, e.stage_slot))
        return self._orch_reply(c.replace(eps=e), over, script)

    def _tick(self, params: Roles, scripts: tuple, ropes: tuple, agents: tuple, c: Carry) -> Carry:
        """One tick (module docstring), ``text_swarm_tick`` in a profile; ``agents``: the
        rows' agent keys (orchestrators [B], sub-agent slots [B K]) when ``episode_keys``,
        else None."""
        with jax.named_scope("text_swarm_tick"):
            return self._tick_body(params, scripts, ropes, agents, c)

    def _tick_body(self, params: Roles, scripts: tuple, ropes: tuple, agents: tuple, c: Carry) -> Carry:
        orch_params, work_params = params.orchestrator, params.subagents
        o_script, w_script = scripts
        o_rope, w_rope = ropes
        if self.episode_keys:           # per row: its episode, agent and position (the key stays)
            key, ko = c.key, position_keys(agents[0], c.orch.trace.length)
            kw = None if c.work is None else position_keys(agents[1], c.work.trace.length)
        else:
            key, ko, kw = jax.random.split(c.key, 3)
        wide = lambda rows: max(1, int(round(self.wide_rows * rows)))                       # noqa: E731
        o, o_end, o_cut = self._sample(orch_params, self.orch, c.orch, c.eps.end == RUNNING, ko, o_script, c.greedy)
        o = feed(orch_params, self.orch, o, c.eps.end == RUNNING, self.chunk, wide(o.turning.shape[0]),
                 self.buckets, o_rope)
        c = c.replace(tick=c.tick + 1, key=key, orch=o)
        if not self.K:
            return lax.cond(jnp.any(o_end), lambda c: self._orch_turns(c, o_end, o_cut, o_script, w_script),
                            lambda c: c, c)
        w, w_end, w_cut = self._sample(work_params, self.work, c.work, c.eps.slot == RUNNING_SLOT, kw, w_script,
                                       c.greedy)
        w = feed(work_params, self.work, w, c.eps.slot == RUNNING_SLOT, self.chunk, wide(w.turning.shape[0]),
                 self.buckets, w_rope)
        c = c.replace(work=w)

        def events(c: Carry) -> Carry:
            c = self._orch_turns(c, o_end, o_cut, o_script, w_script)
            c = self._worker_turns(c, w_end, w_cut, w_script)
            return self._stages(c, o_script)
        return lax.cond(jnp.any(o_end) | jnp.any(w_end), events, lambda c: c, c)

    def _rollout(self, params: Roles, arrays, prompt, prompt_len, key, episode_ids, o_script, w_script,
                 greedy, budget) -> dict[str, Any]:
        B, K = prompt.shape[0], self.K
        agents = None if not self.episode_keys else (                                         # per-row keys
            agent_keys(key, jnp.stack([episode_ids, jnp.zeros_like(episode_ids)], 1)),                # [B]
            agent_keys(key, jnp.stack([jnp.repeat(episode_ids, K),                                     # [B K]
                                       jnp.tile(jnp.arange(1, K + 1, dtype=jnp.int32), B)], 1)))
        eps = Episodes.init(self.task.init(arrays), B, max_subagents=K, max_calls=self.task.max_calls,
                            grid_width=self.task.grid_width)
        orch = self._agents(params.orchestrator, self.orch, "orchestrator", B)
        work = self._agents(params.subagents, self.work, "worker", B * K) if K else None
        orch = orch.replace(trace=orch.trace.hear(jnp.ones((B,), bool), prompt, prompt_len,
                                                  jnp.zeros_like(prompt_len)))
        orch = self._open(self.orch, orch, jnp.ones((B,), bool), o_script)
        c = Carry(tick=jnp.int32(0), key=key, orch=orch, work=work, eps=eps, greedy=greedy, budget=budget)
        ropes = tuple(None if a is None else a.rows.rope(m.cfg, a.rows.cache.max_len)
                      for a, m in ((orch, self.orch), (work, self.work)))
        max_ticks = self.rcfg.contexts.orchestrator + K * self.rcfg.contexts.subagents + 2
        c = lax.while_loop(lambda c: jnp.any(c.eps.end == RUNNING) & (c.tick < max_ticks),
                           functools.partial(self._tick, params, (o_script, w_script), ropes,
                                             agents), c)
        return {"orch": c.orch.trace, "work": None if work is None else c.work.trace, "eps": c.eps,
                "orch_steps": c.orch.steps, "work_steps": None if work is None else c.work.steps, "ticks": c.tick}

    # ------------------------------------------------------------------ host result

    def _result(self, problems: list[Any], out: dict[str, Any]) -> TextRolloutResult:
        e, tr, wt = out["eps"], out["orch"], out["work"]
        B, X = tr.ids.shape
        K = self.K
        valid = np.arange(X)[None, :] < tr.length[:, None]
        traces = [_agent_trace("orchestrator", tr, b, int(out["orch_steps"][b])) for b in range(B)]
        subs = []
        for b in range(B):
            subs.append([_agent_trace(self.task.agent_names[int(e.agent[b * K + j])], wt, b * K + j,
                                      int(out["work_steps"][b * K + j]))
                         for j in range(int(e.spawned[b]))])
        answers = []
        for b in range(B):
            last = (tr.turn[b] == out["orch_steps"][b]) & tr.sampled[b] & valid[b]
            answers.append(self.task.chat.tokenizer.decode(tr.ids[b][last]) if e.end[b] == END_ANSWER else None)
        return TextRolloutResult(
            tokens=np.where(valid, tr.ids, self.pad_id).astype(np.int32), length=tr.length.astype(np.int32),
            loss_mask=tr.sampled & valid, logprobs=tr.logprobs, model_logprobs=tr.model_logprobs,
            stage_ids=np.where(valid, tr.turn, 0), orch_steps=out["orch_steps"].astype(np.int32),
            critical_steps=e.critical, total_steps=e.total, spawned=e.spawned, finished=e.finished,
            end_reason=e.end, rewards=self.task.rewards(problems, e.task, answers),
            answers=answers, orchestrators=traces, subagents=subs,
            stats={"ticks": int(out["ticks"]), "cut_by_max_ticks": int(np.sum(e.end == RUNNING))})


def _agent_trace(name: str, tr, r: int, steps: int) -> AgentTrace:
    n = int(tr.length[r])
    t = AgentTrace(name=name, steps=steps)
    t.ids, t.sampled = [tr.ids[r, :n]], [tr.sampled[r, :n]]
    t.logprobs, t.model_logprobs, t.turn = [tr.logprobs[r, :n]], [tr.model_logprobs[r, :n]], [tr.turn[r, :n]]
    return t
