"""A generated task set as a task plug-in (:mod:`swarmjax.envs.task`).

:class:`SynthToolTask` reads a task set written by ``swarmjax envs synth`` (its
``envs.json`` and its tasks: the TFDS data set read with grain when it is there, else
the JSON-lines files), or generates one in memory from a
:class:`~swarmjax.envs.synth.generator.SynthConfig`. Each episode gets a
:class:`SynthWorld`: the task's initial state and its environment's tools acting on it
(the orchestrator and its sub-agents share one world). The verifier scores by outcome:

* each part's answer: a list of keys by item-F1, a number within 0.01, a word or key
  exactly (case and surrounding quotes ignored); the parts' mean;
* a write task's final state: item-F1 of the cells it changed
  (:func:`~swarmjax.envs.synth.world.changes`) against the expected changes, averaged
  with the answer's score (partial credit: the right update of the wrong row scores
  half its cells).

Reward terms: ``r_perf`` (the score), ``correct`` (score 1), ``answer_score``,
``state_f1`` (writes; 1 for reads), ``parts``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from swarmjax.envs.orchestration import ASSIGN, CREATE
from swarmjax.envs.synth.generator import SynthConfig, generate
from swarmjax.envs.synth.world import EnvSpec, State, changes, execute, initial_state, parameters
from swarmjax.envs.task import Demo, Task, TaskError, jsonl_records
from swarmjax.envs.scoring import item_f1
from swarmjax.text.chat import ChatFormat
from swarmjax.text.tools import Tool

SYSTEM = ("You work with the tools of the {env} environment. Use them to answer the user. Answer with the value "
          "only (several keys separated by commas).")
WORKER = "Answer the question with the tools. Answer with the value only (several keys separated by commas)."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ITEMS = re.compile(r"[^,\s]+")


def answer_text(value: Any) -> str:
    """How an answer is written: keys joined by ", ", numbers and words as they are."""
    return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def score_answer(expected: Any, text: str) -> float:
    """One part's score in [0, 1] (module docstring)."""
    text = text.strip().strip(".").strip()
    if isinstance(expected, list):
        got = {t.strip("'\".") for t in _ITEMS.findall(text)}
        want = {str(v) for v in expected}
        return float(item_f1(len(got & want), len(got), len(want), bool(got)))
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        found = _NUMBER.findall(text)
        return float(bool(found) and abs(float(found[-1]) - float(expected)) <= 0.01)
    return float(text.strip("'\"").lower() == str(expected).lower())


def part_texts(text: str, parts: int) -> list[str]:
    """The answer of each part: the whole text for one part, else the ``<i>: ...`` lines
    (a missing line is an empty answer)."""
    if parts == 1:
        return [text]
    found = {}
    for line in text.splitlines():
        head, sep, rest = line.partition(":")
        if sep and head.strip().rstrip(".").isdigit():
            found.setdefault(int(head.strip().rstrip(".")), rest)
    return [found.get(i + 1, "") for i in range(parts)]


def task_messages(problem: dict[str, Any]) -> list[dict[str, str]]:
    """A task's system and user messages (the system turn is the environment's alone, so
    every prompt of an environment opens with the same ids: one shared prefix; a
    multi-part query says how to answer it)."""
    return [{"role": "system", "content": SYSTEM.format(env=problem["env"])},
            {"role": "user", "content": problem["query"]}]


def state_f1(expected: set, actual: set) -> float:
    """Item-F1 of the changed cells (1 when neither changed anything)."""
    if not expected and not actual:
        return 1.0
    return float(item_f1(len(expected & actual), len(actual), len(expected), bool(actual)))


class SynthWorld:
    """One episode's world: the task's initial state, the environment's tools bound to
    it (a lock makes parallel sub-agents' calls one at a time), and the verifier of the
    final answer and state."""

    def __init__(self, env: EnvSpec, record: dict[str, Any]):
        self.env, self.record = env, record
        self.initial = initial_state(env, int(record["state_seed"]))
        self.state = self.initial
        self._lock = threading.Lock()
        self._tools = [tool.bind(functools.partial(self._call, spec)) for tool, spec in zip(env_tools(env), env.tools)]

    def _call(self, spec, **args):
        with self._lock:                    # a ToolError becomes the call's error reply (ToolRunner)
            self.state, out = execute(self.env, spec, self.state, args)
        return out

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def verify(self, answer: str) -> dict[str, float]:
        return verify(self.record, self.initial, self.state, answer)


@functools.lru_cache(maxsize=256)
def env_tools(env: EnvSpec) -> tuple[Tool, ...]:
    """An environment's tools without a function (their schemas checked once; each
    episode's world binds them to its state: :meth:`~swarmjax.text.tools.Tool.bind`)."""
    kinds = {k.name: k for k in env.kinds}
    return tuple(Tool(t.name, t.description, parameters(t, kinds), fn=None) for t in env.tools)


