"""Turn a wide-search episode into an orchestration trace (JSON, schema in ``schema.json``).

The trace format is the orchestration-trace survey's (arXiv 2605.02801); ``schema.json``
is that schema made stricter (closed objects, integer counts and times, the required
fields below), so a trace valid here is valid there.

**Time** ``t`` is the critical step at which an event happens: an orchestrator turn
starting at critical step ``c`` happens at ``t = c``; a sub-agent spawned by it takes
its turn ``j`` at ``c + 1 + j`` and, after ``s`` steps, returns at ``t = c + 1 + s``;
the orchestrator aggregates when the slowest sub-agent is done. A tool call happens at
its turn's step, its result one step later. So the Gantt chart of a trace *is* its
critical path.

**Events** (ids are structural, so the functions below are independent):

* ``prompt``: the task, a ``message`` from the environment to the orchestrator;
* per orchestrator turn ``i``: ``o{i}``, an ``orchestrator_decision`` (the tokens it
  said); a lookup adds ``o{i}.call`` / ``o{i}.result`` (``tool_call`` / ``tool_result``,
  ``ok`` false on ``<fail>``); a malformed turn adds ``o{i}.fail``, the environment's
  ``<fail>`` (a ``message`` with a ``reason``); a spawn adds per sub-agent ``k`` a
  ``spawn`` event ``w{k}.spawn`` (text: the sub-agent's prompt) and one ``o{i}.agg``
  ``aggregate`` (text: the ``<result>`` blocks the orchestrator heard);
* per sub-agent turn ``j``: a lookup is ``w{k}.{j}`` / ``w{k}.{j}.result``
  (``tool_call`` / ``tool_result``), a malformed turn ``w{k}.{j}`` / ``w{k}.{j}.fail``
  (``message`` to / from the environment); its end is ``w{k}.end``: ``return`` (its
  return turn) or ``despawn`` (stopped, with the ``reason``);
* ``end``: the episode's end, a ``return`` of the answer or a ``despawn`` of the
  orchestrator (``reason``: ``answer`` / ``budget`` / ``context``).

Text events carry ``text`` (decoded tokens) and ``content_ref`` = ``"<agent>[a:b]"``,
the token positions in that agent's context; the spans of an agent's events cover its
whole context, so the transcripts can be rebuilt from the trace.

**Edges**: ``message`` from the prompt to the first turn; ``temporal`` along the
orchestrator's thread (each turn's last event to the next turn, the last to ``end``);
``causal`` from a decision to its call or ``<fail>`` and along each sub-agent's thread
(spawn -> first turn -> ... -> end); ``tool_dependency`` from each call to its result;
``spawn`` from the spawn decision to each ``spawn``; ``return`` from each sub-agent's
end to the stage's ``aggregate``.

**Numbers**: ``rewards`` holds the reward channels the caller passes (a PARL rollout's:
every channel, the weights and the total, :mod:`swarmjax.traces.rollout`); ``costs``
and ``metrics`` are numbers only (:func:`episode_costs`, :func:`episode_metrics`);
``costs.wall_clock_s`` is measured by the caller (see :func:`trace_from_outcome`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from swarmjax.envs.widesearch import Episode, Outcome, Vocab, WideSearchConfig, score
from swarmjax.envs.scoring import item_f1

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema.json")

Event = dict[str, Any]
Edge = dict[str, str]


def load_schema() -> dict[str, Any]:
    """The project's trace schema (JSON Schema draft 2020-12)."""
    with open(SCHEMA_PATH) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- turns


def turn_spans(sampled: Sequence[bool]) -> tuple[int, list[tuple[int, int, int]]]:
    """Split one agent's context into its prompt and its turns, from the per-token flags
    ``sampled`` (True: said by the agent; False: heard from the environment).

    Returns ``(p, turns)``: the prompt is ``[0, p)`` (everything before the first said
    token) and turn ``i`` is ``(a, b, c)``: said tokens ``[a, b)``, then the environment's
    reply ``[b, c)`` (empty when the turn ended the agent or its context). A turn's said
    tokens are contiguous and every turn but the last is followed by a reply, so each
    maximal run of said tokens is one turn."""
    L = len(sampled)
    p = next((i for i, s in enumerate(sampled) if s), L)
    turns, i = [], p
    while i < L:
        a = i
        while i < L and sampled[i]:
            i += 1
        b = i
        while i < L and not sampled[i]:
            i += 1
        turns.append((a, b, i))
    return p, turns


