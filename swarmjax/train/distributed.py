"""Starting JAX's distributed runtime for ``swarmjax train`` / ``swarmjax eval``.

A multi-host job runs the same command on every host; each process must call
``jax.distributed.initialize`` before anything touches the JAX backend (even
``jax.process_count()``), so the CLI calls :func:`maybe_initialize` first thing.
Where the coordinator, the number of processes and this process's id come from,
first match wins for each of the three:

1. the flags ``--coordinator HOST:PORT``, ``--num-processes N``, ``--process-id I``;
2. the environment variables ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
   ``JAX_PROCESS_ID`` (a launcher can export them);
3. a cluster JAX knows how to read (Cloud TPU VM, GKE TPU, SLURM, Open MPI,
   Kubernetes with the ``kubernetes`` package): JAX fills in whatever is still
   missing (``jax.distributed.initialize()`` auto-detection).

Nothing set and no cluster: a plain single-process run (no initialisation). A cluster
that reports one process (a one-task SLURM allocation, a single-host TPU VM) is also
left alone. ``--no-distributed`` turns all of this off.

JAX has no public "is this a cluster?" query, so :func:`detect_cluster` asks JAX's
own (private) cluster classes, ``jax._src.clusters.ClusterEnv``, defensively: if
their interface changes, detection reports no cluster and explicit flags or the
``JAX_*`` variables still work.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["DistributedSpec", "allgather", "barrier", "detect_cluster", "global_rows", "global_whole", "local_replica",
           "maybe_initialize", "resolve", "share"]

log = logging.getLogger(__name__)

ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
    """What :func:`maybe_initialize` hands ``jax.distributed.initialize``: None fields
    are left to JAX's cluster auto-detection. ``source`` says where the settings came
    from (for messages): "flags", "environment", "cluster:<name>" or a mix joined by +."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    source: str


def detect_cluster() -> tuple[str, int | None] | None:
    """``(name, process count or None if unknown)`` of the cluster environment JAX's
    auto-detection would use (e.g. ``("slurm", 4)``, ``("gcetpu", 1)``), or None. Does
    not initialise anything and does not touch the backend. Uses JAX's private
    ``ClusterEnv`` registry (no public equivalent): any error there counts as "no
    cluster"."""
    try:
        from jax._src import clusters
        kinds = list(clusters.ClusterEnv._cluster_types)
    except Exception as e:                                  # noqa: BLE001  (private API moved)
        log.debug("swarmjax: no cluster detection (%s)", e)
        return None
    for env in kinds:
        if getattr(env, "opt_in_only_method", False):      # mpi4py: only when asked for by name
            continue
        try:
            with warnings.catch_warnings():                 # K8s without the `kubernetes` package warns
                warnings.simplefilter("ignore")
                present = bool(env.is_env_present())
        except Exception as e:                              # noqa: BLE001
            log.debug("swarmjax: cluster check %s failed: %s", getattr(env, "__name__", env), e)
            continue
        if present:
            try:
                count = int(env.get_process_count())
            except Exception:                               # noqa: BLE001  (unknown: let JAX decide)
                count = None
            return str(getattr(env, "name", "") or env.__name__), count
    return None


def _int_setting(value, what: str, minimum: int) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if out < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {out}")
    return out


