"""Configs, validation and the gcloud argument lists of ``launch/tpu.py``: pure functions only.

Nothing here runs a command or touches the disk: every function takes a typed config and
returns data (an argument list, a path, a decision), so the exact commands are unit-tested
(``tests/test_launch.py``) and printed verbatim by ``--dry-run``. Standard library only; this
package never imports jax.

gcloud reference pages the flags were checked against (Cloud SDK 528, June 2025):

- https://cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm/create
  (``TPU --zone --accelerator-type --version [--spot | --preemptible | --reserved]
  [--metadata-from-file startup-script=FILE]``)
- https://cloud.google.com/sdk/gcloud/reference/compute/tpus/queued-resources/create
  (``QR --zone --node-id --accelerator-type --runtime-version [--spot | --reserved]
  [--metadata-from-file ...]``; no ``--preemptible``)
- https://cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm/ssh and .../tpu-vm/scp
  (``--worker=all`` or ``--worker=i``, ``--command``)
- https://cloud.google.com/sdk/gcloud/reference/compute/tpus/queued-resources/describe and
  .../queued-resources/delete (``--force`` also deletes the node; ``--quiet`` skips the prompt)
- https://cloud.google.com/tpu/docs/queued-resources (the states: WAITING_FOR_RESOURCES,
  PROVISIONING, ACTIVE, SUSPENDING, SUSPENDED, FAILED, ...)
- https://cloud.google.com/sdk/gcloud/reference/storage/ls (exit status 1 when nothing matches)
"""

from __future__ import annotations

import enum
import posixpath
import re
import shlex
from dataclasses import dataclass

CAPACITIES = ("on-demand", "spot", "preemptible", "reserved")
DISTRIBUTED = ("flags", "auto")

_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")                 # us-central2-b, europe-west4-a
_ACCELERATOR = re.compile(r"^(v[2-9][a-z]*|tpu[0-9]+[a-z]*)-([0-9]+)$")  # v4-32, v5litepod-16, v5p-8, v6e-8
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")            # GCE resource names
_BUCKET = re.compile(r"^gs://[a-z0-9][-a-z0-9_.]{1,221}[a-z0-9](/.*)?$")


class LaunchError(ValueError):
    """Bad launcher input; ``tpu.py`` prints the message and exits with status 2."""


@dataclass(frozen=True)
class TpuConfig:
    """One TPU VM (single host or pod slice), optionally requested as a queued resource.

    ``version`` is the runtime version (``--version`` of ``tpu-vm create``,
    ``--runtime-version`` of ``queued-resources create``), e.g. ``tpu-ubuntu2204-base`` or
    ``v2-alpha-tpuv5-lite``. ``startup_script`` is a local file passed as the
    ``startup-script`` metadata: every worker runs it as root at every boot.
    """

    name: str
    zone: str
    accelerator_type: str = ""
    version: str = ""
    project: str | None = None
    capacity: str = "on-demand"
    queued: bool = False
    queued_resource: str | None = None
    startup_script: str | None = None

    @property
    def qr_name(self) -> str:
        """The queued resource's id (default: ``<name>-qr``)."""
        return self.queued_resource or f"{self.name}-qr"


@dataclass(frozen=True)
class JobConfig:
    """What the workers install and run.

    ``source``: ``git+URL[@REF]`` (cloned on each worker), ``gs://.../src.tar.gz`` (a tarball
    made by ``tpu.py pack``) or a local checkout directory (packed and copied by ``tpu.py
    setup``; not usable from a startup script). ``remote_dir`` is relative to the worker's
    home unless absolute; it holds ``venv/``, ``src/``, ``logs/`` and the scripts. A relative
    ``config`` is relative to ``<remote_dir>/src``, a relative local ``workdir`` to
    ``remote_dir``. ``distributed="flags"`` passes ``--coordinator/--num-processes/
    --process-id`` (worker 0's address from the TPU metadata) when there is more than one
    worker; ``"auto"`` leaves it to ``jax.distributed.initialize()``'s Cloud TPU detection.
    """

    config: str = ""
    workdir: str = ""
    source: str = "."
    train_args: tuple[str, ...] = ()
    jax_spec: str = "jax[tpu]"
    extra_pip: tuple[str, ...] = ()
    remote_dir: str = "swarmjax"
    python_version: str = "3.11"
    distributed: str = "flags"
    coordinator_port: int = 8476
    sync_seconds: int = 300
    retries: int = 5


@dataclass(frozen=True)
class Source:
    """A parsed package source: ``kind`` is ``git``, ``gcs`` or ``local``."""

    kind: str
    url: str
    ref: str = ""


# ----------------------------------------------------------------------------- validation

