"""``swarmjax envs``: generated tool environments.

    swarmjax envs synth --envs 150 --tasks 100000 --out data/synth     # write a task set
    swarmjax envs show data/synth                                       # print its card

``synth`` writes ``envs.json``, one JSON-lines file per split, the data set card
(``card.md``, ``card.json``) and, unless ``--no-tfds``, the TFDS data set (ArrayRecord,
under ``tfds/``) that ``SynthToolTask(data=DIR)`` reads with grain.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil

from swarmjax.cli import register


def add_arguments(p: argparse.ArgumentParser) -> None:
    from swarmjax.envs.synth.generator import SynthConfig

    d = SynthConfig()
    p.add_argument("action", choices=("synth", "show"), help="generate a task set, or print a task set's card")
    p.add_argument("dir", nargs="?", help="show: the task set's directory")
    p.add_argument("--out", help="synth: the directory to write")
    p.add_argument("--envs", type=int, default=d.domains,
                   help="domains to generate; the tool graph's Louvain communities become the environments "
                        "(as many when the domains separate, as at the default similarity)")
    p.add_argument("--tasks", type=int, default=d.tasks, help="tasks over all environments and splits")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-calls", type=int, default=d.max_calls, help="most calls in one part of a task")
    p.add_argument("--max-parts", type=int, default=d.max_parts, help="most independent parts in a task")
    p.add_argument("--held-out", type=float, default=d.held_out, help="share of environments held out")
    p.add_argument("--rows", type=int, default=d.rows, help="rows per table of a task's initial state")
    p.add_argument("--ops", default=",".join(d.ops), help="operations to generate tools for (comma-separated)")
    p.add_argument("--no-tfds", action="store_true", help="write the JSON-lines files only")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")


def _synth(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from swarmjax.envs.synth.card import card_markdown, write
    from swarmjax.envs.synth.generator import SynthConfig, generate

    if not args.out:
        raise ValueError("synth needs --out DIR")
    if os.path.exists(args.out) and os.listdir(args.out):
        if not args.overwrite:
            raise ValueError(f"{args.out} is not empty: pick another --out, or pass --overwrite to replace it")
        shutil.rmtree(args.out)
    cfg = dataclasses.replace(SynthConfig(), domains=args.envs, tasks=args.tasks, seed=args.seed,
                              max_calls=args.max_calls, max_parts=args.max_parts, held_out=args.held_out,
                              rows=args.rows, ops=tuple(o.strip() for o in args.ops.split(",") if o.strip()))
    with tqdm(total=None, desc="environments", unit="env") as bar:
        def progress(done, total):
            bar.total = total
            bar.update(done - bar.n)
        data = generate(cfg, progress=progress)
    c = write(data, args.out)
    if not args.no_tfds:
        from swarmjax.data.synth_builder import build

        build(args.out, os.path.join(args.out, "tfds"), digest=c["digest"])
    print(card_markdown(c))
    print(f"wrote {args.out} (train with task=SynthToolTask(data={args.out!r}))")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "synth":
        return _synth(args)
    import json

    if not args.dir:
        raise ValueError("show needs the task set's directory")
    path = os.path.join(args.dir, "card.json")
    if not os.path.exists(path):
        raise ValueError(f"{args.dir}: no card.json; write a task set with 'swarmjax envs synth --out DIR'")
    from swarmjax.envs.synth.card import card_markdown

    with open(path) as f:
        print(card_markdown(json.load(f)))
    return 0


register("envs", "generate tool environments and their tasks from a tool graph, or show a task set's card")(
    (add_arguments, run))
