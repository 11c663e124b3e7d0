"""An OpenEnv environment as a task: Gym-style reset/step to an environment server.

    OpenEnvTask(app="guess_env:app", problems="guess_env:problems", system="Guess the number ...")

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ (``pip install openenv-core``) serves
an ``Environment`` (``reset(**kwargs) -> Observation``, ``step(Action) -> Observation``
with ``done`` and ``reward``) behind a FastAPI app; a client holds one WebSocket session
per episode. The task:

* starts the app as a local process (``python -m uvicorn <app>`` on 127.0.0.1, on a port
  it binds itself and hands over, so no other process can take it), waits for its
  ``/health``, and stops it when the job's process ends; or talks to a server already
  running (``base_url``, e.g. one in a container);
* per episode opens a session (:class:`OpenEnvEnv`): ``reset(**problem)`` (a problem is
  the reset's keyword arguments, e.g. ``{"seed": 7}``), the observation's text as the
  first user turn (after ``system``); each sampled turn's visible text (the think block
  and stop id left out) becomes the action, ``{action: text}``; the next observation is
  the next user turn. Token-in-token-out: the turn's ids are kept as sampled, only the
  observation's text is tokenised (:meth:`~swarmjax.text.chat.ChatFormat.continuation_ids`);
* sums the environment's step rewards into ``r_perf`` (a ``None`` reward is 0); the
  episode ends when the environment says ``done`` (its session closed then), or when the
  rollout's context limit ends it (its session closed when the environment object is
  collected: the rollout has no close hook).

An error from the server during a step (a refused action, a lost connection) ends the
episode with ``env_error`` 1 and no further reward: a session whose reply may be late is
not reusable (the next step would read the late reply). A server that cannot start an
episode (connect or reset fails) raises :class:`~swarmjax.envs.task.TaskError`.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import dataclasses
import os
import socket
import subprocess
import sys
import time
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from swarmjax.envs.api import Step, SubAgentResult
from swarmjax.envs.task import EnvContext, Task, TaskError, maybe_import, once_per_task, problem_records
from swarmjax.text.chat import ChatFormat
from swarmjax.text.toolcalls import parse_turn

__all__ = ["OpenEnvTask", "OpenEnvEnv", "EnvServer"]

_LOG = logging.getLogger(__name__)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EnvServer:
    """An OpenEnv app served by uvicorn in a child process on 127.0.0.1.

    The listening socket is bound here (port 0: a free one) and passed to uvicorn
    (``--fd``), so the port cannot be taken between choosing and serving it. ``start()``
    returns once ``GET /health`` answers; the server's output goes to ``log`` (a path;
    default: discarded)."""

    def __init__(self, app: str, *, pythonpath: Sequence[str] = (), log: str | None = None,
                 ready_timeout: float = 60.0, ws_max_mb: int = 64):
        self.app, self.pythonpath, self.log = app, list(pythonpath), log
        self.ready_timeout, self.ws_max_mb = ready_timeout, ws_max_mb
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def start(self) -> "EnvServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("NO_PROXY", "127.0.0.1,localhost")
        out = open(self.log, "a") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", self.app, "--fd", str(sock.fileno()), "--log-level", "warning",
                 "--ws-max-size", str(self.ws_max_mb << 20)],
                pass_fds=(sock.fileno(),), env=env, stdout=out, stderr=out, start_new_session=True)
        finally:
            sock.close()
            if out is not subprocess.DEVNULL:
                out.close()
        self.base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise TaskError(f"the OpenEnv server {self.app!r} exited with code {self.proc.returncode} before "
                                f"it answered /health" + (f" (its log: {self.log})" if self.log else
                                                          " (give OpenEnvTask.server_log to see why)"))
            try:
                with _DIRECT.open(self.base_url + "/health", timeout=1.0):   # 127.0.0.1: never through a proxy
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TaskError(f"the OpenEnv server {self.app!r} did not answer /health within "
                                    f"{self.ready_timeout:g} s") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the server (killed after 10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _text(observation: Mapping[str, Any], spec: str | Callable) -> str:
    """The text of an observation: ``spec(observation)`` or its field ``spec``."""
    if callable(spec):
        return str(spec(observation))
    if spec not in observation:
        raise TaskError(f"the observation has no field {spec!r} (it has {', '.join(map(repr, observation)) or 'none'}); "
                        "set OpenEnvTask.observation to its text field or a function of the observation")
    return str(observation[spec])


class OpenEnvEnv:
    """One episode over an OpenEnv session: a :class:`~swarmjax.envs.api.HostEnv`
    (module docstring).

    Args:
      chat: the chat format (tokenizer inside).
      connect: ``() -> client``, a synchronous OpenEnv client (``reset(**kw)``,
        ``step(action)`` returning ``StepResult(observation, reward, done)``, ``close()``).
      system: the system turn (None: none).
      observation: the observation's text field, or ``observation -> str``.
      action: the action's text field, or ``text -> action dict``.
    """

    def __init__(self, chat: ChatFormat, connect: Callable[[], Any], *, system: str | None = None,
                 observation: str | Callable = "text", action: str | Callable = "text"):
        self.chat, self.connect, self.system = chat, connect, system
        self.observation, self.action = observation, action
        self.client: Any = None
        self._finalizer: weakref.finalize | None = None

    def reset(self, task: Any) -> np.ndarray:
        """Open a session and reset it with ``task`` (keyword arguments). -> [P] int32:
        the system turn and the first observation as a user turn, then the generation prompt."""
        self.close()
        try:
            self.client = self.connect()
            self._finalizer = weakref.finalize(self, _close_quietly, self.client)   # a cut episode closes too
            result = self.client.reset(**dict(task or {}))
        except Exception as e:  # noqa: BLE001 - one line that names the episode
            self.close()
            raise TaskError(f"the OpenEnv server could not start an episode of {task!r}: "
                            f"{type(e).__name__}: {e}") from e
        messages = ([{"role": "system", "content": self.system}] if self.system is not None else []) + [
            {"role": "user", "content": _text(result.observation, self.observation)}]
        return self.chat.prompt_ids(messages)

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """Send the turn's [T] visible text as the action; the next observation as a user
        turn (reply ids [R]), or the end (``done``, an error)."""
        turn = np.asarray(turn, np.int32).reshape(-1)
        text = parse_turn(self.chat.tokenizer.decode(turn), {}, syntax=self.chat.call_syntax).content
        action = self.action(text) if callable(self.action) else {self.action: text}
        try:
            result = self.client.step(action)
        except Exception as e:  # noqa: BLE001 - a server's refusal or a lost session ends the episode
            _LOG.warning("OpenEnv step failed, the episode ends with env_error: %s", e)
            self.close()
            return Step(done=True, answer=text, rewards={"r_perf": 0.0, "env_error": 1.0,
                                                         "truncated": float(truncated)})
        reward = float(result.reward or 0.0)
        if result.done:
            self.close()
            return Step(done=True, answer=text, rewards={"r_perf": reward, "env_error": 0.0,
                                                         "truncated": float(truncated)})
        reply = np.concatenate([self.chat.after_turn_ids(turn), self.chat.continuation_ids(
            [{"role": "user", "content": _text(result.observation, self.observation)}])])
        return Step(reply=reply.astype(np.int32), rewards={"r_perf": reward})

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        raise RuntimeError("an OpenEnv episode starts no sub-agents")

    def close(self) -> None:
        """Close the session (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()
        self.client = self._finalizer = None


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - a session the server already dropped
        pass


@dataclasses.dataclass(frozen=True)
class OpenEnvTask(Task):
    """An OpenEnv environment as a task (module docstring).

    Args:
      problems: the reset arguments per split: ``{split: [kwargs, ...]}``, a callable
        ``split -> Sequence``, an import path of either, or a JSON-lines path with
        ``{split}`` in it.
      app: the environment's FastAPI app as an import path (``"my_env.server:app"``), served
        in a child process; or None with ``base_url``.
      base_url: a running OpenEnv server (``http://host:port``) instead of ``app``.
      pythonpath: directories the child process imports ``app`` from.
      system: the system turn of every episode.
      observation: the observation's text field, or ``"module:function"`` of the observation.
      action: the action's text field, or ``"module:function"`` from the turn's text to the
        action dict.
      corpus_episodes: first observations of training problems a local tokenizer reads.
      corpus_text: more text for a local tokenizer.
      timeout_s: seconds to wait for one reply of the server.
      server_log: a file the child server's output is appended to (None: discarded).
    """

    problems: Any
    app: str | None = None
    base_url: str | None = None
    pythonpath: tuple[str, ...] = ()
    system: str | None = None
    observation: Any = "text"
    action: Any = "text"
    corpus_episodes: int = 32
    corpus_text: tuple[str, ...] = ()
    timeout_s: float = 60.0
    server_log: str | None = None

    def __post_init__(self):
        if (self.app is None) == (self.base_url is None):
            raise TaskError("OpenEnvTask takes one of app= (an import path 'module:app', served here) or base_url= "
                            "(a running server)")
        if self.timeout_s <= 0:
            raise TaskError(f"OpenEnvTask.timeout_s must be > 0, got {self.timeout_s}")
        if importlib.util.find_spec("openenv") is None:
            raise TaskError("OpenEnvTask needs OpenEnv's client: pip install openenv-core")

    def records(self, split: str) -> Sequence[Any]:
        """The reset arguments of ``split``'s episodes."""
        return problem_records(self.problems, split, what="OpenEnvTask.problems")

    def url(self) -> str:
        """The server's base URL, starting ``app`` on first use (one server per task object
        and process, stopped at exit)."""
        if self.base_url is not None:
            return self.base_url.rstrip("/")
        return once_per_task(self, "openenv server", self._start_server).base_url

    def _start_server(self) -> EnvServer:
        server = EnvServer(self.app, pythonpath=self.pythonpath, log=self.server_log).start()
        atexit.register(server.stop)
        return server

    def connect(self) -> Any:
        """A connected synchronous client of a new session."""
        from openenv.core import GenericEnvClient

        client = GenericEnvClient(base_url=self.url(), message_timeout_s=self.timeout_s).sync()
        try:
            client.connect()
        except Exception:
            _close_quietly(client)              # its event-loop thread too
            raise
        return client

    def env(self, problem: Any, ctx: EnvContext) -> OpenEnvEnv:
        """An :class:`OpenEnvEnv` on this task's server."""
        if ctx.role != "single":
            raise TaskError("OpenEnvTask runs as a single agent (role='single')")
        return OpenEnvEnv(ctx.chat, self.connect, system=self.system,
                          observation=maybe_import(self.observation, what="OpenEnvTask.observation"),
                          action=maybe_import(self.action, what="OpenEnvTask.action"))

    def corpus(self) -> list[str]:
        """What a local tokenizer trains on: ``corpus_text``, the system turn, and the first
        observation of the first ``corpus_episodes`` training problems."""
        texts = [*self.corpus_text, *([self.system] if self.system else [])]
        observation = maybe_import(self.observation, what="OpenEnvTask.observation")
        client = self.connect()
        try:
            for problem in list(self.records("train"))[:self.corpus_episodes]:
                texts.append(_text(client.reset(**dict(problem)).observation, observation))
        finally:
            _close_quietly(client)
        return texts
