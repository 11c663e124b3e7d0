"""Tasks as plug-ins: what a task provides to ``swarmjax train``, and how a config names one.

A *task* is one object. ``swarmjax train`` reaches it through a config field
``task=``, which holds either

* the object itself (``task=UnitsTask(max_value=50)`` in the config file),
* an import path ``"package.module:Name"`` (``Name`` is a class or a factory taking no
  arguments, or an instance), or
* the name of a built-in task (:data:`TASKS`: ``"arith"``, ``"widesearch"``, ``"relay"``,
  ``"widesearch-tokens"``: the token world, whose engine is ``"token"``).

Adding a task edits no file of swarmjax. The task object provides (duck-typed; the
:class:`Task` base class only supplies the defaults of the optional methods):

Required:

* the **stream**, one of

  - ``sample(rng, count, *, split) -> list[problem]``: a seeded generator
    (``rng``: ``np.random.Generator``; its state goes into the job's checkpoints), or
  - ``records(split) -> Sequence[problem]``: a dataset (a list, :func:`jsonl_records`
    of a JSON-lines file, a grain ``RandomAccessDataSource`` or a TFDS
    ``tfds.data_source``: anything with ``len`` and ``[i]``);

  with ``split`` one of :data:`SPLITS` (``"train"`` for training, ``"validation"``
  for the periodic evaluations and the choice of the best checkpoint, ``"test"`` for
  the final table);
* the **environment**: either ``env(problem, ctx) -> HostEnv``, or the three pieces the
  generic tool agent (:class:`~swarmjax.envs.tool_env.ToolAgentEnv`) is built from:
  ``tools() -> list[Tool]``, ``messages(problem) -> list[dict]`` (the first prompt's
  system / user turns) and ``verify(problem, answer_text) -> dict[str, float]``
  (reward terms; ``"r_perf"`` is the task reward, the rest are logged); a *stateful*
  task gives ``messages`` and ``world(problem)`` instead of ``tools`` and ``verify``:
  a fresh object per episode whose ``tools()`` act on its state (the orchestrator and
  its sub-agents share it) and whose ``verify(answer_text)`` can read the final state.

Optional:

* ``demonstration(problem, chat, rng, *, role) -> Demo | list[turns] | None``: scripted
  turns (ids as a model would sample them) for a warm start; ``role`` is ``"single"``
  or ``"orchestrator"`` (sub-agents' scripts in :attr:`Demo.workers`); with the
  ``"summary"`` context strategy it is called with ``summarize=True`` as well, and its
  turns may call the ``summarize`` tool (the conversation restarts from the summary);
* ``demonstration_set(count, seed, chat) -> list[(problem, Demo)]``: a task that draws
  its demonstrations' problems and scripts together (from one seeded generator) gives
  ``count`` of them here, in place of ``demonstration`` over the train stream's problems;
* ``stream(split, seed)``: a task that draws its problems its own way (e.g. a share of
  large tasks, held-out tasks per size) gives each split's stream here, an object with
  ``take(count)``, ``ids(count)``, ``state()`` and ``restore(state)`` (e.g.
  :class:`ReplayStream`), in place of ``sample``'s;
* ``held_out(split, seed, count) -> list[problem]``: a task that picks its held-out
  problems its own way (e.g. the first of each size of a dataset) gives them here, in
  place of the first ``count`` of ``split``'s stream;
* ``prepare(workdir, *, progress) -> task``: a task whose problems live in a dataset it
  builds once (the token world's TFDS task set) builds it here, under the workdir, and
  returns itself bound to it (the job calls it on one process first);
* ``corpus() -> list[str]``: text to train a local tokenizer on (jobs with no
  tokenizer of their own);
* ``subagent_messages(system_prompt, prompt) -> list[dict]``: a sub-agent's first turns
  (default: the orchestrator's ``system_prompt`` and its ``prompt`` as the user turn);
* ``size(problem) -> int``: how large a problem is (>= 1; e.g. the entities of a wide
  search), the ``task_size`` of its orchestration traces (default 1);
* ``judge_text(problem) -> str``: the task as an LLM judge reads it (default: the last
  user message of ``messages(problem)``; :mod:`swarmjax.rl.judge`);
* ``reference(problem) -> str``: a reference answer, shown to a judge whose reward
  asks for one (``JudgeReward.reference``);
* ``device_task(chat) -> DeviceTask``: the task's *device twin*
  (:mod:`swarmjax.envs.device_api`: its tools parsed and answered inside the jitted
  swarm, :class:`~swarmjax.swarm.text_engine.TextSwarm`), what a job with
  ``engine="device"`` rolls out (:func:`device_twin`); its episodes are the problems of
  the task's stream and score as the task's own environments do.

Roles: a job runs the task as a single agent, or as an orchestrator that may
``create_subagent`` / ``assign_task`` (:mod:`swarmjax.envs.orchestration`); its
sub-agents have the task's own tools (:func:`make_env`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from swarmjax.envs.api import HostEnv
from swarmjax.envs.orchestration import Orchestration
from swarmjax.envs.tool_env import ToolAgentEnv
from swarmjax.text.chat import ChatFormat
from swarmjax.text.runner import ToolRunner

SPLITS = ("train", "validation", "test")
ROLES = ("single", "orchestrator")
Messages = list[dict[str, Any]]

# built-in tasks: name -> import path (imported when asked for, so this module stays light)
TASKS: dict[str, str] = {"arith": "swarmjax.envs.arith:ArithTask",
                         "widesearch": "swarmjax.envs.widesearch_text:WideSearchTask",
                         "relay": "swarmjax.envs.widesearch_relay:RelayWideSearchTask",
                         "widesearch-tokens": "swarmjax.envs.widesearch_token_task:WideSearchTokens"}

ORCHESTRATOR_NOTE = ("You may create sub-agents with create_subagent and give each a self-contained task "
                     "with assign_task; the assign_task calls of one turn run in parallel and their "
                     "answers come back together. Sub-agents have your tools.")


class TaskError(ValueError):
    """A task that cannot be used: the message names the task and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Demo:
    """A scripted episode for the warm start: the agent's ``turns`` (each a list of ids
    ending with its stop id) and, for an orchestrator, one script per sub-agent it
    starts (in spawn order over its stages)."""

    turns: Sequence[Sequence[int]]
    workers: Sequence[Sequence[Sequence[int]]] = ()