def _text(vocab: Vocab, agent: str, tokens: Sequence[int], a: int, b: int) -> dict[str, str]:
    """The ``text`` / ``content_ref`` fields of an event for tokens ``[a, b)`` of ``agent``'s context."""
    return {"text": vocab.decode(tokens[a:b]), "content_ref": f"{agent}[{a}:{b}]"}


def _edge(src: str, dst: str, kind: str) -> Edge:
    return {"src": src, "dst": dst, "type": kind}


def failure_reason(cfg: WideSearchConfig, steps: int) -> str:
    """Why a sub-agent that took ``steps`` steps failed: it hit the step limit
    (``subagent_steps``) or its context filled first."""
    return "step_limit" if steps >= cfg.subagent_steps else "context_full"


# ----------------------------------------------------------------------------- sub-agents


def reply_events(vocab: Vocab, agent: str, tokens: Sequence[int], *, eid: str, t: int, role: str,
                 kind: str, span: tuple[int, int, int]) -> tuple[list[Event], list[Edge]]:
    """A turn that is not a decision: ``agent`` (role ``role``) says ``[a, b)`` of its
    context at step ``t`` (event ``eid``), the environment replies with ``[b, c)`` at
    ``t + 1``. ``kind`` is the turn's first token: a ``<lookup>`` is a ``tool_call`` /
    ``tool_result`` pair (``ok``: not ``<fail>``) linked by ``tool_dependency``; any
    other turn is malformed, a ``message`` to the environment answered by its
    ``<fail>`` (``reason``), linked by ``causal``. No reply event when ``c == b`` (the
    context filled first)."""
    a, b, c = span
    lookup = kind == "<lookup>"
    said = {"id": eid, "t": t, "agent": agent, "role": role, **_text(vocab, agent, tokens, a, b)}
    said.update({"type": "tool_call", "tool": "lookup"} if lookup else {"type": "message", "to": "environment"})
    if c == b:
        return [said], []
    rid = f"{eid}.result" if lookup else f"{eid}.fail"
    reply = {"id": rid, "t": t + 1, "agent": "environment", "to": agent, **_text(vocab, agent, tokens, b, c)}
    if lookup:
        reply.update(type="tool_result", tool="lookup", trusted=True, ok=vocab.symbol(tokens[b]) != "<fail>")
    else:
        reply.update(type="message", reason="malformed_turn")
    return [said, reply], [_edge(eid, rid, "tool_dependency" if lookup else "causal")]


def worker_turn(vocab: Vocab, agent: str, tokens: Sequence[int], *, eid: str, t: int,
                span: tuple[int, int, int]) -> tuple[list[Event], list[Edge]]:
    """A sub-agent's lookup or malformed turn (see :func:`reply_events`)."""
    return reply_events(vocab, agent, tokens, eid=eid, t=t, role="sub-agent",
                        kind=vocab.symbol(tokens[span[0]]), span=span)


def worker_events(cfg: WideSearchConfig, vocab: Vocab, k: int, tokens: Sequence[int], sampled: Sequence[bool],
                  *, start: int, steps: int, returned: bool) -> tuple[list[Event], list[Edge]]:
    """Events and edges of sub-agent ``k`` (global spawn index), spawned by the turn at
    critical step ``start``: its turns happen at ``start + 1 + j`` and its end
    (``w{k}.end``) at ``start + 1 + steps``. ``tokens`` / ``sampled``: its context and
    who said each token; ``returned``: whether it returned (else it was stopped).
    The ``spawn`` event itself (and its edge from the decision) is the caller's."""
    agent = f"worker_{k}"
    _, turns = turn_spans(sampled)
    if len(turns) != steps:
        raise ValueError(f"{agent}: {len(turns)} turns in its context, {steps} steps reported")
    if returned and not turns:
        raise ValueError(f"{agent}: returned without a turn")
    events: list[Event] = []
    edges: list[Edge] = []
    prev = f"w{k}.spawn"
    for j, (a, b, c) in enumerate(turns[:-1] if returned else turns):   # a return turn is the end
        ev, ed = worker_turn(vocab, agent, tokens, eid=f"w{k}.{j}", t=start + 1 + j, span=(a, b, c))
        events += ev
        edges += [_edge(prev, ev[0]["id"], "causal"), *ed]
        prev = ev[-1]["id"]
    end = {"id": f"w{k}.end", "t": start + 1 + steps, "agent": agent, "role": "sub-agent",
           "from": agent, "to": "orchestrator"}
    if returned:
        a, b, _ = turns[-1]
        end.update(type="return", **_text(vocab, agent, tokens, a, b))
    else:
        end.update(type="despawn", reason=failure_reason(cfg, steps))
    events.append(end)
    edges.append(_edge(prev, end["id"], "causal"))
    return events, edges


