"""launch/: TPU pod launch tooling (standard library only, never imports jax).

Golden gcloud argument lists (the pure builders and the ``--dry-run`` output of every
subcommand), the babysitter driven by a fake ``gcloud`` on PATH, the rendered worker scripts
(``bash -n``, shellcheck when installed, and run against fake ``python``/``swarmjax``/
``curl``/``gcloud``), ``launch/local.py`` (JAX_* environments, logs, exit status, signal
forwarding) and a check that nothing under launch/ imports jax."""

from __future__ import annotations

import ast
import dataclasses
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
sys.path.insert(0, str(LAUNCH))

import local  # noqa: E402
import tpu  # noqa: E402
import tpu_args as ta  # noqa: E402
import tpu_render as tr  # noqa: E402

PY = sys.executable
ZONE = ["--zone", "us-central2-b"]
VM = ta.TpuConfig(name="swarm-a", zone="us-central2-b", accelerator_type="v4-32", version="tpu-ubuntu2204-base")
JOB = ta.JobConfig(config="configs/parl_widesearch_cpu.py", workdir="gs://my-bucket/run1",
                   source="git+https://github.com/o/swarmjax.git@v1", train_args=("--set", "rl.steps=50"))


# ----------------------------------------------------------------------------- pure argument lists

def test_create_args_vm_and_queued():
    assert ta.create_args(VM) == ["gcloud", "compute", "tpus", "tpu-vm", "create", "swarm-a", *ZONE,
                                  "--accelerator-type", "v4-32", "--version", "tpu-ubuntu2204-base"]
    spot = dataclasses.replace(VM, capacity="spot", project="p1", startup_script="/s.sh")
    assert ta.create_args(spot) == ["gcloud", "compute", "tpus", "tpu-vm", "create", "swarm-a", *ZONE,
                                    "--project", "p1", "--accelerator-type", "v4-32", "--version",
                                    "tpu-ubuntu2204-base", "--spot", "--metadata-from-file", "startup-script=/s.sh"]
    pre = dataclasses.replace(VM, capacity="preemptible")
    assert ta.create_args(pre)[-1] == "--preemptible"
    for capacity in ("spot", "reserved"):
        q = dataclasses.replace(VM, capacity=capacity, queued=True, startup_script="/s.sh")
        assert ta.create_args(q) == ["gcloud", "compute", "tpus", "queued-resources", "create", "swarm-a-qr", *ZONE,
                                     "--node-id", "swarm-a", "--accelerator-type", "v4-32", "--runtime-version",
                                     "tpu-ubuntu2204-base", f"--{capacity}", "--metadata-from-file",
                                     "startup-script=/s.sh"]
    named = dataclasses.replace(VM, queued=True, queued_resource="my-qr")
    assert ta.create_args(named)[5] == "my-qr" and "--spot" not in ta.create_args(named)


def test_status_delete_ssh_scp_args():
    q = dataclasses.replace(VM, queued=True)
    assert ta.status_args(VM) == [["gcloud", "compute", "tpus", "tpu-vm", "describe", "swarm-a", *ZONE]]
    assert ta.status_args(q) == [["gcloud", "compute", "tpus", "queued-resources", "describe", "swarm-a-qr", *ZONE],
                                 ["gcloud", "compute", "tpus", "tpu-vm", "describe", "swarm-a", *ZONE]]
    assert ta.delete_args(VM) == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "swarm-a", *ZONE, "--quiet"]
    assert ta.delete_args(q) == ["gcloud", "compute", "tpus", "queued-resources", "delete", "swarm-a-qr", *ZONE,
                                 "--force", "--quiet"]
    assert ta.describe_queued_args(q, json_format=True)[-1] == "--format=json"
    assert ta.run_worker_args(VM, JOB, 3) == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "swarm-a", *ZONE,
                                              "--worker=3", "--command", "bash swarmjax/worker_run.sh"]
    assert ta.run_detached_args(VM, JOB)[-3:] == [
        "--worker=all", "--command", "nohup bash swarmjax/worker_run.sh > swarmjax/logs/nohup.out 2>&1 < /dev/null &"]
    assert ta.exists_args("gs://my-bucket/run1/summary.json") == ["gcloud", "storage", "ls",
                                                                  "gs://my-bucket/run1/summary.json"]
    with pytest.raises(ta.LaunchError):
        ta.exists_args("runs/x/summary.json")


