#!/usr/bin/env python3
"""Create, set up, run and babysit ``swarmjax train`` on a Cloud TPU VM or pod slice.

    python launch/tpu.py create  --name N --zone Z --accelerator-type v4-32 --version tpu-ubuntu2204-base
                                 [--spot|--preemptible|--reserved] [--queued] [--startup JOB FLAGS]
    python launch/tpu.py setup   --name N --zone Z [--source .|git+URL[@REF]|gs://B/src.tar.gz]
    python launch/tpu.py run     --name N --zone Z --config C --workdir gs://B/run [--set K=V ...] [--detach]
    python launch/tpu.py stop    --name N --zone Z              # SIGTERM: checkpoint, exit 143
    python launch/tpu.py status  --name N --zone Z [--queued]
    python launch/tpu.py delete  --name N --zone Z [--queued]
    python launch/tpu.py babysit --name N --zone Z --accelerator-type T --version V [--spot|--reserved]
                                 --startup --source S --config C --workdir gs://B/run
    python launch/tpu.py pack    --source . --out src.tar.gz

Every subcommand takes ``--dry-run``: the gcloud commands are printed (``shlex.join``), not
run (scripts are still rendered, into ``--render-dir``). The argument lists come from the
pure functions of ``tpu_args.py``; the worker scripts are the templates ``worker_*.sh``
rendered by ``tpu_render.py``. See ``launch/README.md``. Standard library only; never
imports jax.

``run`` (attached, the default) copies the run script to every worker, then starts one
``gcloud compute tpus tpu-vm ssh --worker=i`` per worker in parallel, each one's output in
``--log-dir``/worker-<i>.log (worker 0's also echoed); it ends when all do, with the first
non-zero status (the others of a failed worker stop when JAX notices the missing peer).
Ctrl-C (or a lost connection) ends only the local ssh sessions: the workers train on;
``stop`` ends them (SIGTERM: a checkpoint, then exit 143). ``run --detach`` starts the
script on ``--worker=all`` under nohup and returns. Either way each worker also writes its
own log and copies it to WORKDIR/logs/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procgroup import ProcSpec, run_group  # noqa: E402
from tpu_args import (Action, JobConfig, LaunchError, TpuConfig, create_args, decide, delete_args,  # noqa: E402
                      delete_queued_args, describe_queued_args, describe_vm_args, estimate_hosts, exists_args,
                      parse_source, run_copy_args, run_detached_args, run_worker_args, setup_commands,
                      startup_remote_dir, status_args, stop_args, summary_uri, validate_job, validate_tpu)
from tpu_render import TARBALL, pack_source, render_run, render_setup, render_startup, write_script  # noqa: E402


class CommandFailed(RuntimeError):
    """A gcloud command exited non-zero."""

    def __init__(self, args: list[str], status: int, stderr: str = ""):
        super().__init__(f"command failed with status {status}: {shlex.join(args)}\n{stderr}".rstrip())
        self.status = status


class Runner:
    """Runs commands, or with ``dry_run`` prints them (one ``shlex.join`` line each) to ``out``."""

    def __init__(self, *, dry_run: bool, out=None):
        self.dry_run = dry_run
        self.out = out or sys.stdout

    def run(self, args: list[str], *, check: bool = True, capture: bool = False,
            echo: bool = True) -> subprocess.CompletedProcess:
        if self.dry_run:
            print(shlex.join(args), file=self.out, flush=True)
            return subprocess.CompletedProcess(args, 0, "", "")
        if echo:
            print(f"+ {shlex.join(args)}", file=sys.stderr, flush=True)
        proc = subprocess.run(args, text=True, capture_output=capture)
        if check and proc.returncode:
            raise CommandFailed(args, proc.returncode, proc.stderr or "")
        return proc


def log(msg: str) -> None:
    """A timestamped line on stdout."""
    print(f"[tpu.py {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}] {msg}", flush=True)


# ----------------------------------------------------------------------------- configs from flags

def tpu_config(args: argparse.Namespace) -> TpuConfig:
    """The TPU part of the flags (not yet validated)."""
    return TpuConfig(name=args.name or "", zone=args.zone or "",
                     accelerator_type=getattr(args, "accelerator_type", "") or "",
                     version=getattr(args, "version", "") or "", project=args.project,
                     capacity=getattr(args, "capacity", "on-demand"), queued=args.queued,
                     queued_resource=args.queued_resource, startup_script=getattr(args, "startup_script", None))


def job_config(args: argparse.Namespace) -> JobConfig:
    """The job part of the flags (not yet validated)."""
    train_args = tuple(a for kv in args.overrides for a in ("--set", kv)) + tuple(args.train_arg)
    return JobConfig(config=args.config or "", workdir=args.workdir or "", source=args.source,
                     train_args=train_args, jax_spec=args.jax_spec, extra_pip=tuple(args.extra_pip),
                     remote_dir=args.remote_dir, python_version=args.python, distributed=args.distributed,
                     coordinator_port=args.coordinator_port, sync_seconds=args.sync_seconds, retries=args.retries)


def render_dir(args: argparse.Namespace) -> Path:
    """Where rendered scripts and the source tarball go."""
    return Path(args.render_dir) if args.render_dir else Path.home() / ".cache" / "swarmjax-launch" / args.name


def with_startup(args: argparse.Namespace, cfg: TpuConfig) -> TpuConfig:
    """``--startup``: render the startup script from the job flags into the render dir."""
    if getattr(args, "startup", False):
        if cfg.startup_script:
            raise LaunchError("pass --startup (render it from the job flags) or --startup-script FILE, not both")
        job = job_config(args)
        validate_job(job)
        path = write_script(render_dir(args) / "startup.sh", render_startup(job))
        return dataclasses.replace(cfg, startup_script=str(path))
    if cfg.startup_script and not Path(cfg.startup_script).is_file():
        raise LaunchError(f"--startup-script {cfg.startup_script!r}: no such file")
    return cfg


# ----------------------------------------------------------------------------- subcommands

def cmd_create(args: argparse.Namespace, runner: Runner) -> int:
    cfg = tpu_config(args)
    validate_tpu(cfg, for_create=True)
    cfg = with_startup(args, cfg)
    runner.run(create_args(cfg))
    return 0


def cmd_setup(args: argparse.Namespace, runner: Runner) -> int:
    cfg, job = tpu_config(args), job_config(args)
    validate_tpu(cfg)
    validate_job(job, need_run=False)
    out = render_dir(args)
    files = [str(write_script(out / "worker_setup.sh", render_setup(job)))]
    source = parse_source(job.source)
    if source.kind == "local":
        sha = pack_source(Path(source.url), out / TARBALL)
        log(f"packed {source.url} into {out / TARBALL} (sha256 {sha[:12]})")
        files.append(str(out / TARBALL))
    for command in setup_commands(cfg, job, files):
        runner.run(command)
    return 0


def count_workers(runner: Runner, cfg: TpuConfig) -> int:
    """The slice's workers: the ``networkEndpoints`` of ``tpu-vm describe``."""
    proc = runner.run(describe_vm_args(cfg, json_format=True), capture=True)
    return max(1, len(json.loads(proc.stdout or "{}").get("networkEndpoints", [])))


