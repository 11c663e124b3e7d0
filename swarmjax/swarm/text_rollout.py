"""The host-driven text rollout: orchestrators and frozen sub-agents decode together on
the device; the host parses finished turns, runs tools and appends the replies.

One rollout of B episodes alternates three phases until every episode has ended:

1. **decode** (:func:`~swarmjax.swarm.text_device.decode_segment`, one jitted call):
   every row that takes a turn now (orchestrators, and sub-agents holding one of the
   ``subagent_lanes`` lanes) samples until its stop id or its limit (or the segment ends
   once ``segment_exit`` of its rows are done, and the rest resume in the next one);
2. **environment** (host, a thread pool): each finished turn goes to its
   :class:`~swarmjax.envs.api.HostEnv`, which parses it, runs tools, and answers
   with reply ids, the end of the episode, or sub-agents to start (a stage);
3. **append** (:func:`~swarmjax.swarm.text_device.prefill_chunk`, jitted per chunk
   bucket): reply ids, results of finished stages and new sub-agents' prompts are
   appended to their rows' KV caches, up to ``F`` ids a call (``F`` the smallest of
   ``prefill_buckets`` that holds the longest, so few shapes ever compile). Conversations
   that open with the same ids (system turn, tool schemas) share them as one prefix,
   prefilled once per rollout and attended over by all of them (``text_device``).

Counting is the token world's (:mod:`swarmjax.envs.widesearch`): a finished turn is
one step of its agent; a stage costs ``1 + max`` sub-agent steps on the critical path
(the orchestrator turn that opened it is the 1) and the sum of all of them in total
steps; an orchestrator turn starts only while ``critical_steps + 1 <= budget`` (else
the episode ends with reason ``budget``); a sub-agent that has not answered after
``subagent_turns`` turns is stopped and fails; an agent that must hear ids its context
cannot hold ends (orchestrator: reason ``context``; sub-agent: it fails).

**Asynchronous environments** (an orchestrator's env with ``asynchronous = True``: a
server slot whose next request comes when a client sends it, or a harness with slow
tools): their ``reset`` and ``step`` run in threads of their own. The episode's row idles
while the other rows decode, and rejoins the next segment once its env answers
(continuous batching). After each decode the rollout waits up to ``async_wait`` seconds
for all of their answers: a decode segment costs about the same with few rows as with
many, so a row that joins one segment later costs more than a short wait. Such a
``reset`` may return None: the episode never starts (no ids, reason ``closed``). Any env
may bound its agent's next turn with ``turn_limit`` (ids; None: ``max_turn_tokens``), e.g.
a request's ``max_tokens``. The sampled ids do not depend on when a row decodes (each
token's key is its episode's, agent's and position's).

The output is the token world's trajectory (:class:`TextRolloutResult`): the
orchestrator's ids exactly as sampled and appended, a loss mask on its sampled ids
only, the sampler's log-probs, stage ids and the step counts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.api import HostEnv, Step, SubAgentResult
# the token world's end reasons (re-exported: a text result's end_reason indexes END_REASONS)
from swarmjax.envs.widesearch_jax import END_ANSWER, END_BUDGET, END_CONTEXT, END_REASONS, RUNNING  # noqa: F401
from swarmjax.models.config import ModelConfig
from swarmjax.roles import Roles
from swarmjax.swarm.context import compact, summarizer_task, summary_restart
from swarmjax.swarm.text_rollout_state import Agent, EpisodeState, in_thread, rollout_result
from swarmjax.swarm.text_device import Rows, decode_segment_jit, init_rows, make_prefix_jit, prefill_chunk_jit
from swarmjax.swarm.text_types import (AgentTrace, TextRolloutConfig, TextRolloutResult,  # noqa: F401  (re-exported)
                                      TextScripts)

SEGMENT_KEY = 1 << 20        # the key's agent id of an orchestrator's segment s: s * SEGMENT_KEY (sub-agents: 1..)
SUMMARIZER_INDEX = 1 << 16   # spawn index (key id - 1) of an episode's first frozen summariser

class TextRollout:
    """Runs batches of text episodes: see the module docstring.

    >>> rollout = TextRollout(model_cfg, TextRolloutConfig(), stop_ids=chat.stop_ids)
    >>> result = rollout(Roles(orch_params, subagent_params), envs, tasks, jax.random.key(0))

    ``envs``: one fresh :class:`~swarmjax.envs.api.HostEnv` per episode; ``tasks``:
    what each one's ``reset`` takes.
    """

    def __init__(self, cfg: ModelConfig | Roles[ModelConfig], rcfg: TextRolloutConfig, *,
                 stop_ids: Sequence[int], pad_id: int = 0):
        self.cfgs, self.rcfg = Roles.of(cfg), rcfg
        self.stop_ids = np.asarray(list(stop_ids), np.int32)
        if self.stop_ids.size == 0:
            raise ValueError("a text rollout needs at least one stop id")
        self.pad_id = pad_id
        self._pool = ThreadPoolExecutor(rcfg.env_threads, thread_name_prefix="swarmjax-env")

    # ------------------------------------------------------------------ device calls

    def _bucket(self, n: int) -> int:
        return next((b for b in self.rcfg.prefill_buckets if b >= n), self.rcfg.prefill_buckets[-1])

    @staticmethod
    def _size(n: int, floor: int) -> int:
        """``n`` rounded up to the next of floor * (1, 1.5, 2, 3, 4, 6, ...) (2^k and
        3 * 2^(k-1)): few compiled shapes, and at most a third of a call is padding."""
        p = max(floor, 1 << (max(n, 1) - 1).bit_length())
        return 3 * p // 4 if p > floor and n <= 3 * p // 4 else p

    @classmethod
    def _compact(cls, agents: list, spare: int) -> np.ndarray:
        """Row indices of ``agents`` padded with the spare row to :meth:`_size` (>= 4;
        rows outside a call are neither computed nor copied)."""
        size = cls._size(len(agents), 4)
        return np.asarray([a.row for a in agents] + [spare] * (size - len(agents)), np.int32)

    def _window(self, need: int, slots: int) -> int:
        """Slots a call attends over: ``need`` rounded up by :meth:`_size` from
        ``rcfg.min_window`` (a few compiled widths; attention reads all of them)."""
        return min(slots, self._size(int(need), self.rcfg.min_window))

    def _share_prefix(self, params, cfg, rows: Rows, agents: list[Agent], prefixes: dict, stats) -> Rows:
        """Conversations that start now and open with the model's shared prefix attend
        over it (``offset`` = its length) and append only what follows. The prefix is
        set once per rollout and model: the longest common opening (system turn, tool
        schemas) of the first two or more conversations that start together, when it is
        at least the smallest prefill bucket long (each keeps >= 1 id of its own: its logits)."""
        fresh = [a for a in agents if a.reset and a.pending is not None]
        role = "orch" if agents and agents[0].is_orch else "work"
        if rows.prefix is None and len(fresh) >= 2:
            first = fresh[0].pending
            n = min(len(a.pending) for a in fresh) - 1
            for a in fresh[1:]:
                diff = np.flatnonzero(a.pending[:n] != first[:n])
                n = int(diff[0]) if diff.size else n
            if n >= self.rcfg.prefill_buckets[0]:
                ids = np.zeros((max(16, 1 << (n - 1).bit_length()),), np.int32)   # few compiled sizes
                ids[:n] = first[:n]
                rows = rows.replace(prefix=make_prefix_jit(params, cfg, ids, np.int32(n)))
                prefixes[role] = first[:n].copy()
                stats["prefill_computed"] += ids.size
        prefix = prefixes.get(role)
        for a in fresh:
            a.offset = 0
            if prefix is not None and len(a.pending) > len(prefix) and np.array_equal(a.pending[:len(prefix)], prefix):
                a.offset, a.pending = len(prefix), a.pending[len(prefix):]
                stats["prefix_shared"] += len(prefix)
        return rows

    def _append(self, params, cfg, rows: Rows, agents: list[Agent], prefixes: dict, stats) -> Rows:
        """Append every agent's pending ids to its row, chunk by chunk (conversations
        that start now and open with the shared prefix append only what follows it)."""
        rows = self._share_prefix(params, cfg, rows, agents, prefixes, stats)
        spare, slots = rows.pos.shape[0] - 1, rows.cache.max_len
        queue = [a for a in agents if a.pending is not None and a.pending.size]
        done = {id(a): 0 for a in queue}
        base = {id(a): 0 if a.reset else len(a.trace) - len(a.pending) - a.offset for a in queue}   # slot
        while True:
            live = [a for a in queue if done[id(a)] < len(a.pending)]
            if not live:
                break
            groups: dict[int, list[Agent]] = {}     # rows by chunk bucket: short replies pad to short chunks
            for a in live:
                groups.setdefault(self._bucket(len(a.pending) - done[id(a)]), []).append(a)
            for F, group in sorted(groups.items()):
                idx = self._compact(group, spare)
                chunk = np.zeros((len(idx), F), np.int32)
                counts = np.zeros((len(idx),), np.int32)
                reset = np.zeros((len(idx),), bool)
                offset = np.zeros((len(idx),), np.int32)
                for j, a in enumerate(group):
                    part = a.pending[done[id(a)]:done[id(a)] + F]
                    chunk[j, :len(part)] = part
                    counts[j] = len(part)
                    reset[j] = a.reset and done[id(a)] == 0
                    offset[j] = a.offset
                    done[id(a)] += len(part)
                window = self._window(max(base[id(a)] + done[id(a)] - counts[j] + F for j, a in enumerate(group)),
                                      slots)
                rows = prefill_chunk_jit(params, cfg, rows, idx, chunk, counts, reset, offset, window=window)
                stats["prefill_calls"] += 1
                stats["prefill_computed"] += chunk.size
        for a in agents:
            a.pending, a.reset = None, False
        return rows

    # ------------------------------------------------------------------ host logic

    def _context(self, agent: Agent) -> int:
        return self.rcfg.contexts.orchestrator if agent.is_orch else self.rcfg.contexts.subagents

    def _hear(self, agent: Agent, ids: np.ndarray, *, turn: int | None = None) -> bool:
        """Queue ``ids`` for ``agent`` if its context holds them and one more token."""
        if len(agent.trace) + len(ids) + 1 > self._context(agent):
            return False
        agent.trace.append(ids, sampled=False, turn=turn)
        agent.pending = ids if agent.pending is None else np.concatenate([agent.pending, ids])
        return True

    def _next_turn(self, ep: EpisodeState):
        """The orchestrator may take another turn: budget permitting."""
        b = self.rcfg.budget
        if b is not None and ep.critical + 1 > b:
            ep.end = END_BUDGET
        else:
            ep.orch.turning = True

    def _orch_step(self, ep: EpisodeState, step: Step, spawn_queue: list) -> None:
        ep.add(step.rewards)
        if step.done:
            ep.end, ep.orch.trace.answer = END_ANSWER, step.answer
            ep.orch.trace.reason, ep.orch.trace.ok = "answer", True
        elif step.spawn:
            for req in step.spawn:
                ep.subagents.append(self._spawn(ep, req, len(ep.subagents), spawn_queue))
            ep.spawned += len(step.spawn)
        elif step.restart is not None:                 # the agent summarised: a new segment, within the bound
            within = len(ep.orch.trace.segments) < self.rcfg.context.max_compactions
            if within and self._restart(ep, step.restart, dropped=len(ep.orch.trace) - len(step.restart)):
                self._next_turn(ep)
            else:
                ep.end = END_CONTEXT
        elif not self._orch_hear(ep, step.reply, spawn_queue):
            ep.end = END_CONTEXT
        elif ep.held is None:                          # (else a frozen summariser runs first)
            self._next_turn(ep)

    def _spawn(self, ep: EpisodeState, req: Any, index: int, spawn_queue: list) -> Agent:
        """Queue a sub-agent of the stage the orchestrator's latest turn opened."""
        sub = Agent(env=req.env, trace=AgentTrace(name=req.agent, stage=ep.orch.trace.steps),
                     episode=ep.orch.episode, is_orch=False, index=index)
        spawn_queue.append((sub, req.task))
        ep.stage.append(sub)
        return sub

    def _restart(self, ep: EpisodeState, ids: np.ndarray, *, dropped: int) -> bool:
        """Close the orchestrator's segment and open the next with ``ids`` (its row starts
        over); False when they do not fit its context."""
        a = ep.orch
        if len(ids) + 1 > self.rcfg.contexts.orchestrator:
            return False
        a.trace.restart()
        a.trace.dropped += dropped
        a.pending, a.reset = None, True
        return self._hear(a, ids)

    def _orch_hear(self, ep: EpisodeState, reply: np.ndarray, spawn_queue: list) -> bool:
        """The orchestrator hears a finished turn's reply. Past the context strategy's
        threshold its conversation is compacted first (:mod:`swarmjax.swarm.context`): the
        current segment is closed and the strategy's ids open the next one (the row starts
        over), or a frozen summariser is started (the reply held until it answers). False
        when the reply (or the new segment) does not fit: the episode ends."""
        a, rcfg = ep.orch, self.rcfg
        ccfg = rcfg.context
        limit = rcfg.contexts.orchestrator if ccfg.threshold is None else min(ccfg.threshold,
                                                                               rcfg.contexts.orchestrator)
        if len(a.trace) + len(reply) + 1 > limit and len(a.trace.segments) < ccfg.max_compactions:
            trace = a.trace.arrays()
            req = summarizer_task(a.env, trace["ids"]) if ccfg.summarizer == "frozen" else None
            if req is not None:
                ep.summarizers.append(self._spawn(ep, req, SUMMARIZER_INDEX + len(ep.summarizers), spawn_queue))
                ep.held = reply
                return True
            out = compact(ccfg.strategy, a.env, trace, a.trace.steps, reply)
            if out is not None:
                ids, restart = out
                if restart and self._restart(ep, ids, dropped=len(a.trace) + len(reply) - len(ids)):
                    return True
                if not restart and self._hear(a, ids):      # the reply with a request (summary)
                    return True
        return self._hear(a, reply)

    def _worker_end(self, ep: EpisodeState, sub: Agent, ok: bool, reason: str, answer: str | None,
                    spawn_queue: list) -> None:
        sub.trace.ok, sub.trace.reason, sub.trace.answer = ok, reason, answer
        sub.turning = False
        if all(s.trace.reason != "running" for s in ep.stage):
            steps = [s.trace.steps for s in ep.stage]
            ep.critical += max(steps)
            ep.total += sum(steps)
            if ep.held is not None:                    # a frozen summariser's stage
                self._summarized(ep, sub)
                return
            ep.finished += sum(s.trace.ok for s in ep.stage)
            results = [SubAgentResult(agent=s.trace.name, answer=s.trace.answer, steps=s.trace.steps,
                                      ok=s.trace.ok, reason=s.trace.reason) for s in ep.stage]
            ep.stage = []
            self._orch_step(ep, ep.orch.env.resume(results), spawn_queue)

    def _summarized(self, ep: EpisodeState, sub: Agent) -> None:
        """A frozen summariser ended: the conversation restarts from its summary, or (it
        failed, or the restart does not fit) the orchestrator hears the held reply."""
        reply, ep.held, ep.stage = ep.held, None, []
        a = ep.orch
        ids = summary_restart(a.env, sub.trace.answer) if sub.trace.ok and sub.trace.answer is not None else None
        if ids is not None and self._restart(ep, ids, dropped=len(a.trace) + len(reply) - len(ids)):
            self._next_turn(ep)
        elif self._hear(a, reply):
            self._next_turn(ep)
        else:
            ep.end = END_CONTEXT

    def _count_step(self, ep: EpisodeState, agent: Agent) -> None:
        agent.trace.steps += 1
        agent.turn_tokens = 0
        if agent.is_orch:
            ep.critical += 1
            ep.total += 1

    def _continue(self, ep: EpisodeState, agent: Agent, step: Step, spawn_queue: list) -> None:
        """``Step.more``: the turn goes on after the reply. An agent that cannot hear it
        ends as at a turn's end (its unfinished turn counts as a step, as the token
        world counts a turn from its first token)."""
        ep.add(step.rewards if agent.is_orch else {f"subagent/{k}": v for k, v in step.rewards.items()})
        if self._hear(agent, step.reply, turn=agent.trace.steps + 1):
            agent.turning = True
            return
        self._count_step(ep, agent)
        if agent.is_orch:
            ep.end = END_CONTEXT
        else:
            self._worker_end(ep, agent, False, "context", None, spawn_queue)

    def _worker_step(self, ep: EpisodeState, sub: Agent, step: Step, spawn_queue: list) -> None:
        if step.spawn:
            raise ValueError(f"sub-agent {sub.trace.name!r} asked for sub-agents: stages do not nest")
        if step.restart is not None:
            raise ValueError(f"sub-agent {sub.trace.name!r} restarted its conversation: only orchestrators "
                             "compact their context")
        ep.add({f"subagent/{k}": v for k, v in step.rewards.items()})
        if step.done:                                  # no answer: its environment ended it (e.g. a harness gone)
            ok = step.answer is not None
            self._worker_end(ep, sub, ok, "answer" if ok else "ended", step.answer, spawn_queue)
        elif sub.trace.steps >= self.rcfg.subagent_turns:
            self._worker_end(ep, sub, False, "turns", None, spawn_queue)
        elif not self._hear(sub, step.reply):
            self._worker_end(ep, sub, False, "context", None, spawn_queue)
        else:
            sub.turning = True

    def __call__(self, params: Roles, envs: Sequence[HostEnv], tasks: Sequence[Any],
                 key: jax.Array, *, scripts: TextScripts | None = None,
                 episode_ids: Sequence[int] | None = None) -> TextRolloutResult:
        """Run ``len(envs)`` episodes to their end; see the module docstring.

        Every token is drawn with a key of its own: ``key`` folded with its episode's id
        (``episode_ids``, default 0..B-1), its agent and its position in the conversation
        (:func:`~swarmjax.swarm.text_device.row_keys`). An episode samples the same ids
        whichever batch, segments or process run it: a process that runs episodes 8-15
        of a step passes ``episode_ids=range(8, 16)``."""
        rcfg, T = self.rcfg, self.rcfg.max_turn_tokens
        B, L = len(envs), rcfg.subagent_lanes
        if len(tasks) != B:
            raise ValueError(f"{B} environments but {len(tasks)} tasks")
        episode_ids = np.arange(B) if episode_ids is None else np.asarray(list(episode_ids), np.int64)
        if episode_ids.shape != (B,):
            raise ValueError(f"{B} environments but {episode_ids.size} episode ids")
        stats = dict(segments=0, prefill_calls=0, decode_s=0.0, prefill_s=0.0, env_s=0.0,
                     sampled_tokens=0, appended_tokens=0, prefill_computed=0, decode_row_steps=0,
                     prefix_shared=0, env_wait_s=0.0)
        t_start = time.perf_counter()
        extra = rcfg.prefill_buckets[-1] + 1      # room past a context for a chunk's padding
        orch_rows = init_rows(self.cfgs.orchestrator, B, rcfg.contexts.orchestrator + extra)
        work_rows = init_rows(self.cfgs.subagents, L, rcfg.contexts.subagents + extra)
        stop_ids = jnp.asarray(self.stop_ids)
        prefixes: dict = {}                       # role -> the shared prefix's ids

        eps = []
        for b, (env, task) in enumerate(zip(envs, tasks)):
            orch = Agent(env=env, trace=AgentTrace(name="orchestrator"), episode=b, is_orch=True, row=b,
                          reset=True)
            eps.append(EpisodeState(orch=orch))
        waits: dict = {}                    # episode -> (future of its async env's reset or step, is a step)
        later = {b for b, env in enumerate(envs) if getattr(env, "asynchronous", False)}
        for b in sorted(later):
            waits[b] = in_thread(envs[b].reset, tasks[b]), False
        now = [b for b in range(B) if b not in later]
        t0 = time.perf_counter()
        prompts = list(self._pool.map(lambda b: envs[b].reset(tasks[b]), now))
        stats["env_s"] += time.perf_counter() - t0
        for b, prompt in zip(now, prompts):
            self._start(eps[b], prompt)

        lanes: list[Agent | None] = [None] * L
        waiting: deque = deque()            # (sub-agent, task) without a lane yet
        spawn_queue: list = []              # (sub-agent, task) asked for, not reset yet

        def place_subagents():
            """Reset the sub-agents asked for and give lanes to those waiting. A sub-agent
            whose prompt does not fit fails at once, which may close a stage whose reply
            asks for more: loop until nothing new is asked."""
            while True:
                t0 = time.perf_counter()
                new = list(spawn_queue)
                spawn_queue.clear()
                prompts = list(self._pool.map(lambda st: st[0].env.reset(st[1]), new))
                stats["env_s"] += time.perf_counter() - t0
                waiting.extend((sub, np.asarray(p, np.int32)) for (sub, _), p in zip(new, prompts))
                while waiting and None in lanes:
                    sub, prompt = waiting.popleft()
                    if not self._hear(sub, prompt):
                        self._worker_end(eps[sub.episode], sub, False, "context", None, spawn_queue)
                        continue
                    sub.row, sub.reset, sub.turning = lanes.index(None), True, True
                    lanes[sub.row] = sub
                if not spawn_queue:
                    return

        def flush(orch_rows, work_rows):
            t0 = time.perf_counter()
            orchs = [ep.orch for ep in eps if ep.orch.pending is not None]
            works = [a for a in lanes if a is not None and a.pending is not None]
            stats["appended_tokens"] += sum(len(a.pending) for a in orchs + works)
            if orchs:
                orch_rows = self._append(params.orchestrator, self.cfgs.orchestrator, orch_rows, orchs, prefixes, stats)
            if works:
                work_rows = self._append(params.subagents, self.cfgs.subagents, work_rows, works, prefixes, stats)
            jax.block_until_ready((orch_rows, work_rows))     # the time is the prefill's, not the next decode's
            stats["prefill_s"] += time.perf_counter() - t0
            return orch_rows, work_rows

        def forced(agent: Agent) -> np.ndarray | None:
            if scripts is None:
                return None
            if agent.is_orch:
                turns = scripts.orch[agent.episode] if agent.episode < len(scripts.orch) else ()
            elif agent.index >= SUMMARIZER_INDEX:
                per_ep = scripts.summarizers[agent.episode] if agent.episode < len(scripts.summarizers) else ()
                k = agent.index - SUMMARIZER_INDEX
                turns = per_ep[k:k + 1]
            else:
                per_ep = scripts.workers[agent.episode] if agent.episode < len(scripts.workers) else ()
                turns = per_ep[agent.index] if agent.index < len(per_ep) else ()
            k = agent.trace.steps
            return np.asarray(turns[k], np.int32)[agent.turn_tokens:] if k < len(turns) else None

        def handle(a: Agent, step: Step) -> None:
            ep = eps[a.episode]
            if step.more:
                self._continue(ep, a, step, spawn_queue)
                return
            self._count_step(ep, a)
            if a.is_orch:
                self._orch_step(ep, step, spawn_queue)
            else:
                self._worker_step(ep, a, step, spawn_queue)

        def harvest(block: bool, gather: float = 0.0) -> bool:
            """Take in what asynchronous envs answered: waiting for one if ``block``, for
            all of them up to ``gather`` seconds."""
            if waits and (block or gather):
                t0 = time.perf_counter()
                if gather:
                    wait([f for f, _ in waits.values()], timeout=gather)
                if block:
                    wait([f for f, _ in waits.values()], return_when=FIRST_COMPLETED)
                stats["env_wait_s"] += time.perf_counter() - t0
            ready = [b for b, (f, _) in waits.items() if f.done()]
            for b in ready:
                f, is_step = waits.pop(b)
                if is_step:
                    handle(eps[b].orch, f.result())
                else:
                    self._start(eps[b], f.result())
            return bool(ready)

        orch_rows, work_rows = flush(orch_rows, work_rows)
        while any(ep.end == RUNNING for ep in eps):
            if harvest(block=False, gather=rcfg.async_wait):
                place_subagents()
                orch_rows, work_rows = flush(orch_rows, work_rows)
            rows_o = [ep.orch for ep in eps if ep.end == RUNNING and ep.orch.turning]
            rows_w = [a for a in lanes if a is not None and a.turning]
            if not rows_o and not rows_w:
                if not waits and all(ep.end != RUNNING for ep in eps):   # the last ones just ended
                    break
                if not waits:
                    raise RuntimeError("text rollout made no progress: no agent can take a turn (an "
                                       "environment returned a Step that neither replies, spawns nor ends)")
                harvest(block=True)
                place_subagents()
                orch_rows, work_rows = flush(orch_rows, work_rows)
                continue
            args = {}
            for name, agents, rows in (("orch", rows_o, orch_rows), ("work", rows_w, work_rows)):
                idx = self._compact(agents, rows.pos.shape[0] - 1)
                limit = np.zeros(len(idx), np.int32)
                fbuf = np.full((len(idx), T), -1, np.int32)
                for j, a in enumerate(agents):
                    script = forced(a)
                    if a.partial is None:      # a new call: what it may sample before the env hears it
                        a.partial = []
                        a.call_left = min(T, self._context(a) - len(a.trace),
                                          getattr(a.env, "turn_limit", None) or T)
                        if script is not None:
                            a.call_left = min(a.call_left, max(len(script), 1))
                    limit[j] = a.call_left
                    if script is not None:
                        fbuf[j, :min(len(script), T)] = script[:T]
                pos = np.asarray([len(a.trace) - a.offset + sum(len(p[0]) for p in a.partial) for a in agents]
                                 + [0] * (len(idx) - len(agents)), np.int64)      # each row's next free slot
                who = np.zeros((len(idx), 2), np.int32)                           # (episode, agent): the keys
                for j, a in enumerate(agents):      # an orchestrator's later segments: keys of their own
                    who[j] = episode_ids[a.episode], SEGMENT_KEY * len(a.trace.segments) if a.is_orch \
                        else 1 + a.index
                need = int(max((pos + limit + 1)[:len(agents)], default=1))
                if rcfg.decode_slack is not None and agents:
                    need = min(need, int(pos[:len(agents)].max()) + rcfg.decode_slack + 1)
                window = self._window(need, rows.cache.max_len)
                limit = np.minimum(limit, np.maximum(window - pos - 1, 0)).astype(np.int32)  # cut at the window
                args.update({f"{name}_idx": idx, f"{name}_limit": limit, f"{name}_window": window,
                             f"{name}_forced": fbuf if scripts is not None else None, f"{name}_agents": who,
                             f"{name}_start": (pos + np.asarray([a.offset for a in agents] + [0] * (
                                 len(idx) - len(agents)), np.int64)).astype(np.int32)})
            min_done = np.int32(max(1, int(np.ceil(rcfg.segment_exit * (len(rows_o) + len(rows_w))))))
            t0 = time.perf_counter()
            orch_rows, work_rows, turns_o, turns_w = decode_segment_jit(
                params, self.cfgs, rcfg.sampling, orch_rows, work_rows, key, stop_ids=stop_ids, steps=T,
                min_done=min_done, **args)
            turns_o, turns_w = jax.device_get((turns_o, turns_w))
            stats["decode_row_steps"] += (len(args["orch_idx"]) + len(args["work_idx"])) * int(
                max(turns_o.lengths.max(initial=0), turns_w.lengths.max(initial=0)))
            stats["decode_s"] += time.perf_counter() - t0
            stats["segments"] += 1

            # ---- record the calls that ended (a stop id or their limit), then let the
            # environments answer them (in parallel); rows cut by segment_exit go on
            finished = []
            for agents, turns in ((rows_o, turns_o), (rows_w, turns_w)):
                for j, a in enumerate(agents):         # turns come in the order of the agents
                    n = int(turns.lengths[j])
                    a.partial.append((turns.tokens[j, :n], turns.logprobs[j, :n], turns.model_logprobs[j, :n]))
                    a.call_left -= n
                    a.turn_tokens += n
                    stats["sampled_tokens"] += n
                    if not (turns.stopped[j] or a.call_left <= 0):
                        continue
                    ids, lps, mlps = (np.concatenate(x) for x in zip(*a.partial))
                    a.partial, a.turning = None, False
                    a.trace.append(ids, sampled=True, logprobs=lps, model_logprobs=mlps, turn=a.trace.steps + 1)
                    finished.append((a, ids, not bool(turns.stopped[j])))
            for a, ids, cut in [f for f in finished if f[0].is_orch and f[0].episode in later]:
                waits[a.episode] = in_thread(a.env.step, ids, truncated=cut), True
            finished = [f for f in finished if not (f[0].is_orch and f[0].episode in later)]
            t0 = time.perf_counter()
            steps = list(self._pool.map(lambda f: f[0].env.step(f[1], truncated=f[2]), finished))
            stats["env_s"] += time.perf_counter() - t0
            for (a, _, _), step in zip(finished, steps):
                handle(a, step)
            for l, a in enumerate(lanes):       # lanes of sub-agents that ended are free again
                if a is not None and a.trace.reason != "running":
                    lanes[l] = None
            place_subagents()
            orch_rows, work_rows = flush(orch_rows, work_rows)

        stats["total_s"] = time.perf_counter() - t_start
        stats["compactions"] = sum(len(ep.orch.trace.segments) for ep in eps)
        stats["context_dropped"] = sum(ep.orch.trace.dropped for ep in eps)
        return rollout_result(eps, stats, context=rcfg.contexts.orchestrator, pad_id=self.pad_id)

    def _start(self, ep: EpisodeState, prompt: np.ndarray | None) -> None:
        """The orchestrator hears its env's first prompt (None: the episode never starts)."""
        if prompt is None:
            ep.end, ep.orch.trace.reason = END_ANSWER, "closed"
            return
        if not self._hear(ep.orch, np.asarray(prompt, np.int32)):
            raise ValueError(f"a prompt of {len(prompt)} ids does not fit "
                             f"contexts.orchestrator={self.rcfg.contexts.orchestrator}")
        ep.orch.reset = True
        self._next_turn(ep)

    def close(self):
        self._pool.shutdown(wait=False)
