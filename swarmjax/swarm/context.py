"""Context strategies of the host text rollout: what an orchestrator's conversation becomes
when it fills.

Long agentic episodes fill the context. The rollout (:class:`~swarmjax.swarm.text_rollout.
TextRollout`) asks :func:`compact` for a fresh conversation when the reply to a finished
turn would take the orchestrator's conversation past ``ContextConfig.threshold`` ids:

* ``"none"``: nothing; an agent that cannot hear a reply ends (reason ``context``) and
  the episode's figures count it (``context_ended``);
* ``"discard_all"`` (as Kimi K2.5 evaluates it, arXiv 2602.02276): the first prompt
  (system turn, task) again, with :data:`DISCARD_NOTE` as a user turn; every tool call
  and result so far is dropped;
* ``"keep_last_round"``: the first prompt with :data:`KEEP_NOTE`, then the latest round
  only: the turn just sampled (its ids as sampled) and its reply.

Token in, token out: the episode's conversation becomes *segments*, each its own id
stream. A segment's sampled ids stay as sampled (its loss mask and log-probs); the next
segment's prompt is environment ids (loss mask 0), also where it repeats ids an earlier
segment sampled (``keep_last_round``'s latest turn). The first prompt is re-rendered by
the environment with the note (``HostEnv.restart_ids(note)``, optional:
:class:`~swarmjax.envs.tool_env.ToolAgentEnv` has it); an environment without it cannot
be compacted and its episode ends at the context as with ``"none"``.

Compaction happens where a finished turn's reply is heard (after a turn or after a
stage of sub-agents), for the orchestrator (or single agent); sub-agents keep their own
bounded contexts. ``max_compactions`` bounds the segments of an episode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

DISCARD_NOTE = ("Your earlier tool calls and their results were removed to free context. "
                "Continue the task from the start of this conversation.")
KEEP_NOTE = ("Earlier rounds of tool calls and their results were removed to free context; "
             "only the latest round follows. Continue the task.")


@dataclasses.dataclass(frozen=True)
class ContextConfig:
    """The orchestrator's context strategy (module docstring).

    strategy: a key of :data:`STRATEGIES`.
    threshold: ids past which a heard reply triggers a compaction (None: the
      orchestrator's context itself, i.e. only when the reply would not fit).
    max_compactions: compactions per episode; past them the strategy is ``"none"``.
    """

    strategy: str = "none"
    threshold: int | None = None
    max_compactions: int = 8

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown context strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.threshold is not None and self.threshold < 1:
            raise ValueError(f"context threshold must be >= 1 or None, got {self.threshold}")
        if self.max_compactions < 0:
            raise ValueError(f"max_compactions must be >= 0, got {self.max_compactions}")


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


# strategy -> (env, the conversation's arrays (AgentTrace.arrays), the turn just
# finished, its reply [R]) -> the next segment's ids (None: cannot compact)
STRATEGIES: dict[str, Callable[..., np.ndarray | None] | None] = {
    "none": None, "discard_all": _discard_all, "keep_last_round": _keep_last_round}


def compact(strategy: str, env: Any, trace: dict[str, np.ndarray], turn: int,
            reply: np.ndarray) -> np.ndarray | None:
    """The ids [P] that open the next segment of a conversation (``trace``: its current
    segment's :meth:`~swarmjax.swarm.text_types.AgentTrace.arrays`; ``turn`` the turn
    just finished; ``reply`` [R] the ids that did not fit), ending with the generation
    prompt; None when ``strategy`` is ``"none"`` or the environment cannot restart."""
    fn = STRATEGIES[strategy]
    return None if fn is None else fn(env, trace, turn, np.asarray(reply, np.int32))