def validate_tpu(cfg: TpuConfig, *, for_create: bool = False) -> None:
    """Raise :class:`LaunchError` naming the first bad field of ``cfg``."""
    if not cfg.name:
        raise LaunchError("missing --name (the TPU VM's name, e.g. swarm-v4)")
    if not _NAME.match(cfg.name):
        raise LaunchError(f"bad TPU name {cfg.name!r}: lower-case letters, digits and '-', "
                          "starting with a letter, at most 63 characters")
    if cfg.queued and not _NAME.match(cfg.qr_name):
        raise LaunchError(f"bad queued resource name {cfg.qr_name!r}: same rules as --name")
    if not cfg.zone:
        raise LaunchError("missing zone: pass --zone (e.g. us-central2-b) or set CLOUDSDK_COMPUTE_ZONE")
    if not _ZONE.match(cfg.zone):
        raise LaunchError(f"bad zone {cfg.zone!r}: expected REGION-ZONE such as us-central2-b or europe-west4-a")
    if cfg.capacity not in CAPACITIES:
        raise LaunchError(f"unknown capacity {cfg.capacity!r}: one of {', '.join(CAPACITIES)}")
    if cfg.queued and cfg.capacity == "preemptible":
        raise LaunchError("queued resources take --spot or --reserved, not --preemptible")
    if for_create:
        if not cfg.accelerator_type:
            raise LaunchError("missing --accelerator-type (e.g. v4-8, v5litepod-16, v5p-8, v6e-8)")
        if not _ACCELERATOR.match(cfg.accelerator_type):
            raise LaunchError(f"unknown accelerator type format {cfg.accelerator_type!r}: expected "
                              "FAMILY-SIZE such as v4-32, v5litepod-16, v5p-8 or v6e-8")
        if not cfg.version:
            raise LaunchError("missing --version (the TPU runtime, e.g. tpu-ubuntu2204-base)")


def validate_job(job: JobConfig, *, need_run: bool = True) -> None:
    """Raise :class:`LaunchError` for a job the worker scripts could not run."""
    parse_source(job.source)
    if need_run:
        if not job.config:
            raise LaunchError("missing --config (the swarmjax config file, e.g. configs/parl_widesearch_cpu.py)")
        if not job.workdir:
            raise LaunchError("missing --workdir (gs://bucket/path for a pod: every worker must see it)")
        if job.workdir.startswith("gs://") and not _BUCKET.match(job.workdir):
            raise LaunchError(f"bad gs:// workdir {job.workdir!r}: expected gs://BUCKET[/PATH] "
                              "(a bucket name: 3-63 lower-case letters, digits, '-', '_', '.')")
    if job.distributed not in DISTRIBUTED:
        raise LaunchError(f"unknown --distributed {job.distributed!r}: one of {', '.join(DISTRIBUTED)}")
    if not re.match(r"^3\.[0-9]+$", job.python_version):
        raise LaunchError(f"bad --python {job.python_version!r}: expected 3.N such as 3.11")
    if job.sync_seconds <= 0 or job.retries <= 0:
        raise LaunchError("--sync-seconds and --retries must be positive")
    if not 0 < job.coordinator_port < 65536:
        raise LaunchError(f"bad --coordinator-port {job.coordinator_port}")


def parse_source(source: str) -> Source:
    """``git+URL[@REF]`` -> git, ``gs://...tar.gz`` -> gcs, anything else -> a local directory."""
    if not source:
        raise LaunchError("missing --source (git+URL[@REF], gs://.../src.tar.gz or a local checkout)")
    if source.startswith("git+"):
        url, ref = source[4:], ""
        tail = url.rsplit("/", 1)[-1]
        if "@" in tail:                          # git+ssh://git@host/x.git has its '@' before a '/'
            url, ref = url.rsplit("@", 1)
        if "://" not in url:
            raise LaunchError(f"bad git source {source!r}: expected git+https://HOST/REPO[@REF]")
        return Source("git", url, ref)
    if source.startswith("gs://"):
        if not source.endswith((".tar.gz", ".tgz")) or not _BUCKET.match(source):
            raise LaunchError(f"bad gs:// source {source!r}: expected gs://BUCKET/PATH.tar.gz "
                              "(made by `tpu.py pack`)")
        return Source("gcs", source)
    if "://" in source:
        raise LaunchError(f"unsupported source {source!r}: use git+URL[@REF], gs://.../src.tar.gz "
                          "or a local checkout directory")
    return Source("local", source)


