"""Trace files: read a job's trace logs, and export them one validated file per episode.

A job writes its evaluation episodes twice (:class:`~swarmjax.train.logs.JobLog`): as
orchestration traces (``traces.jsonl``, the survey's format, :mod:`swarmjax.traces.export`)
and as ATIF v1.8 trajectories (``atif.jsonl``, :mod:`swarmjax.traces.atif`: token ids and
log-probs), one JSON object a line, for every engine. :func:`export` writes each of them
as its own ``<id>.json`` (what tools that read ATIF take: one trajectory a file),
validated first:

* ATIF with the ``atif`` package's ``Trajectory`` model when it is installed
  (``pip install atif``), else only the root fields (and the result says so);
* survey traces against the project's JSON Schema (``schema.json``, draft 2020-12).

Nothing is written unless every selected record is valid.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["FORMATS", "export", "read_records"]

# format -> (the job's file of it, the record's id field)
FORMATS = {"atif": ("atif.jsonl", "trajectory_id"), "survey": ("traces.jsonl", "trace_id")}
ATIF_ROOT = ("schema_version", "trajectory_id", "agent", "steps")


def read_records(path: str) -> list[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file (one a line, blank lines skipped) or of a
    ``.json`` file (one object or a list of them). Raises ``ValueError`` naming the file,
    the line and the problem on bad input."""
    if not os.path.isfile(path):
        raise ValueError(f"no such trace file: {path}")
    with open(path) as f:
        text = f.read()
    if path.endswith(".jsonl"):
        records = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        records = data if isinstance(data, list) else [data]
    bad = [i for i, r in enumerate(records) if not isinstance(r, dict)]
    if bad:
        raise ValueError(f"{path}: record {bad[0]} is not a JSON object")
    return records


def _atif_check() -> tuple[Any, str]:
    """(record -> None or raise, what it checks)."""
    try:
        import atif
    except ImportError:
        def root(doc):
            missing = [k for k in ATIF_ROOT if k not in doc]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
        return root, "root fields only: pip install atif to validate with its models"
    return atif.Trajectory.model_validate, f"validated with atif {getattr(atif, '__version__', '')}".rstrip()


def _survey_check() -> tuple[Any, str]:
    import jsonschema

    from swarmjax.traces.export import load_schema

    validator = jsonschema.Draft202012Validator(load_schema())

    def check(doc):
        err = jsonschema.exceptions.best_match(validator.iter_errors(doc))
        if err is not None:
            raise ValueError(f"{'/'.join(map(str, err.absolute_path)) or 'root'}: {err.message}")
    return check, "validated against the trace schema"


CHECKS = {"atif": _atif_check, "survey": _survey_check}


def _file_name(rid: str) -> str:
    """A trace id as a file name: characters outside ``[A-Za-z0-9._-]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", rid) + ".json"


def export(source: str, out: str, *, fmt: str = "atif", ids: Sequence[str] | None = None) -> tuple[list[str], str]:
    """Write the ``fmt`` records of ``source`` (a job's workdir, or a ``.jsonl`` / ``.json``
    file of them) to ``out/<id>.json``, one each; ``ids``: only these (each must exist).

    Returns (the paths written, what validated them). Raises ``ValueError`` on an unknown
    format, a missing file, a record without its id, a repeated id (two records would
    share a file), an id not found, or an invalid record (its id and the first error)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}: one of {', '.join(FORMATS)}")
    name, key = FORMATS[fmt]
    path = source
    if os.path.isdir(source):
        path = os.path.join(source, name)
        if not os.path.isfile(path):
            raise ValueError(f"{source} has no {name}: a job writes it at its final test evaluation")
    records = read_records(path)
    if not records:
        raise ValueError(f"{path}: no records")
    rids = [r.get(key) for r in records]
    missing = [i for i, r in enumerate(rids) if not isinstance(r, str) or not r]
    if missing:
        raise ValueError(f"{path}: record {missing[0]} has no {key} (is it a {fmt} file?)")
    files = [_file_name(r) for r in rids]
    repeated = sorted({f for f in files if files.count(f) > 1})
    if repeated:
        raise ValueError(f"{path}: {len(repeated)} {key}s repeat (e.g. {repeated[0][:-5]!r}); each record needs its own")
    if ids is not None:
        unknown = [i for i in ids if i not in rids]
        if unknown:
            raise ValueError(f"{path}: no {key} {unknown[0]!r} (it has {', '.join(rids[:5])}"
                             f"{', ...' if len(rids) > 5 else ''})")
        keep = [rids.index(i) for i in ids]
    else:
        keep = list(range(len(records)))
    check, checked = CHECKS[fmt]()
    for i in keep:
        try:
            check(records[i])
        except Exception as e:          # pydantic's ValidationError, jsonschema's, ours: one line each
            first = str(e).strip().splitlines()
            raise ValueError(f"{path}: {rids[i]} is not valid {fmt} ({' '.join(first[:3])})") from None
    os.makedirs(out, exist_ok=True)
    written = []
    for i in keep:
        dest = os.path.join(out, files[i])
        with open(dest, "w") as f:
            json.dump(records[i], f, indent=1)
        written.append(dest)
    return written, checked