def verify(record: dict[str, Any], initial: State, final: State, answer: str) -> dict[str, float]:
    """Reward terms of a task (module docstring) from its answer text and the state it
    left (``final``; ``initial``: the task's starting state)."""
    parts = record["parts"]
    scores = [score_answer(p["answer"], t) for p, t in zip(parts, part_texts(answer, len(parts)))]
    ans = float(np.mean(scores))
    write = record["kind"] == "write"
    expected = {tuple(c) for c in record["changes"]}
    st = state_f1(expected, changes(initial, final)) if write else 1.0
    score = (ans + st) / 2 if write else ans
    return {"r_perf": score, "correct": float(score == 1.0), "answer_score": ans, "state_f1": st,
            "parts": float(len(parts))}


@functools.cache
def _generated(cfg: SynthConfig):
    return generate(cfg)


@functools.cache
def _envs_file(path: str) -> dict[str, EnvSpec]:
    from etils import epath

    with epath.Path(path, "envs.json").open() as f:
        return {e["name"]: EnvSpec.from_json(e) for e in json.load(f)["envs"]}


def _decode(example: dict[str, Any]) -> dict[str, Any]:
    raw = example["record"]
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)


@dataclasses.dataclass(frozen=True)
class SynthToolTask(Task):
    """Generated tool environments as a task (module docstring).

    Args:
      data: a directory ``swarmjax envs synth`` wrote; None: generate ``cfg`` in memory.
      cfg: the task set to generate when ``data`` is None.
      delegate: share of the multi-part tasks an orchestrator's demonstration hands to
        sub-agents (one a part); the rest it does itself.
    """

    data: str | None = None
    cfg: SynthConfig = SynthConfig()
    delegate: float = 1.0

    def envs(self) -> dict[str, EnvSpec]:
        if self.data is None:
            return {e.name: e for e in _generated(self.cfg).envs}
        if not os.path.exists(os.path.join(self.data, "envs.json")):
            raise TaskError(f"{self.data}: no envs.json here; write a task set with 'swarmjax envs synth --out DIR'")
        return _envs_file(self.data)

    def records(self, split: str) -> Sequence[dict[str, Any]]:
        """The tasks of ``split`` (``train``, ``seen``, ``validation``, ``test``): a list,
        or a grain ``MapDataset`` over the TFDS data set (decoded as it is read)."""
        if self.data is None:
            return _generated(self.cfg).splits[split]
        tfds_dir = os.path.join(self.data, "tfds")
        if os.path.isdir(tfds_dir):
            import grain

            from swarmjax.envs.synth.card import tfds_source
            return grain.MapDataset.source(tfds_source(tfds_dir, split)).map(_decode)
        path = os.path.join(self.data, f"{split}.jsonl")
        if not os.path.exists(path):
            raise TaskError(f"{self.data}: no split {split!r} ({split}.jsonl)")
        return jsonl_records(path)

    def world(self, problem: dict[str, Any]) -> SynthWorld:
        return SynthWorld(self.envs()[problem["env"]], problem)

    def messages(self, problem: dict[str, Any]) -> list[dict[str, str]]:
        return task_messages(problem)

    def subagent_messages(self, system_prompt: str, prompt: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]

    def size(self, problem: dict[str, Any]) -> int:
        """The task's independent parts."""
        return len(problem["parts"])

    def demonstration(self, problem: dict[str, Any], chat: ChatFormat, rng: np.random.Generator, *,
                      role: str = "single") -> Demo:
        """The recorded calls, one a turn, then the answer; an orchestrator (with
        probability ``delegate``, tasks of several parts) creates one sub-agent a part
        and assigns them in one turn, each sub-agent making its part's calls."""
        parts = problem["parts"]

        def turns(part):
            return [chat.assistant_ids("", [{"name": c["name"], "arguments": c["arguments"]}]).tolist()
                    for c in part["calls"]] + [chat.assistant_ids(answer_text(part["answer"])).tolist()]

        final = chat.assistant_ids(answer_text(parts[0]["answer"]) if len(parts) == 1 else "\n".join(
            f"{i + 1}: {answer_text(p['answer'])}" for i, p in enumerate(parts))).tolist()
        if role == "orchestrator" and len(parts) > 1 and rng.random() < self.delegate:
            calls = [{"name": CREATE, "arguments": {"name": f"worker{i}", "system_prompt": WORKER}}
                     for i in range(len(parts))]
            calls += [{"name": ASSIGN, "arguments": {"agent": f"worker{i}", "prompt": p["question"]}}
                      for i, p in enumerate(parts)]
            return Demo([chat.assistant_ids("", calls).tolist(), final], [turns(p) for p in parts])
        own = [t for p in parts for t in turns(p)[:-1]]
        return Demo(own + [final])

    def corpus(self, *, seed: int = 0) -> list[str]:
        """Text for a local tokenizer: the training environments' tool schemas, the
        prompts, queries, calls and answers of training tasks (held-out environments'
        text stays out)."""
        envs = self.envs()
        train = self.records("train")
        seen = {train[i]["env"] for i in range(len(train))}
        out = [SYSTEM.format(env=n) for n in sorted(seen)] + [WORKER] * 20
        for name in sorted(seen):
            out += [json.dumps(t.schema()) for t in env_tools(envs[name])]
        for i in range(min(len(train), 2000)):
            r = train[i]
            out.append(r["query"])
            for p in r["parts"]:
                out += [json.dumps({"name": c["name"], "arguments": c["arguments"]}) for c in p["calls"]]
                out += [json.dumps(c["output"]) for c in p["calls"]] + [answer_text(p["answer"])]
        return out
