"""A task whose agent is the user's own harness: any loop over an OpenAI-style client.

    HarnessTask(run="my_agent:solve", verify="my_agent:score", problems="my_agent:problems")

Per episode the job starts ``run(problem, client, model)`` in a thread of its own, with
``client`` an ``openai.OpenAI`` whose requests go to the job's server
(:class:`~swarmjax.serve.http.HarnessServer`, on 127.0.0.1, a free port, this episode's
key in every request's ``X-Episode-Id`` header) and ``model`` the name to send. The
harness runs its own loop (its prompts, tools and their execution, retries of its own)
and returns its final answer; ``verify(problem, answer)`` scores it (a float, the
``r_perf`` reward, or a dict of reward terms with ``"r_perf"``); a harness that scores
its own episodes returns a :class:`~swarmjax.serve.hub.Scored` instead (answer
and reward terms: an environment hub's rubric, :mod:`swarmjax.envs.verifiers`). The job trains on
exactly the ids the server sampled and rendered for its requests
(:class:`~swarmjax.serve.harness_env.HarnessEnv`).

``problems``: ``{split: [problem, ...]}``, a callable ``split -> Sequence``, an import
path of either, or a JSON-lines path with ``{split}`` in it (``data/{split}.jsonl``).
Splits: ``"train"``, ``"validation"``, ``"test"``.

A warm start needs demonstrations, and only the harness knows its prompts: a
``teacher(problem, messages, tools) -> assistant message`` (``{"content": ...,
"tool_calls": [...]}``, OpenAI's shape; a script, a rule, a stronger model's reply)
answers the harness's requests in its place (:meth:`HarnessTask.transcript`); the
teacher's turns, tokenised as a model following the chat format would sample them, are
the demonstration, which the job then plays through the harness itself. The same
transcripts give a local tokenizer its corpus.

A harness that starts sub-agents names their requests with the ``X-Agent-Id`` header
(``client.with_options(default_headers={"X-Agent-Id": name})``): sub-agents started
together are one parallel stage of the rollout, sampled with the frozen sub-agent
parameters, each ending at its first turn without tool calls; run such a job with
``role="orchestrator"`` for PARL's rewards (critical steps, spawned and finished
sub-agents; at most the job's ``max_subagents`` an episode) (:mod:`swarmjax.serve.harness_env`).

The harness's client is built with ``max_retries=0``: a retried request would be a
second turn of the stream. Each environment step waits for its harness's next request,
so give the rollout a thread per episode of a step (``rl.rollout.env_threads`` >=
``tasks_per_step * group_size``); fewer make the round trips wait in turn. Requires the ``openai`` package (``pip install openai``) and
the server's ``aiohttp``.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import inspect
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from swarmjax.envs.task import Demo, EnvContext, Task, TaskError, maybe_import, once_per_task, problem_records
from swarmjax.text.chat import ChatFormat, call_parts

__all__ = ["HarnessTask"]



def _assistant(reply: Any, *, call_id: str) -> dict:
    """A teacher's reply as an assistant message in OpenAI's shape: a str is the content;
    calls get ids and their arguments as a JSON object string."""
    if isinstance(reply, str):
        reply = {"content": reply}
    if not isinstance(reply, Mapping):
        raise TaskError(f"HarnessTask.teacher returned {type(reply).__name__}; an assistant message dict or a str")
    calls = []
    for i, call in enumerate(reply.get("tool_calls") or []):
        name, arguments = call_parts(call)
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        calls.append({"id": call.get("id") or f"{call_id}_{i}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    out = {"role": "assistant", "content": reply.get("content") or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    if reply.get("reasoning_content") is not None:
        out["reasoning_content"] = reply["reasoning_content"]
    return out


@dataclasses.dataclass(frozen=True)
class HarnessTask(Task):
    """The user's harness as a task (module docstring).

    Args:
      run: ``(problem, client, model) -> answer`` or its import path ``"module:name"``.
      verify: ``(problem, answer) -> float | dict`` or its import path; None when the harness
        returns :class:`~swarmjax.serve.hub.Scored` answers.
      problems: the problems per split (module docstring).
      model: the model name the server serves (the harness sends it).
      timeout_s: the most seconds one episode may take.
      api_key: a key the server requires (the harness's client sends it).
      corpus_text: more text to train a local tokenizer on (jobs without a tokenizer
        of their own).
      teacher: ``(problem, messages, tools) -> assistant message`` or its import path:
        the demonstrations of a warm start (module docstring); None: no warm start.
      corpus_episodes: teacher transcripts of training problems a local tokenizer reads.
    """

    run: Any
    verify: Any
    problems: Any
    model: str = "swarmjax"
    timeout_s: float = 300.0
    api_key: str | None = None
    corpus_text: tuple[str, ...] = ()
    teacher: Any = None
    corpus_episodes: int = 64

    def __repr__(self) -> str:
        # a checkpoint and summary.json record the task's repr (to refuse a resume with
        # another task, :func:`~swarmjax.envs.task.task_name`): callables by their import
        # path, not their address; long values (problems given in place) by a digest; the
        # api key hidden
        def show(name, v):
            if name == "api_key" and v is not None:
                return "'***'"
            if callable(v) and hasattr(v, "__qualname__"):
                return f"{v.__module__}:{v.__qualname__}"
            text = repr(v)
            if len(text) > 200:
                return f"<{type(v).__name__} sha1 {hashlib.sha1(text.encode()).hexdigest()[:12]}>"
            return text
        fields = ", ".join(f"{f.name}={show(f.name, getattr(self, f.name))}" for f in dataclasses.fields(self))
        return f"HarnessTask({fields})"

    def __post_init__(self):
        for name in ("run", "verify", "teacher"):
            if name in ("verify", "teacher") and getattr(self, name) is None:
                continue
            fn = maybe_import(getattr(self, name), what=f"HarnessTask.{name}")
            if not callable(fn):
                raise TaskError(f"HarnessTask.{name} is not callable: {fn!r}")
        if self.timeout_s <= 0:
            raise TaskError(f"HarnessTask.timeout_s must be > 0, got {self.timeout_s}")

    # ------------------------------------------------------------------ the task protocol
    def records(self, split: str) -> Sequence[Any]:
        """The problems of ``split``."""
        return problem_records(self.problems, split, what="HarnessTask.problems")

    def corpus(self) -> list[str]:
        """What a local tokenizer trains on: ``corpus_text``, the training problems and,
        with a teacher, the first ``corpus_episodes`` transcripts (every request's
        messages and tools, every reply)."""
        texts = [*self.corpus_text, *map(str, self.records("train"))]
        if self.teacher is not None:
            for problem in list(self.records("train"))[:self.corpus_episodes]:
                for request, reply in self.transcript(problem):
                    texts += [json.dumps(list(request.messages), ensure_ascii=False),
                              json.dumps(list(request.tools), ensure_ascii=False), json.dumps(reply, ensure_ascii=False)]
        return texts

    def demonstration(self, problem: Any, chat: ChatFormat, rng: Any, *, role: str = "single",
                      summarize: bool = False) -> Demo | None:
        """The teacher's turns of ``problem`` (None without a teacher): each its message as
        a model following ``chat`` samples it (:meth:`~swarmjax.text.chat.ChatFormat.assistant_ids`)."""
        if self.teacher is None or role != "single" or summarize:
            return None
        return Demo([chat.assistant_ids(reply.get("content") or "", reply.get("tool_calls") or [],
                                        reasoning=reply.get("reasoning_content"))
                     for _, reply in self.transcript(problem)])

    def transcript(self, problem: Any) -> list[tuple[Any, dict]]:
        """The harness run on ``problem`` with the teacher answering its requests:
        [(request, the teacher's reply)] in order. Raises :class:`TaskError` when the
        harness raises or passes ``timeout_s``."""
        from swarmjax.serve.hub import Finished
        from swarmjax.serve.protocol import completion

        teacher = maybe_import(self.teacher, what="HarnessTask.teacher")
        hub, server = self.server()
        episode = hub.open()
        deadline = time.monotonic() + self.timeout_s
        self._launcher()(problem, episode)
        out = []
        try:
            while True:
                event = episode.next_event(deadline - time.monotonic())
                if event is None:
                    raise TaskError(f"HarnessTask: the harness took over {self.timeout_s:g} s with the teacher")
                if isinstance(event, Finished):
                    if event.error is not None:
                        raise TaskError(f"HarnessTask: the harness raised {event.error} with the teacher")
                    return out
                reply = _assistant(teacher(problem, list(event.request.messages), list(event.request.tools)),
                                   call_id=f"call_{len(out)}")   # no random key: the corpus is made of these
                out.append((event.request, reply))
                event.respond(200, completion(reply, model=self.model, request_id=f"teacher-{len(out)}",
                                              prompt_tokens=0, completion_tokens=0, truncated=False))
        finally:
            hub.close(episode)

    def score(self, problem: Any, answer: str) -> dict[str, float]:
        """``verify(problem, answer)`` as reward terms (a float is ``r_perf``)."""
        if self.verify is None:
            raise TaskError("HarnessTask.verify is None, so its harness scores its own episodes: it returns "
                            f"swarmjax.serve.hub.Scored(answer, rewards), not {type(answer).__name__}")
        out = maybe_import(self.verify, what="HarnessTask.verify")(problem, answer)
        if isinstance(out, Mapping):
            if "r_perf" not in out:
                raise TaskError(f"HarnessTask.verify returned {dict(out)!r}: a dict of reward terms holds 'r_perf'")
            return {k: float(v) for k, v in out.items()}
        return {"r_perf": float(out)}

    def env(self, problem: Any, ctx: EnvContext):
        """A :class:`~swarmjax.serve.harness_env.HarnessEnv` on this task's server."""
        from swarmjax.serve.harness_env import HarnessEnv

        hub, server = self.server()
        return HarnessEnv(ctx.chat, hub, self._launcher(), verify=self.score,
                          model=self.model, timeout=self.timeout_s, context=ctx.context,
                          max_subagents=ctx.max_subagents)

    # ------------------------------------------------------------------ the server and the harness
    def server(self):
        """(hub, server) of this task in this process, started on first use."""
        return once_per_task(self, "harness server", self._start_server)

    def _start_server(self):
        from swarmjax.serve.http import HarnessServer
        from swarmjax.serve.hub import Hub

        hub = Hub()
        server = HarnessServer(hub, model=self.model, api_key=self.api_key).start()
        atexit.register(server.stop)
        return hub, server

    def _launcher(self) -> Callable:
        """``launch(problem, episode)``: the harness in a thread of its own (one per task
        object and process)."""
        return once_per_task(self, "harness launcher", self._make_launcher)

    def _make_launcher(self) -> Callable:
        _, server = self.server()
        try:
            import openai
        except ImportError:
            raise TaskError("HarnessTask needs the openai client: pip install openai") from None
        from swarmjax.serve.http import EPISODE_HEADER

        run = maybe_import(self.run, what="HarnessTask.run")
        takes_model = len(inspect.signature(run).parameters) >= 3
        # one HTTP connection pool for the episodes; each gets a view of it with its own key
        # (``with_options`` shares the underlying client: building one a thread costs ~50 ms)
        base = openai.OpenAI(base_url=server.base_url, api_key=self.api_key or "unused", max_retries=0,
                             timeout=self.timeout_s)

        def launch(problem: Any, episode) -> None:
            client = base.with_options(default_headers={EPISODE_HEADER: episode.key})

            def harness():
                try:
                    answer = run(problem, client, self.model) if takes_model else run(problem, client)
                except BaseException as e:  # noqa: BLE001 - the episode records it and scores 0
                    episode.finish(error=e)
                else:
                    episode.finish(answer)


            threading.Thread(target=harness, name=f"harness-{episode.key[:8]}", daemon=True).start()
        return launch
