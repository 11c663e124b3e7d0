"""Orchestration traces of host text rollouts (:class:`~swarmjax.swarm.text_rollout.TextRollout`):
one episode of a :class:`~swarmjax.swarm.text_types.TextRolloutResult` as a trace valid
against ``schema.json`` (the survey's format, :mod:`swarmjax.traces.export`).

**Time** ``t`` is the critical step, as in the token world's traces: orchestrator turn
``k`` (1-based) starts at ``t_k``, and ``t_{k+1} = t_k + 1 + (the longest sub-agent that
turn started, 0 without one)``; a sub-agent started by turn ``k`` returns at ``t_k + 1 +
its steps``.

**Events**:

* ``prompt``: the first prompt, a ``message`` from the environment (``content_ref``
  ``orchestrator[0:P]``);
* per orchestrator turn ``k``: ``o{k}``, an ``orchestrator_decision`` (the ids it
  sampled), and ``o{k}.reply``, the environment's reply (tool responses or sub-agents'
  answers: a ``message`` to the orchestrator) when it has one;
* per sub-agent ``j``: ``w{j}.spawn`` (``spawn``, the sub-agent's name in ``to``) at its
  turn's time and ``w{j}.end`` (by that name: ``return`` with its whole conversation,
  ``content_ref`` ``w{j}[0:T]``, or ``despawn`` with the ``reason``), so
  ``swarmjax trace show`` draws its bar;
* per compaction ``c`` (a context strategy restarted the conversation,
  :mod:`swarmjax.swarm.context`): ``compact{c}``, a ``message`` from the environment with
  ``role`` ``"context_compaction"`` and the ids the new segment opens with (the first
  prompt and the strategy's note; a ``summary``'s note holds the summary);
  ``content_ref`` names the segment: ``orchestrator_s{c}[a:b]``;
* ``end``: the episode's end, ``return`` (answered) or ``despawn`` (``budget`` or
  ``context``).

**Edges**: ``message`` from the prompt to the first turn, ``temporal`` along the
orchestrator's thread (a turn, its reply, a compaction, the next turn, ``end``),
``spawn`` from a turn to its sub-agents, ``causal`` from a spawn to the sub-agent's
end, ``return`` from a sub-agent's end to the reply that carried its answer.

**Numbers**: ``rewards`` are the rollout's reward terms of the episode (and any the
caller adds); ``costs``: ``tokens`` (every agent's every segment), ``sampled_tokens``,
``tool_calls`` (the task's verifier term, when it reports one), ``messages`` (spawns and
sub-agent ends), ``wall_clock_s`` (the caller's measure); ``metrics``: the step counts,
sub-agents, ``task_size`` (the caller's), ``compactions``, ``context_dropped`` and
``peak_context``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from swarmjax.envs.widesearch_jax import END_REASONS
from swarmjax.swarm.text_types import AgentTrace, TextRolloutResult
from swarmjax.traces.export import Edge, Event, _edge, turn_spans


def _text(decode, agent: str, ids: np.ndarray, a: int, b: int) -> dict[str, str]:
    """An event's ``content_ref`` / ``text`` for ids ``[a, b)`` of ``agent``'s context."""
    return {"content_ref": f"{agent}[{a}:{b}]", "text": decode(ids[a:b].tolist())}


def text_trace(res: TextRolloutResult, b: int, decode, *, trace_id: str, task_id: str, task_size: int,
               wall_clock_s: float = 0.0, rewards: dict[str, float] | None = None, agent: str = "orchestrator"
               ) -> dict[str, Any]:
    """Episode ``b`` of ``res`` as a trace (module docstring). ``decode``: ids -> text
    (the tokenizer's); ``task_size``: the task's size for ``metrics``; ``rewards``: more
    reward channels (added to the rollout's terms); ``agent``: the name and role of the
    episode's main agent ("orchestrator"; a single agent's job: "agent"), whose
    decisions are the schema's ``orchestrator_decision`` events."""
    orch: AgentTrace = res.orchestrators[b]
    segments = [*orch.segments, orch.arrays()]
    subs = res.subagents[b]
    started: dict[int, list[int]] = {}                 # orchestrator turn -> the sub-agents it started
    for j, s in enumerate(subs):
        started.setdefault(s.stage, []).append(j)
    longest = {k: max(subs[j].steps for j in js) for k, js in started.items()}
    times, t = {}, 0
    for k in range(1, orch.steps + 2):
        times[k] = t
        t += 1 + longest.get(k, 0)
    events: list[Event] = []
    edges: list[Edge] = []
    last = None
    for s, seg in enumerate(segments):
        name = agent if s == 0 else f"{agent}_s{s}"
        ids, turn = seg["ids"], seg["turn"]
        head, spans = turn_spans(seg["sampled"].tolist())
        first_turn = int(turn[spans[0][0]]) if spans else orch.steps + 1
        if s == 0:
            events.append({"id": "prompt", "t": 0, "type": "message", "agent": "environment", "role": "task",
                           "to": agent, **_text(decode, name, ids, 0, head)})
            last = "prompt"
        else:
            cid = f"compact{s}"
            events.append({"id": cid, "t": times[first_turn], "type": "message", "agent": "environment",
                           "role": "context_compaction", "to": agent, **_text(decode, name, ids, 0, head)})
            edges.append(_edge(last, cid, "temporal"))
            last = cid
        for a, e, r in spans:
            k = int(turn[a])
            oid = f"o{k}"
            events.append({"id": oid, "t": times[k], "type": "orchestrator_decision", "agent": agent,
                           "role": agent, **_text(decode, name, ids, a, e)})
            edges.append(_edge(last, oid, "message" if last == "prompt" else "temporal"))
            last = oid
            for j in started.get(k, ()):
                sub = subs[j]
                sid, eid = f"w{j}.spawn", f"w{j}.end"
                events.append({"id": sid, "t": times[k], "type": "spawn", "agent": agent,
                               "from": agent, "to": sub.name})
                arr = sub.arrays()
                end = {"id": eid, "t": times[k] + 1 + sub.steps, "type": "return" if sub.ok else "despawn",
                       "agent": sub.name, "role": "subagent", "to": agent,
                       **_text(decode, f"w{j}", arr["ids"], 0, len(arr["ids"]))}
                if not sub.ok:
                    end["reason"] = "step_limit" if sub.reason == "turns" else "context_full"
                events.append(end)
                edges += [_edge(oid, sid, "spawn"), _edge(sid, eid, "causal")]
            if r > e:                                           # the reply the agent heard
                rid = f"o{k}.reply"
                events.append({"id": rid, "t": times[k + 1], "type": "message", "agent": "environment",
                               "to": agent, **_text(decode, name, ids, e, r)})
                edges.append(_edge(oid, rid, "temporal"))
                edges += [_edge(f"w{j}.end", rid, "return") for j in started.get(k, ())]
                last = rid
    reason = END_REASONS[int(res.end_reason[b])]
    events.append({"id": "end", "t": times[orch.steps + 1] if reason != "answer" else times[orch.steps],
                   "type": "return" if reason == "answer" else "despawn", "agent": agent,
                   "role": agent, "from": agent, "to": "environment", "reason": reason})
    edges.append(_edge(last, "end", "temporal"))
    terms = {k: float(v[b]) for k, v in res.rewards.items()}
    all_segments = segments + [t.arrays() for t in subs]
    return {
        "trace_id": trace_id, "task_id": task_id, "system": "swarmjax", "topology": "swarm" if subs else "centralized",
        "events": events, "edges": edges,
        "rewards": {**terms, **{k: float(v) for k, v in (rewards or {}).items()}} or {"r_perf": 0.0},
        "costs": {"tokens": int(sum(len(a["ids"]) for a in all_segments)),
                  "sampled_tokens": int(sum(a["sampled"].sum() for a in all_segments)),
                  "tool_calls": int(terms.get("tool_calls", 0)), "messages": 2 * len(subs),
                  "wall_clock_s": float(wall_clock_s)},
        "metrics": {"critical_steps": int(res.critical_steps[b]), "total_steps": int(res.total_steps[b]),
                    "orchestrator_steps": int(res.orch_steps[b]), "subagents": int(res.spawned[b]),
                    "subagents_finished": int(res.finished[b]), "task_size": int(task_size),
                    "compactions": len(orch.segments), "context_dropped": int(orch.dropped),
                    "peak_context": int(orch.peak)},
    }
