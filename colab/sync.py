"""Regenerate the Colab notebooks ``colab/*.ipynb`` from their sources ``colab/*.py``.

The sources are jupytext percent files (``# %%`` code cells, ``# %% [markdown]`` text
cells): edit those, then run this script. Each ``.ipynb`` is a pure function of its
``.py``: no outputs, execution counts or per-cell metadata, cell ids numbered in order,
and Colab's notebook metadata for a TPU runtime (``"accelerator": "TPU"``, ``"colab":
{"gpuType": ...}``, the ``python3`` kernel), so Colab opens it on a TPU runtime.

    python colab/sync.py             # write colab/*.ipynb
    python colab/sync.py --check     # exit 1 if a committed .ipynb differs from its .py
    python colab/sync.py --org NAME  # set the GitHub owner (badge and install cell), then write

With ``ORG = ""`` (the repository's own sources) a notebook names no GitHub owner: its
first cell says how to open it (an upload, with a clone beside it) instead of a badge
that would point at a repository that may not exist; ``--org`` puts the badge there.

Needs ``jupytext`` and ``nbformat`` (``pip install -e ".[test]"``).
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
NOTEBOOKS = ("quickstart", "pieces")

# What Colab writes for a notebook saved on a TPU runtime (v5e-1; "V28" is a v2-8).
METADATA = {
    "accelerator": "TPU",
    "colab": {"provenance": [], "gpuType": "V5E1", "toc_visible": True},
    "kernelspec": {"display_name": "Python 3", "name": "python3"},
    "language_info": {"name": "python"},
}
BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
         "(https://colab.research.google.com/github/{org}/swarmjax/blob/main/colab/{name}.ipynb)")
ORG_LINE = re.compile(r'^ORG = "([^"]*)"', re.M)
UPLOAD = "# *To open in Colab:* upload this notebook"        # the first cell's opening without an owner


def org_of(source: str) -> str:
    """The ``ORG = "..."`` of a notebook source (its install cell)."""
    m = ORG_LINE.search(source)
    if m is None:
        raise ValueError("the notebook source has no ORG = \"...\" line (the install cell)")
    return m.group(1)


def opening(name: str, org: str) -> str:
    """What the first cell of notebook ``name`` must hold: the Open-in-Colab badge of
    ``org``'s repository, or without an owner the upload line."""
    return BADGE.format(org=org, name=name) if org else UPLOAD


def check_source(name: str, source: str) -> None:
    """ValueError unless the source opens with a markdown cell holding :func:`opening`."""
    want = opening(name, org_of(source))
    first = source.split("# %%", 2)[1] if source.startswith("# %%") else ""
    if not first.startswith(" [markdown]") or want not in first:
        raise ValueError(f"colab/{name}.py must open with a markdown cell holding {want!r}")


def build(name: str, source: str | None = None) -> str:
    """The ``.ipynb`` text of notebook ``name`` (from ``colab/NAME.py`` unless ``source``)."""
    import jupytext
    import nbformat

    if source is None:
        source = (HERE / f"{name}.py").read_text()
    check_source(name, source)
    nb = jupytext.reads(source, fmt="py:percent")
    nb.metadata = copy.deepcopy(METADATA)
    nb.nbformat, nb.nbformat_minor = 4, 5
    for i, cell in enumerate(nb.cells):
        cell.id = f"{name}-{i:02d}"
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nbformat.validate(nb)
    return nbformat.writes(nb, version=4) + "\n"


def set_org(org: str) -> None:
    """Replace the GitHub owner in every source's install cell and badge."""
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?", org):
        raise ValueError(f"not a GitHub owner name: {org!r}")
    for name in NOTEBOOKS:
        path = HERE / f"{name}.py"
        text = path.read_text()
        old = org_of(text)
        if old:
            text = text.replace(BADGE.format(org=old, name=name), BADGE.format(org=org, name=name))
        else:                                   # the upload paragraph (the first cell's opening) becomes the badge
            start = text.index(UPLOAD)
            end = text.index("\n#\n", start)
            text = text[:start] + "# " + BADGE.format(org=org, name=name) + text[end:]
        text = ORG_LINE.sub(f'ORG = "{org}"', text)
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Regenerate colab/*.ipynb from colab/*.py.")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a .ipynb is out of date")
    p.add_argument("--org", help="set the GitHub owner in the sources (badge, ORG) first")
    args = p.parse_args(argv)
    if args.org and args.check:
        p.error("--org writes the sources: not with --check")
    try:
        if args.org:
            set_org(args.org)
        stale = []
        for name in NOTEBOOKS:
            text, path = build(name), HERE / f"{name}.ipynb"
            if path.exists() and path.read_text() == text:
                continue
            stale.append(path.name)
            if not args.check:
                path.write_text(text)
    except ValueError as e:
        print(f"sync: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if stale:
            print(f"out of date: {', '.join(stale)} (run python colab/sync.py)", file=sys.stderr)
            return 1
        print("colab notebooks in sync")
    else:
        print(f"wrote {', '.join(stale)}" if stale else "colab notebooks already in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