@dataclasses.dataclass(frozen=True)
class EnvContext:
    """What the job gives a task's environments: the chat format (tokenizer inside), the
    shared tool runner (thread pool, timeout), the role, for an orchestrator the most
    sub-agent assignments per episode, whether the agent has the ``summarize`` tool
    (the rollout's ``"summary"`` context strategy: :mod:`swarmjax.swarm.context`), and
    the agent's context in ids where the engine bounds it (None: not known)."""

    chat: ChatFormat
    runner: ToolRunner
    role: str = "single"
    max_subagents: int = 4
    summarize: bool = False
    context: int | None = None


class Task:
    """Optional base class of a task plug-in: the optional methods' defaults (see the
    module docstring for the whole protocol)."""

    def demonstration(self, problem: Any, chat: ChatFormat, rng: np.random.Generator, *,
                      role: str = "single", summarize: bool = False) -> Demo | None:
        return None

    def subagent_messages(self, system_prompt: str, prompt: str) -> Messages:
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]


def check_device_twin(task: Any) -> None:
    """Raise :class:`TaskError` (one line) when ``task`` has no device twin
    (``device_task(chat)``, module docstring)."""
    if not callable(getattr(task, "device_task", None)):
        raise TaskError(f"task {task_name(task)} has no device twin (a device_task(chat) method): engine='device' "
                        "runs tasks whose tools run inside the jitted swarm (built in: relay); use engine='host'")


def device_twin(task: Any, chat: ChatFormat) -> Any:
    """``task.device_task(chat)``: the task's device twin over ``chat`` (module
    docstring). Raises :class:`TaskError` (one line) for a task without one."""
    check_device_twin(task)
    return task.device_task(chat)