# ----------------------------------------------------------------------------- orchestrator


def spawn_stage(cfg: WideSearchConfig, vocab: Vocab, out: Outcome, stage: dict, *, turn: int, t: int,
                first_worker: int, heard: tuple[int, int]) -> tuple[list[Event], list[Edge]]:
    """Events and edges of spawn turn ``turn`` (at critical step ``t``) that launched
    sub-agents ``first_worker ..`` (``stage``: an entry of ``Outcome.stages``): their
    ``spawn`` events, their own events and the ``aggregate`` (``o{turn}.agg``, text: the
    orchestrator context's ``heard = (b, c)`` tokens, the stage's ``<result>`` blocks)."""
    events: list[Event] = []
    edges: list[Edge] = []
    decision = f"o{turn}"
    ends = []
    for i, (steps, pairs) in enumerate(zip(stage["worker_steps"], stage["results"])):
        k = first_worker + i
        agent = f"worker_{k}"
        tokens, sampled = out.worker_tokens[k], out.worker_sampled[k]
        p, _ = turn_spans(sampled)
        events.append({"id": f"w{k}.spawn", "t": t, "type": "spawn", "agent": "orchestrator",
                       "role": "orchestrator", "to": agent, **_text(vocab, agent, tokens, 0, p)})
        edges.append(_edge(decision, f"w{k}.spawn", "spawn"))
        ev, ed = worker_events(cfg, vocab, k, tokens, sampled, start=t, steps=steps, returned=pairs is not None)
        events += ev
        edges += ed
        ends.append(f"w{k}.end")
    agg = {"id": f"o{turn}.agg", "t": t + 1 + max(stage["worker_steps"]), "type": "aggregate",
           "agent": "orchestrator", "role": "orchestrator"}
    if heard[1] > heard[0]:
        agg.update(_text(vocab, "orchestrator", out.orch_tokens, *heard))
    events.append(agg)
    edges += [_edge(e, agg["id"], "return") for e in ends]
    return events, edges


def orchestrator_turn(cfg: WideSearchConfig, vocab: Vocab, out: Outcome, stage: dict, *, turn: int, t: int,
                      span: tuple[int, int, int], first_worker: int) -> tuple[list[Event], list[Edge], str]:
    """Events and edges of orchestrator turn ``turn`` at critical step ``t`` (``span``:
    its said / heard tokens ``(a, b, c)`` in the orchestrator's context), and the id of
    its last event on the orchestrator's thread (where the next turn follows)."""
    a, b, c = span
    toks, did, lookup = out.orch_tokens, f"o{turn}", stage["kind"] == "<lookup>"
    events = [{"id": did, "t": t, "type": "orchestrator_decision", "agent": "orchestrator",
               "role": "orchestrator", **_text(vocab, "orchestrator", toks, a, b)}]
    if stage["worker_steps"]:
        ev, ed = spawn_stage(cfg, vocab, out, stage, turn=turn, t=t, first_worker=first_worker, heard=(b, c))
        return events + ev, ed, f"{did}.agg"
    ev, ed = reply_events(vocab, "orchestrator", toks, eid=f"{did}.call" if lookup else did, t=t,
                          role="orchestrator", kind=stage["kind"], span=span)
    if lookup:                       # the decision is the call: both point at [a, b)
        return events + ev, [_edge(did, ev[0]["id"], "causal"), *ed], ev[-1]["id"]
    # any other turn: the decision, then the environment's <fail> when it was heard (none
    # after an answer, which ends the episode, or when the context filled first)
    return events + ev[1:], ed, ev[-1]["id"]


# ----------------------------------------------------------------------------- metrics, costs


def episode_metrics(ep: Episode, out: Outcome) -> dict[str, float]:
    """Numbers only: step counts, sub-agents, task size and the answer's item counts."""
    correct, answered, truth = score(ep, out.answer)
    has = out.end_reason == "answer"
    return {"critical_steps": out.critical_steps, "total_steps": out.total_steps,
            "orchestrator_steps": out.orch_steps, "subagents": out.spawned,
            "subagents_finished": out.finished, "task_size": len(ep.task), "answered": int(has),
            "items_correct": correct, "items_answered": answered,
            "item_f1": float(item_f1(correct, answered, truth, has))}


