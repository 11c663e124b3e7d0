"""Kimi K2.5's orchestration tools as a reusable piece: ``create_subagent`` and
``assign_task``.

* ``create_subagent(name, system_prompt)`` registers a named sub-agent (its system
  prompt says what it is for); it answers at once and opens no stage.
* ``assign_task(agent, prompt)`` gives a registered sub-agent a task. The
  ``assign_task`` calls of ONE orchestrator turn form one stage: the sub-agents run in
  parallel (frozen params) and, when all have stopped, their final answers come back
  as tool responses in call order, each naming its agent (chat templates have no call
  ids, so the name is in the text).

One :class:`Orchestration` serves one orchestrator episode (it holds the registered
agents, the assignments and the answers that came back). ``make_subagent(system_prompt)`` builds the sub-agent's host environment.

References:
  Kimi Team, "Kimi K2.5: Visual Agentic Intelligence" (2026), Agent Swarm / PARL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from swarmjax.envs.api import HostEnv, SubAgentResult, SubAgentTask
from swarmjax.text.toolcalls import CallError, ToolCall
from swarmjax.text.tools import Tool

CREATE, ASSIGN = "create_subagent", "assign_task"

CREATE_PARAMETERS = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "A short unique name for the sub-agent."},
                   "system_prompt": {"type": "string", "description": "What the sub-agent is and does."}},
    "required": ["name", "system_prompt"],
}
ASSIGN_PARAMETERS = {
    "type": "object",
    "properties": {"agent": {"type": "string", "description": "Name of a sub-agent created earlier."},
                   "prompt": {"type": "string", "description": "The task, complete and self-contained."}},
    "required": ["agent", "prompt"],
}


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A pending ``assign_task`` call: its position in the turn and the sub-agent task."""

    position: int
    task: SubAgentTask


class Orchestration:
    """The orchestration tools of one orchestrator episode.

    Args:
      make_subagent: ``system_prompt -> HostEnv``, a fresh environment per assignment.
      max_subagents: assignments allowed per episode (K); later ones get an error reply.
    """

    def __init__(self, make_subagent: Callable[[str], HostEnv], *, max_subagents: int = 8):
        if max_subagents < 1:
            raise ValueError(f"max_subagents must be >= 1, got {max_subagents}")
        self.make_subagent, self.max_subagents = make_subagent, max_subagents
        self.agents: dict[str, str] = {}         # name -> system prompt
        self.assigned = 0
        self.history: list[tuple[str, str]] = []   # (agent, prompt) of every assignment that ran
        self.answers: list[str] = []               # final answers of the sub-agents that finished

    def create_subagent(self, name: str, system_prompt: str) -> str:
        """Register ``name``; re-creating a name replaces its system prompt."""
        self.agents[name] = system_prompt
        return f"Created sub-agent '{name}'."

    def tools(self) -> list[Tool]:
        """The two tools with their JSON schemas, for the orchestrator's system turn.
        Both are answered by :meth:`handle` (``assign_task`` by the stage), never by a
        tool runner."""
        return [Tool(name=CREATE, description="Create a sub-agent with its own system prompt.",
                     parameters=CREATE_PARAMETERS, fn=self.create_subagent),
                Tool(name=ASSIGN, description="Give a sub-agent a task. Every assign_task call of one "
                     "turn runs in parallel; their answers come back together.",
                     parameters=ASSIGN_PARAMETERS, fn=None)]

    def handle(self, calls: Sequence[ToolCall]) -> tuple[list[Assignment], dict[int, str]]:
        """The well-formed orchestration calls of one turn, in call order (a sub-agent
        created in a turn can be assigned later in the same turn). Returns the stage's
        assignments and the immediate replies (position -> text): creations, and errors
        for an unknown agent or an assignment past K."""
        stage, replies = [], {}
        for i, call in enumerate(calls):
            if call.error != CallError.NONE or call.name not in (CREATE, ASSIGN):
                continue
            if call.name == CREATE:
                replies[i] = self.create_subagent(**call.arguments)
                continue
            agent, prompt = call.arguments["agent"], call.arguments["prompt"]
            if agent not in self.agents:
                known = ", ".join(sorted(self.agents)) or "none yet"
                replies[i] = f"Error: no sub-agent named '{agent}' (created: {known}). Call create_subagent first."
            elif self.assigned >= self.max_subagents:
                replies[i] = f"Error: the limit of {self.max_subagents} sub-agent tasks per episode is reached."
            else:
                self.assigned += 1
                self.history.append((agent, prompt))
                env = self.make_subagent(self.agents[agent])
                stage.append(Assignment(position=i, task=SubAgentTask(agent=agent, env=env, task=prompt)))
        return stage, replies

    def record(self, results: Sequence[SubAgentResult]) -> None:
        """Keep the answers of a finished stage (rewards read them at the end)."""
        self.answers.extend(r.answer for r in results if r.ok and r.answer is not None)


def result_text(result: SubAgentResult) -> str:
    """The tool response of one ``assign_task``: the agent's name and its final answer,
    or why it has none."""
    if result.ok and result.answer is not None:
        return f"Sub-agent '{result.agent}' answered:\n{result.answer}"
    why = {"turns": "was stopped at its turn limit", "context": "ran out of context"}.get(
        result.reason, f"ended ({result.reason})")
    return f"Sub-agent '{result.agent}' {why} without an answer."