def estimate_hosts(accelerator_type: str) -> int | None:
    """Workers (hosts) of a slice, from its type; None for an unknown family.

    An estimate for ``--dry-run`` only: a real ``run`` counts the ``networkEndpoints`` of
    ``tpu-vm describe``. v2/v3 count TensorCores (8 a host), v4/v5p TensorCores (2 a chip,
    4 chips a host), v5litepod/v6e chips (up to 8 on one host, else 4 a host).
    """
    m = _ACCELERATOR.match(accelerator_type)
    if not m:
        return None
    family, size = m.group(1), int(m.group(2))
    if family in ("v2", "v3", "v4", "v5p"):
        return max(1, size // 8)
    if family in ("v5litepod", "v5e", "v6e"):
        return 1 if size <= 8 else size // 4
    return None


# ----------------------------------------------------------------------------- gcloud argument lists

def _where(cfg: TpuConfig) -> list[str]:
    return ["--zone", cfg.zone] + (["--project", cfg.project] if cfg.project else [])


def _startup(cfg: TpuConfig) -> list[str]:
    return ["--metadata-from-file", f"startup-script={cfg.startup_script}"] if cfg.startup_script else []


def create_vm_args(cfg: TpuConfig) -> list[str]:
    """``gcloud compute tpus tpu-vm create``."""
    capacity = {"on-demand": [], "spot": ["--spot"], "preemptible": ["--preemptible"],
                "reserved": ["--reserved"]}[cfg.capacity]
    return (["gcloud", "compute", "tpus", "tpu-vm", "create", cfg.name, *_where(cfg),
             "--accelerator-type", cfg.accelerator_type, "--version", cfg.version]
            + capacity + _startup(cfg))


def create_queued_args(cfg: TpuConfig) -> list[str]:
    """``gcloud compute tpus queued-resources create`` for one node named ``cfg.name``."""
    capacity = {"on-demand": [], "spot": ["--spot"], "reserved": ["--reserved"]}[cfg.capacity]
    return (["gcloud", "compute", "tpus", "queued-resources", "create", cfg.qr_name, *_where(cfg),
             "--node-id", cfg.name, "--accelerator-type", cfg.accelerator_type,
             "--runtime-version", cfg.version]
            + capacity + _startup(cfg))


def create_args(cfg: TpuConfig) -> list[str]:
    """The create command of ``cfg``: a queued resource when ``cfg.queued``, else a VM."""
    return create_queued_args(cfg) if cfg.queued else create_vm_args(cfg)


def describe_vm_args(cfg: TpuConfig, *, json_format: bool = False) -> list[str]:
    """``gcloud compute tpus tpu-vm describe`` (``--format=json`` to parse it)."""
    return (["gcloud", "compute", "tpus", "tpu-vm", "describe", cfg.name, *_where(cfg)]
            + (["--format=json"] if json_format else []))


def describe_queued_args(cfg: TpuConfig, *, json_format: bool = False) -> list[str]:
    """``gcloud compute tpus queued-resources describe`` (its ``state.state`` is the state)."""
    return (["gcloud", "compute", "tpus", "queued-resources", "describe", cfg.qr_name, *_where(cfg)]
            + (["--format=json"] if json_format else []))


def delete_vm_args(cfg: TpuConfig) -> list[str]:
    """``gcloud compute tpus tpu-vm delete`` without the prompt."""
    return ["gcloud", "compute", "tpus", "tpu-vm", "delete", cfg.name, *_where(cfg), "--quiet"]


def delete_queued_args(cfg: TpuConfig) -> list[str]:
    """``gcloud compute tpus queued-resources delete --force --quiet`` (the node goes too)."""
    return ["gcloud", "compute", "tpus", "queued-resources", "delete", cfg.qr_name, *_where(cfg),
            "--force", "--quiet"]


def status_args(cfg: TpuConfig) -> list[list[str]]:
    """``status``: the queued resource (when queued), then the node."""
    return ([describe_queued_args(cfg)] if cfg.queued else []) + [describe_vm_args(cfg)]


def delete_args(cfg: TpuConfig) -> list[str]:
    """``delete``: the queued resource with its node, or the VM."""
    return delete_queued_args(cfg) if cfg.queued else delete_vm_args(cfg)


def ssh_args(cfg: TpuConfig, command: str, *, worker: str | int = "all") -> list[str]:
    """``gcloud compute tpus tpu-vm ssh NAME --worker=W --command CMD``."""
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", cfg.name, *_where(cfg),
            f"--worker={worker}", "--command", command]


def scp_args(cfg: TpuConfig, files: list[str], remote_dir: str, *, worker: str | int = "all") -> list[str]:
    """``gcloud compute tpus tpu-vm scp FILES NAME:REMOTE_DIR/`` on every worker."""
    return ["gcloud", "compute", "tpus", "tpu-vm", "scp", *files, f"{cfg.name}:{remote_dir.rstrip('/')}/",
            *_where(cfg), f"--worker={worker}"]