def cmd_run(args: argparse.Namespace, runner: Runner) -> int:
    cfg, job = tpu_config(args), job_config(args)
    validate_tpu(cfg)
    validate_job(job)
    script = write_script(render_dir(args) / "worker_run.sh", render_run(job))
    if args.num_workers is not None and args.num_workers < 1:
        raise LaunchError("--num-workers must be at least 1")
    n = args.num_workers
    if n is None and not args.detach:
        if runner.dry_run:
            n = estimate_hosts(cfg.accelerator_type)
            if n is None:
                raise LaunchError("--dry-run needs --num-workers (or --accelerator-type to estimate it)")
        else:
            n = count_workers(runner, cfg)
    if (n is None or n > 1) and not job.workdir.startswith("gs://"):
        log(f"warning: workdir {job.workdir!r} is not gs://: with several workers, each writes its own local copy")
    runner.run(run_copy_args(cfg, job, str(script)))
    if args.detach:
        runner.run(run_detached_args(cfg, job))
        log(f"started on every worker; logs: {job.workdir}/logs/worker-<i>.log (synced every {job.sync_seconds} s)")
        return 0
    commands = [run_worker_args(cfg, job, i) for i in range(n)]
    if runner.dry_run:
        for command in commands:
            runner.run(command)
        return 0
    log_dir = Path(args.log_dir) if args.log_dir else Path("logs") / cfg.name
    log(f"{n} workers; logs in {log_dir}/worker-<i>.log")
    specs = [ProcSpec(argv=c, log=log_dir / f"worker-{i}.log", label=f"w{i}") for i, c in enumerate(commands)]
    # keep_going: closing a session would not stop its worker; watch each to its end
    result = run_group(specs, echo=args.echo if args.echo >= 0 else None, keep_going=True)
    log(f"worker exit statuses {result.returncodes}")
    return result.status


