"""``swarmjax trace``: look at orchestration traces.

    swarmjax trace show FILE [--index N | --id ID] [--png OUT.png]
    swarmjax trace demo OUT.jsonl      # a serial and an 8-way episode, to look at
    swarmjax trace export RUN --format atif --out DIR   # a job's episodes, one ATIF file each
"""

from __future__ import annotations

import argparse
import random

from swarmjax.cli import register
from swarmjax.traces.files import FORMATS, export


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("show", "demo", "export"),
                   help="show a trace file, write a demo one, or export a job's traces one file each")
    p.add_argument("file", help="trace file (.jsonl or .json); for demo: where to write; for export: a job's "
                                "workdir or its atif.jsonl / traces.jsonl")
    p.add_argument("--index", type=int, help="which trace of the file (default 0)")
    p.add_argument("--id", dest="trace_id", help="pick the trace by trace_id")
    p.add_argument("--png", help="also draw the Gantt chart to this PNG file")
    p.add_argument("--all", action="store_true", help="show every trace of the file")
    p.add_argument("--format", choices=tuple(FORMATS), default="atif",
                   help="export: ATIF v1.8 trajectories with token ids and log-probs (atif.jsonl), or the "
                        "orchestration-trace survey's format (traces.jsonl)")
    p.add_argument("--out", help="export: the folder to write <id>.json files to")


def _demo(path: str) -> None:
    """Two reference-simulator episodes of one n = 16 task, serial and 8 sub-agents x 2
    lookups, scripted. Their only reward channel is ``r_perf`` (item-F1: no PARL run,
    so no schedule to weigh the others by); ``wall_clock_s`` is the simulator's measured
    time for the episode."""
    import time

    from swarmjax.envs import scripts
    from swarmjax.envs.widesearch import Episode, WideSearchConfig, scripted, simulate
    from swarmjax.traces.export import episode_metrics, trace_from_outcome, write_jsonl

    cfg = WideSearchConfig(budget=None)
    ep = Episode.sample(cfg, random.Random(0), n=16)
    orch, work = scripts.split(cfg, ep, 8)
    runs = (("serial", lambda: simulate(cfg, ep, scripted(scripts.serial(cfg, ep)), scripted([]))),
            ("swarm-8x2", lambda: simulate(cfg, ep, scripted(orch), scripted([]),
                                           workers=[scripted(w) for w in work])))
    traces = []
    for name, run_episode in runs:
        t0 = time.perf_counter()
        out = run_episode()
        seconds = time.perf_counter() - t0
        f1 = episode_metrics(ep, out)["item_f1"]
        traces.append(trace_from_outcome(cfg, ep, out, {"r_perf": f1}, name, "demo-n16", seconds))
    write_jsonl(traces, path)
    print(f"wrote {len(traces)} traces to {path}: serial ({traces[0]['metrics']['critical_steps']} critical "
          f"steps) and swarm-8x2 ({traces[1]['metrics']['critical_steps']})")


def run(args: argparse.Namespace) -> int:
    if args.action == "demo":
        _demo(args.file)
        return 0
    if args.action == "export":
        if not args.out:
            raise ValueError("trace export needs --out DIR (the folder for the <id>.json files)")
        written, checked = export(args.file, args.out, fmt=args.format,
                                  ids=[args.trace_id] if args.trace_id else None)
        print(f"wrote {len(written)} {args.format} files to {args.out} ({checked})")
        return 0
    from swarmjax.traces.render import load_traces, save_gantt, select, timeline

    traces = load_traces(args.file)
    chosen = traces if args.all else [select(traces, index=args.index, trace_id=args.trace_id)]
    for i, trace in enumerate(chosen):
        if i:
            print("\n" + "-" * 80 + "\n")
        print(timeline(trace))
    if args.png:
        if len(chosen) > 1:
            raise ValueError("--png draws one trace: pick it with --index or --id instead of --all")
        print(f"\nGantt chart written to {save_gantt(chosen[0], args.png)}")
    return 0


register("trace", "show orchestration traces (timeline, Gantt PNG) or write a demo file")((add_arguments, run))
