"""A `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment as a task.

    VerifiersTask(taskset="my_env:config")       # a verifiers TasksetConfig (its tasks, tools, rewards)

verifiers (``pip install verifiers``, 0.4: ``verifiers.v1``) describes an environment as a
*taskset* (typed tasks, their MCP toolsets, ``@vf.reward`` functions) played by a
*harness*: a program that runs the chat loop against an OpenAI-compatible endpoint while
verifiers' interception server relays its requests. So a verifiers episode is a harness
in swarmjax's sense (:mod:`swarmjax.envs.harness`): per episode the job runs
``vf.Agent(...).run(task)`` in a thread of its own, pointed at the job's chat server
with the episode's key in every request's header; the server samples every turn with
the policy and records the exact ids (:class:`~swarmjax.serve.harness_env.HarnessEnv`);
verifiers runs the tools and scores the trace with the taskset's rubric, which becomes
the reward: ``r_perf`` is the trace's weighted reward, each named reward and metric is
a reward term ``vf_<name>``, and ``env_error`` counts rollouts verifiers marked as failed
(an error, a timeout: reward 0).

The harness is verifiers' own chat program (the built-in ``null`` harness: tools over
MCP, the taskset's system prompt), run with this interpreter: the packages it needs come
with verifiers, and the built-in harnesses' first use would otherwise install ``uv`` and
download them (:func:`local_chat_harness`). Tasks run in ``SubprocessConfig`` runtimes,
on this machine.

Splits: a taskset has no train / test split of its own, so ``splits`` maps each of
``"train"``, ``"validation"``, ``"test"`` to a slice of its tasks (``"0:200"``, ``":"``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from swarmjax.envs.task import EnvContext, Task, TaskError, maybe_import, once_per_task
from swarmjax.text.chat import ChatFormat

__all__ = ["VerifiersTask", "local_chat_harness"]

_LOG = logging.getLogger(__name__)
KEY_VARIABLE = "SWARMJAX_VERIFIERS_UPSTREAM_KEY"   # verifiers reads the endpoint's key from a variable
SCORING_MARGIN_S = 60.0      # an episode's time past verifiers' rollout timeout: its rubric's scoring


def _slice(spec: str, *, what: str) -> slice:
    try:
        parts = [int(p) if p.strip() else None for p in spec.split(":")]
        if len(parts) != 2:
            raise ValueError
    except ValueError:
        raise TaskError(f"{what}: {spec!r} is not a slice 'start:stop' (e.g. '0:200', ':')") from None
    return slice(*parts)


class _LocalScripts:
    """A verifiers runtime whose PEP 723 scripts run with this interpreter (which has
    their packages: they are verifiers' own) instead of a ``uv`` environment."""

    def __init__(self, runtime: Any):
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: Mapping[str, str] | None = None, *,
                                activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f"swarmjax-program-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]


@functools.cache
def _local_harness_class() -> type:
    from verifiers.v1.harnesses.null import NullHarness

    class LocalChatHarness(NullHarness):
        async def setup(self, runtime: Any) -> None:
            await super().setup(_LocalScripts(runtime))

        async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kwargs: Any) -> Any:
            return await super().launch(ctx, trace, _LocalScripts(runtime), *args, **kwargs)
    return LocalChatHarness


def local_chat_harness(config: Any) -> Any:
    """verifiers' ``null`` harness (its chat + MCP program) whose program runs with this
    interpreter (module docstring): a subclass of it, built on first use (so this module
    imports without verifiers), with ``config`` (a ``vf.HarnessConfig``)."""
    return _local_harness_class()(config)


