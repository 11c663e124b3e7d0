"""Read orchestration traces and show them: a text timeline and a Gantt chart.

Time in a trace is the critical step (see :mod:`swarmjax.traces.export`): an
orchestrator turn at ``t`` occupies ``[t, t + 1)``; a sub-agent spawned at ``t``
works over ``[t + 1, t_end)`` where ``t_end`` is its return (or despawn) event.
So the chart's width is the episode's critical steps, and parallel sub-agents
appear as stacked bars over the same interval.
"""

from __future__ import annotations

from typing import Any

from swarmjax.traces.files import read_records

REQUIRED = ("trace_id", "task_id", "events", "edges", "rewards", "costs")


def load_traces(path: str) -> list[dict[str, Any]]:
    """Traces from a ``.jsonl`` file (one per line) or a ``.json`` file (one trace or a
    list). Raises ``ValueError`` naming the line and the problem on bad input."""
    traces = read_records(path)
    for i, trace in enumerate(traces):
        missing = [k for k in REQUIRED if not isinstance(trace, dict) or k not in trace]
        if missing:
            raise ValueError(f"{path}: trace {i} is missing {', '.join(missing)}")
        if not trace["events"]:
            raise ValueError(f"{path}: trace {i} ({trace['trace_id']}) has no events")
    if not traces:
        raise ValueError(f"{path}: no traces")
    return traces


def select(traces: list[dict[str, Any]], *, index: int | None = None, trace_id: str | None = None) -> dict[str, Any]:
    """One trace by ``trace_id`` or position (default: the first)."""
    if trace_id is not None:
        for trace in traces:
            if trace["trace_id"] == trace_id:
                return trace
        raise ValueError(f"no trace with id {trace_id!r} (have {', '.join(t['trace_id'] for t in traces[:10])}"
                         f"{' ...' if len(traces) > 10 else ''})")
    index = 0 if index is None else index
    if not -len(traces) <= index < len(traces):
        raise ValueError(f"trace index {index} out of range: the file holds {len(traces)} traces")
    return traces[index]


def _turn_kind(event: dict[str, Any]) -> str:
    """An orchestrator turn's kind: the first token it said (``text``), or in traces of
    the first format the ``content_ref`` ``turn:<i>:<kind>``."""
    words = event.get("text", "").split()
    if words:
        return words[0]
    ref = event.get("content_ref", "")
    return ref.split(":", 2)[2] if ref.count(":") >= 2 else event["type"]


def end_reason(trace: dict[str, Any]) -> str:
    """Why the episode ended (``answer``, ``budget``, ``context``): the ``reason`` of the
    main agent's closing ``return`` / ``despawn`` event (id ``end``; the orchestrator's,
    ``metrics.end_reason`` in traces of the first format)."""
    for ev in reversed(trace["events"]):
        if (ev.get("id") == "end" or ev["agent"] == "orchestrator") and ev["type"] in ("return", "despawn") \
                and "reason" in ev:
            return ev["reason"]
    return str(trace.get("metrics", {}).get("end_reason", "?"))


def _detail(event: dict[str, Any], width: int = 72) -> str:
    """One line about an event: its text (cut to ``width``), tool, outcome, reason, addressee."""
    text = " ".join(event["text"].split()) if "text" in event else event.get("content_ref", "")   # one line
    if len(text) > width:
        text = text[:width - 3] + "..."
    parts = [text, event.get("tool", ""), {True: "ok", False: "failed"}.get(event.get("ok"), ""),
             f"({event['reason']})" if "reason" in event else "", f"-> {event['to']}" if "to" in event else ""]
    return " ".join(p for p in parts if p)


def segments(trace: dict[str, Any]) -> list[tuple[str, int, int, str]]:
    """Gantt bars ``(agent, start, end, kind)``: one per orchestrator turn (kind = the
    turn's first token, e.g. ``<lookup>``) and one per sub-agent (``return`` or
    ``despawn``: whether it returned)."""
    bars: list[tuple[str, int, int, str]] = []
    spawned_at: dict[str, int] = {}
    for ev in trace["events"]:
        if ev["type"] == "orchestrator_decision":
            bars.append((ev["agent"], ev["t"], ev["t"] + 1, _turn_kind(ev)))
        elif ev["type"] == "spawn" and "to" in ev:
            spawned_at[ev["to"]] = ev["t"]
        elif ev["type"] in ("return", "despawn") and ev["agent"] in spawned_at:
            start = spawned_at[ev["agent"]] + 1
            bars.append((ev["agent"], start, max(ev["t"], start), ev["type"]))
    return bars