@pytest.mark.parametrize("cfg, message", [
    (ta.TpuConfig(name="swarm-a", zone=""), "missing zone"),
    (ta.TpuConfig(name="swarm-a", zone="uscentral"), "bad zone"),
    (ta.TpuConfig(name="Swarm_A", zone="us-central2-b"), "bad TPU name"),
    (ta.TpuConfig(name="swarm-a", zone="us-central2-b", version="v"), "missing --accelerator-type"),
    (ta.TpuConfig(name="swarm-a", zone="us-central2-b", accelerator_type="v4", version="v"), "accelerator type format"),
    (ta.TpuConfig(name="swarm-a", zone="us-central2-b", accelerator_type="tpu-v4-8", version="v"),
     "accelerator type format"),
    (ta.TpuConfig(name="swarm-a", zone="us-central2-b", accelerator_type="v4-8"), "missing --version"),
    (ta.TpuConfig(name="swarm-a", zone="us-central2-b", accelerator_type="v4-8", version="v", queued=True,
                  capacity="preemptible"), "not --preemptible"),
])
def test_bad_tpu_input(cfg, message):
    with pytest.raises(ta.LaunchError, match=message):
        ta.validate_tpu(cfg, for_create=True)


@pytest.mark.parametrize("job, message", [
    (ta.JobConfig(workdir="gs://my-bucket/x"), "missing --config"),
    (ta.JobConfig(config="c.py"), "missing --workdir"),
    (ta.JobConfig(config="c.py", workdir="gs://b"), "bad gs:// workdir"),
    (ta.JobConfig(config="c.py", workdir="w", source="https://github.com/o/r"), "unsupported source"),
    (ta.JobConfig(config="c.py", workdir="w", source="gs://my-bucket/src.zip"), "bad gs:// source"),
    (ta.JobConfig(config="c.py", workdir="w", distributed="mpi"), "unknown --distributed"),
])
def test_bad_job_input(job, message):
    with pytest.raises(ta.LaunchError, match=re.escape(message)):
        ta.validate_job(job)


def test_parse_source_and_estimates():
    assert ta.parse_source("git+https://github.com/o/r.git@v1") == ta.Source("git", "https://github.com/o/r.git", "v1")
    assert ta.parse_source("git+ssh://git@github.com/o/r.git") == ta.Source("git", "ssh://git@github.com/o/r.git", "")
    assert ta.parse_source("gs://my-bucket/s/src.tar.gz").kind == "gcs"
    assert ta.parse_source("../swarmjax").kind == "local"
    assert [ta.estimate_hosts(t) for t in ("v4-8", "v4-32", "v3-8", "v5p-16", "v5litepod-8", "v5litepod-16",
                                           "v6e-64", "tpu9x-8", "bad")] == [1, 4, 1, 2, 1, 4, 16, None, None]