@dataclasses.dataclass(frozen=True)
class VerifiersTask(Task):
    """A verifiers taskset as a task (module docstring).

    Args:
      taskset: a ``verifiers.v1.TasksetConfig`` (its ``id`` names the installed taskset
        package), or the import path ``"module:name"`` of one or of a function returning one.
      splits: ``{split: "start:stop"}``, the slice of the taskset's tasks each split plays.
      max_turns: the most model calls of one episode (verifiers' ``AgentConfig.max_turns``).
      timeout_s: verifiers' rollout timeout; the episode may take ``SCORING_MARGIN_S`` more
        (the rubric's scoring).
      tool_timeout_s: seconds one tool call may take.
      model: the model name the server serves.
      corpus_text: more text for a local tokenizer (it reads the tasks' prompts and
        system prompts and the tool schemas already).
      pythonpath: directories the taskset package is imported from, here and in the
        processes verifiers starts (its tool servers); added to ``sys.path`` and
        ``PYTHONPATH``.
    """

    taskset: Any
    splits: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: {"train": ":", "validation": ":", "test": ":"})
    max_turns: int = 8
    timeout_s: float = 300.0
    tool_timeout_s: float = 60.0
    model: str = "swarmjax"
    corpus_text: tuple[str, ...] = ()
    pythonpath: tuple[str, ...] = ()

    def __post_init__(self):
        if importlib.util.find_spec("verifiers") is None:
            raise TaskError("VerifiersTask needs verifiers: pip install 'verifiers>=0.4,<0.5'")
        for split, spec in self.splits.items():
            _slice(spec, what=f"VerifiersTask.splits[{split!r}]")
        if self.max_turns < 1 or self.timeout_s <= 0:
            raise TaskError(f"VerifiersTask: max_turns >= 1 and timeout_s > 0, got {self.max_turns}, {self.timeout_s}")

    # ------------------------------------------------------------------ the task protocol
    def tasks(self) -> list:
        """The taskset's tasks (loaded once per task object and process)."""
        return once_per_task(self, "verifiers tasks", self._load_tasks)

    def _load_tasks(self) -> list:
        from verifiers.v1.utils.loaders import load_taskset

        for path in map(os.path.abspath, self.pythonpath):
            if path not in sys.path:
                sys.path.insert(0, path)
            if path not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))
        config = maybe_import(self.taskset, what="VerifiersTask.taskset")
        if callable(config) and not hasattr(config, "model_dump"):
            config = config()                  # a factory
        elif isinstance(config, type):
            config = config()                  # a TasksetConfig class with its defaults
        if not getattr(config, "id", None):
            raise TaskError(f"VerifiersTask.taskset: {config!r} is not a verifiers TasksetConfig with an id "
                            "(the installed taskset package's name)")
        tasks = list(load_taskset(config))
        if not tasks:
            raise TaskError(f"the verifiers taskset {config.id!r} has no tasks")
        return tasks

    def records(self, split: str) -> Sequence[int]:
        """The indices of ``split``'s tasks in the taskset."""
        if split not in self.splits:
            raise TaskError(f"VerifiersTask.splits has no {split!r} (it has {', '.join(self.splits)})")
        return list(range(len(self.tasks())))[_slice(self.splits[split], what=f"VerifiersTask.splits[{split!r}]")]

    def corpus(self) -> list[str]:
        """The tasks' prompts and system prompts, their tools' schemas, and ``corpus_text``."""
        import json

        texts = list(self.corpus_text)
        for task in self.tasks():
            data = task.data
            texts += [str(x) for x in (data.prompt, getattr(data, "system_prompt", None)) if x]
            for toolset in type(task).toolsets(task.config) if hasattr(type(task), "toolsets") else ():
                texts += [json.dumps(t, default=str) for t in _tool_schemas(toolset)]
        return texts

    def env(self, problem: int, ctx: EnvContext):
        """The harness environment of one episode (:meth:`HarnessTask.env`)."""
        return self._harness_task().env(problem, ctx)

    def demonstration(self, problem: Any, chat: ChatFormat, rng: Any, *, role: str = "single",
                      summarize: bool = False) -> None:
        return None

    # ------------------------------------------------------------------ one episode
    def _harness_task(self):
        from swarmjax.envs.harness import HarnessTask

        # the episode's limit: verifiers' rollout, then its scoring
        return once_per_task(self, "harness task", lambda: HarnessTask(
            run=self.run_episode, verify=None, problems={}, model=self.model,
            timeout_s=self.timeout_s + SCORING_MARGIN_S))

    def run_episode(self, problem: int, client: Any, model: str):
        """One verifiers rollout of task ``problem`` against ``client``'s endpoint (its
        headers, the episode's key among them, on every request). -> the last reply and
        the rubric's reward terms (:class:`~swarmjax.serve.hub.Scored`)."""
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import TimeoutConfig

        from swarmjax.serve.hub import Scored
        from swarmjax.serve.http import EPISODE_HEADER

        os.environ.setdefault(KEY_VARIABLE, client.api_key or "unused")
        headers = {EPISODE_HEADER: client.default_headers[EPISODE_HEADER]}
        agent = vf.Agent(vf.AgentConfig(
            model=model, runtime=vf.SubprocessConfig(), harness=vf.HarnessConfig(id="null", tool_timeout=self.tool_timeout_s),
            max_turns=self.max_turns, timeout=TimeoutConfig(rollout=self.timeout_s),
            client=vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var=KEY_VARIABLE,
                                       headers=headers)))
        agent.harness = local_chat_harness(agent.harness.config)   # verifiers resolves harnesses by package id only
        trace = asyncio.run(agent.run(self.tasks()[problem]))
        if not trace.ok:
            _LOG.warning("verifiers rollout of task %s failed (%s): %s", problem, trace.stop_condition,
                         "; ".join(str(getattr(e, "message", e))[:300] for e in trace.errors))
        rewards = {"r_perf": float(trace.reward or 0.0), "env_error": float(not trace.ok)}
        rewards.update({f"vf_{k}": float(r.score) for k, r in (trace.rewards or {}).items() if r is not None})
        rewards.update({f"vf_{k}": float(v) for k, v in (trace.metrics or {}).items()
                        if isinstance(v, (int, float))})
        return Scored(trace.last_reply or "", rewards)


def _tool_schemas(toolset: Any) -> list:
    """The schemas a toolset advertises, where it lists them without starting (else none)."""
    tools = getattr(toolset, "tools", None)
    try:
        return list(tools() if callable(tools) else tools or [])
    except Exception:  # noqa: BLE001 - a toolset that needs its server to list its tools
        return []
