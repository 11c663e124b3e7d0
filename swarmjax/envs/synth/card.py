"""A generated task set on disk, and its data set card.

:func:`write` puts a :class:`~swarmjax.envs.synth.generator.SynthData` in a directory:

* ``envs.json``: the generator's settings, their digest and every environment
  (:class:`~swarmjax.envs.synth.world.EnvSpec`);
* ``<split>.jsonl``: the tasks of each split, one JSON record a line;
* ``card.json`` / ``card.md``: :func:`card`: the counts (environments, tools, tasks per
  split and how they were made), what the filters removed, the tool graph's statistics;

and ``swarmjax envs synth`` adds the TFDS data set (``tfds/``, :mod:`swarmjax.data.synth_builder`),
which :func:`tfds_source` reads back.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from typing import Any

from swarmjax.envs.synth.generator import FILTERS, SPLITS, SynthData

TFDS_NAME = "synth_tool_tasks"      # the TFDS data set swarmjax.data.synth_builder writes under <dir>/tfds


def digest(data: SynthData) -> str:
    """A short digest of the generator's settings (names the TFDS config)."""
    text = json.dumps(dataclasses.asdict(data.config), sort_keys=True)
    return "s" + hashlib.sha256(text.encode()).hexdigest()[:12]


def card(data: SynthData) -> dict[str, Any]:
    """The data set card as a dict (module docstring)."""
    splits = {}
    for s in SPLITS:
        recs = data.splits[s]
        splits[s] = {"tasks": len(recs), "environments": len(data.split_envs[s]),
                     "by_method": dict(sorted(collections.Counter(r["method"] for r in recs).items())),
                     "by_kind": dict(sorted(collections.Counter(r["kind"] for r in recs).items())),
                     "by_parts": dict(sorted(collections.Counter(str(len(r["parts"])) for r in recs).items())),
                     "by_calls": dict(sorted(collections.Counter(
                         str(sum(len(p["calls"]) for p in r["parts"])) for r in recs).items()))}
    ops = collections.Counter(t.op for e in data.envs for t in e.tools)
    return {"config": dataclasses.asdict(data.config), "digest": digest(data),
            "environments": len(data.envs), "tools": sum(len(e.tools) for e in data.envs),
            "tools_by_operation": dict(sorted(ops.items())), "splits": splits,
            "split_environments": data.split_envs, "filters": data.counts, "graph": data.stats}


def card_markdown(c: dict[str, Any]) -> str:
    """:func:`card` as a page a person reads."""
    cfg = c["config"]
    lines = [f"# Generated tool environments ({c['digest']})", "",
             f"{c['environments']} environments, {c['tools']} tools, "
             f"{sum(s['tasks'] for s in c['splits'].values())} tasks; seed {cfg['seed']}, {cfg['domains']} domains, "
             f"{cfg['rows']} rows per table, up to {cfg['max_calls']} calls and {cfg['max_parts']} parts a task.", "",
             "Splits are by environment: `train` and `seen` share their environments; `validation` and `test` "
             "hold environments (and tools) no training task uses.", "",
             "| split | environments | tasks | walk / path | read / write | parts | calls |",
             "|---|---|---|---|---|---|---|"]
    for name, s in c["splits"].items():
        m, k = s["by_method"], s["by_kind"]
        fmt = lambda d: " ".join(f"{key}:{v}" for key, v in d.items())      # noqa: E731
        lines.append(f"| {name} | {s['environments']} | {s['tasks']} | {m.get('walk', 0)} / {m.get('path', 0)} | "
                     f"{k.get('read', 0)} / {k.get('write', 0)} | {fmt(s['by_parts'])} | {fmt(s['by_calls'])} |")
    f = c["filters"]
    lines += ["", f"Filters: {f['candidates']} candidates tried, {f['kept']} kept; removed:", "",
              "| filter | removed |", "|---|---|"] + [f"| {name} | {f[name]} |" for name in FILTERS] + \
             [f"| communities under {cfg['min_tools']} tools | {f['small_communities']} |", ""]
    g = c["graph"]
    lines += ["Tool graph (all domains, before the split):", "", "| statistic | value |", "|---|---|"] + \
             [f"| {k} | {v} |" for k, v in g.items()] + \
             ["", "Tools by operation: " + ", ".join(f"{k} {v}" for k, v in c["tools_by_operation"].items()), ""]
    return "\n".join(lines)


def write(data: SynthData, out: str) -> dict[str, Any]:
    """Write ``data`` to the directory ``out`` (module docstring); returns the card."""
    os.makedirs(out, exist_ok=True)
    c = card(data)
    with open(os.path.join(out, "envs.json"), "w") as f:
        json.dump({"config": c["config"], "digest": c["digest"], "envs": [e.to_json() for e in data.envs]}, f)
    for s in SPLITS:
        with open(os.path.join(out, f"{s}.jsonl"), "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in data.splits[s])
    with open(os.path.join(out, "card.json"), "w") as f:
        json.dump(c, f, indent=1)
    with open(os.path.join(out, "card.md"), "w") as f:
        f.write(card_markdown(c))
    return c


def tfds_source(tfds_dir: str, split: str):
    """The random-access source of ``split`` of the one prepared data set under
    ``tfds_dir`` (``tensorflow_datasets`` is imported here, on first use). Raises
    ``ValueError`` when there is none, or the split is missing."""
    import tensorflow_datasets as tfds
    from etils import epath

    found = sorted(epath.Path(tfds_dir).glob(f"{TFDS_NAME}/*/*/features.json"))
    if len(found) != 1:
        raise ValueError(f"{tfds_dir}: expected one prepared {TFDS_NAME} data set, found {len(found)}")
    sources = tfds.builder_from_directory(str(found[0].parent)).as_data_source()
    if split not in sources:
        raise ValueError(f"{tfds_dir}: no split {split!r}; it has {sorted(sources)}")
    return sources[split]
