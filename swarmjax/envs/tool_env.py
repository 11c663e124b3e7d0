"""A chat agent with tools as a host environment: the generic :class:`~swarmjax.envs.api.HostEnv`.

A user's task plugs in with three things: the tools (Python callables with JSON
schemas), how a task becomes the first messages, and a verifier of the final answer.

Per finished turn (ids the agent sampled):

1. the turn is decoded *to be read* (``tokenizer.decode``; the ids themselves are
   appended as sampled, never re-encoded) and parsed for tool calls
   (:func:`swarmjax.text.toolcalls.parse_turn`; calls inside the think block are
   reasoning, not calls);
2. a turn without calls is the final answer: the episode ends and the verifier scores
   it (a turn cut by the length limit is still read as the answer it is, and counted
   in the ``truncated`` term);
3. otherwise every call gets one tool response, in call order: malformed calls (bad
   JSON, unknown tool, missing or wrongly typed argument, cut off) an error text,
   good calls the tool's output (run in a thread pool with a timeout; a raising or
   hanging tool gives an error text). The turn costs one step either way.
   ``assign_task`` calls (with :class:`~swarmjax.envs.orchestration.Orchestration`)
   instead open a stage; their responses are the sub-agents' answers.

Reply ids: the chat format's closing ids of the turn, then one tool-response turn
and the next generation prompt; only the new text (tool outputs) is tokenised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from swarmjax.envs.api import Step, SubAgentResult, SubAgentTask
from swarmjax.envs.orchestration import Orchestration, result_text
from swarmjax.envs.context_notes import SUMMARIZE, SUMMARY_NOTE, SUMMARY_REQUEST, summarize_tool
from swarmjax.text.chat import ChatFormat
from swarmjax.text.runner import ToolRunner
from swarmjax.text.toolcalls import ParsedTurn, parse_turn
from swarmjax.text.tools import Tool, ToolSet

Messages = list[dict[str, Any]]


class ToolAgentEnv:
    """One agent's episode: a chat format, tools, a prompt builder and a verifier.

    Args:
      chat: the :class:`~swarmjax.text.chat.ChatFormat` (tokenizer inside).
      tools: the agent's own tools.
      runner: a :class:`~swarmjax.text.runner.ToolRunner` (thread pool, timeout), shared
        by many episodes: each run resolves calls against this episode's tools.
      messages: ``task -> messages`` (system / user turns) of the first prompt.
      verify: ``(task, answer text) -> reward terms`` (e.g. ``{"r_perf": 1.0}``); None
        for sub-agents, whose answer goes back to their orchestrator.
      orchestration: optional :class:`Orchestration` (its tools are added).
      per_turn: most calls of a tool per turn (``{"lookup": 1}``); later calls of it in
        the same turn get an error reply and are not run.
      syntax: the tool-call syntax (key of ``toolcalls.CALL_SYNTAXES``; default the format's).
      summarize: the agent also has ``summarize(summary)`` (the ``"summary"`` context
        strategy, :mod:`swarmjax.swarm.context`): a turn with a well-formed call of it
        restarts the conversation from the first prompt and the summary
        (``Step(restart=...)``; the turn's other calls are not run).
    """

    def __init__(self, chat: ChatFormat, tools: Sequence[Tool], *, runner: ToolRunner,
                 messages: Callable[[Any], Messages],
                 verify: Callable[[Any, str], Mapping[str, float]] | None = None,
                 orchestration: Orchestration | None = None, per_turn: Mapping[str, int] | None = None,
                 syntax: str | None = None, summarize: bool = False):
        self.chat, self.runner, self.messages, self.verify = chat, runner, messages, verify
        self.orchestration = orchestration
        self.own = ToolSet(tools)
        self.tools = ToolSet(list(tools) + (orchestration.tools() if orchestration is not None else [])
                             + ([summarize_tool()] if summarize else []))
        self.summarize = summarize
        self.per_turn = dict(per_turn or {})
        self.syntax = syntax or chat.call_syntax
        self.task: Any = None
        self.tool_calls = 0           # calls of the agent's own tools that ran and returned
        self.errors = 0               # malformed, refused or failed calls
        self._pending: tuple | None = None
        self._last: tuple | None = None        # (closing ids, tool responses) of the last reply

    def reset(self, task: Any) -> np.ndarray:
        """The first prompt ids (tool schemas in the system turn, generation prompt at the end)."""
        self.task = task
        schemas = self.tools.schemas() if len(self.tools) else None
        return self.chat.prompt_ids(self.messages(task), tools=schemas)

    def restart_ids(self, note: str) -> np.ndarray:
        """The first prompt again with ``note`` as a last user turn (a context strategy's
        fresh conversation, :mod:`swarmjax.swarm.context`)."""
        schemas = self.tools.schemas() if len(self.tools) else None
        return self.chat.prompt_ids([*self.messages(self.task), {"role": "user", "content": note}], tools=schemas)

    def parse(self, turn: np.ndarray) -> ParsedTurn:
        """Read a turn: decoded (special tokens kept) and parsed for calls."""
        return parse_turn(self.chat.tokenizer.decode(turn), self.tools, syntax=self.syntax)

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """Answer a finished turn [T] (module docstring): the final answer (done, reward
        terms), one tool response per call, or a stage of sub-agents."""
        parsed = self.parse(turn)
        closing = self.chat.after_turn_ids(turn)
        if not parsed.calls:
            terms = {"truncated": float(truncated), "tool_calls": float(self.tool_calls),
                     "tool_errors": float(self.errors)}
            if self.verify is not None:
                terms.update(self.verify(self.task, parsed.content))
            return Step(done=True, answer=parsed.content, rewards=terms)
        calls = list(parsed.calls)
        summary = _summary_call(calls) if self.summarize else None
        if summary is not None:
            return Step(restart=self.restart_ids(SUMMARY_NOTE.format(summary=summary.arguments["summary"])))
        stage, replies = self.orchestration.handle(calls) if self.orchestration is not None else ([], {})
        self.errors += sum(text.startswith("Error:") for text in replies.values())   # unknown agent, past K
        staged = {a.position for a in stage}
        seen: dict[str, int] = {}
        run = []
        for i, call in enumerate(calls):
            if i in staged or i in replies:
                continue
            seen[call.name] = seen.get(call.name, 0) + 1
            if call.ok and seen[call.name] > self.per_turn.get(call.name, len(calls)):
                replies[i] = (f"Error: {call.name} serves {self.per_turn[call.name]} call(s) per turn; "
                              "this one was not run.")
                self.errors += 1
            else:
                run.append(i)
        for i, res in zip(run, self.runner.run([calls[i] for i in run], tools=self.own)):
            replies[i] = res.text
            self.tool_calls += res.ok
            self.errors += not res.ok
        if stage:
            self._pending = (closing, len(calls), replies, stage)
            return Step(spawn=tuple(a.task for a in stage))
        return self._reply(closing, [replies[i] for i in range(len(calls))])

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        """The turn's tool responses once its stage is over: sub-agents' answers at the
        positions of their ``assign_task`` calls, the other replies as they were."""
        if self._pending is None:
            raise RuntimeError("resume() without a stage: step() did not spawn sub-agents")
        closing, count, replies, stage = self._pending
        if len(results) != len(stage):
            raise ValueError(f"the stage had {len(stage)} sub-agents, got {len(results)} results")
        for a, res in zip(stage, results):
            replies[a.position] = result_text(res)
        self.orchestration.record(results)
        self._pending = None
        return self._reply(closing, [replies[i] for i in range(count)])

    def _reply(self, closing: np.ndarray, responses: list[str]) -> Step:
        self._last = (closing, responses)
        return Step(reply=np.concatenate([closing, self.chat.tool_responses_ids(responses)]))

    def summarizer(self, conversation: np.ndarray) -> SubAgentTask | None:
        """The frozen summariser of this conversation (``ContextConfig(summarizer="frozen")``):
        a one-turn agent whose prompt is ``conversation`` [T] (ids as the agent heard and
        said them) and the last reply with the summary request (:meth:`summary_request_ids`);
        its answer is the ``summary`` argument of its ``summarize`` call, or its text
        without one. None where :meth:`summary_request_ids` is."""
        request = self.summary_request_ids()
        if request is None:
            return None
        prompt = np.concatenate([np.asarray(conversation, np.int32), request])
        return SubAgentTask(agent="summarizer", env=_Summarizer(self, prompt), task=None)

    def summary_request_ids(self) -> np.ndarray | None:
        """The last reply again with :data:`~swarmjax.envs.context_notes.SUMMARY_REQUEST` after
        its last tool response (the ``"summary"`` strategy past its threshold); None
        without a tool reply or without the ``summarize`` tool."""
        if self._last is None or not self.summarize:
            return None
        closing, responses = self._last
        asked = [*responses[:-1], f"{responses[-1]}\n\n{SUMMARY_REQUEST}"]
        return np.concatenate([closing, self.chat.tool_responses_ids(asked)])


def _summary_call(calls: Sequence[Any]) -> Any:
    """The first well-formed ``summarize`` call of a turn's parsed calls, or None."""
    return next((c for c in calls if c.ok and c.name == SUMMARIZE), None)


class _Summarizer:
    """A frozen summariser's one-turn episode (:meth:`ToolAgentEnv.summarizer`)."""

    def __init__(self, agent: ToolAgentEnv, prompt: np.ndarray):
        self.agent, self.prompt = agent, prompt

    def reset(self, task: Any) -> np.ndarray:
        return self.prompt

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        parsed = self.agent.parse(turn)
        call = _summary_call(parsed.calls)
        return Step(done=True, answer=call.arguments["summary"] if call is not None else parsed.content)

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        raise RuntimeError("a summariser starts no sub-agents")
