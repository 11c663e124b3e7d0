"""Context strategies of the host text rollout: what an orchestrator's conversation becomes
when it fills.

Long agentic episodes fill the context. The rollout (:class:`~swarmjax.swarm.text_rollout.
TextRollout`) asks :func:`compact` for a fresh conversation when the reply to a finished
turn would take the orchestrator's conversation past ``ContextConfig.threshold`` ids:

* ``"none"``: nothing; an agent that cannot hear a reply ends (reason ``context``) and
  the episode's figures count it (``context_ended``);
* ``"discard_all"`` (as Kimi K2.5 evaluates it, arXiv 2602.02276): the first prompt
  (system turn, task) again, with :data:`~swarmjax.envs.context_notes.DISCARD_NOTE` as a user turn; every tool call
  and result so far is dropped;
* ``"keep_last_round"``: the first prompt with :data:`~swarmjax.envs.context_notes.KEEP_NOTE`, then the latest round
  only: the turn just sampled (its ids as sampled) and its reply;
* ``"summary"`` (ReSum, Wu et al. 2025, arXiv 2509.13313): the agent has a ``summarize``
  tool (:data:`~swarmjax.envs.context_notes.SUMMARIZE`); a turn that calls it ends the segment, and the next one is the
  first prompt with :data:`~swarmjax.envs.context_notes.SUMMARY_NOTE` and the summary (the environment answers such a
  turn with ``Step(restart=ids)``). Past the threshold the reply asks for it: its last
  tool response ends with :data:`~swarmjax.envs.context_notes.SUMMARY_REQUEST` (``HostEnv.summary_request_ids()``), and
  the agent's next turn writes the summary. The summary's ids are sampled ids of the
  segment that wrote them (in the loss) and prompt ids of the next one (not in the loss).
  Set the threshold a turn or more below the context, so that the request and the
  summary fit. With ``summarizer="frozen"`` a frozen copy of the policy writes it instead:
  the rollout runs it as a one-turn sub-agent (the sub-agents' params, a lane of its own)
  whose prompt is the conversation so far and the request, and restarts the conversation
  from its answer; its ids are in no training row, its steps are on the critical path
  (a sub-agent's context must hold the conversation at the threshold; a summariser that
  fails leaves the reply as it was).

Token in, token out: the episode's conversation becomes *segments* (of a conversation;
not the rollout's decode segments, whose count its stats call ``segments``), each its own id
stream. A segment's sampled ids stay as sampled (its loss mask and log-probs); the next
segment's prompt is environment ids (loss mask 0), also where it repeats ids an earlier
segment sampled (``keep_last_round``'s latest turn). The first prompt is re-rendered by
the environment with the note (``HostEnv.restart_ids(note)``, optional:
:class:`~swarmjax.envs.tool_env.ToolAgentEnv` has it); an environment without it cannot
be compacted and its episode ends at the context as with ``"none"`` (the agent job refuses
such a task up front: :func:`check_env`).

Compaction happens where a finished turn's reply is heard (after a turn or after a
stage of sub-agents), for the orchestrator (or single agent); sub-agents keep their own
bounded contexts. ``max_compactions`` bounds the segments of an episode: the compactions
the rollout starts (and the summary requests), and the ``summarize`` calls the agent makes
on its own, which restart while the bound allows; one past it ends the episode as out of
context (an agent that summarises again and again never runs out of context otherwise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from swarmjax.envs.context_notes import DISCARD_NOTE, KEEP_NOTE, SUMMARY_NOTE

MAX_SEGMENTS = 1 << 11          # an orchestrator segment's key id is segment << 20, in an int32


@dataclasses.dataclass(frozen=True)
class ContextConfig:
    """The orchestrator's context strategy (module docstring).

    strategy: a key of :data:`STRATEGIES`.
    threshold: ids past which a heard reply triggers a compaction (None: the
      orchestrator's context itself, i.e. only when the reply would not fit).
    max_compactions: compactions per episode (at most 2047: every segment has a sampling
      key of its own); past them the strategy is ``"none"`` and an agent's own summary
      ends the episode (out of context).
    summarizer: who writes a ``"summary"`` past the threshold: ``"policy"`` (the agent's
      own next turn) or ``"frozen"`` (a frozen copy of the policy, the sub-agents' params,
      run as a one-turn sub-agent over the conversation: :func:`summarizer_task`).
    """

    strategy: str = "none"
    threshold: int | None = None
    max_compactions: int = 8
    summarizer: str = "policy"

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown context strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.summarizer not in SUMMARIZERS:
            raise ValueError(f"unknown summarizer {self.summarizer!r}; known: {', '.join(SUMMARIZERS)}")
        if self.summarizer == "frozen" and self.strategy != "summary":
            raise ValueError("summarizer='frozen' writes summaries: it needs strategy='summary'")
        if self.threshold is not None and self.threshold < 1:
            raise ValueError(f"context threshold must be >= 1 or None, got {self.threshold}")
        if not 0 <= self.max_compactions < MAX_SEGMENTS:
            raise ValueError(f"max_compactions must be in [0, {MAX_SEGMENTS}), got {self.max_compactions}")


def _restart(env: Any, note: str) -> np.ndarray | None:
    fn = getattr(env, "restart_ids", None)
    return None if not callable(fn) else np.asarray(fn(note), np.int32)


def _discard_all(env: Any, trace: dict[str, np.ndarray], turn: int, reply: np.ndarray) -> np.ndarray | None:
    return _restart(env, DISCARD_NOTE)


def _keep_last_round(env: Any, trace: dict[str, np.ndarray], turn: int, reply: np.ndarray) -> np.ndarray | None:
    head = _restart(env, KEEP_NOTE)
    if head is None:
        return None
    last = trace["ids"][trace["sampled"] & (trace["turn"] == turn)]          # the turn just sampled
    return np.concatenate([head, last, reply]).astype(np.int32)


def _summary(env: Any, trace: dict[str, np.ndarray], turn: int, reply: np.ndarray) -> np.ndarray | None:
    fn = getattr(env, "summary_request_ids", None)
    ids = fn() if callable(fn) else None
    return None if ids is None else np.asarray(ids, np.int32)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """What a strategy does past the threshold: ``ids(env, the conversation's arrays
    (AgentTrace.arrays), the turn just finished, its reply [R]) -> ids | None`` (None:
    it cannot), whether those ids open a new segment (``restart``) or replace the
    reply in the current one (a request: ``summary``), and the environment methods it
    calls (``needs``: :func:`check_env`)."""

    ids: Callable[..., np.ndarray | None]
    restart: bool = True
    needs: tuple[str, ...] = ("restart_ids",)


STRATEGIES: dict[str, Strategy | None] = {
    "none": None, "discard_all": Strategy(_discard_all), "keep_last_round": Strategy(_keep_last_round),
    "summary": Strategy(_summary, restart=False, needs=("restart_ids", "summary_request_ids"))}


def compact(strategy: str, env: Any, trace: dict[str, np.ndarray], turn: int,
            reply: np.ndarray) -> tuple[np.ndarray, bool] | None:
    """Past the threshold: (ids [P], restart) — the ids that open the next segment of a
    conversation (``restart``; ending with the generation prompt), or that the agent hears
    instead of ``reply`` (a summary request) — or None when ``strategy`` is ``"none"`` or
    the environment cannot. ``trace``: the current segment's
    :meth:`~swarmjax.swarm.text_types.AgentTrace.arrays`; ``turn`` the turn just
    finished; ``reply`` [R] its reply."""
    s = STRATEGIES[strategy]
    if s is None:
        return None
    ids = s.ids(env, trace, turn, np.asarray(reply, np.int32))
    return None if ids is None else (ids, s.restart)


SUMMARIZERS = ("policy", "frozen")


def summarizer_task(env: Any, conversation: np.ndarray) -> Any:
    """The frozen summariser of a conversation past the threshold (``summarizer="frozen"``):
    ``env.summarizer(conversation [T])``, a :class:`~swarmjax.envs.api.SubAgentTask` whose
    environment opens with the conversation and the summary request and ends after one
    turn with the summary as its answer; None when the environment has no summariser."""
    fn = getattr(env, "summarizer", None)
    return fn(np.asarray(conversation, np.int32)) if callable(fn) else None


def summary_restart(env: Any, summary: str) -> np.ndarray | None:
    """The ids a conversation restarts from after ``summary`` (the first prompt and
    :data:`~swarmjax.envs.context_notes.SUMMARY_NOTE`), or None."""
    return _restart(env, SUMMARY_NOTE.format(summary=summary))


def check_env(strategy: str, env: Any, *, summarizer: str = "policy") -> None:
    """Raise one ValueError when ``env`` (an agent's environment) lacks a method
    ``strategy`` calls (:attr:`Strategy.needs`: ``restart_ids``, and for ``"summary"``
    ``summary_request_ids``; with ``summarizer="frozen"`` ``summarizer`` too;
    :class:`~swarmjax.envs.tool_env.ToolAgentEnv` has them all)."""
    s = STRATEGIES[strategy]
    needs = (*(s.needs if s is not None else ()), *(("summarizer",) if summarizer == "frozen" else ()))
    missing = [m for m in needs if not callable(getattr(env, m, None))]
    if missing:
        raise ValueError(f"context strategy {strategy!r}: the task's environment ({type(env).__name__}) lacks "
                         f"{', '.join(missing)}; use a ToolAgentEnv-based task or strategy 'none'")
