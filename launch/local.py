#!/usr/bin/env python3
"""Run N local processes with the environment a TPU pod gives each worker.

    python launch/local.py -n 2 -- swarmjax train --config configs/parl_widesearch_cpu.py --workdir runs/mh
    python launch/local.py -n 2 -- python -m swarmjax.cli train --config configs/parl_widesearch_cpu.py \
    --workdir runs/mh --coordinator {coordinator} --num-processes {num_processes} --process-id {process_id}

Process i gets ``JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT``, ``JAX_NUM_PROCESSES=N`` and
``JAX_PROCESS_ID=i`` (PORT: ``--port`` or a free one). A ``swarmjax train`` command (also
``python -m swarmjax train``) gets ``--coordinator 127.0.0.1:PORT --num-processes N
--process-id i`` appended, unless it has ``--coordinator`` already or ``--no-cli-flags`` is
given. In any command the words ``{process_id}``, ``{num_processes}``, ``{port}`` and
``{coordinator}`` are replaced by their values (for scripts that take them as arguments).

One log per process (``--log-dir``, default ``logs/local``: ``process-<i>.log``); process 0's
output is echoed with a ``[p0]`` prefix (``--echo -1`` for none). Waits for all; the exit
status is the first non-zero one (a failure stops the others unless ``--keep-going``);
SIGTERM/SIGINT are forwarded to every process. Standard library only (never imports jax).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procgroup import ProcSpec, child_env, run_group  # noqa: E402

PLACEHOLDERS = ("{process_id}", "{num_processes}", "{port}", "{coordinator}")


def free_port(*, host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_swarmjax_train(cmd: list[str]) -> bool:
    """``swarmjax train ...`` or ``python -m swarmjax[.cli] train ...``."""
    if len(cmd) >= 2 and os.path.basename(cmd[0]) == "swarmjax":
        return cmd[1] == "train"
    if len(cmd) >= 4 and os.path.basename(cmd[0]).startswith("python") and cmd[1] == "-m":
        return cmd[2] in ("swarmjax", "swarmjax.cli") and cmd[3] == "train"
    return False


def pod_env(*, host: str, port: int, num_processes: int, process_id: int) -> dict[str, str]:
    """The JAX_* variables of one process."""
    return {"JAX_COORDINATOR_ADDRESS": f"{host}:{port}", "JAX_NUM_PROCESSES": str(num_processes),
            "JAX_PROCESS_ID": str(process_id)}


def child_argv(cmd: list[str], *, host: str, port: int, num_processes: int, process_id: int,
               cli_flags: bool = True) -> list[str]:
    """Process ``process_id``'s argv: placeholders replaced, distributed flags appended to
    ``swarmjax train`` (see the module docstring)."""
    values = {"{process_id}": str(process_id), "{num_processes}": str(num_processes), "{port}": str(port),
              "{coordinator}": f"{host}:{port}"}
    out = []
    for word in cmd:
        for key, value in values.items():
            word = word.replace(key, value)
        out.append(word)
    if cli_flags and is_swarmjax_train(out) and "--coordinator" not in out:
        out += ["--coordinator", f"{host}:{port}", "--num-processes", str(num_processes),
                "--process-id", str(process_id)]
    return out


def specs(cmd: list[str], *, n: int, host: str, port: int, log_dir: Path, cli_flags: bool = True,
          base_env: dict[str, str] | None = None) -> list[ProcSpec]:
    """The N process specs (argv, environment, log file)."""
    return [ProcSpec(argv=child_argv(cmd, host=host, port=port, num_processes=n, process_id=i, cli_flags=cli_flags),
                     env=child_env(pod_env(host=host, port=port, num_processes=n, process_id=i), base=base_env),
                     log=log_dir / f"process-{i}.log", label=f"p{i}")
            for i in range(n)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="launch/local.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python launch/local.py -n 2 -- swarmjax train --config C --workdir W")
    p.add_argument("-n", "--num-processes", type=int, required=True, help="number of processes")
    p.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="coordinator host (default 127.0.0.1)")
    p.add_argument("--log-dir", type=Path, default=Path("logs/local"), help="process-<i>.log go here")
    p.add_argument("--echo", type=int, default=0, help="echo this process's output (-1: none)")
    p.add_argument("--keep-going", action="store_true", help="a failing process does not stop the others")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL after a failure")
    p.add_argument("--no-cli-flags", action="store_true",
                   help="do not append --coordinator/--num-processes/--process-id to swarmjax train")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("no command: put it after --, e.g. -- swarmjax train --config C --workdir W")
    if args.num_processes < 1:
        p.error("-n must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    port = args.port or free_port(host=args.host)
    group = specs(args.command, n=args.num_processes, host=args.host, port=port, log_dir=args.log_dir,
                  cli_flags=not args.no_cli_flags)
    print(f"local.py: {args.num_processes} processes, coordinator {args.host}:{port}, logs in {args.log_dir}/",
          file=sys.stderr, flush=True)
    result = run_group(group, echo=args.echo if args.echo >= 0 else None, keep_going=args.keep_going,
                       grace_s=args.grace)
    print(f"local.py: exit statuses {result.returncodes}", file=sys.stderr, flush=True)
    return result.status


if __name__ == "__main__":
    sys.exit(main())
