"""The environment API of text agents: what a host environment promises the rollout.

A *host environment* is plain Python. One object serves one agent's episode:

* ``reset(task) -> ids [P]``: the agent's first prompt as token ids (rendered once,
  tool schemas in the system turn, ending with the generation prompt).
* ``step(turn, *, truncated) -> Step`` for each finished turn: ``turn`` [T] are the
  ids the agent sampled (the stop id included when it stopped; ``truncated`` when the
  turn hit its length limit instead). The environment parses the turn (it may decode
  the ids to read them, but never re-encodes them) and answers with a :class:`Step`:
  the ids to append (closing ids of the turn, tool replies, the next generation
  prompt), whether the episode is over, and reward terms.
* A step may instead ask for sub-agents (``Step.spawn``): the rollout runs them as one
  parallel stage with the frozen sub-agent params and then calls
  ``resume(results) -> Step`` with their results in the order asked.

Token-in-token-out: the rollout appends the agent's sampled ids as sampled and the
reply ids as given (environment ids, loss mask 0), so the trajectory the learner
reads is exactly the conversation the model saw.

The rollout, not the environment, counts steps (one per finished turn), critical
steps (per stage: 1 + the longest sub-agent's steps), the budget, turn limits of
sub-agents and context limits: every environment is counted the same way, and
exactly as the token world counts them (:mod:`swarmjax.envs.widesearch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

EMPTY = np.zeros((0,), np.int32)


@dataclasses.dataclass(frozen=True)
class SubAgentTask:
    """One sub-agent of a stage: its name (as the orchestrator called it), a fresh
    environment for it, and the task that environment's ``reset`` takes."""

    agent: str
    env: "HostEnv"
    task: Any


@dataclasses.dataclass(frozen=True)
class SubAgentResult:
    """What came back from one sub-agent of a stage.

    answer: its final answer text (None when it did not finish);
    steps: turns it took; ok: it finished (answered within its turn and context limits);
    reason: why it ended ("answer", "turns", "context"; "ended": its environment ended it
    without an answer, a ``Step(done=True)`` with ``answer=None``).
    """

    agent: str
    answer: str | None
    steps: int
    ok: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Step:
    """An environment's answer to one finished turn.

    reply:   [R] int32 ids appended after the turn (loss mask 0); empty when ``done`` or
             when the reply waits for sub-agents (``spawn``).
    done:    the episode (this agent's) is over; ``answer`` holds a sub-agent's final answer.
    spawn:   sub-agents to run as one parallel stage before the reply (``resume`` gives it).
    rewards: reward terms earned at this step (summed over the episode by the rollout),
             e.g. ``{"r_perf": f1}`` at the end, or counts a reward needs.
    answer:  the agent's final answer text (what a sub-agent returns to its orchestrator).
    more:    the turn is not over (an environment whose turns end by its grammar, not
             by a stop id, e.g. the token world driven one token per call): ``reply``
             (often empty) is appended and the agent samples on in the same turn; no step
             is counted. ``max_turn_tokens`` bounds the tokens between two ``step`` calls.
    restart: [P] int32 ids that open a new segment of the conversation instead of a reply
             (the agent summarised its context: :mod:`swarmjax.swarm.context`); the turn
             counts as a step. Orchestrators (or single agents) only.
    """

    reply: np.ndarray = dataclasses.field(default_factory=lambda: EMPTY)
    done: bool = False
    spawn: tuple[SubAgentTask, ...] = ()
    rewards: Mapping[str, float] = dataclasses.field(default_factory=dict)
    answer: str | None = None
    more: bool = False
    restart: np.ndarray | None = None

    def __post_init__(self):
        object.__setattr__(self, "reply", np.asarray(self.reply, np.int32).reshape(-1))
        if self.spawn and (self.done or self.reply.size):
            raise ValueError("a Step that spawns sub-agents has no reply and is not done: "
                             "the reply comes from resume() after the stage")
        if self.more and (self.done or self.spawn):
            raise ValueError("a Step with more=True continues the turn: it neither ends the "
                             "episode nor spawns sub-agents")
        if self.restart is not None:
            object.__setattr__(self, "restart", np.asarray(self.restart, np.int32).reshape(-1))
            if self.done or self.spawn or self.more or self.reply.size:
                raise ValueError("a Step that restarts the conversation has no reply, does not end the "
                                 "episode, spawn or continue the turn")


@runtime_checkable
class HostEnv(Protocol):
    """One agent's episode in a host environment (see the module docstring)."""

    def reset(self, task: Any) -> np.ndarray:
        """The first prompt: [P] int32 ids ending with the generation prompt."""

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """Answer a finished turn: ``turn`` [T] int32 sampled ids."""

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        """The reply after the stage a ``Step.spawn`` asked for (results in that order)."""


@dataclasses.dataclass
class Played:
    """A scripted episode of one agent: ids [T] and the mask [T] of its own ids (the last
    segment's, when a ``Step.restart`` split the conversation), the last :class:`Step`
    (None without turns), the sub-agents' ``Played`` in spawn order, and the earlier
    segments as (ids, mask) pairs, oldest first."""

    ids: np.ndarray
    mask: np.ndarray
    last: Step | None
    subagents: list[Played]
    segments: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)


def play(env: HostEnv, task: Any, turns: Sequence[Sequence[int]], *,
         workers: Sequence[Sequence[Sequence[int]]] = ()) -> Played:
    """Run scripted ``turns`` through a host environment on the host (no model): the
    conversation exactly as a rollout that sampled those turns builds it (a warm
    start's demonstrations). A stage's sub-agents play the next scripts of
    ``workers`` (in spawn order, over all stages); one counts as finished (``ok``)
    when its script ends with a ``done`` step, and took ``len(script)`` steps. A step that
    restarts the conversation (``Step.restart``: a summary) closes a segment; the next
    opens with the restart ids (:class:`Played` ``segments``)."""
    prompt = np.asarray(env.reset(task), np.int32)
    ids, mask, subs, step, segments = [prompt], [np.zeros(len(prompt), bool)], [], None, []
    scripts = iter(workers)
    for turn in turns:
        turn = np.asarray(turn, np.int32)
        ids.append(turn)
        mask.append(np.ones(len(turn), bool))
        step = env.step(turn)
        if step.spawn:
            results = []
            for sub in step.spawn:
                script = next(scripts, None)
                if script is None:
                    raise ValueError(f"the episode spawned more sub-agents than the {len(workers)} scripts given")
                played = play(sub.env, sub.task, script)
                ok = played.last is not None and played.last.done
                results.append(SubAgentResult(agent=sub.agent, answer=played.last.answer if ok else None,
                                              steps=len(script), ok=ok, reason="answer" if ok else "turns"))
                subs.append(played)
            step = env.resume(results)
        if step.done:
            break
        if step.restart is not None:
            segments.append((np.concatenate(ids), np.concatenate(mask)))
            ids, mask = [step.restart], [np.zeros(len(step.restart), bool)]
            continue
        ids.append(step.reply)
        mask.append(np.zeros(len(step.reply), bool))
    return Played(np.concatenate(ids), np.concatenate(mask), step, subs, segments)