def check_coordinator(address: str, what: str = "--coordinator") -> str:
    """``address`` if it is HOST:PORT (IPv6 hosts in brackets: [::1]:1234), else ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT with a port in 1..65535, got {address!r}")
    return address


def resolve(*, coordinator: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, enabled: bool = True,
            environ: Mapping[str, str] | None = None,
            cluster: tuple[str, int | None] | None | bool = True) -> DistributedSpec | None:
    """Decide whether and how to start the distributed runtime (pure: no JAX calls).

    ``coordinator`` / ``num_processes`` / ``process_id``: the flags (None: not given).
    ``enabled=False`` (``--no-distributed``): never start it; ValueError if a flag asks
    for it. ``environ``: the ``JAX_*`` variables (default ``os.environ``). ``cluster``:
    the result of :func:`detect_cluster`, or True to call it (only when needed).

    Returns None for a single-process run, else a :class:`DistributedSpec`. Raises
    ValueError (one line) for inconsistent or malformed settings."""
    flags = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    given = [k for k, v in flags.items() if v is not None]
    if not enabled:
        if given:
            raise ValueError(f"--no-distributed conflicts with {', '.join(given)}")
        return None
    environ = os.environ if environ is None else environ
    sources: set[str] = set()
    flags_name = {ENV_COORDINATOR: "--coordinator", ENV_NUM_PROCESSES: "--num-processes",
                  ENV_PROCESS_ID: "--process-id"}

    def pick(flag, var, parse):
        if flag is not None:
            sources.add("flags")
            return parse(flag, flags_name[var])
        if environ.get(var) not in (None, ""):
            sources.add("environment")
            return parse(environ[var], var)
        return None

    addr = pick(coordinator, ENV_COORDINATOR, check_coordinator)
    count = pick(num_processes, ENV_NUM_PROCESSES, lambda v, w: _int_setting(v, w, 1))
    pid = pick(process_id, ENV_PROCESS_ID, lambda v, w: _int_setting(v, w, 0))
    if count is not None and pid is not None and pid >= count:
        raise ValueError(f"process id {pid} is out of range for {count} processes (ids 0..{count - 1})")
    if addr is not None and count is not None and pid is not None:
        return DistributedSpec(addr, count, pid, "+".join(sorted(sources)))
    if cluster is True:
        cluster = detect_cluster()
    if cluster:
        name, cluster_count = cluster
        if addr is None and count is None and pid is None and cluster_count == 1:
            return None                                    # a one-process allocation: nothing to join
        sources.add(f"cluster:{name}")
        return DistributedSpec(addr, count, pid, "+".join(sorted(sources)))
    if addr is None and count is None and pid is None:
        return None
    missing = [f"{flag} (or {var})" for flag, var, v in
               (("--coordinator HOST:PORT", ENV_COORDINATOR, addr), ("--num-processes N", ENV_NUM_PROCESSES, count),
                ("--process-id I", ENV_PROCESS_ID, pid)) if v is None]
    raise ValueError(f"a distributed run needs {', '.join(missing)} too: no cluster that JAX can read "
                     "was detected to supply it (or pass --no-distributed)")


def maybe_initialize(*, coordinator: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, enabled: bool = True,
                     environ: Mapping[str, str] | None = None,
                     initialization_timeout: int = 300) -> DistributedSpec | None:
    """Start JAX's distributed runtime when :func:`resolve` says so; returns the spec
    used, or None (single process, or already initialised by the caller). Must run
    before anything touches the JAX backend. On the CPU backend the cross-process
    collectives use gloo (JAX's CPU default since 0.5; set explicitly when the
    installed JAX has none configured)."""
    spec = resolve(coordinator=coordinator, num_processes=num_processes, process_id=process_id,
                   enabled=enabled, environ=environ)
    if spec is None:
        return None
    import jax

    if jax.distributed.is_initialized():
        return None
    try:
        if jax.config.jax_cpu_collectives_implementation in (None, "none"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except AttributeError:                                  # an older/newer JAX without the option
        pass
    log.info("swarmjax: jax.distributed.initialize(%s, %s, %s) from %s", spec.coordinator,
             spec.num_processes, spec.process_id, spec.source)
    jax.distributed.initialize(coordinator_address=spec.coordinator, num_processes=spec.num_processes,
                               process_id=spec.process_id, initialization_timeout=initialization_timeout)
    return spec


# ------------------------------------------------------------------ a job's processes


def check_processes(mesh: Any, tasks: tuple[str, int], needs: Sequence[tuple[str, bool]] = ()) -> None:
    """What a job needs to run over several processes (nothing with one): a mesh over
    them, its per-step task count ``tasks`` = (its config key, its value) divisible by the
    process count (each process rolls out whole groups), and every ``(what, missing)`` of
    ``needs``. ValueError: one line naming the first thing missing."""
    import jax

    procs = jax.process_count()
    if procs == 1:
        return
    why = [what for what, missing in (
        ("a mesh over them (e.g. --set mesh.data=-1)", mesh is None),
        (f"{tasks[0]} divisible by them (each rolls out whole groups; have {tasks[1]})", tasks[1] % procs),
        *needs) if missing]
    if why:
        raise ValueError(f"{procs} processes need {why[0]}")


def share(count: int) -> tuple[int, int]:
    """``[start, stop)`` of this process's contiguous share of ``count`` items (episodes,
    problems): ``count / process_count`` each (ValueError unless it divides). (0, count)
    with one process."""
    import jax

    procs = jax.process_count()
    if count % procs:
        raise ValueError(f"{count} items do not split evenly over {procs} processes")
    n = count // procs
    return jax.process_index() * n, (jax.process_index() + 1) * n


def allgather(tree):
    """``tree``'s arrays whole on every process, the processes' leading axes concatenated
    in process order (a collective with several processes: all must call it); with one
    process, unchanged."""
    import jax

    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (no-op with one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def primary_first(name: str, write: Callable[[], Any], read: Callable[[], Any]) -> Any:
    """What process 0 makes and every other process reads back: ``write()`` on process 0
    (e.g. a tokenizer or a data set written to the shared workdir), then every process
    waits (:func:`barrier` ``name``), then the others return ``read()``. With one
    process: ``write()``."""
    import jax

    out = write() if jax.process_index() == 0 else None
    barrier(name)
    return out if jax.process_index() == 0 else read()


def local_replica(tree, mesh):
    """``tree`` (global arrays over ``mesh``) as a whole copy on this process's first
    device: what a process-local rollout decodes with. With one process, unchanged."""
    import jax

    if jax.process_count() == 1:
        return tree
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    whole = jax.jit(lambda t: t, out_shardings=replicated)(tree)
    return jax.tree.map(lambda x: x.addressable_data(0), whole)


def global_rows(tree, mesh):
    """``tree``'s arrays holding this process's rows as global arrays split over ``mesh``'s
    batch axes, the processes' rows concatenated in process order; with one process,
    ``tree`` unchanged."""
    import jax
    import numpy as np

    from swarmjax.sharding.mesh import batch_sharding

    if jax.process_count() == 1:
        return tree

    def one(x):
        x = np.asarray(x)
        B = x.shape[0] * jax.process_count()
        return jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim, batch_size=B), x)
    return jax.tree.map(one, tree)


def global_whole(tree, shardings):
    """``tree``'s arrays, the same values on every process, as global arrays with
    ``shardings`` (a matching tree): each process supplies its own shards."""
    import jax
    import numpy as np

    def one(x, sharding):
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.tree.map(one, tree, shardings)
