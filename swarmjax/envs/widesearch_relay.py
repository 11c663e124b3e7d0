"""Wide-search in text with *canonical relays*: the text task that can run on the device.

:mod:`swarmjax.envs.widesearch_text` lets the orchestrator write anything: a sub-agent's
system prompt, its task, and the sub-agent's free answer travel back verbatim. Text
copied verbatim from one conversation into another cannot be produced inside ``jit``
without a tokenizer, so this variant relays *what the text means* instead, always
in the same words:

* ``create_subagent(name)`` takes one of ``worker0 .. worker{K-1}`` (an enum); every
  sub-agent gets the same system prompt (``WORKER_SYSTEM``).
* ``assign_task(agent, prompt)``: the sub-agent's task is rebuilt from the prompt as
  ``Entities: A, B`` over the entities the prompt mentions (in order of first mention,
  at most ``max_mentions``), whatever else it says.
* ``lookup(entity)`` takes an entity name (a string: an enum of every entity would
  make the tool schema, which every prompt carries, grow with E); another string gets
  ``UNKNOWN_ENTITY``.
* A sub-agent's answer comes back as ``Sub-agent 'worker3' answered:`` and one
  ``entity: value`` line per distinct pair it answered with a known entity and value,
  in order (:mod:`swarmjax.text.device.answers` reads the answer lines).
* Every error has one fixed sentence per cause (a call's :class:`CallError`, a second
  lookup in a turn, an unknown agent, the K limit, calls past ``max_calls``).

So every id an agent hears is a join of fixed fragments (names, sentences, the chat
format's pieces), and :mod:`swarmjax.envs.widesearch_relay_device` says them on the
device; :class:`RelayEnv` here is the host twin (a :class:`~swarmjax.envs.api.HostEnv`
run by :class:`~swarmjax.swarm.text_rollout.TextRollout`) that renders the same texts
through the chat format and the tokenizer, which the differential tests compare.

The rules and counts are the token world's, as in :mod:`widesearch_text`: one lookup
per turn; a stage of ``assign_task`` calls costs 1 + its longest sub-agent on the
critical path (the rollout counts); at most K assignments per episode. Reward terms of
an orchestrator episode: ``r_perf`` (item-F1 of its answer lines), ``correct``,
``answered``, ``truth``, ``novel`` (assignments mentioning an asked-for entity no
earlier assignment mentioned), ``returned`` (distinct asked-for entities in the relayed
answers), ``parallel`` (per stage, the asked-for entities its sub-agents relayed first
beside its busiest one, summed: ``r_parallel = "parallel"`` of :mod:`swarmjax.rl.parl`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from swarmjax.envs import scripts
from swarmjax.envs.api import Step, SubAgentResult, SubAgentTask
from swarmjax.envs.device_api import CALL_ERROR_TEXT
from swarmjax.envs.orchestration import ASSIGN, CREATE
from swarmjax.envs.task import Demo, EnvContext, TaskError
from swarmjax.envs.widesearch import Episode, WideSearchConfig, score
from swarmjax.envs.widesearch_text import ORCH_SYSTEM, WORKER_SYSTEM, TaskNames, WideSearchProblems, text_corpus
from swarmjax.envs.scoring import delegation_counts, item_f1
from swarmjax.text.chat import ChatFormat
from swarmjax.text.byte_tries import token_byte_table
from swarmjax.text.device.answers import host_answer_pairs
from swarmjax.text.toolcalls import CallError, parse_turn
from swarmjax.text.tools import Tool, ToolSet

LOOKUP = "lookup"
ERROR_TEXT = CALL_ERROR_TEXT
LOOKUP_AGAIN = "Error: lookup serves one call per turn; this one was not run."
LIMIT = "Error: the limit of sub-agent tasks per episode is reached."
UNKNOWN_ENTITY = "Error: there is no entity of that name."


@dataclasses.dataclass(frozen=True)
class RelayTask(TaskNames):
    """The canonical text wide-search: names, tools and every sentence agents hear.

    Args:
      cfg: the token world's sizes (E, V, K; the rollout holds contexts and budget).
      chat: the chat format (its tokenizer renders the host twin's ids).
      seed: seed of the generated names (as :class:`~swarmjax.envs.widesearch_text.WideSearchText`).
      max_calls: calls per turn that are read and answered; later ones get one
        ``too_many`` response together.
      max_mentions: entities an assignment's prompt passes on (the first ones mentioned).
      max_pairs: answer lines read per answer.
    """

    cfg: WideSearchConfig
    chat: ChatFormat
    seed: int = 0
    max_calls: int = 8
    max_mentions: int = 16
    max_pairs: int = 32

    # ---------------------------------------------------------------- names and tools


    @property
    def agent_names(self) -> list[str]:
        return [f"worker{k}" for k in range(self.cfg.max_subagents)]

    def tools(self, role: str) -> list[Tool]:
        """:func:`relay_tools` of ``role`` for this task's agent names."""
        return relay_tools(role, self.agent_names)

    # ---------------------------------------------------------------- sentences

    def task_text(self, entities: Sequence[int]) -> str:
        return "Entities:" + ",".join(" " + self.entity_names[e] for e in entities)

    def lines_text(self, pairs: Sequence[tuple[int, int]]) -> str:
        return "".join(f"\n{self.entity_names[e]}: {self.value_names[v]}" for e, v in pairs)

    def created_text(self, k: int) -> str:
        return f"Created sub-agent '{self.agent_names[k]}'."

    def unknown_agent_text(self, k: int) -> str:
        return f"Error: there is no sub-agent '{self.agent_names[k]}' yet. Call create_subagent first."

    def too_many_text(self) -> str:
        return f"Error: a turn may make at most {self.max_calls} calls; the later ones were not run."

    def result_text(self, k: int, reason: str, pairs: Sequence[tuple[int, int]]) -> str:
        """What an ``assign_task`` call of sub-agent k hears back."""
        name = self.agent_names[k]
        if reason == "answer":
            return f"Sub-agent '{name}' answered:" + self.lines_text(pairs)
        why = "was stopped at its turn limit" if reason == "turns" else "ran out of context"
        return f"Sub-agent '{name}' {why} without an answer."

    def messages(self, role: str, entities: Sequence[int]) -> list[dict[str, str]]:
        system = ORCH_SYSTEM if role == "orchestrator" else WORKER_SYSTEM
        return [{"role": "system", "content": system}, {"role": "user", "content": self.task_text(entities)}]

    def mentions(self, text: str) -> list[int]:
        """Entity ids named in ``text`` by position of first occurrence (the device
        parser's mention order), at most ``max_mentions``."""
        hits = sorted((text.find(n), i) for i, n in enumerate(self.entity_names) if n in text)
        return [i for _, i in hits][:self.max_mentions]

    def relayed(self, pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The pairs an answer relays: distinct, entity and value known, in order."""
        return list(dict.fromkeys((e, v) for e, v in pairs if e >= 0 and v >= 0))

    @functools.cached_property
    def _byte_table(self) -> tuple[np.ndarray, np.ndarray]:
        return token_byte_table(self.chat.tokenizer)      # built once, not per answer turn

    def answer_pairs(self, turn: np.ndarray) -> list[tuple[int, int]]:
        """(entity, value) ids of a turn's answer lines (``text.device.answers`` rules; control
        ids: the tokenizer's added tokens), the first ``max_pairs``."""
        return host_answer_pairs(self.chat.tokenizer, turn, self.entity_names, self.value_names,
                                 byte_table=self._byte_table)[:self.max_pairs]

    def orchestrator(self, ep: Episode) -> RelayEnv:
        return RelayEnv(self, ep, "orchestrator")

    # ---------------------------------------------------------------- scripted policies

    def turn_ids(self, content: str = "", calls: Sequence[tuple[str, dict]] = ()) -> np.ndarray:
        """The ids of one assistant turn as a model that follows the format samples it."""
        return self.chat.assistant_ids(content, [{"name": n, "arguments": a} for n, a in calls])

    def answer_turn(self, ep: Episode, entities: Sequence[int]) -> np.ndarray:
        return self.turn_ids("\n".join(f"{self.entity_names[e]}: {self.value_names[ep.table[e]]}"
                                       for e in entities))

    def serial_script(self, ep: Episode, entities: Sequence[int] | None = None) -> list[np.ndarray]:
        """One lookup per turn, then the answer: ``n + 1`` turns (an orchestrator's or a
        sub-agent's, ``entities`` default the episode's)."""
        ents = ep.task if entities is None else entities
        return [self.turn_ids(calls=[(LOOKUP, {"entity": self.entity_names[e]})]) for e in ents] \
            + [self.answer_turn(ep, ents)]

    def split_script(self, ep: Episode, parts: int, *, create_first: bool = False
                     ) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        """Create ``parts`` sub-agents and assign each a consecutive chunk (in one turn;
        with ``create_first`` the creations take a turn of their own), then answer; the
        sub-agents' serial scripts. The token world's :func:`~swarmjax.envs.scripts.split`."""
        chunks = scripts.chunks(ep.task, parts)
        creates = [(CREATE, {"name": self.agent_names[k]}) for k in range(parts)]
        assigns = [(ASSIGN, {"agent": self.agent_names[k], "prompt": "Please find " + " and ".join(
            self.entity_names[e] for e in c)}) for k, c in enumerate(chunks)]
        turns = [self.turn_ids(calls=creates), self.turn_ids(calls=assigns)] if create_first \
            else [self.turn_ids(calls=creates + assigns)]
        return turns + [self.answer_turn(ep, ep.task)], [self.serial_script(ep, c) for c in chunks]


def relay_tools(role: str, agent_names: Sequence[str]) -> list[Tool]:
    """The tools of ``role`` ("orchestrator": lookup, create_subagent, assign_task;
    "worker": lookup), in tool-id order (the device parser's tool ids)."""
    enum = lambda names, what: {"type": "string", "enum": list(names), "description": what}
    lookup = Tool(LOOKUP, "Look up one entity's value.",
                  {"type": "object", "properties": {"entity": {"type": "string", "description": "The entity's name."}},
                   "required": ["entity"]}, fn=None)
    if role == "worker":
        return [lookup]
    if role != "orchestrator":
        raise ValueError(f"role must be 'orchestrator' or 'worker', got {role!r}")
    create = Tool(CREATE, "Create a sub-agent.",
                  {"type": "object", "properties": {"name": enum(agent_names, "The sub-agent's name.")},
                   "required": ["name"]}, fn=None)
    assign = Tool(ASSIGN, "Give a sub-agent a task. Every assign_task call of one turn runs in "
                  "parallel; their answers come back together.",
                  {"type": "object", "properties": {
                      "agent": enum(agent_names, "Name of a sub-agent created earlier."),
                      "prompt": {"type": "string", "description": "The entities to look up."}},
                   "required": ["agent", "prompt"]}, fn=None)
    return [lookup, create, assign]


def relay_corpus(cfg: WideSearchConfig, *, seed: int = 0, episodes: int = 200) -> list[str]:
    """Text to train a tokenizer for this task on: the text task's corpus
    (:func:`~swarmjax.envs.widesearch_text.text_corpus`) plus the tool schemas and the
    relay sentences, so prompts and responses tokenise compactly."""
    agents = [f"worker{k}" for k in range(cfg.max_subagents)]
    out = text_corpus(cfg, seed=seed, episodes=episodes)
    out += [json.dumps(t.schema(), ensure_ascii=False) for role in ("orchestrator", "worker")
            for t in relay_tools(role, agents)]
    out += [*ERROR_TEXT.values(), LOOKUP_AGAIN, LIMIT, UNKNOWN_ENTITY]
    for a in agents:
        out += [f"Created sub-agent '{a}'.", f"Sub-agent '{a}' answered:",
                f'{{"name": "{ASSIGN}", "arguments": {{"agent": "{a}", "prompt": "Entities: "}}}}',
                f'{{"name": "{CREATE}", "arguments": {{"name": "{a}"}}}}']
    return out


def verify(ep: Episode, pairs: Sequence[tuple[int, int]], assigned: Sequence[Sequence[int]],
           returned: Sequence[Sequence[tuple[int, int]]]) -> dict[str, float]:
    """Reward terms of an orchestrator episode (module docstring): ``pairs`` its answer's,
    ``assigned`` the entities of every assignment that ran, ``returned`` the pairs
    relayed back."""
    correct, answered, truth = score(ep, pairs)
    f1 = float(item_f1(correct, answered, truth, True))
    counts = delegation_counts(ep.task, assigned, (e for ps in returned for e, _ in ps))
    return {"r_perf": f1, "correct": float(correct), "answered": float(answered), "truth": float(truth),
            **{k: float(v) for k, v in counts.items()}}


class RelayEnv:
    """The host twin: one agent (``role`` "orchestrator" or "worker") of a
    :class:`RelayTask` episode; ``reset(entities)`` takes the entities of its task
    (``ep.task`` for an orchestrator, ignored for it: pass anything)."""

    def __init__(self, task: RelayTask, ep: Episode, role: str):
        if role not in ("orchestrator", "worker"):
            raise ValueError(f"role must be 'orchestrator' or 'worker', got {role!r}")
        self.task, self.ep, self.role = task, ep, role
        self.toolset = ToolSet(task.tools(role))
        self.created: set[int] = set()
        self.assigned: list[list[int]] = []
        self.returned: list[list[tuple[int, int]]] = []
        self.parallel = 0          # asked-for entities relayed beside each stage's busiest sub-agent
        self._pending: tuple | None = None

    def reset(self, entities: Any) -> np.ndarray:
        ents = self.ep.task if self.role == "orchestrator" else list(entities)
        return self.task.chat.prompt_ids(self.task.messages(self.role, ents), tools=self.toolset.schemas())

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        t, chat = self.task, self.task.chat
        calls = parse_turn(chat.tokenizer.decode(turn), self.toolset, syntax=chat.call_syntax).calls
        if not calls:
            pairs = t.answer_pairs(np.asarray(turn))
            if self.role == "worker":
                return Step(done=True, answer=t.lines_text(t.relayed(pairs)).lstrip("\n"))
            return Step(done=True, answer=chat.tokenizer.decode(turn),
                        rewards={**verify(self.ep, pairs, self.assigned, self.returned),
                                 "parallel": float(self.parallel)})
        replies: list[str | None] = []
        stage, lookups = [], 0
        for i, call in enumerate(calls[:t.max_calls]):
            if call.error != CallError.NONE:
                replies.append(ERROR_TEXT[call.error])
            elif call.name == LOOKUP:
                lookups += 1
                name = call.arguments["entity"]
                replies.append(LOOKUP_AGAIN if lookups > 1 else UNKNOWN_ENTITY if name not in t.entity_names
                               else t.value_names[self.ep.table[t.entity_names.index(name)]])
            elif call.name == CREATE:
                k = t.agent_names.index(call.arguments["name"])
                self.created.add(k)
                replies.append(t.created_text(k))
            else:
                k = t.agent_names.index(call.arguments["agent"])
                if k not in self.created:
                    replies.append(t.unknown_agent_text(k))
                elif len(self.assigned) >= t.cfg.max_subagents:
                    replies.append(LIMIT)
                else:
                    ents = t.mentions(call.arguments["prompt"])
                    self.assigned.append(ents)
                    stage.append((i, k, ents))
                    replies.append(None)
        if len(calls) > t.max_calls:
            replies.append(t.too_many_text())
        closing = chat.after_turn_ids(turn)
        if stage:
            self._pending = (closing, replies, stage)
            return Step(spawn=tuple(SubAgentTask(agent=t.agent_names[k], env=RelayEnv(t, self.ep, "worker"),
                                                 task=ents) for _, k, ents in stage))
        return Step(reply=np.concatenate([closing, chat.tool_responses_ids(replies)]))

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        """The turn's responses once its stage is over (relayed answers at the
        ``assign_task`` positions)."""
        if self._pending is None:
            raise RuntimeError("resume() without a stage: step() did not spawn sub-agents")
        closing, replies, stage = self._pending
        if len(results) != len(stage):
            raise ValueError(f"the stage had {len(stage)} sub-agents, got {len(results)} results")
        t = self.task
        asked, prior, own = set(self.ep.task), {e for ps in self.returned for e, _ in ps}, []
        for (i, k, _), res in zip(stage, results):
            pairs = self.pairs_of(res.answer) if res.ok else []
            self.returned.append(pairs)
            replies[i] = t.result_text(k, res.reason, pairs)
            new = {e for e, _ in pairs if e in asked} - prior
            own.append(len(new))
            prior |= new
        self.parallel += sum(own) - max(own)
        self._pending = None
        return Step(reply=np.concatenate([closing, t.chat.tool_responses_ids(replies)]))

    def pairs_of(self, answer: str | None) -> list[tuple[int, int]]:
        """The relayed pairs back from a worker's ``Step.answer`` (its canonical lines)."""
        ents = {n: i for i, n in enumerate(self.task.entity_names)}
        vals = {n: i for i, n in enumerate(self.task.value_names)}
        out = []
        for line in (answer or "").split("\n"):
            if line:
                e, v = line.split(": ", 1)
                out.append((ents[e], vals[v]))
        return out


@functools.lru_cache(maxsize=8)
def _relay(cfg: WideSearchConfig, chat: ChatFormat, seed: int, limits: tuple[int, int, int]) -> RelayTask:
    calls, mentions, pairs = limits             # one per chat format: its byte table is built once
    return RelayTask(cfg, chat, seed=seed, max_calls=calls, max_mentions=mentions, max_pairs=pairs)


@dataclasses.dataclass(frozen=True)
class RelayWideSearchTask(WideSearchProblems):
    """Canonical-relay wide-search as a task plug-in (:mod:`swarmjax.envs.task`; the
    built-in ``task="relay"``): the orchestrator environment :class:`RelayEnv` (its own
    ``create_subagent`` / ``assign_task`` over ``worker0..``; sub-agents with ``lookup``),
    run by the agent job like any task. Orchestrator role only: the answer a sub-agent
    relays is not a verifiable episode of its own. Its device twin (:meth:`device_task`)
    is what :class:`~swarmjax.swarm.text_engine.TextSwarm` runs inside ``jit``.

    Demonstrations: the serial script, or (:meth:`WideSearchProblems.split_parts`) one
    turn creating sub-agents and assigning each a consecutive chunk
    (:meth:`RelayTask.split_script`). ``max_calls``, ``max_mentions``, ``max_pairs``:
    :class:`RelayTask`'s limits.
    """

    max_calls: int = 8
    max_mentions: int = 16
    max_pairs: int = 32

    def __post_init__(self):
        super().__post_init__()
        if min(self.max_calls, self.max_mentions, self.max_pairs) < 1:
            raise ValueError("max_calls, max_mentions and max_pairs must be >= 1")
        if self.cfg.max_task_size > min(self.max_pairs, self.max_mentions):
            raise ValueError(f"max_task_size {self.cfg.max_task_size} is above max_pairs {self.max_pairs} or "
                             f"max_mentions {self.max_mentions}: answers would be cut")

    def relay(self, chat: ChatFormat) -> RelayTask:
        """The canonical task over ``chat``: names, tools and sentences, for the host twin
        and the device engine alike."""
        return _relay(self.cfg, chat, self.names_seed, (self.max_calls, self.max_mentions, self.max_pairs))

    def device_task(self, chat: ChatFormat):
        """The device twin (:class:`~swarmjax.envs.widesearch_relay_device.RelayDeviceTask`)
        of :meth:`relay`."""
        from swarmjax.envs.widesearch_relay_device import RelayDeviceTask     # the device twin imports this module
        return RelayDeviceTask(self.relay(chat))

    def env(self, problem: Episode, ctx: EnvContext) -> RelayEnv:
        if ctx.role != "orchestrator":
            raise TaskError(f"task 'relay' runs as an orchestrator only (role={ctx.role!r}); use task='widesearch' "
                            "for a single agent")
        return self.relay(ctx.chat).orchestrator(problem)

    def demonstration(self, problem: Episode, chat: ChatFormat, rng: np.random.Generator, *,
                      role: str = "orchestrator") -> Demo:
        task, parts = self.relay(chat), self.split_parts(problem, rng)
        if parts:
            turns, workers = task.split_script(problem, parts)
            return Demo(turns, workers)
        return Demo(task.serial_script(problem))

    def corpus(self, *, seed: int = 0) -> list[str]:
        return relay_corpus(self.cfg, seed=self.names_seed)
