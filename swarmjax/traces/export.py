"""Turn a wide-search episode into an orchestration trace (JSON, schema in ``schema.json``).

Time ``t`` is the critical step at which an event happens: an orchestrator turn
starting at critical step ``c`` happens at ``t = c``; a worker spawned by it (its steps
start at ``c + 1``) that takes ``s`` steps returns at ``t = c + 1 + s``; the orchestrator aggregates when the
slowest worker is done. So the Gantt chart of a trace *is* its critical path.
"""

from __future__ import annotations

import json
import os
from typing import Any

from swarmjax.envs.widesearch import Episode, Outcome, Vocab, WideSearchConfig

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema.json")


def load_schema() -> dict[str, Any]:
    with open(SCHEMA_PATH) as f:
        return json.load(f)


def trace_from_outcome(cfg: WideSearchConfig, ep: Episode, out: Outcome, rewards: dict[str, float],
                       trace_id: str, task_id: str, wall_clock_s: float = 0.0) -> dict[str, Any]:
    """Events: one ``orchestrator_decision`` per orchestrator turn; lookups as
    ``tool_call`` + ``tool_result``; spawns as ``spawn`` events, each worker's end as
    ``return`` (or ``despawn`` when it failed) and one ``aggregate``. Edges: temporal
    between consecutive orchestrator events, spawn, return and aggregate edges."""
    vocab = Vocab(cfg)
    events: list[dict[str, Any]] = []
    edges: list[dict[str, str]] = []
    last_orch: str | None = None
    t = 0
    worker_count = 0

    def add(kind: str, agent: str, time: int, **extra) -> str:
        eid = f"e{len(events)}"
        events.append({"id": eid, "t": time, "type": kind, "agent": agent, **extra})
        return eid

    for i, stage in enumerate(out.stages):
        decision = add("orchestrator_decision", "orchestrator", t, role="orchestrator",
                       content_ref=f"turn:{i}:{stage['kind']}")
        if last_orch is not None:
            edges.append({"src": last_orch, "dst": decision, "type": "temporal"})
        last_orch = decision
        if stage["kind"] == "<lookup>":
            call = add("tool_call", "orchestrator", t, tool="lookup")
            result = add("tool_result", "environment", t + 1, tool="lookup", to="orchestrator",
                         trusted=True)
            edges += [{"src": decision, "dst": call, "type": "causal"},
                      {"src": call, "dst": result, "type": "tool_dependency"}]
            last_orch = result
        elif stage["worker_steps"]:
            ends = []
            for steps, pairs in zip(stage["worker_steps"], stage["results"]):
                worker = f"worker_{worker_count}"
                worker_count += 1
                spawn = add("spawn", "orchestrator", t, to=worker)
                end = add("return" if pairs is not None else "despawn", worker, t + 1 + steps,
                          role="sub-agent", **{"from": worker, "to": "orchestrator"})
                edges += [{"src": decision, "dst": spawn, "type": "spawn"},
                          {"src": spawn, "dst": end, "type": "causal"}]
                ends.append(end)
            agg = add("aggregate", "orchestrator", t + 1 + max(stage["worker_steps"]))
            edges += [{"src": e, "dst": agg, "type": "return"} for e in ends]
            last_orch = agg
        t += 1 + (max(stage["worker_steps"]) if stage["worker_steps"] else 0)

    return {
        "trace_id": trace_id, "task_id": task_id, "system": "swarmjax", "topology": "swarm",
        "events": events, "edges": edges,
        "rewards": {k: float(v) for k, v in rewards.items()},
        "costs": {"tokens": len(out.orch_tokens), "wall_clock_s": float(wall_clock_s),
                  "tool_calls": sum(s["kind"] == "<lookup>" for s in out.stages),
                  "messages": out.spawned},
        "metrics": {"critical_steps": out.critical_steps, "total_steps": out.total_steps,
                    "subagents": out.spawned, "subagents_finished": out.finished,
                    "end_reason": out.end_reason, "task_size": len(ep.task),
                    "transcript": vocab.decode(out.orch_tokens)},
    }


def write_jsonl(traces: list[dict[str, Any]], path: str) -> None:
    """One trace per line."""
    with open(path, "w") as f:
        for trace in traces:
            f.write(json.dumps(trace) + "\n")