def test_babysitter_rule():
    assert ta.decide("ACTIVE", done=True) is ta.Action.STOP
    assert ta.decide(None, done=True) is ta.Action.STOP
    for state in ("ACTIVE", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACCEPTED", "CREATING", "DELETING"):
        assert ta.decide(state, done=False) is ta.Action.WAIT
    for state in ("FAILED", "SUSPENDED", "SUSPENDING"):
        assert ta.decide(state, done=False) is ta.Action.RECREATE
    assert ta.decide(None, done=False) is ta.Action.CREATE


# ----------------------------------------------------------------------------- --dry-run of each subcommand

def dry(capsys, *argv) -> list[list[str]]:
    """tpu.py ARGV --dry-run: the printed gcloud commands, split back into argument lists."""
    assert tpu.main([*argv, "--dry-run"]) == 0
    return [shlex.split(line) for line in capsys.readouterr().out.splitlines() if line.startswith("gcloud ")]


TPU = ["--name", "swarm-a", "--zone", "us-central2-b"]
MAKE = ["--accelerator-type", "v4-32", "--version", "tpu-ubuntu2204-base"]


def test_dry_run_create(capsys, tmp_path):
    assert dry(capsys, "create", *TPU, *MAKE, "--spot") == [
        ["gcloud", "compute", "tpus", "tpu-vm", "create", "swarm-a", *ZONE, "--accelerator-type", "v4-32",
         "--version", "tpu-ubuntu2204-base", "--spot"]]
    job = ["--source", "git+https://github.com/o/swarmjax.git@v1", "--config", "c.py", "--workdir", "gs://my-bucket/r"]
    assert dry(capsys, "create", *TPU, *MAKE, "--queued", "--reserved", "--startup", *job,
               "--render-dir", str(tmp_path)) == [
        ["gcloud", "compute", "tpus", "queued-resources", "create", "swarm-a-qr", *ZONE, "--node-id", "swarm-a",
         "--accelerator-type", "v4-32", "--runtime-version", "tpu-ubuntu2204-base", "--reserved",
         "--metadata-from-file", f"startup-script={tmp_path / 'startup.sh'}"]]
    startup = (tmp_path / "startup.sh").read_text()                    # setup + run scripts embedded
    for text in ("SOURCE_URL=https://github.com/o/swarmjax.git", "WORKDIR=gs://my-bucket/r", "CONFIG=c.py",
                 "REMOTE_DIR=/opt/swarmjax",
                 "<<'SWARMJAX_SETUP_EOF'", "<<'SWARMJAX_RUN_EOF'", 'nohup bash "$REMOTE_DIR/worker_run.sh"'):
        assert text in startup, text


def test_dry_run_before_the_command(capsys):
    """``tpu.py --dry-run create ...`` prints what ``tpu.py create ... --dry-run`` prints."""
    after = dry(capsys, "create", *TPU, *MAKE, "--spot")
    assert tpu.main(["--dry-run", "create", *TPU, *MAKE, "--spot"]) == 0
    assert [shlex.split(x) for x in capsys.readouterr().out.splitlines() if x.startswith("gcloud ")] == after


def test_dry_run_setup_run_status_delete(capsys, tmp_path):
    src = tmp_path / "checkout"
    (src / "configs").mkdir(parents=True)
    (src / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (src / "configs" / "c.py").write_text("")
    out = tmp_path / "r"
    common = [*TPU, "--render-dir", str(out)]
    assert dry(capsys, "setup", *common, "--source", str(src)) == [
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "swarm-a", *ZONE, "--worker=all", "--command",
         "mkdir -p swarmjax/logs"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp", str(out / "worker_setup.sh"), str(out / "src.tar.gz"),
         "swarm-a:swarmjax/", *ZONE, "--worker=all"],
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "swarm-a", *ZONE, "--worker=all", "--command",
         "bash swarmjax/worker_setup.sh"]]
    with tarfile.open(out / "src.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["swarmjax-src/configs/c.py", "swarmjax-src/pyproject.toml"]
    job = ["--config", "configs/c.py", "--workdir", "gs://my-bucket/r", "--set", "rl.steps=5"]
    ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "swarm-a", *ZONE]
    scp_run = ["gcloud", "compute", "tpus", "tpu-vm", "scp", str(out / "worker_run.sh"), "swarm-a:swarmjax/", *ZONE,
               "--worker=all"]
    assert dry(capsys, "run", *common, *job, "--accelerator-type", "v4-16") == [
        scp_run, [*ssh, "--worker=0", "--command", "bash swarmjax/worker_run.sh"],
        [*ssh, "--worker=1", "--command", "bash swarmjax/worker_run.sh"]]
    assert len(dry(capsys, "run", *common, *job, "--num-workers", "4")) == 5
    assert dry(capsys, "run", *common, *job, "--detach") == [
        scp_run, [*ssh, "--worker=all", "--command",
                  "nohup bash swarmjax/worker_run.sh > swarmjax/logs/nohup.out 2>&1 < /dev/null &"]]
    assert "TRAIN_ARGS=(--set rl.steps=5)" in (out / "worker_run.sh").read_text()
    assert dry(capsys, "status", *TPU, "--queued") == [
        ["gcloud", "compute", "tpus", "queued-resources", "describe", "swarm-a-qr", *ZONE],
        ["gcloud", "compute", "tpus", "tpu-vm", "describe", "swarm-a", *ZONE]]
    stop = dry(capsys, "stop", *TPU)
    assert stop == [[*ssh, "--worker=all", "--command", ta.stop_args(VM, ["swarmjax", "/opt/swarmjax"])[-1]]]
    assert "for f in swarmjax/logs/run.pid /opt/swarmjax/logs/run.pid;" in stop[0][-1]
    assert dry(capsys, "stop", *TPU, "--remote-dir", "/x")[0][-1] == ta.stop_args(VM, ["/x"])[-1]
    assert dry(capsys, "delete", *TPU) == [["gcloud", "compute", "tpus", "tpu-vm", "delete", "swarm-a", *ZONE,
                                           "--quiet"]]
    assert dry(capsys, "delete", *TPU, "--queued", "--project", "p1") == [
        ["gcloud", "compute", "tpus", "queued-resources", "delete", "swarm-a-qr", *ZONE, "--project", "p1",
         "--force", "--quiet"]]


