"""What an LLM judge costs per scored answer, against what the rollout that wrote the
answer costs per episode (``python bench/judge.py [--json]``).

Workload: the text swarm on a generated tool environment as in ``bench/rollout_synth.py``
(``--batch`` recorded tasks, the 1m model, the jitted engine); then the rollout's answers
scored by a judge that is a frozen copy of the same model (:mod:`swarmjax.rl.judge`), per
rubric mode: ``yes_no`` (one forward per answer) and ``score`` (the judge writes up to
``--new-tokens`` ids). Each timed best of ``--repeats`` after a first (compiling) call;
ratios against the rollout's time per episode measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, time_best  # noqa: E402
from rollout_synth import script, setup  # noqa: E402

from swarmjax.rl.judge import Judge, JudgeConfig, Rubric  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.swarm.text_engine import TextSwarm  # noqa: E402
from swarmjax.swarm.text_types import TextScripts  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    _, batch, chat, dt, mcfg, params, rcfg = setup(
        args.batch, corpus=("Reply yes or no.", "yes", "no", "<score>7</score>") * 20)
    peak = matmul_peak_flops()
    engine = TextSwarm(dt, mcfg, rcfg)
    scripts = TextScripts(orch=[script(chat, r) for r in batch])
    run = lambda: engine(Roles.both(params), batch, jax.random.key(0), scripts=scripts)     # noqa: E731
    res = run()
    rollout_s = time_best(run, args.repeats)
    queries = [r["query"] for r in batch]
    answers = [dt.content(a) if a is not None else None for a in res.answers]
    figures = {"jax": jax.__version__, "backend": jax.default_backend(), "peak_flops": peak, "batch": args.batch,
               "params": mcfg.num_params(), "rollout_s": rollout_s, "rollout_per_episode_ms": 1e3 * rollout_s / args.batch}
    for mode in ("yes_no", "score"):
        judge = Judge(JudgeConfig(rubrics=(Rubric("right", "Is the answer right?", mode=mode),), batch=args.batch,
                                  max_new_tokens=args.new_tokens), mcfg, params, chat)
        score = lambda: judge(queries, answers)                                           # noqa: E731
        out = score()
        s = time_best(score, args.repeats)
        figures[f"{mode}_per_answer_ms"] = 1e3 * s / args.batch
        figures[f"{mode}_over_rollout"] = s / rollout_s
        figures[f"{mode}_unparseable"] = int(out.unparseable["right"])
    if args.json:
        print(json.dumps(figures))
        return
    print(f"jax {figures['jax']} on {figures['backend']} (matmul peak {peak / 1e9:.1f} GFLOP/s), {args.batch} answers "
          f"of a generated environment, judge = the 1m policy model ({mcfg.num_params() / 1e6:.2f}M), frozen")
    print(f"rollout (jitted engine):  {figures['rollout_per_episode_ms']:8.2f} ms per episode")
    for mode in ("yes_no", "score"):
        print(f"judge {mode:7}          {figures[f'{mode}_per_answer_ms']:8.2f} ms per answer "
              f"({100 * figures[f'{mode}_over_rollout']:.1f}% of the rollout; unparseable "
              f"{figures[f'{mode}_unparseable']} of {args.batch})")


if __name__ == "__main__":
    main()