def remote_path(job: JobConfig, name: str) -> str:
    """A file of the worker's ``remote_dir`` as a path for ssh/scp (relative = home-relative)."""
    return posixpath.join(job.remote_dir, name)


def setup_commands(cfg: TpuConfig, job: JobConfig, files: list[str]) -> list[list[str]]:
    """``setup``: make the remote directory, copy ``files`` (setup script, source tarball) into
    it, run the setup script, all on ``--worker=all``."""
    mkdir = f"mkdir -p {shlex.quote(remote_path(job, 'logs'))}"
    run = f"bash {shlex.quote(remote_path(job, 'worker_setup.sh'))}"
    return [ssh_args(cfg, mkdir), scp_args(cfg, files, job.remote_dir), ssh_args(cfg, run)]


def run_copy_args(cfg: TpuConfig, job: JobConfig, run_script: str) -> list[str]:
    """``run``, first step: copy the rendered run script to every worker."""
    return scp_args(cfg, [run_script], job.remote_dir)


def run_worker_args(cfg: TpuConfig, job: JobConfig, worker: int) -> list[str]:
    """``run``, attached: the run script on worker ``worker`` (one of these per worker, in parallel)."""
    return ssh_args(cfg, f"bash {shlex.quote(remote_path(job, 'worker_run.sh'))}", worker=worker)


def startup_remote_dir(remote_dir: str) -> str:
    """A startup script runs as root: a relative remote dir goes under /opt (readable by the
    ssh user, unlike /root), e.g. ``swarmjax`` -> ``/opt/swarmjax``."""
    return remote_dir if remote_dir.startswith("/") else posixpath.join("/opt", remote_dir)


def stop_args(cfg: TpuConfig, remote_dirs: list[str]) -> list[str]:
    """``stop``: SIGTERM to swarmjax on every worker (pid from ``DIR/logs/run.pid`` for each
    of ``remote_dirs``, checked to be a swarmjax process; ``sudo -n`` for a run the startup
    script began as root): it saves a checkpoint at its next step and exits 143."""
    files = " ".join(shlex.quote(posixpath.join(d, "logs/run.pid")) for d in remote_dirs)
    command = (f'n=0; for f in {files}; do p=$(cat "$f" 2>/dev/null || true); '
               f'if [ -n "$p" ] && grep -q swarmjax "/proc/$p/cmdline" 2>/dev/null; then '
               f'{{ kill -TERM "$p" 2>/dev/null || sudo -n kill -TERM "$p"; }} && n=1 && '
               f'echo "$(hostname): SIGTERM to swarmjax ($p)"; fi; done; '
               f'[ "$n" = 1 ] || echo "$(hostname): no swarmjax run"')
    return ssh_args(cfg, command)


def run_detached_args(cfg: TpuConfig, job: JobConfig) -> list[str]:
    """``run --detach``: start the run script on ``--worker=all`` in the background and return
    (the logs are on the workers and, synced, under ``WORKDIR/logs/``)."""
    script = shlex.quote(remote_path(job, "worker_run.sh"))
    out = shlex.quote(remote_path(job, "logs/nohup.out"))
    return ssh_args(cfg, f"nohup bash {script} > {out} 2>&1 < /dev/null &")


# ----------------------------------------------------------------------------- babysitter

class Action(enum.Enum):
    """What the babysitter does after one poll."""

    STOP = "stop"          # summary.json exists: the run is done
    WAIT = "wait"          # healthy or on its way (queued, provisioning, active, deleting)
    RECREATE = "recreate"  # failed / suspended / being suspended: delete --force, create
    CREATE = "create"      # the queued resource does not exist


RECREATE_STATES = frozenset({"FAILED", "SUSPENDED", "SUSPENDING"})


def decide(state: str | None, *, done: bool) -> Action:
    """The babysitter's rule: ``state`` is the queued resource's ``state.state``, None when
    it does not exist; ``done`` whether the run's summary.json exists."""
    if done:
        return Action.STOP
    if state is None:
        return Action.CREATE
    if state.upper() in RECREATE_STATES:
        return Action.RECREATE
    return Action.WAIT


def summary_uri(workdir: str) -> str:
    """Where ``swarmjax train`` writes its summary: ``WORKDIR/summary.json``."""
    return workdir.rstrip("/") + "/summary.json"


def exists_args(uri: str) -> list[str]:
    """Command whose exit status is 0 iff the gs:// object ``uri`` exists."""
    if not uri.startswith("gs://"):
        raise LaunchError(f"{uri!r} is not a gs:// path: check a local path with pathlib")
    return ["gcloud", "storage", "ls", uri]