def test_cli_errors(capsys, monkeypatch):
    monkeypatch.delenv("CLOUDSDK_COMPUTE_ZONE", raising=False)
    assert tpu.main(["create", "--name", "swarm-a", *MAKE, "--dry-run"]) == 2
    assert "missing zone: pass --zone" in capsys.readouterr().err
    assert tpu.main(["create", *TPU, "--accelerator-type", "v4", "--version", "v", "--dry-run"]) == 2
    assert "unknown accelerator type format 'v4'" in capsys.readouterr().err
    assert tpu.main(["run", *TPU, "--config", "c.py", "--dry-run"]) == 2
    assert "missing --workdir" in capsys.readouterr().err
    assert tpu.main(["create", *TPU, *MAKE, "--startup", "--source", ".", "--config", "c", "--workdir", "w",
                     "--dry-run"]) == 2
    assert "--startup cannot copy the local checkout" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the babysitter, fake gcloud

FAKE_GCLOUD = """\
#!{py}
# Fake gcloud: logs its argv; `queued-resources describe` prints the scripted states (a list
# per number of creates so far, the last state repeating); `storage ls` succeeds once
# `summary_after` describes happened (then a local summary_path is written too).
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
scenario = json.load(open(os.environ["FAKE_SCENARIO"]))
state_file = os.environ["FAKE_SCENARIO"] + ".state"
st = json.load(open(state_file)) if os.path.exists(state_file) else {{"describes": 0, "creates": 0, "since": 0}}
rc = 0
if args[:4] == ["compute", "tpus", "queued-resources", "describe"]:
    states = scenario["states"][min(st["creates"], len(scenario["states"]) - 1)]
    state = states[min(st["since"], len(states) - 1)]
    st["describes"] += 1
    st["since"] += 1
    if state == "NOT_FOUND":
        sys.stderr.write("ERROR: (gcloud.compute.tpus.queued-resources.describe) NOT_FOUND: Resource not found\\n")
        rc = 1
    else:
        print(json.dumps({{"name": args[4], "state": {{"state": state}}}}))
    if st["describes"] >= scenario["summary_after"] and scenario.get("summary_path"):
        open(scenario["summary_path"], "w").write("{{}}")
elif args[:4] == ["compute", "tpus", "queued-resources", "create"]:
    st["creates"] += 1
    st["since"] = 0
elif args[:2] == ["storage", "ls"]:
    rc = 0 if st["describes"] >= scenario["summary_after"] else 1
json.dump(st, open(state_file, "w"))
sys.exit(rc)
"""


def fake_bin(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    tr.write_script(d / name, text)
    return d


def babysit(tmp_path, scenario, *extra):
    bindir = fake_bin(tmp_path, "gcloud", FAKE_GCLOUD.format(py=PY))
    (tmp_path / "scenario.json").write_text(json.dumps(scenario))
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "FAKE_LOG": str(tmp_path / "gcloud.jsonl"), "FAKE_SCENARIO": str(tmp_path / "scenario.json")}
    proc = subprocess.run([PY, str(LAUNCH / "tpu.py"), "babysit", *TPU, *MAKE, "--spot", "--startup",
                           "--source", "git+https://github.com/o/swarmjax.git@v1", "--config", "c.py",
                           "--render-dir", str(tmp_path / "r"), "--interval", "0", "--max-polls", "50", *extra],
                          env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in (tmp_path / "gcloud.jsonl").read_text().splitlines()]
    return proc, calls


QR = ["compute", "tpus", "queued-resources"]
DESCRIBE = [*QR, "describe", "swarm-a-qr", *ZONE, "--format=json"]
DELETE = [*QR, "delete", "swarm-a-qr", *ZONE, "--force", "--quiet"]


def create_call(tmp_path):
    return [*QR, "create", "swarm-a-qr", *ZONE, "--node-id", "swarm-a", "--accelerator-type", "v4-32",
            "--runtime-version", "tpu-ubuntu2204-base", "--spot", "--metadata-from-file",
            f"startup-script={tmp_path / 'r' / 'startup.sh'}"]