def cmd_status(args: argparse.Namespace, runner: Runner) -> int:
    cfg = tpu_config(args)
    validate_tpu(cfg)
    commands = status_args(cfg)
    for i, command in enumerate(commands):
        proc = runner.run(command, check=i == 0)   # a queued resource's node may not exist yet
        if proc.returncode:
            log(f"no node {cfg.name} yet")
    return 0


def cmd_stop(args: argparse.Namespace, runner: Runner) -> int:
    cfg = tpu_config(args)
    validate_tpu(cfg)
    dirs = [args.remote_dir] if args.remote_dir else ["swarmjax", startup_remote_dir("swarmjax")]
    runner.run(stop_args(cfg, dirs))
    return 0


def cmd_delete(args: argparse.Namespace, runner: Runner) -> int:
    cfg = tpu_config(args)
    validate_tpu(cfg)
    runner.run(delete_args(cfg))
    return 0


def queued_state(runner: Runner, cfg: TpuConfig) -> str | None:
    """The queued resource's ``state.state``; None when it does not exist. Raises
    :class:`CommandFailed` on any other error."""
    args = describe_queued_args(cfg, json_format=True)
    proc = runner.run(args, check=False, capture=True, echo=False)
    if proc.returncode:
        if "NOT_FOUND" in proc.stderr or "not found" in proc.stderr.lower():
            return None
        raise CommandFailed(args, proc.returncode, proc.stderr)
    return str((json.loads(proc.stdout or "{}").get("state") or {}).get("state", "UNKNOWN"))


def summary_exists(runner: Runner, workdir: str) -> bool:
    """Whether ``WORKDIR/summary.json`` exists (``gcloud storage ls`` for gs://)."""
    uri = summary_uri(workdir)
    if not uri.startswith("gs://"):
        return Path(uri).exists()
    return runner.run(exists_args(uri), check=False, capture=True, echo=False).returncode == 0


