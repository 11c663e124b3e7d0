"""The jitted text swarm: orchestrators and their frozen sub-agents decode together in
one XLA program, tool calls parsed and answered on the device.

The host-driven :class:`~swarmjax.swarm.text_rollout.TextRollout` returns to Python at
every turn boundary to parse, run tools and tokenise replies. Here the whole rollout of
a batch of canonical text wide-search episodes (:mod:`swarmjax.envs.widesearch_relay`)
is one ``lax.while_loop`` of *ticks*, with no host round trip:

* **rows.** B orchestrator rows (trainable params) and S = B x K sub-agent slots
  (frozen params; slot ``b K + j`` is episode b's j-th assignment). A row's conversation
  is its :class:`~swarmjax.swarm.text_engine_state.Trace` (what it heard and said, in
  order) and its KV cache holds the first ``pos`` ids of it.
* **a tick.** Every row whose turn is open and that has heard everything samples one id
  (written to its trace and fed to the device tool-call parser
  :mod:`swarmjax.text.device_calls` and answer-line parser
  :mod:`swarmjax.text.device_answers`); then each model runs ONE forward over its rows,
  feeding every row the ids of its trace it has not yet fed: 1 for a row that just
  sampled, up to ``chunk`` (F) environment ids for a row that was just answered (a
  chunked prefill; a tick where no row has more than one pending id runs the 1-wide
  forward instead, and a model with nothing to feed is skipped;
  :mod:`swarmjax.swarm.text_engine_feed`).
* **turn ends** (a stop id, or the turn's limit) are answered on the device
  (:mod:`swarmjax.envs.widesearch_relay_device`): the calls' responses are joined from
  token fragments and written to the trace (fed in the next ticks); ``assign_task``
  calls start sub-agents in their slots with prompts rebuilt from the entities their
  prompt mentions; when a stage's sub-agents have all ended, their relayed answers fill
  the orchestrator's responses; an answer (a turn without calls) ends the agent.

Counting and limits are :class:`TextRollout`'s exactly (its docstring): a turn is one
step; a stage costs 1 + its longest sub-agent on the critical path; an orchestrator turn
starts only while ``critical + 1 <= budget``; a sub-agent is stopped after
``subagent_turns`` turns; ids a context cannot hold (with one more) end the agent; a
turn samples at most ``min(max_turn_tokens, context - length)`` ids. So with the
host twin :class:`~swarmjax.envs.widesearch_relay.RelayEnv` in a ``TextRollout`` (one
sub-agent lane per slot) the two give the same trajectories (tests/test_text_engine.py).
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

from swarmjax.envs import widesearch_relay_device as rd
from swarmjax.envs.widesearch import Episode
from swarmjax.envs.widesearch_jax import END_ANSWER, END_BUDGET, END_CONTEXT, RUNNING
from swarmjax.envs.widesearch_relay import RelayTask
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import cache_logical_axes, param_logical_axes
from swarmjax.swarm.text_device import choose, make_prefix
from swarmjax.swarm.text_engine_feed import RoleModel, feed
from swarmjax.swarm.text_engine_state import ENDED_SLOT, RUNNING_SLOT, Agents, Carry, Episodes
from swarmjax.swarm.text_types import AgentTrace, TextRolloutConfig, TextRolloutResult, check_budget
from swarmjax.sharding.mesh import DEFAULT_RULES, batch_sharding, tree_shardings
from swarmjax.text import device_answers as da
from swarmjax.text import device_calls as dc
from swarmjax.text.fragments import render

Array = jax.Array
_NO_BUDGET = 2 ** 30          # the budget argument when it is lifted: never reached


class TextSwarm:
    """Jitted rollouts of canonical text wide-search episodes.

    Args:
      task: the :class:`RelayTask` (names, chat format, tokenizer, limits).
      orch_cfg / worker_cfg: the two models' configs (the same architecture as a rule).
      rcfg: the :class:`TextRolloutConfig` (contexts, turn limit, sub-agent turns,
        budget, sampling; ``worker_lanes`` and the host rollout's bucketing are unused:
        every slot has its own row).
      chunk: F, the most environment ids a row is fed in one tick.
      wide_rows: the most rows (a fraction of each model's rows) fed a chunk in one
        tick; the others with a backlog are fed one id that tick.
      buckets: how many sizes of rows and of cache windows each forward of a tick is
        compiled for (``lax.switch`` picks the smallest that holds the rows it feeds and
        the slots they use, :func:`compact_forward`); 1 runs every row over its whole
        cache each tick. Without a mesh only: on a mesh the rows stay where they are
        sharded (buckets = 1).
      mesh: optional mesh: episodes (and their sub-agent slots, ``b K + j``) are split
        over its batch axes (``data`` x ``fsdp``), weights follow the logical rules, the
        caches are constrained batch-sharded.
    """

    def __init__(self, task: RelayTask, orch_cfg: ModelConfig, rcfg: TextRolloutConfig, *,
                 worker_cfg: ModelConfig | None = None, chunk: int = 16, wide_rows: float = 0.25,
                 buckets: int = 3, mesh: Mesh | None = None,
                 rules=DEFAULT_RULES):
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if not 0.0 < wide_rows <= 1.0:
            raise ValueError(f"wide_rows must be in (0, 1], got {wide_rows}")
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        if rcfg.context.strategy != "none":
            raise ValueError(f"context strategy {rcfg.context.strategy!r}: the device swarm has none (its "
                             "sub-agents are its context management); use the host rollout (TextRollout)")
        self.buckets = 1 if mesh is not None else buckets
        for name, cfg in (("orchestrator", orch_cfg), ("sub-agent", worker_cfg or orch_cfg)):
            if cfg.vocab_size < task.chat.tokenizer.vocab_size:
                raise ValueError(f"{name} model vocab_size {cfg.vocab_size} is smaller than the tokenizer's "
                                 f"({task.chat.tokenizer.vocab_size} ids)")
        self.task, self.rcfg, self.chunk, self.wide_rows = task, rcfg, chunk, wide_rows
        tok = task.chat.tokenizer
        self.tables = rd.RelayTables.build(task)
        self.widths = self.tables.widths(task)
        grammar = lambda role: dc.CallGrammar.build(tok, task.tools(role), max_calls=task.max_calls,
                                                    max_mentions=task.max_mentions, mention_phrases=task.entity_names)
        self.answers = da.AnswerGrammar.build(tok, task.entity_names, task.value_names, max_pairs=task.max_pairs)
        self.orch = RoleModel(orch_cfg, grammar("orchestrator"), rcfg.orch_context, rcfg.orch_sampling)
        self.work = RoleModel(worker_cfg or orch_cfg, grammar("worker"), rcfg.worker_context, rcfg.worker_sampling)
        self.stop_ids = jnp.asarray(task.chat.stop_ids)
        self.pad_id = tok.token_id(task.chat.pad_token)
        self.mesh, self.rules = mesh, rules
        self._jitted: dict[int, Any] = {}
        ids, lens = np.asarray(self.tables.frags.ids), np.asarray(self.tables.frags.lens)
        self._heads = {role: ids[self.tables.c[f"{role}_head"], :lens[self.tables.c[f"{role}_head"]]]
                       for role in ("orchestrator", "worker")}   # each role's shared prefix

    def _compiled(self, orch_params: Any, worker_params: Any, batch: int):
        """The rollout jitted for ``batch`` episodes (over the mesh's batch axes, if any)."""
        if batch not in self._jitted:
            if self.mesh is None:
                self._jitted[batch] = jax.jit(self._rollout)
            else:
                rows = lambda nd: batch_sharding(self.mesh, nd, rules=self.rules, batch_size=batch)
                shard = lambda cfg, p: tree_shardings(param_logical_axes(cfg), p, self.mesh, self.rules)
                self._jitted[batch] = jax.jit(self._rollout, in_shardings=(
                    shard(self.orch.cfg, orch_params), shard(self.work.cfg, worker_params), rows(2), rows(2),
                    NamedSharding(self.mesh, PartitionSpec()), rows(3), rows(3),
                    NamedSharding(self.mesh, PartitionSpec()), NamedSharding(self.mesh, PartitionSpec())))
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

    def __call__(self, orch_params: Any, worker_params: Any, episodes: Sequence[Episode], key: Array, *,
                 scripts: Any = None, greedy: bool = False, budget: int | None | str = "config"
                 ) -> TextRolloutResult:
        """Run ``len(episodes)`` episodes to their end; ``scripts`` an optional
        :class:`~swarmjax.swarm.text_types.TextScripts` of forced turns (ids -1: sample).

        ``greedy``: both roles take the argmax (an evaluation); ``budget``: the critical-step
        budget, "config" for ``rcfg.budget``, None lifted. Both are arguments of the one
        compiled program, so a training rollout and a greedy, budget-lifted evaluation of
        the same batch size share it."""
        if budget == "config":
            budget = self.rcfg.budget
        check_budget(budget)
        cfg = self.task.cfg
        if not episodes:
            raise ValueError("no episodes")
        for i, ep in enumerate(episodes):
            if not 1 <= len(ep.task) <= cfg.max_task_size or len(ep.table) != cfg.num_entities \
                    or not all(0 <= e < cfg.num_entities for e in ep.task):
                raise ValueError(f"episode {i}: a task of 1..{cfg.max_task_size} entity ids below "
                                 f"{cfg.num_entities} and a table of {cfg.num_entities} values expected, got "
                                 f"task {list(ep.task)} and a table of {len(ep.table)}")
        table, task = rd.episode_arrays(list(episodes), cfg.max_task_size)
        seq = jax.vmap(lambda x: rd.prompt_seq(self.tables, "orchestrator", x))(jnp.asarray(task))
        plen = int(np.asarray(self.tables.frags.lens)[np.asarray(seq)].sum(1).max())
        if plen + 1 > self.rcfg.orch_context:
            raise ValueError(f"a prompt of {plen} ids does not fit orch_context={self.rcfg.orch_context}")
        o_script, w_script = self._scripts(scripts, len(episodes))
        run = self._compiled(orch_params, worker_params, len(episodes))
        out = jax.device_get(run(orch_params, worker_params, jnp.asarray(table), jnp.asarray(task), key,
                                 o_script, w_script, jnp.asarray(greedy, bool),
                                 jnp.asarray(_NO_BUDGET if budget is None else budget, jnp.int32)))
        return self._result(out)

    def _scripts(self, scripts, B: int) -> tuple[Array, Array]:
        """[B, NT, T] / [S, NTw, T] int32 forced ids (-1: sample; a turn's length is its
        ids >= 0 run; an all -1 turn is not scripted)."""
        T, K = self.rcfg.max_turn_tokens, self.task.cfg.max_subagents
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
        return a.replace(turning=a.turning | mask, turn_len=jnp.where(mask, 0, a.turn_len),
                         limit=jnp.where(mask, limit, a.limit), calls=dc.reset_turn(m.grammar, a.calls, mask),
                         answers=da.reset(self.answers, a.answers, mask))

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
        answers = da.step(self.answers, a.answers, tok, go)
        stopped = go & jnp.any(tok[:, None] == self.stop_ids[None, :], axis=1)
        ended = stopped | (go & (turn_len >= a.limit))
        cut = ended & ~stopped
        calls = dc.finish(m.grammar, dc.drain(m.grammar, calls, stopped), cut)
        answers = da.finish(self.answers, answers, ended)
        return a.replace(trace=trace, turn_len=turn_len, calls=calls, answers=answers,
                         turning=a.turning & ~ended), ended, cut

    def _reply(self, m: RoleModel, a: Agents, mask: Array, grid: Array, responses: Array, cut: Array
               ) -> tuple[Agents, Array]:
        """Write the responses of each row in ``mask`` to its trace if its context holds
        them and one more id. Returns the agents and which rows heard them."""
        seq = jax.vmap(functools.partial(rd.reply_seq, self.tables))(grid, responses, cut)
        ids, n = render(self.tables.frags, seq, width=self.widths["reply" if m is self.orch else "worker_reply"])
        fits = mask & (a.trace.length + n + 1 <= m.context)
        return a.replace(trace=a.trace.hear(fits, ids, n, a.steps)), fits

    def _orch_turns(self, c: Carry, ended: Array, cut: Array, script: Array, w_script: Array) -> Carry:
        """Orchestrator turns that ended: answer, immediate responses, or a stage."""
        t, o, e, K = self.tables, c.orch, c.eps, self.task.cfg.max_subagents
        B = ended.shape[0]
        o = o.replace(steps=o.steps + ended)
        e = e.replace(critical=e.critical + ended, total=e.total + ended)
        count = o.calls.count
        answer = ended & (count == 0)
        pairs, pcount = da.pairs(o.answers)
        e = e.replace(end=jnp.where(answer, END_ANSWER, e.end),
                      answer=jnp.where(answer[:, None, None], pairs, e.answer),
                      answer_count=jnp.where(answer, pcount, e.answer_count))
        acted = ended & (count > 0)
        rec = dc.call_record(self.orch.grammar, o.calls)
        tc = jax.vmap(functools.partial(rd.turn_calls, t, max_subagents=K))(rec, count, e.table, e.created, e.assigned)
        runs = acted[:, None] & (tc.stage >= 0)                                             # [B, C]
        rank = jnp.cumsum(runs, axis=1) - 1
        slot_of = jnp.where(runs, jnp.arange(B)[:, None] * K + e.assigned[:, None] + rank, -1)
        seen, novel = e.seen, e.novel
        E = seen.shape[1]
        asked = rd.id_mask(e.task, E)
        for i in range(runs.shape[1]):              # assignments in call order (C is small)
            hit = rd.id_mask(tc.entities[:, i], E)                                         # [B, E]
            novel = novel + (runs[:, i] & jnp.any(hit & asked & ~seen, axis=1))
            seen = seen | (hit & runs[:, i][:, None])
        stage = jnp.any(runs, axis=1)
        keep = lambda new, old: jnp.where(acted.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
        e = e.replace(created=keep(tc.created, e.created), assigned=keep(tc.assigned, e.assigned),
                      seen=seen, novel=novel, spawned=e.spawned + runs.sum(1), waiting=e.waiting | stage,
                      grid=keep(tc.grid, e.grid), responses=keep(tc.responses, e.responses),
                      stage_agent=keep(jnp.where(runs, tc.stage, -1), e.stage_agent),
                      stage_slot=keep(slot_of, e.stage_slot), cut=keep(cut, e.cut))
        # sub-agents of the new stages: slot s runs the assignment whose slot_of is s
        S = B * K
        flat = slot_of.reshape(-1)                                                           # [B C]
        start = jnp.zeros((S,), bool).at[jnp.maximum(flat, 0)].max(flat >= 0)
        src = jnp.zeros((S,), jnp.int32).at[jnp.maximum(flat, 0)].max(
            jnp.where(flat >= 0, jnp.arange(flat.shape[0]), 0))
        ents = tc.entities.reshape(flat.shape[0], -1)[src]                                   # [S, M]
        e = e.replace(agent=jnp.where(start, tc.stage.reshape(-1)[src], e.agent))
        c = c.replace(orch=o, eps=e)
        c = self._start_workers(c, start, ents, w_script)
        return self._orch_reply(c, acted & ~stage, script)

    def _start_workers(self, c: Carry, start: Array, ents: Array, script: Array) -> Carry:
        """Reset the slots in ``start`` [S] and say their prompts (entities [S, M]); a
        prompt their context cannot hold ends them at once (reason context)."""
        w, e = c.work, c.eps
        seq = jax.vmap(lambda x: rd.prompt_seq(self.tables, "worker", x))(ents)
        ids, n = render(self.tables.frags, seq, width=self.widths["worker"])
        fits = start & (n + 1 <= self.work.context)
        rows = w.rows
        rows = rows.replace(pos=jnp.where(start, 0, rows.pos),
                            cache=rows.cache.replace(valid=jnp.where(start[:, None], False, rows.cache.valid)))
        trace = w.trace.replace(length=jnp.where(start, 0, w.trace.length))
        w = w.replace(rows=rows, trace=trace.hear(fits, ids, n, jnp.zeros_like(n)),
                      steps=jnp.where(start, 0, w.steps), turning=w.turning & ~start)
        w = self._open(self.work, w, fits, script)
        e = e.replace(slot=jnp.where(fits, RUNNING_SLOT, jnp.where(start, ENDED_SLOT, e.slot)),
                      reason=jnp.where(start & ~fits, rd.R_CONTEXT, jnp.where(start, rd.R_ANSWER, e.reason)),
                      pairs=jnp.where(start[:, None, None], -1, e.pairs))
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
        """Sub-agent turns that ended: an answer (relayed pairs), the turn limit, or responses."""
        w, e = c.work, c.eps
        w = w.replace(steps=w.steps + ended)
        count = w.calls.count
        answer = ended & (count == 0)
        pairs, _ = da.pairs(w.answers)
        stopped = ended & ~answer & (w.steps >= self.rcfg.subagent_turns)
        acted = ended & ~answer & ~stopped
        K = self.task.cfg.max_subagents
        rec = dc.call_record(self.work.grammar, w.calls)
        owner = jnp.arange(ended.shape[0]) // K
        S = ended.shape[0]
        tc = jax.vmap(functools.partial(rd.turn_calls, self.tables, max_subagents=K))(
            rec, count, e.table[owner], jnp.zeros((S, K), bool), jnp.zeros((S,), jnp.int32))
        w, heard = self._reply(self.work, w, acted, tc.grid, tc.responses, cut)
        w = self._open(self.work, w, heard, script)
        gone = answer | stopped | (acted & ~heard)
        reason = jnp.select([answer, stopped], [rd.R_ANSWER, rd.R_TURNS], rd.R_CONTEXT)
        e = e.replace(slot=jnp.where(gone, ENDED_SLOT, e.slot), reason=jnp.where(gone, reason, e.reason),
                      pairs=jnp.where(answer[:, None, None], jax.vmap(rd.relay_pairs)(pairs), e.pairs))
        return c.replace(work=w, eps=e)

    def _stages(self, c: Carry, script: Array) -> Carry:
        """Stages whose sub-agents have all ended: count them, relay the answers, reply."""
        e, w = c.eps, c.work
        slot = jnp.maximum(e.stage_slot, 0)                                                  # [B, C]
        member = e.stage_slot >= 0
        over = e.waiting & jnp.all(~member | (e.slot[slot] == ENDED_SLOT), axis=1)
        steps = jnp.where(member, w.steps[slot], 0)
        ok = member & (e.reason[slot] == rd.R_ANSWER)
        pairs = e.pairs[slot]                                                                # [B, C, P, 2]
        B, E = e.returned.shape
        back = rd.id_mask(jnp.where((ok & over[:, None])[..., None], pairs[..., 0], -1).reshape(B, -1), E)
        # parallel work: asked-for entities each member relayed first (call order, after
        # earlier stages), summed beside the stage's busiest member
        asked, prior, own = rd.id_mask(e.task, E), e.returned, []
        for i in range(member.shape[1]):
            new = rd.id_mask(jnp.where((ok[:, i] & over)[:, None], pairs[:, i, :, 0], -1), E) & asked & ~prior
            own.append(new.sum(1))
            prior = prior | new
        own = jnp.stack(own, axis=1)                                                         # [B, C]
        grid = jax.vmap(functools.partial(rd.fill_results, self.tables))(
            e.grid, e.stage_agent, jnp.where(member, e.reason[slot], rd.R_ANSWER), pairs)
        e = e.replace(critical=e.critical + jnp.where(over, steps.max(1), 0),
                      total=e.total + jnp.where(over, steps.sum(1), 0),
                      finished=e.finished + jnp.where(over, ok.sum(1), 0),
                      returned=e.returned | (back & asked), parallel=e.parallel + own.sum(1) - own.max(1),
                      waiting=e.waiting & ~over,
                      grid=jnp.where(over[:, None, None], grid, e.grid),
                      stage_slot=jnp.where(over[:, None], -1, e.stage_slot))
        return self._orch_reply(c.replace(eps=e), over, script)

    def _tick(self, params: tuple, scripts: tuple, ropes: tuple, c: Carry) -> Carry:
        orch_params, work_params = params
        o_script, w_script = scripts
        o_rope, w_rope = ropes
        key, ko, kw = jax.random.split(c.key, 3)
        o, o_end, o_cut = self._sample(orch_params, self.orch, c.orch, c.eps.end == RUNNING, ko, o_script, c.greedy)
        w, w_end, w_cut = self._sample(work_params, self.work, c.work, c.eps.slot == RUNNING_SLOT, kw, w_script,
                                       c.greedy)
        wide = lambda rows: max(1, int(round(self.wide_rows * rows)))
        o = feed(orch_params, self.orch, o, c.eps.end == RUNNING, self.chunk, wide(o.turning.shape[0]),
                  self.buckets, o_rope)
        w = feed(work_params, self.work, w, c.eps.slot == RUNNING_SLOT, self.chunk, wide(w.turning.shape[0]),
                  self.buckets, w_rope)
        c = c.replace(tick=c.tick + 1, key=key, orch=o, work=w)

        def events(c: Carry) -> Carry:
            c = self._orch_turns(c, o_end, o_cut, o_script, w_script)
            c = self._worker_turns(c, w_end, w_cut, w_script)
            return self._stages(c, o_script)
        return lax.cond(jnp.any(o_end) | jnp.any(w_end), events, lambda c: c, c)

    def _rollout(self, orch_params, work_params, table, task, key, o_script, w_script, greedy, budget
                 ) -> dict[str, Any]:
        B, K = table.shape[0], self.task.cfg.max_subagents
        tk = self.task
        eps = Episodes.init(table, task, max_subagents=K, max_calls=tk.max_calls, max_pairs=tk.max_pairs)
        orch = self._agents(orch_params, self.orch, "orchestrator", B)
        work = self._agents(work_params, self.work, "worker", B * K)
        seq = jax.vmap(lambda x: rd.prompt_seq(self.tables, "orchestrator", x))(task)
        ids, n = render(self.tables.frags, seq, width=self.widths["orchestrator"])
        orch = orch.replace(trace=orch.trace.hear(jnp.ones((B,), bool), ids, n, jnp.zeros_like(n)))
        orch = self._open(self.orch, orch, jnp.ones((B,), bool), o_script)
        c = Carry(tick=jnp.int32(0), key=key, orch=orch, work=work, eps=eps, greedy=greedy, budget=budget)
        ropes = tuple(a.rows.rope(m.cfg, a.rows.cache.max_len) for a, m in ((orch, self.orch), (work, self.work)))
        max_ticks = self.rcfg.orch_context + K * self.rcfg.worker_context + 2
        c = lax.while_loop(lambda c: jnp.any(c.eps.end == RUNNING) & (c.tick < max_ticks),
                           functools.partial(self._tick, (orch_params, work_params), (o_script, w_script), ropes), c)
        return {"orch": c.orch.trace, "work": c.work.trace, "eps": c.eps, "orch_steps": c.orch.steps,
                "work_steps": c.work.steps, "ticks": c.tick, "rewards": _rewards(c.eps)}

    # ------------------------------------------------------------------ host result

    def _result(self, out: dict[str, Any]) -> TextRolloutResult:
        e, tr, wt = out["eps"], out["orch"], out["work"]
        B, X = tr.ids.shape
        K = self.task.cfg.max_subagents
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
            end_reason=e.end, rewards={k: np.asarray(v, np.float32) for k, v in out["rewards"].items()},
            answers=answers, orchestrators=traces, subagents=subs,
            stats={"ticks": int(out["ticks"]), "cut_by_max_ticks": int(np.sum(e.end == RUNNING))})


def _agent_trace(name: str, tr, r: int, steps: int) -> AgentTrace:
    n = int(tr.length[r])
    t = AgentTrace(name=name, steps=steps)
    t.ids, t.sampled = [tr.ids[r, :n]], [tr.sampled[r, :n]]
    t.logprobs, t.model_logprobs, t.turn = [tr.logprobs[r, :n]], [tr.model_logprobs[r, :n]], [tr.turn[r, :n]]
    return t


def _rewards(e: Episodes) -> dict[str, Array]:
    """The host twin's reward terms (:func:`swarmjax.envs.widesearch_relay.verify`),
    on episodes that ended with an answer (0 elsewhere)."""
    pairs = e.answer                                                                         # [B, P, 2]
    P = pairs.shape[1]
    live = jnp.arange(P)[None, :] < jnp.minimum(e.answer_count, P)[:, None]
    first = rd.first_occurrences(pairs, live)                                                # score()'s set
    ent = pairs[..., 0]
    asked = jnp.take_along_axis(rd.id_mask(e.task, e.table.shape[1]), jnp.maximum(ent, 0), axis=1) & (ent >= 0)
    right = asked & (jnp.take_along_axis(e.table, jnp.maximum(ent, 0), axis=1) == pairs[..., 1])
    correct = jnp.sum(first & right, axis=1).astype(jnp.float32)
    answered = jnp.sum(first, axis=1).astype(jnp.float32)
    truth = jnp.sum(e.task >= 0, axis=1).astype(jnp.float32)
    precision, recall = correct / jnp.maximum(answered, 1), correct / jnp.maximum(truth, 1)
    f1 = jnp.where(correct > 0, 2 * precision * recall / jnp.maximum(precision + recall, 1e-9), 0.0)
    done = e.end == END_ANSWER
    z = lambda x: jnp.where(done, x, 0.0)
    return {"r_perf": z(f1), "correct": z(correct), "answered": z(answered), "truth": z(truth),
            "novel": z(e.novel.astype(jnp.float32)), "returned": z(jnp.sum(e.returned, 1).astype(jnp.float32)),
            "parallel": z(e.parallel.astype(jnp.float32))}