def test_babysit_recreates_after_suspension_and_stops_at_summary(tmp_path):
    ls = ["storage", "ls", "gs://my-bucket/run1/summary.json"]
    proc, calls = babysit(tmp_path, {"states": [["ACTIVE", "ACTIVE", "SUSPENDED"], ["WAITING_FOR_RESOURCES", "ACTIVE"]],
                                     "summary_after": 6},
                          "--workdir", "gs://my-bucket/run1", "--delete-when-done")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == [ls, DESCRIBE, ls, DESCRIBE, ls, DESCRIBE, DELETE, create_call(tmp_path),
                     ls, DESCRIBE, ls, DESCRIBE, ls, DESCRIBE, ls, DELETE]
    out = proc.stdout
    for line in ("swarm-a-qr: start -> ACTIVE", "swarm-a-qr: ACTIVE -> SUSPENDED", "recreation 1/10: deleting",
                 "recreation 1/10: creating", "SUSPENDED -> WAITING_FOR_RESOURCES",
                 "WAITING_FOR_RESOURCES -> ACTIVE", "summary.json exists: the run is done"):
        assert line in out, out
    assert out.index("-> SUSPENDED") < out.index("recreation 1/10: deleting") < out.index("WAITING_FOR_RESOURCES ->")
    assert "worker_run.sh" in (tmp_path / "r" / "startup.sh").read_text()


