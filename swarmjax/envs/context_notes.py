"""What an agent reads and calls when its context is compacted (the texts and the tool of
the rollout's context strategies, :mod:`swarmjax.swarm.context`): the notes a fresh
conversation opens with, the request that asks for a summary, and the ``summarize`` tool
(:class:`~swarmjax.envs.tool_env.ToolAgentEnv` answers it; it is never run)."""

from __future__ import annotations

from swarmjax.text.tools import Tool

DISCARD_NOTE = ("Your earlier tool calls and their results were removed to free context. "
                "Continue the task from the start of this conversation.")
KEEP_NOTE = ("Earlier rounds of tool calls and their results were removed to free context; "
             "only the latest round follows. Continue the task.")
SUMMARY_NOTE = ("Your earlier tool calls and their results were removed to free context. "
                "Your summary of them:\n{summary}\nContinue the task.")
SUMMARY_REQUEST = ("Your context is nearly full. Call summarize now with everything you found so far "
                   "that the rest of the task needs; the conversation then restarts from your summary.")
SUMMARIZE_PARAMETERS = {
    "type": "object",
    "properties": {"summary": {"type": "string", "description": "What you found so far that the rest of the "
                                                                 "task needs: facts, values, what is left to do."}},
    "required": ["summary"],
}
SUMMARIZE = "summarize"


def summarize_tool() -> Tool:
    """The ``summarize`` tool's schema as a :class:`~swarmjax.text.tools.Tool` (answered by
    the environment, never run: ``ToolAgentEnv(summarize=True)``)."""
    return Tool(name=SUMMARIZE, description="Replace the conversation so far by your summary of it, to free "
                "context. The conversation restarts from the task and your summary.",
                parameters=SUMMARIZE_PARAMETERS, fn=None)