def episode_costs(events: list[Event], out: Outcome, wall_clock_s: float) -> dict[str, float]:
    """``tokens``: every agent's context (orchestrator and sub-agents: prompts, said and
    heard tokens); ``sampled_tokens``: of them, those the models generated;
    ``tool_calls``: lookups by every agent; ``messages``: messages between agents (a
    task block to each sub-agent, a result from each); ``wall_clock_s``: the caller's
    measure (see :func:`trace_from_outcome`)."""
    return {"tokens": len(out.orch_tokens) + sum(len(w) for w in out.worker_tokens),
            "sampled_tokens": sum(out.sampled) + sum(sum(w) for w in out.worker_sampled),
            "tool_calls": sum(e["type"] == "tool_call" for e in events),
            "messages": sum(e["type"] == "spawn" or e["type"] in ("return", "despawn") and e["agent"] != "orchestrator"
                            for e in events),
            "wall_clock_s": float(wall_clock_s)}


# ----------------------------------------------------------------------------- the trace


def trace_from_outcome(cfg: WideSearchConfig, ep: Episode, out: Outcome, rewards: dict[str, float],
                       trace_id: str, task_id: str, wall_clock_s: float, *,
                       extra_costs: dict[str, float] | None = None) -> dict[str, Any]:
    """One episode as a trace (events and edges: see the module docstring).

    ``rewards``: the episode's reward channels by name (numbers; e.g. PARL's ``r_perf``,
    ``r_parallel``, ``r_finish``, ``cost``, the weights ``lambda1`` / ``lambda2`` and the
    total ``reward``). ``wall_clock_s``: seconds of wall time charged to this episode;
    what it measures is the caller's to say (:func:`swarmjax.traces.rollout.rollout_traces`:
    its rollout batch's measured time, compilation excluded, split evenly over the
    batch; ``swarmjax trace demo``: the reference simulator's time for the episode).
    ``extra_costs``: more cost numbers (e.g. the batch's own time and size)."""
    vocab = Vocab(cfg)
    p, spans = turn_spans(out.sampled)
    if len(spans) != len(out.stages):
        raise ValueError(f"{trace_id}: {len(spans)} turns in the orchestrator's context, "
                         f"{len(out.stages)} steps reported")
    if len(out.worker_tokens) < out.spawned:
        raise ValueError(f"{trace_id}: {out.spawned} sub-agents but {len(out.worker_tokens)} worker contexts")
    events: list[Event] = [{"id": "prompt", "t": 0, "type": "message", "agent": "environment", "role": "task",
                            "to": "orchestrator", **_text(vocab, "orchestrator", out.orch_tokens, 0, p)}]
    edges: list[Edge] = []
    last, t, workers = "prompt", 0, 0
    for i, (stage, span) in enumerate(zip(out.stages, spans)):
        ev, ed, tail = orchestrator_turn(cfg, vocab, out, stage, turn=i, t=t, span=span, first_worker=workers)
        edges.append(_edge(last, f"o{i}", "message" if last == "prompt" else "temporal"))
        events += ev
        edges += ed
        last = tail
        workers += len(stage["worker_steps"])
        t += 1 + (max(stage["worker_steps"]) if stage["worker_steps"] else 0)
    answered = out.end_reason == "answer"
    events.append({"id": "end", "t": t, "type": "return" if answered else "despawn", "agent": "orchestrator",
                   "role": "orchestrator", "from": "orchestrator", "to": "environment", "reason": out.end_reason})
    edges.append(_edge(last, "end", "temporal"))
    return {
        "trace_id": trace_id, "task_id": task_id, "system": "swarmjax", "topology": "swarm",
        "events": events, "edges": edges,
        "rewards": {k: float(v) for k, v in rewards.items()},
        "costs": {**episode_costs(events, out, wall_clock_s),
                  **{k: float(v) for k, v in (extra_costs or {}).items()}},
        "metrics": episode_metrics(ep, out),
    }


def graph_errors(trace: dict[str, Any]) -> list[str]:
    """What JSON Schema cannot check: unique event ids, edges between existing events,
    no edge going back in time. Empty when the trace is consistent."""
    ids = [e["id"] for e in trace["events"]]
    t = {e["id"]: e["t"] for e in trace["events"]}
    errors = [f"duplicate event id {i}" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for edge in trace["edges"]:
        missing = [x for x in (edge["src"], edge["dst"]) if x not in t]
        if missing:
            errors.append(f"{edge['type']} edge {edge['src']} -> {edge['dst']}: no event {', '.join(missing)}")
        elif t[edge["src"]] > t[edge["dst"]]:
            errors.append(f"{edge['type']} edge {edge['src']} -> {edge['dst']} goes back in time")
    return errors


def write_jsonl(traces: list[dict[str, Any]], path: str) -> None:
    """One trace per line."""
    with open(path, "w") as f:
        for trace in traces:
            f.write(json.dumps(trace) + "\n")