def cmd_babysit(args: argparse.Namespace, runner: Runner) -> int:
    """Poll the queued resource; recreate it when FAILED/SUSPENDED/SUSPENDING (or gone);
    stop when the run's summary.json exists."""
    cfg = dataclasses.replace(tpu_config(args), queued=True)
    validate_tpu(cfg, for_create=True)
    if not args.workdir:
        raise LaunchError("babysit needs --workdir: it stops once WORKDIR/summary.json exists")
    cfg = with_startup(args, cfg)
    if not cfg.startup_script:
        log("warning: no --startup / --startup-script: a recreated slice will not start training by itself")
    if runner.dry_run:
        print(f"# every {args.interval} s: summary check, then the queued resource's state", file=runner.out)
        uri = summary_uri(args.workdir)
        check = shlex.join(exists_args(uri)) if uri.startswith("gs://") else f"test -e {shlex.quote(uri)}"
        print(check, file=runner.out)
        runner.run(describe_queued_args(cfg, json_format=True))
        print("# on FAILED / SUSPENDED / SUSPENDING: delete and recreate", file=runner.out)
        runner.run(delete_queued_args(cfg))
        runner.run(create_args(cfg))
        return 0
    last, made, errors, polls = "", 0, 0, 0
    log(f"babysitting {cfg.qr_name} (node {cfg.name}), workdir {args.workdir}, every {args.interval} s, "
        f"at most {args.max_recreations} recreations")
    while True:
        polls += 1
        done = summary_exists(runner, args.workdir)
        state = None
        if not done:
            try:
                state = queued_state(runner, cfg)
                errors = 0
            except CommandFailed as e:
                errors += 1
                log(f"describe failed ({errors}/{args.max_errors}): {e}")
                if errors >= args.max_errors:
                    return 1
                time.sleep(args.interval)
                continue
            shown = state or "NOT_FOUND"
            if shown != last:
                log(f"{cfg.qr_name}: {last or 'start'} -> {shown}")
                last = shown
        action = decide(state, done=done)
        if action is Action.STOP:
            log(f"{summary_uri(args.workdir)} exists: the run is done")
            if args.delete_when_done:
                log(f"deleting {cfg.qr_name}")
                runner.run(delete_queued_args(cfg))
            return 0
        if action in (Action.RECREATE, Action.CREATE):
            if made >= args.max_recreations:
                log(f"{cfg.qr_name} is {last} and {made} recreations were allowed (--max-recreations): giving up")
                return 1
            made += 1
            if action is Action.RECREATE:
                log(f"recreation {made}/{args.max_recreations}: deleting {cfg.qr_name}")
                runner.run(delete_queued_args(cfg))
            log(f"recreation {made}/{args.max_recreations}: creating {cfg.qr_name}")
            runner.run(create_args(cfg))
        if args.max_polls and polls >= args.max_polls:
            log(f"--max-polls {args.max_polls} reached")
            return 3
        time.sleep(args.interval)


def cmd_pack(args: argparse.Namespace, runner: Runner) -> int:
    sha = pack_source(Path(args.source), Path(args.out))
    print(f"{args.out} sha256 {sha}")
    return 0


# ----------------------------------------------------------------------------- flags

