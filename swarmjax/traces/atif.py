"""Rollout episodes as ATIF trajectories (the Agent Trajectory Interchange Format, v1.8:
the ``atif`` package's models; Tunix reads it), with the exact token ids and log-probs.

One episode of a :class:`~swarmjax.swarm.text_types.TextRolloutResult` (every engine's
result: the host rollout, the jitted text swarm, the token world) becomes one trajectory:

* a ``user`` step: the conversation's opening (the rendered first prompt), decoded;
* per agent turn an ``agent`` step: its text outside calls (``message``), its think
  block (``reasoning_content``), its calls (``tool_calls``, each with a name; arguments
  that did not parse as an object are ``{}`` with the text in ``extra``), and
  ``metrics``: ``prompt_token_ids`` (every id of the segment before the turn),
  ``completion_token_ids`` (the ids sampled), ``logprobs`` (the sampler's, aligned with
  them); its ``observation``: the environment's reply, decoded (the ids the rollout
  appended after the turn), and a reference to each sub-agent the turn started;
* where a context strategy restarted the conversation, a ``system`` step saying so, then
  the new segment's opening as a ``user`` step;
* ``final_metrics``: token totals and the steps; ``extra``: the reward terms, the end
  reason, critical and total steps.

Sub-agents are embedded (``subagent_trajectories``, ``trajectory_id`` = ``<episode
id>/<name>``) and referenced from the observation of the turn that started them.

Reference: ATIF v1.8 (``pip install atif``; the tests validate every trajectory with
``atif.Trajectory``). This module writes plain dicts and does not need the package.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from swarmjax.swarm.text_types import AgentTrace, TextRolloutResult

__all__ = ["SCHEMA_VERSION", "episode_trajectory"]

SCHEMA_VERSION = "ATIF-v1.8"
Decode = Callable[[np.ndarray], str]
Parse = Callable[[str], Any]        # text -> ParsedTurn (content, reasoning, calls)


def _segments(trace: AgentTrace) -> list[dict[str, np.ndarray]]:
    current = trace.arrays()
    return [*trace.segments, *([current] if len(current["ids"]) else [])]


def _agent_step(step_id: int, completion: np.ndarray, logprobs: np.ndarray, prompt: np.ndarray,
                decode: Decode, parse: Parse | None, call_prefix: str, model_name: str | None) -> dict:
    text = decode(completion)
    message, reasoning, calls = text, None, []
    if parse is not None:
        parsed = parse(text)
        message, reasoning = parsed.content, parsed.reasoning
        for i, c in enumerate(parsed.calls):
            if c.name is None:
                message = "\n".join(p for p in (message, c.text) if p)
                continue
            call = {"tool_call_id": f"{call_prefix}.{i}", "function_name": c.name,
                    "arguments": dict(c.arguments) if isinstance(c.arguments, Mapping) else {}}
            if not isinstance(c.arguments, Mapping):
                call["extra"] = {"arguments_text": c.text, "error": c.message}
            calls.append(call)
    step = {"step_id": step_id, "source": "agent", "message": message,
            "metrics": {"prompt_tokens": int(len(prompt)), "completion_tokens": int(len(completion)),
                        "prompt_token_ids": prompt.tolist(), "completion_token_ids": completion.tolist(),
                        "logprobs": [float(x) for x in logprobs]}}
    if model_name is not None:
        step["model_name"] = model_name
    if reasoning is not None:
        step["reasoning_content"] = reasoning
    if calls:
        step["tool_calls"] = calls
    return step


def _trajectory(trace: AgentTrace, tid: str, decode: Decode, parse: Parse | None, *,
                subagents: Sequence[AgentTrace] = (), model_name: str | None = None) -> tuple[list[dict], dict]:
    """(steps, totals) of one agent; sub-agents referenced by the turn that started them."""
    steps, totals = [], {"prompt": 0, "completion": 0}
    by_stage: dict[int, list[str]] = {}
    for j, sub in enumerate(subagents):
        by_stage.setdefault(sub.stage, []).append(f"{tid}/{sub.name}-{j}")
    for s, seg in enumerate(_segments(trace)):
        ids, sampled, turn, lps = seg["ids"], seg["sampled"], seg["turn"], seg["logprobs"]
        if s:
            steps.append({"step_id": len(steps) + 1, "source": "system",
                          "message": "The conversation was compacted; it continues from the opening below."})
        first = np.flatnonzero(sampled)
        opening = ids[:first[0]] if first.size else ids
        steps.append({"step_id": len(steps) + 1, "source": "user", "message": decode(opening)})
        for t in np.unique(turn[sampled]):
            own = np.flatnonzero(sampled & (turn == t))
            start, end = int(own[0]), int(own[-1]) + 1
            reply = np.flatnonzero(~sampled & (turn == t) & (np.arange(len(ids)) >= end))
            step = _agent_step(len(steps) + 1, ids[start:end], lps[start:end], ids[:start], decode, parse,
                               f"{tid}.{t}", model_name)
            results = []
            if reply.size:
                results.append({"content": decode(ids[reply[0]:reply[-1] + 1])})
            results += [{"subagent_trajectory_ref": [{"trajectory_id": ref}]} for ref in by_stage.get(int(t), [])]
            if results:
                step["observation"] = {"results": results}
            totals["prompt"] += start
            totals["completion"] += end - start
            steps.append(step)
    return steps, totals


def episode_trajectory(res: TextRolloutResult, b: int, decode: Decode, *, parse: Parse | None = None,
                       trajectory_id: str | None = None, agent: str = "swarmjax", version: str = "",
                       model_name: str | None = None, tools: Sequence[Mapping] | None = None,
                       extra: Mapping[str, Any] | None = None) -> dict:
    """Episode ``b`` of ``res`` as an ATIF trajectory (a JSON-ready dict; module docstring).

    ``decode``: ids -> text (the tokenizer's, special tokens kept, or the token world's
    vocabulary); ``parse``: text -> a :class:`~swarmjax.text.toolcalls.ParsedTurn` (the chat
    format's call parser; None: no calls are read); ``tools``: the tool schemas the agent
    had (``agent.tool_definitions``); ``extra``: more root metadata (e.g. the problem)."""
    tid = trajectory_id or f"episode-{b}"
    orch, subs = res.orchestrators[b], list(res.subagents[b]) if res.subagents else []
    steps, totals = _trajectory(orch, tid, decode, parse, subagents=subs, model_name=model_name)
    sub_docs = []
    for j, sub in enumerate(subs):
        sub_steps, sub_totals = _trajectory(sub, f"{tid}/{sub.name}-{j}", decode, parse, model_name=model_name)
        sub_docs.append({"schema_version": SCHEMA_VERSION, "trajectory_id": f"{tid}/{sub.name}-{j}",
                         "agent": {"name": agent, "version": version, "extra": {"role": "subagent"}},
                         "steps": sub_steps,
                         "final_metrics": {"total_prompt_tokens": sub_totals["prompt"],
                                           "total_completion_tokens": sub_totals["completion"],
                                           "total_steps": int(sub.steps)},
                         "extra": {"answer": sub.answer, "ok": bool(sub.ok), "reason": sub.reason, "stage": int(sub.stage)}})
        totals = {k: totals[k] + sub_totals[k] for k in totals}
    from swarmjax.envs.widesearch_jax import END_REASONS

    doc = {"schema_version": SCHEMA_VERSION, "trajectory_id": tid,
           "agent": {"name": agent, "version": version, **({"model_name": model_name} if model_name else {}),
                     **({"tool_definitions": [dict(t) for t in tools]} if tools else {})},
           "steps": steps,
           "final_metrics": {"total_prompt_tokens": totals["prompt"], "total_completion_tokens": totals["completion"],
                             "total_steps": int(res.total_steps[b])},
           "extra": {"rewards": {k: float(v[b]) for k, v in res.rewards.items()},
                     "end_reason": END_REASONS[int(res.end_reason[b])], "answer": res.answers[b],
                     "critical_steps": int(res.critical_steps[b]), "orchestrator_steps": int(res.orch_steps[b]),
                     **json.loads(json.dumps(dict(extra or {}), default=str))}}
    if sub_docs:
        doc["subagent_trajectories"] = sub_docs
    return doc
