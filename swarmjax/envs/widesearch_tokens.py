"""The token world (:mod:`swarmjax.envs.widesearch`) as host environments
(:mod:`swarmjax.envs.api`), so the text rollout runs it like any text environment.

The rules are the reference simulator's by construction: each environment wraps its
agent's reference coroutine (:func:`~swarmjax.envs.widesearch.episode_process` for the
orchestrator; :func:`~swarmjax.envs.widesearch.worker_process` for a sub-agent, made by
the orchestrator's coroutine when its stage launches) and forwards each sampled token
to it.

**One token per step.** Token-world turns end by their grammar, not by stop ids, so
the rollout runs with ``max_turn_tokens=1`` (:func:`rollout_config`; the stop ids do
not matter, e.g. :data:`STOP_IDS`): every ``step`` gets the one token the agent sampled
(``truncated`` is ignored) and answers with the tokens the reference made the agent
hear meanwhile, as

* ``Step(reply, more=True)`` when the turn goes on (the coroutine waits for the next
  token of the same turn);
* ``Step(reply)`` when the turn is over: the coroutine waits for the first token of a
  turn, or the agent ended without an answer (budget, context, turn limit);
* ``Step(done=True, answer=text)`` at the orchestrator's answer or a sub-agent's
  return, ``text`` the pairs as ``"e3 v5 e1 v0"`` (:func:`parse_pairs` reads it back);
* ``Step(spawn=...)`` at ``<wait>``: one :class:`WorkerEnv` per block. ``resume``
  replies with the ``<wait>`` the environment said after a K-th block, if it did (the
  orchestrator samples nothing during a stage, so the id stream is the reference's),
  then one ``<result> .. </result>`` per sub-agent.

**Counts.** The reference counts a turn at its first token, the rollout a step at
each ``Step`` without ``more``, i.e. at the turn's last token. Every turn the
reference starts ends with such a step (a turn cut by a limit too), so the two agree
whenever a turn may begin, which is where the budget is checked: steps, critical
steps, total steps, spawned, finished and answers are the reference's.

**Contexts.** :func:`rollout_config` gives the rollout the config's contexts, budget
and ``subagent_turns = subagent_steps``. The reference says a token only while its
context is not full (``len < capacity``) and hears token by token; the rollout hears a
reply only if it and one more token fit. A coroutine checks its next token's room as
soon as it is sent a token, so it ends an agent in the same call the rollout does.
At the edge the two differ only in what is recorded: (1) a reply that does not fit
(with one more token) ends the agent in both, but the reference keeps the tokens of
it that fit and the rollout none; (2) a reply that fills the orchestrator's context
exactly while its budget is spent ends the episode with reason ``budget`` in the
reference (it checks the budget before the room for a token), ``context`` in the
rollout (it checks the room when it appends); (3) the rollout does not append the
last reply of a sub-agent it stops at its turn limit.

**Rewards**, once, at the step that ends the orchestrator's episode (however it ends):
``correct``, ``answered``, ``truth`` (:func:`~swarmjax.envs.widesearch.score`),
``r_perf`` (item-F1; 0 without an answer) and PARL's counts ``novel`` (sub-agents
whose block holds an asked-for entity no earlier block had) and ``returned``
(distinct asked-for entities finished sub-agents returned).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from swarmjax.envs.api import Step, SubAgentResult, SubAgentTask
from swarmjax.envs.widesearch import (PROTOCOL, Agent, Episode, Outcome, Stage, Vocab, WideSearchConfig, _say,
                                      episode_process, score)
from swarmjax.envs.scoring import delegation_counts, item_f1

STOP_IDS = (PROTOCOL.index("<eos>"),)     # any id will do: every turn is one token long


def rollout_config(cfg: WideSearchConfig, **overrides: Any):
    """A :class:`~swarmjax.swarm.text_rollout.TextRolloutConfig` that runs ``cfg``'s
    token world: one token per turn segment, the config's contexts, budget and
    sub-agent turns (``overrides``: any other field, e.g. ``subagent_lanes``)."""
    from swarmjax.swarm.text_rollout import TextRolloutConfig
    return TextRolloutConfig(**{**dict(contexts=cfg.contexts,
                                       max_turn_tokens=1, subagent_turns=cfg.subagent_steps,
                                       budget=cfg.budget), **overrides})


def pairs_text(vocab: Vocab, pairs: Sequence[tuple[int, int]]) -> str:
    """(entity, value) pairs as an answer text: ``"e3 v5 e1 v0"`` ("" for none)."""
    return vocab.decode([t for e, v in pairs for t in (vocab.entity(e), vocab.value(v))])


def parse_pairs(vocab: Vocab, text: str) -> list[tuple[int, int]]:
    """The (entity, value) pairs of an answer text of :func:`pairs_text`."""
    toks = vocab.encode(text)
    return [(e - vocab.entity_base, v - vocab.value_base) for e, v in zip(toks[::2], toks[1::2])]


class _Process:
    """A reference coroutine advanced one message at a time: ``msg`` is what it yielded
    last (its :class:`Agent` waiting for a token, or a :class:`Stage`), ``value`` what
    it returned once ``ended``."""

    def __init__(self, proc, agent: Agent | None = None):
        self.proc, self.agent = proc, agent
        self.msg, self.value, self.ended = None, None, False

    def send(self, x) -> list[int]:
        """Send ``x`` (a token, a stage's results, None to start); returns the ids the
        agent heard meanwhile."""
        mark = len(self.agent.ctx) if self.agent is not None else 0
        try:
            self.msg = self.proc.send(x)
        except StopIteration as stop:
            self.msg, self.value, self.ended = None, stop.value, True
        if self.agent is None:
            self.agent, mark = self.msg, len(self.msg.ctx)    # the orchestrator's, at its first yield
        return [t for t, said in zip(self.agent.ctx[mark:], self.agent.sampled[mark:]) if not said]

    def turn_over(self) -> bool:
        """The coroutine ended, or waits for the first token of a turn: it is suspended
        in its own ``_say`` (lookup arguments, spawn blocks and pairs are read in
        sub-generators)."""
        sub = self.proc.gi_yieldfrom
        return self.ended or (sub is not None and sub.gi_code is _say.__code__)

    def token(self, turn: np.ndarray) -> list[int]:
        turn = np.asarray(turn).reshape(-1)
        if turn.size != 1:
            raise ValueError(f"the token world takes one token per step, got {turn.size}: "
                             "run the rollout with max_turn_tokens=1 (rollout_config)")
        if self.ended or not isinstance(self.msg, Agent):
            raise RuntimeError("step() called while the agent is not waiting for a token")
        return self.send(int(turn[0]))


class WorkerEnv:
    """One sub-agent of a stage: its reference ``worker_process`` (made by the
    orchestrator's coroutine). ``result``: ``(steps, pairs or None)`` once it ended."""

    def __init__(self, vocab: Vocab, agent: Agent, proc):
        self.vocab, self._p = vocab, _Process(proc, agent)

    @property
    def result(self) -> tuple[int, list | None] | None:
        return self._p.value

    def reset(self, task: Any = None) -> np.ndarray:
        """The prompt ``<worker> <task> e.. </task>`` [n + 3] (``task``, its block's
        entities, is already in it)."""
        prompt = np.asarray(self._p.agent.ctx, np.int32)
        self._p.send(None)
        return prompt

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """``turn`` [1]: the token the sub-agent sampled (module docstring)."""
        heard = self._p.token(turn)
        if self._p.ended and self._p.value[1] is not None:
            return Step(done=True, answer=pairs_text(self.vocab, self._p.value[1]))
        return Step(reply=heard, more=not self._p.turn_over())

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        raise RuntimeError("a token-world sub-agent spawns no sub-agents")


class WideSearchTokenEnv:
    """The orchestrator's episode (``reset(episode)``); its stages' sub-agents are
    :class:`WorkerEnv` s. ``outcome``: the reference's :class:`Outcome` once it ended."""

    def __init__(self, cfg: WideSearchConfig):
        self.cfg, self.vocab = cfg, Vocab(cfg)
        self.ep: Episode | None = None
        self.workers: list[WorkerEnv] = []      # the running stage's
        self._p: _Process | None = None
        self._wait: list[int] = []

    @property
    def outcome(self) -> Outcome | None:
        return self._p.value if self._p is not None else None

    def reset(self, task: Episode | dict) -> np.ndarray:
        """The prompt ``<orch> <task> e.. </task>`` [n + 3] of episode ``task`` (or of a
        task record, :func:`~swarmjax.envs.widesearch_token_task.episode`)."""
        if isinstance(task, dict):
            from swarmjax.envs.widesearch_token_task import episode
            task = episode(task)
        self.ep, self._p = task, _Process(episode_process(self.cfg, task))
        self._p.send(None)
        return np.asarray(self._p.agent.ctx, np.int32)

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """``turn`` [1]: the token the orchestrator sampled (module docstring)."""
        heard = self._p.token(turn)
        if self._p.ended:
            return self._end(heard)
        if isinstance(self._p.msg, Stage):
            stage, v = self._p.msg, self.vocab
            self.workers = [WorkerEnv(v, a, p) for a, p in zip(stage.agents, stage.procs)]
            self._wait = heard               # the <wait> the environment says after a K-th block
            return Step(spawn=tuple(SubAgentTask(agent=f"worker{a.slot}", env=w,
                                                 task=[t - v.entity_base for t in a.ctx[2:-1]])
                                    for a, w in zip(stage.agents, self.workers)))
        return Step(reply=heard, more=not self._p.turn_over())

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        """``<wait>`` if the environment said it, and the stage's ``<result>`` s."""
        # a sub-agent the rollout stopped before its coroutine ended (limits smaller than
        # the config's) failed after the steps the rollout counted
        done = [w.result if w.result is not None else (r.steps, None) for w, r in zip(self.workers, results)]
        reply = self._wait + self._p.send(done)
        self.workers, self._wait = [], []
        return self._end(reply) if self._p.ended else Step(reply=reply)

    def _end(self, reply: list[int]) -> Step:
        out, ep = self._p.value, self.ep
        correct, answered, truth = score(ep, out.answer)
        counts = delegation_counts(
            ep.task, ([t - self.vocab.entity_base for t in toks[2:toks.index(self.vocab["</task>"])]]
                      for toks in out.worker_tokens),
            (e for st in out.stages for pairs in st["results"] if pairs for e, _ in pairs))
        rewards = {"r_perf": float(item_f1(correct, answered, truth, True)),
                   "correct": correct, "answered": answered, "truth": truth, **counts}
        if out.end_reason == "answer":
            return Step(done=True, answer=pairs_text(self.vocab, out.answer), rewards=rewards)
        return Step(reply=reply, rewards=rewards)      # the rollout ends it too (budget or context)