def _agents(bars) -> list[str]:
    seen: list[str] = []
    for agent, *_ in bars:
        if agent not in seen:
            seen.append(agent)
    return seen


def timeline(trace: dict[str, Any], max_events: int = 200) -> str:
    """A readable account of one episode: the headline metrics, an ASCII Gantt chart
    (one row per agent, one column per critical step) and the event list by time."""
    m, r = trace.get("metrics", {}), trace["rewards"]
    bars = segments(trace)
    width = max([end for _, _, end, _ in bars] + [1])
    lines = [f"trace {trace['trace_id']}  task {trace['task_id']}  size n={m.get('task_size', '?')}  "
             f"end: {end_reason(trace)}",
             f"critical steps {m.get('critical_steps', '?')}  total steps {m.get('total_steps', '?')}  "
             f"sub-agents {m.get('subagents', 0)} ({m.get('subagents_finished', 0)} returned)  "
             f"tokens {trace['costs'].get('tokens', '?')}  tool calls {trace['costs'].get('tool_calls', '?')}  "
             f"wall clock {trace['costs'].get('wall_clock_s', 0.0):.4f} s",
             "rewards  " + "  ".join(f"{k} {v:.3f}" for k, v in r.items()), ""]
    marks = {"<lookup>": "L", "<spawn>": "S", "<answer>": "A", "return": "=", "despawn": "x"}
    names = _agents(bars)
    pad = max(len(a) for a in names) + 2
    lines.append(" " * pad + "".join(str(t % 10) for t in range(width)) + "   (critical steps)")
    for agent in names:
        row = [" "] * width
        for a, start, end, kind in bars:
            if a == agent:
                for t in range(start, end):
                    row[t] = marks.get(kind, "?")
        lines.append(agent.ljust(pad) + "".join(row))
    lines.append(" " * pad + "L lookup  S spawn  A answer  ? other/malformed turn  = sub-agent working  "
                 "x sub-agent failed")
    lines.append("")
    pad = max([pad] + [len(ev["agent"]) + 2 for ev in trace["events"]])
    lines.append(f"{'t':>4}  {'agent':<{pad}}{'event':<22}detail")
    for ev in sorted(trace["events"], key=lambda e: e["t"])[:max_events]:
        lines.append(f"{ev['t']:>4}  {ev['agent']:<{pad}}{ev['type']:<22}{_detail(ev)}")
    if len(trace["events"]) > max_events:
        lines.append(f"... {len(trace['events']) - max_events} more events")
    return "\n".join(lines)


COLORS = {"<lookup>": "#4c72b0", "<spawn>": "#dd8452", "<answer>": "#55a868", "return": "#8172b3",
          "despawn": "#c44e52"}


def save_gantt(trace: dict[str, Any], path: str) -> str:
    """Draw the trace's Gantt chart (agents x critical steps) to ``path`` (PNG)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise ValueError("--png needs matplotlib (pip install matplotlib)") from e
    bars = segments(trace)
    names = _agents(bars)
    m = trace.get("metrics", {})
    width = max([end for _, _, end, _ in bars] + [1])
    height = 0.45 * len(names) + 2.0                       # inches; 0.5 of it for the legend
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * width + 3), height))
    for agent, start, end, kind in bars:
        y = names.index(agent)
        ax.barh(y, end - start, left=start, height=0.7, color=COLORS.get(kind, "#999999"),
                edgecolor="black", linewidth=0.5)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, width)
    ax.set_xticks(range(width + 1))
    ax.set_xlabel("critical step")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"{trace['trace_id']}: n={m.get('task_size', '?')}, critical steps "
                 f"{m.get('critical_steps', '?')}, total steps {m.get('total_steps', '?')}, "
                 f"sub-agents {m.get('subagents', 0)}", fontsize=10)
    labels = {"<lookup>": "lookup turn", "<spawn>": "spawn turn", "<answer>": "answer turn",
              "return": "sub-agent (returned)", "despawn": "sub-agent (failed)"}
    used = {kind for *_, kind in bars}
    handles = [Patch(color=COLORS[k], label=labels[k]) for k in labels if k in used]
    if used - set(labels):
        handles.append(Patch(color="#999999", label="other / malformed turn"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.5 / height, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
