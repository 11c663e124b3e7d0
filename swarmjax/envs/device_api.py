"""What a task must give the jitted text swarm (:class:`~swarmjax.swarm.text_engine.TextSwarm`)
to run on the device: the *device-task* contract.

The host-driven rollout talks to a :class:`~swarmjax.envs.api.HostEnv` per agent (text
in, ids out, Python in between). The jitted swarm never leaves the device during an
episode, so a task it runs is a set of pure functions over arrays, and everything an
agent hears is joined from fragments tokenised once on the host
(:mod:`swarmjax.text.fragments`). The engine owns the rows, the models, the turn
bookkeeping (limits, contexts, the critical-step counts, sub-agent slots and stages);
the task owns its episode state (any pytree with leading dimension B, and per
sub-agent slot S = B x K where it needs one) and says:

=====================  ==========================================================
host, before the loop  :meth:`DeviceTask.batch`: problems -> arrays and the
                       orchestrators' prompt ids; :meth:`~DeviceTask.head_ids`: each
                       role's shared prompt prefix; :meth:`~DeviceTask.grammar` and
                       ``answer_grammar``: the device parsers of calls and answer lines
``init``               the episode state from the arrays
``orch_turn``          an orchestrator turn with calls ended: the responses (a grid of
                       fragments, :class:`TurnOut`), the sub-agents it starts and their
                       prompts' arguments
``orch_answer``        an orchestrator turn without calls: the episode's answer
``worker_prompt``      a started sub-agent's prompt (fragments) from its arguments
``worker_turn``        a sub-agent turn with calls ended: its responses
``worker_answer``      a sub-agent answered (what it relays back)
``stage_over``         every sub-agent a turn started has ended: their results into
                       the orchestrator's pending responses
``reply_seq``          a grid of responses -> one reply's fragments
host, after the loop   :meth:`DeviceTask.rewards`: reward terms from the final state
                       and the decoded answers
=====================  ==========================================================

The host twin of a device task is a :class:`~swarmjax.envs.api.HostEnv` that renders the
same sentences through the chat format and the tokenizer; the differential tests run
both (tests/test_text_engine.py for the canonical wide-search relay,
tests/test_synth_engine.py for a generated tool environment).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import numpy as np

from swarmjax.text.chat import ChatFormat
from swarmjax.text.fragments import Fragments
from swarmjax.text.toolcalls import CallError

Array = jax.Array
R_ANSWER, R_TURNS, R_CONTEXT = 0, 1, 2       # why a sub-agent ended
REASONS = ("answer", "turns", "context")
# one fixed sentence per call error (a device task's response never echoes the call)
CALL_ERROR_TEXT = {
    CallError.BAD_JSON: "Error: the call is not a JSON object with a name and arguments.",
    CallError.UNKNOWN_TOOL: "Error: there is no tool of that name.",
    CallError.MISSING_ARGUMENT: "Error: the call misses a required argument.",
    CallError.BAD_ARGUMENT: "Error: an argument is not one of the allowed values.",
    CallError.INCOMPLETE: "Error: the call was cut off before </tool_call>.",
}


@flax.struct.dataclass
class TurnOut:
    """What a batch of finished turns did (R rows; C = max calls, G = fragments a response holds).

    grid [R, C + 1, G]: each call's response fragments in call order (row C: the
    response to calls past C); responses [R]: how many responses (a turn's reply says
    rows ``< responses``); spawn [R, C]: the sub-agent k a call starts, else -1
    (sub-agent turns: all -1); args [R, C, M] int32: the started sub-agent's prompt
    arguments (:meth:`DeviceTask.worker_prompt`).
    """

    grid: Array
    responses: Array
    spawn: Array
    args: Array


class DeviceTask:
    """The contract (module docstring). Attributes every implementation sets:

    chat: the :class:`ChatFormat` (its tokenizer made every fragment);
    frags: :class:`Fragments` of every sentence piece;
    max_subagents: K sub-agent slots per episode (0: the orchestrator works alone);
    agent_names: [K] the sub-agents' names (traces);
    max_calls: C; grid_width: G;
    answer_grammar: a :class:`~swarmjax.text.device.answers.AnswerGrammar` the engine
      steps on every sampled id (None: the task reads no answer lines on the device);
    widths: static bounds in ids: ``reply`` (an orchestrator's reply), ``worker_reply``,
      ``worker`` (a sub-agent's prompt).
    """

    chat: ChatFormat
    frags: Fragments
    max_subagents: int
    agent_names: Sequence[str]
    max_calls: int
    grid_width: int
    answer_grammar: Any
    widths: dict[str, int]

    # ---- host
    def grammar(self, role: str) -> Any:
        """The :class:`~swarmjax.text.device.calls.CallGrammar` of ``role``'s tools."""
        raise NotImplementedError

    def head_ids(self, role: str) -> np.ndarray:
        """[P] the ids every prompt of ``role`` opens with (prefilled once per rollout)."""
        raise NotImplementedError

    def batch(self, problems: Sequence[Any]) -> tuple[Any, list[np.ndarray]]:
        """(arrays: a pytree of [B, ...] numpy arrays, the orchestrators' prompt ids);
        ValueError naming the first bad problem."""
        raise NotImplementedError

    def rewards(self, problems: Sequence[Any], state: Any, answers: Sequence[str | None]) -> dict[str, np.ndarray]:
        """Reward terms [B] (0 where the episode did not answer) of ``problems`` from the
        final state (numpy leaves) and each orchestrator's answer text (None: no answer)."""
        raise NotImplementedError

    # ---- device (pure; B episodes, S = B K slots)
    def init(self, arrays: Any) -> Any:
        raise NotImplementedError

    def orch_turn(self, state: Any, rec: Any, count: Array, acted: Array) -> tuple[Any, TurnOut]:
        """rec: the parser's :class:`~swarmjax.text.device.calls_state.CallRecord` [B, C, ...];
        count [B] calls made; acted [B] the rows whose turn ended with calls."""
        raise NotImplementedError

    def orch_answer(self, state: Any, answers: Any, mask: Array) -> Any:
        """answers: the answer parser's state [B] (None without ``answer_grammar``)."""
        return state

    def worker_prompt(self, args: Array) -> Array:
        """[S, M] prompt arguments -> [S, L] fragment ids."""
        raise NotImplementedError

    def worker_turn(self, state: Any, rec: Any, count: Array, acted: Array) -> tuple[Any, TurnOut]:
        raise NotImplementedError

    def worker_answer(self, state: Any, answers: Any, mask: Array) -> Any:
        return state

    def stage_over(self, state: Any, over: Array, grid: Array, spawn: Array, slot: Array, reason: Array
                   ) -> tuple[Any, Array]:
        """over [B]: stages that ended; grid [B, C + 1, G] their pending responses; spawn
        [B, C] agent k per position or -1; slot [B, C] its sub-agent slot (clamped to 0
        where spawn is -1); reason [B, C] R_* (R_ANSWER where none). -> (state, grid)."""
        raise NotImplementedError

    def reply_seq(self, grid: Array, responses: Array, cut: Array) -> Array:
        """One row: grid [C + 1, G], responses [], cut [] (the turn hit its length
        limit) -> [L] fragment ids."""
        raise NotImplementedError