def problem_size(task: Any, problem: Any) -> int:
    """``task.size(problem)`` when the task has it, else 1 (module docstring)."""
    fn = getattr(task, "size", None)
    return max(int(fn(problem)), 1) if callable(fn) else 1


def problem_text(task: Any, problem: Any, *, reference: bool = False) -> str:
    """What a judge reads as the task: ``task.judge_text(problem)`` when the task has it,
    else the last user message of ``task.messages(problem)``, else ``str(problem)``;
    with ``reference``, followed by the task's ``reference(problem)`` answer."""
    fn = getattr(task, "judge_text", None)
    if callable(fn):
        text = str(fn(problem))
    else:
        messages = getattr(task, "messages", None)
        users = [m["content"] for m in messages(problem) if m.get("role") == "user"] if callable(messages) else []
        text = str(users[-1]) if users else str(problem)
    if not reference:
        return text
    ref = getattr(task, "reference", None)
    if not callable(ref):
        raise ValueError(f"the judge asks for a reference answer, but task {task_name(task)} has no "
                         "reference(problem) method")
    return f"{text}\n\nReference answer:\n{ref(problem)}"


def task_name(task: Any) -> str:
    """A stable name of a task object (its class; a dataclass's repr holds its settings):
    what a checkpoint records to refuse a resume with another task."""
    kind = f"{type(task).__module__}.{type(task).__qualname__}"
    return repr(task) if dataclasses.is_dataclass(task) else kind


def check_task(task: Any, *, name: str | None = None) -> Any:
    """``task`` if it provides the protocol (module docstring), else one
    :class:`TaskError` naming every missing method."""
    label = name or type(task).__name__
    missing = []
    if not has_stream(task):
        missing.append("a stream: sample(rng, count, *, split) or records(split)")
    if not callable(getattr(task, "env", None)):
        needs = ("messages",) if callable(getattr(task, "world", None)) else ("tools", "messages", "verify")
        missing += [m for m in needs if not callable(getattr(task, m, None))]
    if missing:
        raise TaskError(f"task {label!r} lacks {', '.join(missing)} (see swarmjax.envs.task)")
    return task


def resolve_task(spec: Any) -> Any:
    """The task object a config's ``task=`` names: an object (checked), a built-in name
    (:data:`TASKS`) or an import path ``"module:Name"``. Raises :class:`TaskError` with
    one line for a name that does not resolve or an object that lacks a method."""
    if not isinstance(spec, str):
        return check_task(spec)
    path = TASKS.get(spec, spec)
    if ":" not in path:
        raise TaskError(f"unknown task {spec!r}: give a built-in name ({', '.join(sorted(TASKS))}) or an "
                        f"import path 'package.module:Name'")
    obj = import_object(path, what=f"task {spec!r}")
    attr = path.partition(":")[2]
    if isinstance(obj, type) or (callable(obj) and not has_stream(obj)):
        try:
            obj = obj()
        except TypeError as e:
            raise TaskError(f"task {spec!r}: {attr}() needs arguments ({e}); construct it in the config "
                            "file instead (task=...)") from None
    return check_task(obj, name=spec)


