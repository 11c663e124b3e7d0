"""Where the context experiment's orchestrator loses items when it copies its sub-agents' results.

    python experiments/context_copy.py                     # seeds 0-4, 48 tasks of n = 16 each

A probe, not a table: each seed's kept warm start (``docs/experiments/context/warm_s<seed>``)
as the orchestrator with frozen sub-agents (the context table's ``swarm`` arm: the step-0
checkpoint of a PARL run from it), greedy, on that table's held-out wide-search tasks of
``--n`` entities (the same tasks: :func:`context._problems`). Each line the sub-agents
returned (in the order they came back) is put in one class by what the answer says of its
entity:

* ``copied``: the returned value;
* ``next line's value``: the value of the returned line after it (the copy slipped a line);
* ``other value``: any other value;
* ``dropped``: the entity is not in the answer;

and the answer's lines for entities no sub-agent returned (``invented``) and lines that
repeat an entity (``repeated``) are counted. Prints the counts per seed and the returned
lines (1-based, in the order they came back, which is the order a right answer lists them)
where the most items were lost; writes ``<runs>/copy.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import context as C
from common import invocation, train_missing

CLASSES = ("copied", "next line's value", "other value", "dropped")


def classify(returned: list[tuple[int, int]], answer: list[tuple[int, int]]) -> tuple[collections.Counter, list]:
    """Counts of :data:`CLASSES` over ``returned`` (entity, value) lines [R] against the
    answer's lines, plus ``invented`` and ``repeated``; and the 1-based positions of the
    returned lines that were not copied."""
    said = {}
    for e, v in answer:
        said.setdefault(e, v)                       # an entity's first line is its answer
    back = {e for e, _ in returned}
    got, lost = collections.Counter(), []
    for i, (e, v) in enumerate(returned):
        if e not in said:
            kind = "dropped"
        elif said[e] == v:
            kind = "copied"
        elif i + 1 < len(returned) and said[e] == returned[i + 1][1]:
            kind = "next line's value"
        else:
            kind = "other value"
        got[kind] += 1
        if kind != "copied":
            lost.append(i + 1)
    got["invented"] = sum(e not in back for e, _ in answer)
    got["repeated"] = len(answer) - len({e for e, _ in answer})
    return got, lost


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--episodes", type=int, default=48)
    p.add_argument("--runs", default="runs/context_copy")
    p.add_argument("--results", default=os.path.join(C.ROOT, "docs", "experiments", "context"),
                   help="where the kept warm starts are (warm_s<seed>)")
    args = p.parse_args()
    from swarmjax.envs.task import resolve_task
    from swarmjax.envs.widesearch_text import WideSearchText
    from swarmjax.train.agent_job import evaluate_agent_checkpoint

    out = {"command": invocation(__file__), "args": vars(args), "seeds": {}}
    for seed in args.seeds:
        jobs = C._jobs([], seed, args.runs, 1)      # one PARL step: its step-0 checkpoint is the warm start
        train_missing(jobs, ("warm", "parl"), f"copy s{seed}", kept_warm=os.path.join(args.results, f"warm_s{seed}"))
        job, workdir = jobs["parl"]
        task = resolve_task(job.task)
        names = WideSearchText(task.cfg, None, None, seed=task.names_seed)       # reads answers' lines only
        problems = C._problems(job, args.n, args.episodes, seed)
        total, lost, exact = collections.Counter(), collections.Counter(), 0

        def on_result(res, call, first):
            nonlocal exact
            for b in range(len(call)):
                returned = [pair for sub in res.subagents[b] for pair in names.parse_pairs(sub.answer or "")]
                answer = names.parse_pairs(res.answers[b] or "")
                got, where = classify(returned, answer)
                total.update(got)
                lost.update(where)
                exact += not where and not got["invented"] and not got["repeated"]

        got = evaluate_agent_checkpoint(job, workdir, which="0", problems=problems, on_result=on_result)["episodes"]
        lines = sum(total[k] for k in CLASSES)
        out["seeds"][seed] = {"item_f1": C._mean(got["accuracy"]), "copy_fidelity": C._mean(got["copy_fidelity"]),
                              "returned_lines": lines, **{k: total[k] for k in (*CLASSES, "invented", "repeated")},
                              "exact_answers": exact, "lost_at_returned_line": dict(sorted(lost.items()))}
        r = out["seeds"][seed]
        print(f"seed {seed}: {args.episodes} tasks of n = {args.n}, item-F1 {r['item_f1']:.3f}, copy fidelity "
              f"{r['copy_fidelity']:.3f}, {exact} answers exactly what came back")
        print("  " + ", ".join(f"{k} {total[k]} ({total[k] / max(lines, 1):.1%})" for k in CLASSES)
              + f"; invented {total['invented']}, repeated {total['repeated']}")
        print("  lost at returned line: " + ", ".join(f"{i}: {c}" for i, c in lost.most_common(6)), flush=True)
    os.makedirs(args.runs, exist_ok=True)
    with open(os.path.join(args.runs, "copy.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