def test_babysit_local_workdir_not_found_and_giving_up(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    proc, calls = babysit(tmp_path, {"states": [["NOT_FOUND"], ["ACTIVE"]], "summary_after": 3,
                                     "summary_path": str(work / "summary.json")}, "--workdir", str(work))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == [DESCRIBE, create_call(tmp_path), DESCRIBE, DESCRIBE]     # summary: a local file check
    assert "start -> NOT_FOUND" in proc.stdout and "NOT_FOUND -> ACTIVE" in proc.stdout

    for f in ("gcloud.jsonl", "scenario.json.state"):
        (tmp_path / f).unlink()
    (work / "summary.json").unlink()
    proc, calls = babysit(tmp_path, {"states": [["FAILED"]], "summary_after": 99}, "--workdir", str(work),
                          "--max-recreations", "2")
    assert proc.returncode == 1
    assert calls == [DESCRIBE, DELETE, create_call(tmp_path)] * 2 + [DESCRIBE]
    assert "giving up" in proc.stdout


def test_run_one_ssh_per_worker_with_logs(tmp_path):
    calls = tmp_path / "calls"
    bindir = fake_bin(tmp_path, "gcloud", textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {calls}
        case "$*" in
          *"tpu-vm describe"*) echo '{{"networkEndpoints": [{{"ipAddress": "a"}}, {{"ipAddress": "b"}}]}}' ;;
          *"tpu-vm ssh"*--worker=1*) echo "worker 1 says hi"; exit 4 ;;
          *"tpu-vm ssh"*) echo "worker 0 says hi" ;;
        esac
        """))
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([PY, str(LAUNCH / "tpu.py"), "run", *TPU, "--config", "c.py", "--workdir", "gs://my-bucket/r",
                           "--render-dir", str(tmp_path / "r"), "--log-dir", str(tmp_path / "logs")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stdout + proc.stderr                  # the first non-zero status
    assert [line.split()[:4] for line in calls.read_text().splitlines()] == [
        ["compute", "tpus", "tpu-vm", "describe"], ["compute", "tpus", "tpu-vm", "scp"]] + \
        [["compute", "tpus", "tpu-vm", "ssh"]] * 2
    for i in range(2):
        assert (tmp_path / "logs" / f"worker-{i}.log").read_text() == f"worker {i} says hi\n"
    assert "[w0] worker 0 says hi" in proc.stdout and "[w1] exited with status 4" in proc.stderr


# ----------------------------------------------------------------------------- rendered worker scripts

def rendered(tmp_path) -> dict[str, str]:
    jobs = {"git": JOB, "gcs": dataclasses.replace(JOB, source="gs://my-bucket/src.tar.gz",
                                                 extra_pip=("tensorboardX",), distributed="auto"),
            "local": dataclasses.replace(JOB, source=".", train_args=("--set", "a=b c"))}
    out = {}
    for kind, job in jobs.items():
        out[f"setup-{kind}"] = tr.render_setup(job)
        out[f"run-{kind}"] = tr.render_run(job)
        if kind != "local":
            out[f"startup-{kind}"] = tr.render_startup(job)
    return out


def test_rendered_scripts_parse(tmp_path):
    scripts = rendered(tmp_path)
    for name, text in scripts.items():
        assert "@@" not in text.replace("@@...@@", ""), name
        path = tr.write_script(tmp_path / f"{name}.sh", text)
        subprocess.run(["bash", "-n", str(path)], check=True)
    assert "TRAIN_ARGS=(--set 'a=b c')" in scripts["run-local"]
    assert "EXTRA_PIP=(tensorboardX)" in scripts["setup-gcs"] and "SOURCE_KIND=gcs" in scripts["setup-gcs"]
    assert "SOURCE_KIND=tarball" in scripts["setup-local"] and "SOURCE_REF=v1" in scripts["setup-git"]
    for path in tr.TEMPLATES.values():                       # the templates themselves are valid bash
        subprocess.run(["bash", "-n", str(path)], check=True)
    with pytest.raises(ta.LaunchError, match="no value"):
        tr.render_template("X=@@MISSING@@", {})
    with pytest.raises(ta.LaunchError, match="no placeholder"):
        tr.render_template("X=1", {"Y": "2"})


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (bash -n still checked)")
def test_rendered_scripts_shellcheck(tmp_path):
    for name, text in rendered(tmp_path).items():
        path = tr.write_script(tmp_path / f"{name}.sh", text)
        proc = subprocess.run([shutil.which("shellcheck"), str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, name + "\n" + proc.stdout


def test_worker_run_script_with_fakes(tmp_path):
    remote = tmp_path / "remote"
    (remote / "src").mkdir(parents=True)
    tr.write_script(remote / "venv" / "bin" / "swarmjax", textwrap.dedent("""\
        #!/bin/sh
        echo "ARGV $*"
        echo "PWD $(pwd)"
        echo "ENV ${JAX_COORDINATOR_ADDRESS:-} ${JAX_NUM_PROCESSES:-} ${JAX_PROCESS_ID:-}"
        exit "${FAKE_RC:-0}"
        """))
    calls = tmp_path / "calls"
    fake_bin(tmp_path, "curl", textwrap.dedent(f"""\
        #!/bin/sh
        echo "curl $*" >> {calls}
        case "$*" in
          *agent-worker-number*) echo 1 ;;
          *worker-network-endpoints*) echo t-w-0:0:10.0.0.2,t-w-1:1:10.0.0.3 ;;
          *) exit 22 ;;
        esac
        """))
    bindir = fake_bin(tmp_path, "gcloud", f'#!/bin/sh\necho "gcloud $*" >> {calls}\n')
    job = ta.JobConfig(config="configs/c.py", workdir="gs://my-bucket/run1", remote_dir=str(remote),
                       train_args=("--set", "rl.steps=5"))
    script = tr.write_script(tmp_path / "worker_run.sh", tr.render_run(job))
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), "FAKE_RC": "3"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert ("ARGV train --config configs/c.py --workdir gs://my-bucket/run1 --resume auto --no-progress "
            "--coordinator 10.0.0.2:8476 --num-processes 2 --process-id 1 --set rl.steps=5") in proc.stdout
    assert f"PWD {remote / 'src'}" in proc.stdout and "ENV 10.0.0.2:8476 2 1" in proc.stdout
    log = (remote / "logs" / "worker-1.log").read_text()
    assert "ARGV train" in log and "swarmjax exited with status 3" in log
    assert (f"gcloud storage cp --quiet {remote}/logs/worker-1.log gs://my-bucket/run1/logs/worker-1.log"
            in calls.read_text())

    # one process, a local workdir, identity from the environment: no metadata, no distributed flags
    calls.unlink()
    job = ta.JobConfig(config="c.py", workdir="out", remote_dir=str(remote), sync_seconds=1)
    script = tr.write_script(tmp_path / "worker_run.sh", tr.render_run(job))
    env.update(FAKE_RC="0", SWARMJAX_PROCESS_ID="0", SWARMJAX_NUM_PROCESSES="1", SWARMJAX_COORDINATOR="h:1")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert f"ARGV train --config c.py --workdir {remote}/out --resume auto --no-progress\n" in proc.stdout
    assert "ARGV train" in (remote / "out" / "logs" / "worker-0.log").read_text()
    assert not calls.exists()
    # a second run while one holds the lock is refused
    with open(remote / "logs" / "run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 75 and "another run holds" in proc.stderr


FAKE_TRAIN = """\
#!{py}
# Fake swarmjax: on SIGTERM "saves a checkpoint" for a while, then exits 143 (a second
# SIGTERM shows up as "SIGTERM 2" in its output).
import signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda *a: (got.append(1), print(f"SIGTERM {{len(got)}}", flush=True)))
print("training", flush=True)
t = time.time()
while not got and time.time() - t < 20:
    time.sleep(0.02)