def import_object(path: str, *, what: str) -> Any:
    """The object an import path ``"package.module:Name"`` (``Name`` may be dotted) names.
    Raises :class:`TaskError` with one line, naming ``what`` the path is for."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TaskError(f"{what}: {path!r} is not an import path 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise TaskError(f"{what}: cannot import {module_name!r} ({e}); is its directory on "
                        f"PYTHONPATH or beside the config file?") from None
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise TaskError(f"{what}: module {module_name!r} has no {attr!r}") from None
    return obj


def has_generator(task: Any) -> bool:
    """Whether ``task`` draws its problems (``sample``) rather than reading records."""
    return callable(getattr(task, "sample", None))


def has_stream(obj: Any) -> bool:
    """Whether ``obj`` has a stream of problems: ``sample``, ``records`` or its own ``stream``."""
    return has_generator(obj) or callable(getattr(obj, "records", None)) or callable(getattr(obj, "stream", None))


def make_env(task: Any, problem: Any, ctx: EnvContext) -> HostEnv:
    """A fresh environment for one episode of ``problem`` in ``ctx.role``: the task's own
    ``env`` when it has one, else the generic tool agent over its ``tools``,
    ``messages`` and ``verify``; an orchestrator's gets the orchestration tools (a note
    on them appended to its system turn) and sub-agents with the task's tools (a stateful
    task's: its world's, one world per episode)."""
    if callable(getattr(task, "env", None)):
        return task.env(problem, ctx)
    world = task.world(problem) if callable(getattr(task, "world", None)) else None
    tools = list(world.tools() if world is not None else task.tools())
    verify = (lambda _, answer: world.verify(answer)) if world is not None else task.verify
    orchestration = None
    messages: Callable[[Any], Messages] = task.messages
    if ctx.role == "orchestrator":
        sub_messages = getattr(task, "subagent_messages", None) or Task.subagent_messages.__get__(task)

        def make_subagent(system_prompt: str) -> HostEnv:
            return ToolAgentEnv(ctx.chat, tools, runner=ctx.runner,
                                messages=lambda prompt: sub_messages(system_prompt, prompt))
        orchestration = Orchestration(make_subagent, max_subagents=ctx.max_subagents)
        messages = lambda p: _with_note(task.messages(p), ORCHESTRATOR_NOTE)      # noqa: E731
    elif ctx.role != "single":
        raise TaskError(f"unknown role {ctx.role!r}; known: {', '.join(ROLES)}")
    return ToolAgentEnv(ctx.chat, tools, runner=ctx.runner, messages=messages, verify=verify,
                        orchestration=orchestration, summarize=ctx.summarize)


def _with_note(messages: Messages, note: str) -> Messages:
    """``messages`` with ``note`` appended to the system turn (one added in front when
    there is none)."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{note}"
        return out
    return [{"role": "system", "content": note}, *out]


def demonstration(task: Any, problem: Any, chat: ChatFormat, rng: np.random.Generator, role: str, *,
                  summarize: bool = False) -> Demo | None:
    """The task's demonstration of ``problem`` for ``role`` as a :class:`Demo` (None: it
    has none). ``summarize``: the agent has the ``summarize`` tool (the ``"summary"``
    context strategy); the task's method is then called with ``summarize=True`` and its
    demonstration may call it (a task whose method takes no such argument is an error)."""
    fn = getattr(task, "demonstration", None)
    if not callable(fn):
        return None
    if summarize:
        try:
            inspect.signature(fn).bind(problem, chat, rng, role=role, summarize=True)
        except TypeError:
            raise TaskError(f"task {task_name(task)}: the summary context strategy needs demonstration(..., "
                            "summarize=) (demonstrations that may call the summarize tool), or sft=None") from None
        demo = fn(problem, chat, rng, role=role, summarize=True)
    else:
        demo = fn(problem, chat, rng, role=role)
    if demo is None or isinstance(demo, Demo):
        return demo
    return Demo(turns=demo)


class ReplayStream:
    """A stream of problems drawn one at a time by ``draw(rng, index)`` (``index``: the
    problem's place in the stream) from one ``random.Random(seed_text)``, with the job's
    stream interface (``take``, ``ids``, ``state``, ``restore``): what a task's own
    ``stream(split, seed)`` may return. Its state is the count drawn; :meth:`restore`
    replays the draws up to it, so a resumed job draws what an uninterrupted one does."""

    def __init__(self, draw: Callable[[random.Random, int], Any], seed_text: str, split: str = "train"):
        self.draw, self.seed_text, self.split = draw, seed_text, split
        self.rng, self.drawn = random.Random(seed_text), 0

    def take(self, count: int) -> list[Any]:
        """The next ``count`` problems."""
        start, self.drawn = self.drawn, self.drawn + count
        return [self.draw(self.rng, start + i) for i in range(count)]

    def ids(self, count: int) -> list[str]:
        """The ids of the next ``count`` problems (``"<split>/<index in the stream>"``)."""
        return [f"{self.split}/{self.drawn + i}" for i in range(count)]

    def state(self) -> dict[str, Any]:
        return {"drawn": self.drawn}

    def restore(self, state: dict[str, Any]) -> None:
        """Replay the draws to ``state``'s count from the seed."""
        self.rng, self.drawn = random.Random(self.seed_text), 0
        self.take(int(state["drawn"]))


