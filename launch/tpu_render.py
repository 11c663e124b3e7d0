"""The worker scripts of ``launch/tpu.py``: rendering the ``@@NAME@@`` templates and packing a
local checkout into a reproducible tarball. Standard library only.

A template is a valid bash script as it stands (``X=@@NAME@@`` is a plain word to bash); a
placeholder is replaced by ``shlex.quote(value)`` for a string, ``shlex.join(values)`` for a
list (inside ``ARRAY=(...)``) or the text itself for :class:`Raw` (a heredoc's body).
Rendering fails on an unknown placeholder and on a value no placeholder takes.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import re
import shlex
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tpu_args import JobConfig, LaunchError, Source, parse_source, startup_remote_dir

HERE = Path(__file__).resolve().parent
TEMPLATES = {"setup": HERE / "worker_setup.sh", "run": HERE / "worker_run.sh", "startup": HERE / "worker_startup.sh"}
TARBALL = "src.tar.gz"

_PLACEHOLDER = re.compile(r"@@([A-Z][A-Z0-9_]*)@@")
_SKIP = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", "runs", "logs", "build", "dist"}


@dataclass(frozen=True)
class Raw:
    """A value inserted as it is (no quoting)."""

    text: str


def render_template(text: str, values: dict[str, str | int | list[str] | tuple[str, ...] | Raw]) -> str:
    """Replace every ``@@NAME@@`` of ``text`` (see the module docstring)."""
    used: set[str] = set()

    def one(m: re.Match) -> str:
        name = m.group(1)
        if name not in values:
            raise LaunchError(f"template placeholder @@{name}@@ has no value")
        used.add(name)
        value = values[name]
        if isinstance(value, Raw):
            return value.text
        if isinstance(value, (list, tuple)):
            return shlex.join(str(v) for v in value)
        return shlex.quote(str(value))

    out = _PLACEHOLDER.sub(one, text)
    unused = set(values) - used
    if unused:
        raise LaunchError(f"values no placeholder takes: {', '.join(sorted(unused))}")
    return out


def _template(kind: str) -> str:
    return TEMPLATES[kind].read_text()


def setup_values(job: JobConfig) -> dict:
    """The setup template's values; a local source becomes the tarball ``setup`` copies."""
    src: Source = parse_source(job.source)
    kind, url = {"git": ("git", src.url), "gcs": ("gcs", src.url), "local": ("tarball", TARBALL)}[src.kind]
    return {"REMOTE_DIR": job.remote_dir, "SOURCE_KIND": kind, "SOURCE_URL": url, "SOURCE_REF": src.ref,
            "JAX_SPEC": job.jax_spec, "EXTRA_PIP": list(job.extra_pip), "PYTHON_VERSION": job.python_version,
            "RETRIES": job.retries}


def run_values(job: JobConfig) -> dict:
    """The run template's values."""
    return {"REMOTE_DIR": job.remote_dir, "CONFIG": job.config, "WORKDIR": job.workdir,
            "TRAIN_ARGS": list(job.train_args), "DISTRIBUTED": job.distributed,
            "COORDINATOR_PORT": job.coordinator_port, "SYNC_SECONDS": job.sync_seconds}


def render_setup(job: JobConfig) -> str:
    """``worker_setup.sh`` for ``job``."""
    return render_template(_template("setup"), setup_values(job))


def render_run(job: JobConfig) -> str:
    """``worker_run.sh`` for ``job``."""
    return render_template(_template("run"), run_values(job))


def render_startup(job: JobConfig) -> str:
    """The startup script: the setup and run scripts embedded, then run at boot (as root,
    so a relative ``remote_dir`` goes under /opt: :func:`tpu_args.startup_remote_dir`).

    A local checkout cannot reach a VM that does not exist yet: use ``git+URL[@REF]`` or a
    tarball uploaded to gs:// (``tpu.py pack --out src.tar.gz`` then ``gcloud storage cp``).
    """
    if parse_source(job.source).kind == "local":
        raise LaunchError(f"--startup cannot copy the local checkout {job.source!r}: pass --source "
                          "git+URL[@REF], or `tpu.py pack --out src.tar.gz`, `gcloud storage cp src.tar.gz "
                          "gs://BUCKET/src.tar.gz` and --source gs://BUCKET/src.tar.gz")
    job = dataclasses.replace(job, remote_dir=startup_remote_dir(job.remote_dir))
    setup, run = render_setup(job).rstrip("\n"), render_run(job).rstrip("\n")
    for marker, body in (("SWARMJAX_SETUP_EOF", setup), ("SWARMJAX_RUN_EOF", run)):
        if marker in body.splitlines():
            raise LaunchError(f"a rendered script contains the heredoc marker {marker}")
    return render_template(_template("startup"), {"REMOTE_DIR": job.remote_dir, "SETUP_SCRIPT": Raw(setup),
                                                  "RUN_SCRIPT": Raw(run)})


def write_script(path: Path, text: str) -> Path:
    """Write an executable script (its directory made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


# ----------------------------------------------------------------------------- packing a checkout

def source_files(src: Path) -> list[str]:
    """The files of a checkout, relative and sorted: git's tracked and untracked-but-not-ignored
    files in a git work tree, else every file outside the usual build/cache directories."""
    if not (src / "pyproject.toml").is_file():
        raise LaunchError(f"--source {str(src)!r} is not a package checkout (no pyproject.toml)")
    if (src / ".git").exists():
        out = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True).stdout.decode()
        names = [n for n in out.split("\0") if n and (src / n).is_file()]
    else:
        names = []
        for root, dirs, files in os.walk(src):
            dirs[:] = [d for d in dirs if d not in _SKIP and not d.endswith(".egg-info")]
            names += [os.path.relpath(os.path.join(root, f), src) for f in files]
    return sorted(names)


def pack_source(src: Path, out: Path) -> str:
    """A reproducible ``.tar.gz`` of ``src`` (files under ``swarmjax-src/``, zero mtimes and
    owners): the same checkout gives the same bytes, so the workers' setup can skip an
    unchanged source by its sha256. Returns that sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in source_files(src):
            path = src / name
            info = tarfile.TarInfo(f"swarmjax-src/{name}")
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as f:
                tar.addfile(info, f)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(buf.getvalue())
    return hashlib.sha256(out.read_bytes()).hexdigest()