time.sleep(0.5)
print(f"saved after {{len(got)}} SIGTERM", flush=True)
sys.exit(143)
"""


@pytest.mark.parametrize("how", ["shutdown", "stop"])
def test_worker_run_script_sigterm(tmp_path, how):
    """A shutdown (SIGTERM to every process) or `tpu.py stop` (SIGTERM to swarmjax's pid):
    swarmjax gets exactly one SIGTERM, its output after it still reaches the log, the script
    waits, copies the log and exits 143."""
    remote = tmp_path / "remote"
    tr.write_script(remote / "venv" / "bin" / "swarmjax", FAKE_TRAIN.format(py=PY))
    job = ta.JobConfig(config="c.py", workdir=str(tmp_path / "work"), remote_dir=str(remote))
    script = tr.write_script(tmp_path / "worker_run.sh", tr.render_run(job))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SWARMJAX_PROCESS_ID": "0",
           "SWARMJAX_NUM_PROCESSES": "1", "SWARMJAX_COORDINATOR": "h:1"}
    p = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    log, pid_file = remote / "logs" / "worker-0.log", remote / "logs" / "run.pid"
    deadline = time.monotonic() + 20
    while not (log.exists() and "training" in log.read_text() and pid_file.exists()):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.02)
    if how == "shutdown":
        os.killpg(p.pid, signal.SIGTERM)
    else:                                                    # what `tpu.py stop` runs on each worker
        stop = subprocess.run(["bash", "-c", ta.stop_args(VM, ["/nowhere", str(remote)])[-1]], capture_output=True,
                              text=True, timeout=10)
        assert "SIGTERM to swarmjax" in stop.stdout, stop.stdout + stop.stderr
    out, err = p.communicate(timeout=20)
    assert p.returncode == 143, err
    text = log.read_text()
    assert "SIGTERM 1" in text and "saved after 1 SIGTERM" in text and "SIGTERM 2" not in text, text
    assert "swarmjax exited with status 143" in text and not pid_file.exists()
    assert "saved after 1 SIGTERM" in (tmp_path / "work" / "logs" / "worker-0.log").read_text()


def fake_venv(tmp_path, remote: Path) -> Path:
    """A venv whose python logs ``-m pip ...`` calls (and does nothing) and runs ``-c`` for real."""
    pip_log = tmp_path / "pip.log"
    tr.write_script(remote / "venv" / "bin" / "python", textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "-m" ]; then echo "$*" >> {pip_log}; exit 0; fi
        case "$2" in *"import jax"*) echo 0.0-fake; exit 0 ;; esac
        exec {PY} "$@"
        """))
    tr.write_script(remote / "venv" / "bin" / "swarmjax", "#!/bin/sh\nexit 0\n")
    return pip_log


def pip_installs(pip_log: Path) -> list[str]:
    return [line for line in pip_log.read_text().splitlines() if line.startswith("-m pip install")] \
        if pip_log.exists() else []


def test_worker_setup_script_is_idempotent(tmp_path):
    remote = tmp_path / "remote"
    pip_log = fake_venv(tmp_path, remote)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    sha = tr.pack_source(checkout, remote / tr.TARBALL)
    assert tr.pack_source(checkout, tmp_path / "again.tar.gz") == sha          # reproducible bytes
    job = ta.JobConfig(source=str(checkout), remote_dir=str(remote), extra_pip=("tensorboardX",))
    script = tr.write_script(tmp_path / "worker_setup.sh", tr.render_setup(job))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}

    def setup():
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    out = setup()
    pip = "-m pip install --quiet --disable-pip-version-check"
    assert pip_installs(pip_log) == [f"{pip} jax[tpu] tensorboardX", f"{pip} {remote}/src",
                                     f"{pip} --no-deps --force-reinstall {remote}/src"]
    assert "venv" in out and (remote / "src" / "pyproject.toml").exists()
    assert (remote / "src" / ".source-sha256").read_text().strip() == sha
    out = setup()                                                             # nothing to do
    assert len(pip_installs(pip_log)) == 3 and "already installed" in out and f"already {sha}" in out
    (checkout / "new.py").write_text("x = 1\n")                              # a new source: installed again
    tr.pack_source(checkout, remote / tr.TARBALL)
    setup()
    assert len(pip_installs(pip_log)) == 6 and (remote / "src" / "new.py").exists()