def _parents() -> dict[str, argparse.ArgumentParser]:
    tpu = argparse.ArgumentParser(add_help=False)
    g = tpu.add_argument_group("TPU")
    g.add_argument("--name", required=True, help="the TPU VM (node) name")
    g.add_argument("--zone", default=os.environ.get("CLOUDSDK_COMPUTE_ZONE"),
                   help="e.g. us-central2-b (default: $CLOUDSDK_COMPUTE_ZONE)")
    g.add_argument("--project", help="GCP project (default: gcloud's core/project)")
    g.add_argument("--queued", action="store_true", help="the TPU is (to be) a queued resource's node")
    g.add_argument("--queued-resource", help="queued resource id (default: NAME-qr)")
    g.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")

    create = argparse.ArgumentParser(add_help=False)
    g = create.add_argument_group("creation")
    g.add_argument("--accelerator-type", help="e.g. v4-8, v4-32, v5litepod-16, v5p-8, v6e-8")
    g.add_argument("--version", help="TPU runtime version, e.g. tpu-ubuntu2204-base, v2-alpha-tpuv5-lite")
    cap = g.add_mutually_exclusive_group()
    for flag in ("spot", "preemptible", "reserved"):
        cap.add_argument(f"--{flag}", dest="capacity", action="store_const", const=flag)
    create.set_defaults(capacity="on-demand")
    g.add_argument("--startup-script", help="a startup script file of your own")
    g.add_argument("--startup", action="store_true",
                   help="render the startup script (setup + run at every boot) from the job flags")

    job = argparse.ArgumentParser(add_help=False)
    g = job.add_argument_group("job (worker scripts)")
    g.add_argument("--config", help="swarmjax config file; relative = relative to the source checkout")
    g.add_argument("--workdir", help="gs://BUCKET/PATH (a pod) or a path on the workers")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="swarmjax train --set (repeatable)")
    g.add_argument("--train-arg", action="append", default=[],
                   help="one more swarmjax train argument; a flag as --train-arg=--flag (repeatable)")
    g.add_argument("--source", default=".",
                   help="git+URL[@REF], gs://BUCKET/src.tar.gz or a local checkout (default .)")
    g.add_argument("--jax-spec", default="jax[tpu]", help="pip requirement of the TPU jax (default jax[tpu])")
    g.add_argument("--extra-pip", action="append", default=[], help="another pip requirement (repeatable)")
    g.add_argument("--remote-dir", default="swarmjax", help="on the workers; relative = under $HOME")
    g.add_argument("--python", default="3.11", help="Python version of the workers' venv (default 3.11)")
    g.add_argument("--retries", type=int, default=5, help="tries of each network step of the setup")
    g.add_argument("--distributed", default="flags", choices=("flags", "auto"),
                   help="flags: pass --coordinator/--num-processes/--process-id on a pod; auto: jax detects")
    g.add_argument("--coordinator-port", type=int, default=8476)
    g.add_argument("--sync-seconds", type=int, default=300, help="log copy period to WORKDIR/logs")
    g.add_argument("--render-dir", help="rendered scripts go here (default ~/.cache/swarmjax-launch/NAME)")
    return {"tpu": tpu, "create": create, "job": job}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch/tpu.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", dest="dry_run_all", action="store_true",
                   help="print the commands instead of running them (also accepted after COMMAND)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    par = _parents()
    sub.add_parser("create", parents=[par["tpu"], par["create"], par["job"]],
                   help="create a TPU VM, or with --queued a queued resource").set_defaults(fn=cmd_create)
    sub.add_parser("setup", parents=[par["tpu"], par["job"]],
                   help="copy and run the idempotent setup script on every worker").set_defaults(fn=cmd_setup)
    r = sub.add_parser("run", parents=[par["tpu"], par["job"]], help="run swarmjax train on every worker")
    r.add_argument("--num-workers", type=int, help="workers of the slice (default: from tpu-vm describe)")
    r.add_argument("--accelerator-type", help="only to estimate --num-workers in a --dry-run")
    r.add_argument("--log-dir", help="worker-<i>.log go here (default logs/NAME)")
    r.add_argument("--echo", type=int, default=0, help="echo this worker's output (-1: none)")
    r.add_argument("--detach", action="store_true", help="start on --worker=all under nohup and return")
    r.set_defaults(fn=cmd_run)
    s = sub.add_parser("stop", parents=[par["tpu"]], help="SIGTERM to swarmjax on every worker: checkpoint, exit")
    s.add_argument("--remote-dir", help="as given to setup/run (default: both swarmjax and /opt/swarmjax)")
    s.set_defaults(fn=cmd_stop)
    for name, fn, text in (("status", cmd_status, "describe the TPU / queued resource"),
                           ("delete", cmd_delete, "delete the TPU / queued resource")):
        sub.add_parser(name, parents=[par["tpu"]], help=text).set_defaults(fn=fn)
    b = sub.add_parser("babysit", parents=[par["tpu"], par["create"], par["job"]],
                       help="recreate a preempted/failed queued resource until WORKDIR/summary.json exists")
    b.add_argument("--interval", type=float, default=120.0, help="seconds between polls (default 120)")
    b.add_argument("--max-recreations", type=int, default=10, help="creations the babysitter may issue (default 10)")
    b.add_argument("--max-errors", type=int, default=10, help="consecutive describe errors before giving up")
    b.add_argument("--max-polls", type=int, default=0, help="stop (status 3) after this many polls (0: never)")
    b.add_argument("--delete-when-done", action="store_true", help="delete the queued resource once the run is done")
    b.set_defaults(fn=cmd_babysit)
    k = sub.add_parser("pack", help="a reproducible tarball of a checkout (for --source gs://...)")
    k.add_argument("--source", default=".", help="checkout directory (default .)")
    k.add_argument("--out", required=True, help="the .tar.gz to write")
    k.set_defaults(fn=cmd_pack, dry_run=False)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runner = Runner(dry_run=args.dry_run or args.dry_run_all)
    try:
        return args.fn(args, runner)
    except LaunchError as e:
        print(f"launch/tpu.py {args.command}: error: {e}", file=sys.stderr)
        return 2
    except CommandFailed as e:
        print(f"launch/tpu.py {args.command}: {e}", file=sys.stderr)
        return e.status or 1


if __name__ == "__main__":
    sys.exit(main())
