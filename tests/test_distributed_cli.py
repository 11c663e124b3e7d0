"""Where `swarmjax train` / `swarmjax eval` get their distributed settings from (flags,
JAX_* variables, a detected cluster), the errors for inconsistent ones, and the
--resume modes. Pure: nothing here starts JAX's distributed runtime (the two-process
runs through the CLI are in test_job.py)."""

import pytest

from small_job import CONFIG
from swarmjax.cli import build_parser, main
from swarmjax.train.distributed import DistributedSpec, detect_cluster, maybe_initialize, resolve

CLUSTER_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
                "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")


def test_settings_come_from_flags_then_environment_then_cluster():
    assert resolve(cluster=None, environ={}) is None                             # one process
    assert resolve(coordinator="10.0.0.1:1234", num_processes=2, process_id=1, cluster=None, environ={}) == \
        DistributedSpec("10.0.0.1:1234", 2, 1, "flags")
    env = {"JAX_COORDINATOR_ADDRESS": "[::1]:99", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert resolve(cluster=None, environ=env) == DistributedSpec("[::1]:99", 4, 3, "environment")
    assert resolve(process_id=0, cluster=None, environ=env) == DistributedSpec("[::1]:99", 4, 0,
                                                                                "environment+flags")
    # a cluster JAX reads fills in what is missing; a one-process allocation is no job to join
    assert resolve(cluster=("slurm", 4), environ={}) == DistributedSpec(None, None, None, "cluster:slurm")
    assert resolve(coordinator="h:1", cluster=("slurm", 4), environ={}).source == "cluster:slurm+flags"
    assert resolve(cluster=("gcetpu", 1), environ={}) is None
    assert resolve(cluster=("k8s", None), environ={}) == DistributedSpec(None, None, None, "cluster:k8s")
    # --no-distributed wins over the environment and the cluster
    assert resolve(enabled=False, cluster=("slurm", 4), environ=env) is None


@pytest.mark.parametrize("kwargs,environ,message", [
    (dict(coordinator="h:1"), {}, "needs --num-processes N (or JAX_NUM_PROCESSES), --process-id I"),
    (dict(num_processes=2, process_id=0), {}, "needs --coordinator HOST:PORT (or JAX_COORDINATOR_ADDRESS)"),
    (dict(coordinator="h:1", num_processes=2, process_id=2), {}, "process id 2 is out of range for 2"),
    (dict(coordinator="localhost", num_processes=2, process_id=0), {}, "--coordinator must be HOST:PORT"),
    (dict(coordinator="h:70000", num_processes=2, process_id=0), {}, "port in 1..65535"),
    (dict(num_processes=0, process_id=0, coordinator="h:1"), {}, "--num-processes must be >= 1"),
    (dict(coordinator="h:1", process_id=0), {"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES must be an integer"),
    (dict(coordinator="h:1", enabled=False), {}, "--no-distributed conflicts with --coordinator"),
])
def test_inconsistent_settings_are_one_line(kwargs, environ, message):
    with pytest.raises(ValueError) as e:
        resolve(cluster=None, environ=environ, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cluster_detection_uses_jax_environments(monkeypatch):
    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)
    assert detect_cluster() is None
    for var, value in (("SLURM_JOB_ID", "7"), ("SLURM_STEP_NODELIST", "node[1-2]"), ("SLURM_NTASKS", "2"),
                       ("SLURM_PROCID", "1"), ("SLURM_LOCALID", "0")):
        monkeypatch.setenv(var, value)
    assert detect_cluster() == ("slurm", 2)
    assert resolve(environ={}) == DistributedSpec(None, None, None, "cluster:slurm")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert resolve(environ={}) is None and maybe_initialize(environ={}) is None


def test_cli_flags(capsys):
    parse = lambda *a: build_parser().parse_args(["train", "--config", "c.py", "--workdir", "w", *a])  # noqa: E731
    assert parse().resume == "never" and parse("--resume").resume == "latest"
    assert parse("--resume", "auto").resume == "auto" and parse("--resume", "--no-progress").resume == "latest"
    args = parse("--coordinator", "h:1", "--num-processes", "2", "--process-id", "1")
    assert (args.coordinator, args.num_processes, args.process_id, args.no_distributed) == ("h:1", 2, 1, False)
    with pytest.raises(SystemExit):
        parse("--resume", "sometimes")
    capsys.readouterr()
    # inconsistent flags: one line, exit 2, before anything touches JAX's backend
    for cmd, flags, message in (("train", ["--no-distributed", "--coordinator", "h:1"], "conflicts with"),
                                ("eval", ["--num-processes", "2"], "needs --coordinator")):
        assert main([cmd, "--config", CONFIG, "--workdir", "unused", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"swarmjax {cmd}: error:") and message in err and len(err.splitlines()) == 1


def test_what_several_processes_need_is_one_line(monkeypatch):
    """Every job's check before it runs over several processes (train.distributed.check_processes):
    the first thing missing, in one line; nothing asked of one process."""
    import jax

    from swarmjax.train.distributed import check_processes

    check_processes(None, ("rl.tasks_per_step", 3), [("anything", True)])           # one process: no check
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"^2 processes need a mesh over them \(e.g. --set mesh.data=-1\)$"):
        check_processes(None, ("rl.tasks_per_step", 3))
    with pytest.raises(ValueError, match=r"need rl.tasks_per_step divisible by them \(.*have 3\)$"):
        check_processes(object(), ("rl.tasks_per_step", 3))
    with pytest.raises(ValueError, match=r"need rl.swarm.episode_keys=True$"):
        check_processes(object(), ("rl.tasks_per_step", 4), [("rl.swarm.episode_keys=True", True)])
    check_processes(object(), ("rl.tasks_per_step", 4), [("rl.swarm.episode_keys=True", False)])