def test_worker_setup_script_git_source(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "one"], ["tag", "v1"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    v1 = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "later.py").write_text("")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "two"], check=True)
    remote = tmp_path / "remote"
    pip_log = fake_venv(tmp_path, remote)
    job = ta.JobConfig(source=f"git+file://{repo}@v1", remote_dir=str(remote))
    script = tr.write_script(tmp_path / "worker_setup.sh", tr.render_setup(job))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for _ in range(2):
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    head = subprocess.run(["git", "-C", str(remote / "src"), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.stdout.strip() == v1 and not (remote / "src" / "later.py").exists()
    assert len(pip_installs(pip_log)) == 3                                    # the second run skipped pip


# ----------------------------------------------------------------------------- launch/local.py

PRINT_ENV = ("import json, os, sys; print(json.dumps({'argv': sys.argv[1:], **{k: os.environ[k] for k in "
             "('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID')}}))")


def local_py(*argv, timeout=60, **kw):
    return subprocess.run([PY, str(LAUNCH / "local.py"), *argv], capture_output=True, text=True, timeout=timeout, **kw)


def test_local_env_and_logs(tmp_path):
    proc = local_py("-n", "2", "--port", "12345", "--log-dir", str(tmp_path), "--", PY, "-c", PRINT_ENV,
                    "{process_id}", "{coordinator}")
    assert proc.returncode == 0, proc.stderr
    for i in range(2):
        got = json.loads((tmp_path / f"process-{i}.log").read_text())
        assert got == {"argv": [str(i), "127.0.0.1:12345"], "JAX_COORDINATOR_ADDRESS": "127.0.0.1:12345",
                       "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)}
    assert '[p0] {"argv": ["0"' in proc.stdout and "[p1]" not in proc.stdout   # process 0 echoed


def test_local_exit_status_and_signals(tmp_path):
    code = "import os, sys, time; i = os.environ['JAX_PROCESS_ID']; (time.sleep(30) if i == '0' else sys.exit(3))"
    t0 = time.monotonic()
    proc = local_py("-n", "2", "--grace", "2", "--log-dir", str(tmp_path), "--", PY, "-c", code)
    assert proc.returncode == 3 and time.monotonic() - t0 < 20, proc.stderr   # the sleeper was stopped
    assert "[p1] exited with status 3" in proc.stderr
    assert local_py("-n", "2", "--keep-going", "--log-dir", str(tmp_path), "--", PY, "-c",
                    "import os, sys; sys.exit(int(os.environ['JAX_PROCESS_ID']) * 5)").returncode == 5

    code = ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(7)))\n"
            "print('ready', flush=True); time.sleep(30)")
    p = subprocess.Popen([PY, str(LAUNCH / "local.py"), "-n", "2", "--log-dir", str(tmp_path), "--", PY, "-c", code],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = [tmp_path / f"process-{i}.log" for i in range(2)]
    deadline = time.monotonic() + 20
    while not all(f.exists() and "ready" in f.read_text() for f in logs):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 7
    assert all("got SIGTERM" in f.read_text() for f in logs)


def test_local_child_argv():
    kw = dict(host="127.0.0.1", port=9, num_processes=2, process_id=1)
    flags = ["--coordinator", "127.0.0.1:9", "--num-processes", "2", "--process-id", "1"]
    assert local.child_argv(["swarmjax", "train", "--config", "c"], **kw) == ["swarmjax", "train", "--config", "c",
                                                                            *flags]
    assert local.child_argv(["python", "-m", "swarmjax", "train"], **kw) == ["python", "-m", "swarmjax", "train",
                                                                            *flags]
    assert local.child_argv(["swarmjax", "train"], cli_flags=False, **kw) == ["swarmjax", "train"]
    assert local.child_argv(["swarmjax", "eval"], **kw) == ["swarmjax", "eval"]
    assert local.child_argv(["swarmjax", "train", "--coordinator", "x:1"], **kw) == ["swarmjax", "train",
                                                                                    "--coordinator", "x:1"]
    assert local.child_argv(["w.py", "{process_id}", "{port}", "{num_processes}"], **kw) == ["w.py", "1", "9", "2"]
    assert local.pod_env(host="h", port=1, num_processes=4, process_id=2) == {
        "JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2"}


# ----------------------------------------------------------------------------- launch/ stays jax-free

def test_launch_never_imports_jax():
    own = {p.stem for p in LAUNCH.glob("*.py")}
    for path in LAUNCH.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not re.search(r"^\s*(import\s+jax|from\s+jax)\b", text, re.M), path
    for path in LAUNCH.glob("*.py"):                          # standard library (and each other) only
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in own or top == "__future__", (path, name)