# ------------------------------------------------------------------------ datasets


def jsonl_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (one JSON object a line; blank lines skipped).
    Raises :class:`TaskError` naming the file and line of a bad one."""
    from etils import epath

    out = []
    with epath.Path(path).open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise TaskError(f"{path}:{i}: not a JSON line ({e})") from None
    return out


_ONCE: dict[tuple[int, str], tuple[Any, Any]] = {}
_ONCE_LOCK = threading.RLock()       # re-entrant: one value's ``make`` may ask for another's


def once_per_task(task: Any, what: str, make: Callable[[], Any]) -> Any:
    """``make()`` the first time ``what`` is asked for ``task`` in this process, the same
    value after (a task's server, its loaded dataset). The task is kept with it, so its
    ``id`` is never another object's."""
    with _ONCE_LOCK:
        key = (id(task), what)
        if key not in _ONCE:
            _ONCE[key] = (task, make())
        return _ONCE[key][1]


def maybe_import(spec: Any, *, what: str) -> Any:
    """``spec`` itself, or the object an import path ``"module:name"`` names."""
    return import_object(spec, what=what) if isinstance(spec, str) and ":" in spec else spec


def problem_records(spec: Any, split: str, *, what: str) -> list[Any]:
    """The problems of ``split`` from a task's ``problems`` field: ``{split: [...]}``, a
    callable ``split -> Sequence``, an import path ``"module:name"`` of either, or a
    JSON-lines path with ``{split}`` in it (``data/{split}.jsonl``). ``what`` names the
    field in errors."""
    if not (isinstance(spec, str) and "{split}" in spec):
        spec = maybe_import(spec, what=what)
    if isinstance(spec, str):
        if "{split}" not in spec:
            raise TaskError(f"{what} {spec!r}: a JSON-lines path holds '{{split}}' (e.g. data/{{split}}.jsonl), "
                            "an import path 'module:name'")
        return jsonl_records(spec.format(split=split))
    if isinstance(spec, Mapping):
        if split not in spec:
            raise TaskError(f"{what} has no {split!r} split (it has {', '.join(spec)})")
        return list(spec[split])
    if callable(spec):
        return list(spec(split))
    raise TaskError(f"{what}: {type(spec).__name__} is neither a mapping, a callable, an import path nor a "
                    "JSON-lines path")


def split_seed(seed: int, split: str) -> int:
    """The seed of ``split``'s generator stream: the job's seed for "train", streams of
    their own for "validation" and "test" (so no held-out problem comes from the
    training stream's draws)."""
    offsets = {"train": 0, "test": 1_000_003, "validation": 2_000_003}
    if split not in offsets:
        raise TaskError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    return seed + offsets[split]


def records_of(task: Any, split: str) -> Sequence[Any] | None:
    """A dataset task's records of ``split`` (None for a generator task). Raises
    :class:`TaskError` when the split has none."""
    if has_generator(task):
        return None
    records = task.records(split)
    if len(records) == 0:
        raise TaskError(f"task {task_name(task)}: split {split!r} has no records")
    return records


def reward_terms(rewards: Mapping[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """A rollout's summed reward terms with the ones no episode earned as zeros [B]
    (an episode that ended by its context or budget never reached its verifier)."""
    out = {k: np.asarray(v, np.float32) for k, v in rewards.items()}
    for k in ("r_perf", "tool_calls", "tool_errors", "truncated"):
        out.setdefault(k, np.zeros((count,), np.float32))
    return out
