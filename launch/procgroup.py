"""Run a group of processes side by side, one log file each: used by ``launch/local.py``
(N local JAX processes) and ``launch/tpu.py run`` (one ``gcloud ... ssh --worker=i`` per
worker). Standard library only.

Each child's stdout and stderr go, line by line, to its log file (and, for one chosen child,
to our stdout with a ``[label]`` prefix). SIGINT and SIGTERM received here are forwarded to
every live child (the children run in their own sessions, so a terminal's Ctrl-C reaches
them once, through us). When a child fails, the others get SIGTERM, then SIGKILL after a
grace period (unless ``keep_going``): one dead JAX process leaves the rest waiting on
collectives otherwise. The group's exit status is the first non-zero one, in the order the
children ended (a child killed by signal S counts as 128 + S).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ProcSpec:
    """One child: its argv, its complete environment, its log file and a label for messages."""

    argv: list[str]
    log: Path
    label: str
    env: dict[str, str] | None = None
    cwd: str | None = None


@dataclass
class GroupResult:
    """The children's exit statuses (spec order), the group's status and the order they ended."""

    returncodes: list[int]
    status: int
    ended: list[int] = field(default_factory=list)


def exit_status(returncode: int) -> int:
    """A Popen returncode as a shell exit status (-S -> 128 + S)."""
    return 128 - returncode if returncode < 0 else returncode


def _pump(proc: subprocess.Popen, log: Path, echo_prefix: str | None) -> None:
    with log.open("ab") as f:
        for line in iter(proc.stdout.readline, b""):
            f.write(line)
            f.flush()
            if echo_prefix is not None:
                sys.stdout.write(echo_prefix + line.decode(errors="replace"))
                sys.stdout.flush()
    proc.stdout.close()


def run_group(specs: list[ProcSpec], *, echo: int | None = 0, keep_going: bool = False,
              grace_s: float = 10.0, poll_s: float = 0.05) -> GroupResult:
    """Start every spec, wait for all; see the module docstring."""
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    for i, spec in enumerate(specs):
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        spec.log.write_bytes(b"")
        proc = subprocess.Popen(spec.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=spec.env, cwd=spec.cwd, start_new_session=True)
        procs.append(proc)
        t = threading.Thread(target=_pump, args=(proc, spec.log, f"[{spec.label}] " if echo == i else None),
                             daemon=True)
        t.start()
        pumps.append(t)

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    ended: list[int] = []
    status, kill_at = 0, None
    try:
        while len(ended) < len(procs):
            for i, p in enumerate(procs):
                if i in ended or p.poll() is None:
                    continue
                ended.append(i)
                code = exit_status(p.returncode)
                if code:
                    print(f"[{specs[i].label}] exited with status {code}; log: {specs[i].log}", file=sys.stderr,
                          flush=True)
                    if not status:
                        status = code
                        if not keep_going:
                            forward(signal.SIGTERM, None)
                            kill_at = time.monotonic() + grace_s
            if kill_at is not None and time.monotonic() > kill_at:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                kill_at = None
            time.sleep(poll_s)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t in pumps:
            t.join(timeout=5)
    return GroupResult([exit_status(p.returncode) for p in procs], status, ended)


def child_env(extra: dict[str, str], *, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: our environment) updated with ``extra``."""
    env = dict(os.environ if base is None else base)
    env.update(extra)
    return env
