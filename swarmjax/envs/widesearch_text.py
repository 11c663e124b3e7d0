"""Wide-search in text: the token world's task (:mod:`swarmjax.envs.widesearch`) spoken
through a chat format, with tools as text calls.

Entities and values get generated multi-token names ("Doravin Kelt", "sub-tarno").
The orchestrator's user turn lists the entities; it has ``lookup(entity)`` and the
orchestration tools ``create_subagent`` / ``assign_task``; a sub-agent has
``lookup``. Answers are plain text, one ``entity: value`` line per pair, which the
verifier reads back into (entity, value) pairs.

The rules are the token world's: a turn is one step; ``lookup`` serves one entity per
turn (a second lookup call in the same turn gets an error reply, as the token world
has one lookup per turn); a stage of ``assign_task`` calls costs 1 + its longest
sub-agent on the critical path; at most K assignments per episode; a sub-agent has
``subagent_steps`` turns (the rollout stops it after them). So a scripted serial or
split policy takes exactly the steps, critical steps and answers of the same policy
in the token world (tested differentially).

Reward terms of an orchestrator episode (``ToolAgentEnv``'s verifier): ``r_perf``
(item-F1), ``correct``, ``answered``, ``truth``, and the counts the PARL reward
channels need, as the token world defines them: ``novel`` (assignments naming an
asked-for entity no earlier assignment named) and ``returned`` (distinct asked-for
entities that sub-agents answered).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from collections.abc import Sequence

import numpy as np

from swarmjax.envs import scripts
from swarmjax.envs.context_notes import SUMMARIZE, summarize_tool
from swarmjax.envs.orchestration import ASSIGN, CREATE, Orchestration
from swarmjax.envs.task import Demo, EnvContext, Task
from swarmjax.envs.tool_env import ToolAgentEnv
from swarmjax.envs.widesearch import Episode, WideSearchConfig, handoff_counts, score
from swarmjax.envs.scoring import delegation_counts, item_f1
from swarmjax.text.chat import ChatFormat
from swarmjax.text.runner import ToolRunner
from swarmjax.text.tools import Tool

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei")
_CODAS = ("", "n", "r", "l", "s", "k", "th")

ORCH_SYSTEM = ("You find the value of every entity the user lists. lookup(entity) tells you one "
               "entity's value per turn. You may instead create sub-agents and assign each a part "
               "of the list: all assign_task calls of one turn run in parallel. When you know the "
               "values, answer with one line per entity: <entity>: <value>")
WORKER_SYSTEM = ("You look up the value of every entity you are given, one lookup per turn, then "
                 "answer with one line per entity: <entity>: <value>")
NEEDLE = "Which of them has the value {value}? Answer with its line only."   # a needle question's user line
_LINE = re.compile(r"^\s*(.+?)\s*:\s*(.+?)\s*$")


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def generate_names(count: int, *, seed: int, style: str) -> list[str]:
    """``count`` distinct pronounceable names: ``"entity"`` style "Doravin Kelt" (two
    capitalised words), ``"value"`` style "sub-tarno" (two hyphenated lowercase words).
    Deterministic in ``seed``; no name is a prefix-line ambiguity (none contains ':')."""
    rng, names, seen = random.Random(seed), [], set()
    while len(names) < count:
        a, b = _word(rng, rng.randint(2, 3)), _word(rng, rng.randint(1, 2))
        name = f"{a.capitalize()} {b.capitalize()}" if style == "entity" else f"{a}-{b}"
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def format_pairs(names: Sequence[str], values: Sequence[str], pairs: Sequence[tuple[int, int]]) -> str:
    """The answer text of (entity, value) id pairs: one ``entity: value`` line each."""
    return "\n".join(f"{names[e]}: {values[v]}" for e, v in pairs)


class TaskNames:
    """The generated names of a task's entities and values (``self.cfg``, ``self.seed``)."""

    @property
    def entity_names(self) -> list[str]:
        return _names(self.cfg.num_entities, self.seed, "entity")

    @property
    def value_names(self) -> list[str]:
        return _names(self.cfg.num_values, self.seed + 1, "value")


@dataclasses.dataclass(frozen=True)
class WideSearchText(TaskNames):
    """The text rendering of a :class:`WideSearchConfig`'s tasks, and its environments.

    Args:
      cfg: the token world's sizes (E, V, K, S_sub, budget; contexts are the rollout's).
      chat: the chat format (its tokenizer tokenises prompts and replies).
      runner: a shared :class:`ToolRunner` for the ``lookup`` calls.
      seed: seed of the generated names.
      page_words: ``lookup`` answers with a page: this many filler words about the entity,
        then ``Value: <value>`` (:func:`page`); 0: the value alone. Long tool results
        are what fills a serial agent's context (web pages in a browsing task) while an
        orchestrator hears only its sub-agents' answers.
    """

    cfg: WideSearchConfig
    chat: ChatFormat
    runner: ToolRunner
    seed: int = 0
    page_words: int = 0


    # ---------------------------------------------------------------- reading text

    def parse_pairs(self, text: str) -> list[tuple[int, int]]:
        """(entity, value) id pairs of an answer's ``name: value`` lines, in order. A line
        naming an unknown entity or value is an answered pair that cannot be right
        (``(-1, -1)``), so guessing costs precision as in the token world."""
        ents = {n: i for i, n in enumerate(self.entity_names)}
        vals = {n: i for i, n in enumerate(self.value_names)}
        pairs = []
        for line in text.splitlines():
            m = _LINE.match(line)
            if m:
                pairs.append((ents.get(m.group(1), -1), vals.get(m.group(2), -1)))
        return pairs

    def mentioned(self, text: str) -> list[int]:
        """Entity ids named in ``text`` (an assignment's prompt), in order of first mention."""
        hits = [(text.find(n), i) for i, n in enumerate(self.entity_names) if n in text]
        return [i for _, i in sorted(hits)]

    # ---------------------------------------------------------------- the episode

    def task_text(self, entities: Sequence[int]) -> str:
        return "Entities: " + ", ".join(self.entity_names[e] for e in entities)

    def question(self, ep: Episode) -> str:
        """The user turn of an episode: its entities, and a needle question's line."""
        text = self.task_text(ep.task)
        return text if ep.target is None else text + "\n" + NEEDLE.format(value=self.value_names[ep.table[ep.target]])

    def lookup_tool(self, ep: Episode) -> Tool:
        names, values = self.entity_names, self.value_names
        index = {n: i for i, n in enumerate(names)}

        def lookup(entity: str) -> str:
            """Look up one entity's value.

            Args:
              entity: the entity's name, exactly as listed.
            """
            if entity not in index:
                raise KeyError(f"unknown entity {entity!r}")
            value = values[ep.table[index[entity]]]
            return page(index[entity], value, self.page_words, seed=self.seed) if self.page_words else value
        return Tool.from_function(lookup)

    def orchestrator(self, ep: Episode, *, summarize: bool = False) -> ToolAgentEnv:
        """A fresh orchestrator environment for one episode (``reset(ep)`` starts it);
        ``summarize``: with the ``summarize`` tool (:mod:`swarmjax.swarm.context`)."""
        orch = Orchestration(lambda system: self.worker(ep, system), max_subagents=self.cfg.max_subagents)
        env = ToolAgentEnv(self.chat, [self.lookup_tool(ep)], runner=self.runner,
                           messages=lambda ep: [{"role": "system", "content": ORCH_SYSTEM},
                                                {"role": "user", "content": self.question(ep)}],
                           verify=lambda ep, answer: self.verify(ep, answer, orch),
                           orchestration=orch, per_turn={"lookup": 1}, summarize=summarize)
        return env

    def worker(self, ep: Episode, system_prompt: str) -> ToolAgentEnv:
        """A sub-agent environment (its task, the assignment's prompt, is ``reset``'s)."""
        return ToolAgentEnv(self.chat, [self.lookup_tool(ep)], runner=self.runner,
                            messages=lambda prompt: [{"role": "system", "content": system_prompt},
                                                     {"role": "user", "content": prompt}],
                            per_turn={"lookup": 1})

    def single(self, ep: Episode, *, summarize: bool = False) -> ToolAgentEnv:
        """A serial agent for one episode: ``lookup`` alone, no sub-agents; its verifier
        reports :meth:`answer_terms` (``summarize``: as :meth:`orchestrator`)."""
        return ToolAgentEnv(self.chat, [self.lookup_tool(ep)], runner=self.runner,
                            messages=lambda ep: [{"role": "system", "content": WORKER_SYSTEM},
                                                 {"role": "user", "content": self.question(ep)}],
                            verify=self.answer_terms, per_turn={"lookup": 1}, summarize=summarize)

    def answer_terms(self, ep: Episode, answer: str | list[tuple[int, int]]) -> dict[str, float]:
        """Item-F1 of the answer (its text, or its pairs already read) (``r_perf``) and its
        pair counts."""
        correct, answered, truth = score(ep, self.parse_pairs(answer) if isinstance(answer, str) else answer)
        return {"r_perf": float(item_f1(correct, answered, truth, True)), "correct": correct,
                "answered": answered, "truth": truth}

    def verify(self, ep: Episode, answer: str, orch: Orchestration) -> dict[str, float]:
        """:meth:`answer_terms`, the counts PARL's channels need (module docstring) and
        where the delegated items went (:func:`~swarmjax.envs.widesearch.handoff_counts`:
        the sub-agents' returns, the orchestrator's copy of them)."""
        assigned = [self.mentioned(prompt) for _, prompt in orch.history]
        returned = [pair for text in orch.answers for pair in self.parse_pairs(text)]
        counts = delegation_counts(ep.task, assigned, (e for e, _ in returned))
        pairs = self.parse_pairs(answer)
        return {**self.answer_terms(ep, pairs), **counts, **handoff_counts(ep, assigned, returned, pairs)}

    # ---------------------------------------------------------------- scripted policies

    def turn_ids(self, content: str = "", calls: Sequence[tuple[str, dict]] = ()) -> list[int]:
        """The ids of one assistant turn as a model that follows the format samples it."""
        return self.chat.assistant_ids(content, [{"name": n, "arguments": a} for n, a in calls]).tolist()

    def answer_turn(self, ep: Episode, entities: Sequence[int] | None = None) -> list[int]:
        ents = ep.asked() if entities is None else entities
        return self.turn_ids(format_pairs(self.entity_names, self.value_names,
                                          [(e, ep.table[e]) for e in ents]))

    @staticmethod
    def lookups(ep: Episode, order: Sequence[int] | None = None) -> list[int]:
        """The entities a serial agent looks up, in ``order`` (default the task's): all of
        them, or for a needle question up to its target."""
        order = list(ep.task if order is None else order)
        return order if ep.target is None else order[:order.index(ep.target) + 1]

    def serial_script(self, ep: Episode, order: Sequence[int] | None = None) -> list[list[int]]:
        """The orchestrator looks the entities up itself (:meth:`lookups`), then answers:
        n + 1 turns for wide search."""
        return [self.turn_ids(calls=[("lookup", {"entity": self.entity_names[e]})]) for e in self.lookups(ep, order)] \
            + [self.answer_turn(ep)]

    def summary_script(self, ep: Episode, every: int, order: Sequence[int] | None = None) -> list[list[int]]:
        """:meth:`serial_script` that calls ``summarize`` after every ``every`` lookups
        while entities are left (the ``"summary"`` context strategy): the summary is the
        answer lines of every entity found so far, so each segment opens with the task
        and what the earlier ones found; n + 1 + (n - 1) // every turns for wide search."""
        turns, found = [], []
        for i, e in enumerate(self.lookups(ep, order)):
            if i and i % every == 0:
                text = format_pairs(self.entity_names, self.value_names, [(f, ep.table[f]) for f in found])
                turns.append(self.turn_ids(calls=[(SUMMARIZE, {"summary": text})]))
            turns.append(self.turn_ids(calls=[("lookup", {"entity": self.entity_names[e]})]))
            found.append(e)
        return turns + [self.answer_turn(ep)]

    def worker_script(self, ep: Episode, entities: Sequence[int]) -> list[list[int]]:
        """A sub-agent looks up every entity of its chunk and answers them all (for a
        needle question too: the orchestrator picks the line)."""
        return self.serial_script(Episode(table=ep.table, task=list(entities)))

    def split_script(self, ep: Episode, parts: int, *, system_prompt: str = "Look up each entity."
                     ) -> tuple[list[list[int]], list[list[list[int]]]]:
        """Create ``parts`` sub-agents and assign each a consecutive chunk of the task
        (:func:`~swarmjax.envs.scripts.chunks`) in ONE turn, then answer in the order the
        results come back (the task's order): the token world's :func:`~swarmjax.envs.scripts.split`."""
        chunks = scripts.chunks(ep.task, parts)
        calls = [(CREATE, {"name": f"worker{k}", "system_prompt": system_prompt})
                 for k in range(parts)]
        calls += [(ASSIGN, {"agent": f"worker{k}", "prompt": self.task_text(c)}) for k, c in enumerate(chunks)]
        return [self.turn_ids(calls=calls), self.answer_turn(ep)], [self.worker_script(ep, c) for c in chunks]


@dataclasses.dataclass(frozen=True)
class WideSearchProblems(Task):
    """What the wide-search task plug-ins share: the task sizes (``cfg``: E, V, N range, K),
    the generated names' seed, the episode stream and how demonstrations split a task
    (with probability ``split_fraction``, tasks of 2 or more entities go to sub-agents in
    chunks of 1..``max_chunk`` entities)."""

    cfg: WideSearchConfig = WideSearchConfig(num_entities=32, num_values=32, max_task_size=8, max_subagents=4)
    names_seed: int = 0
    split_fraction: float = 0.5
    max_chunk: int = 2

    def __post_init__(self):
        if not 0.0 <= self.split_fraction <= 1.0 or self.max_chunk < 1:
            raise ValueError("split_fraction must be in [0, 1] and max_chunk >= 1")

    def sample(self, rng: np.random.Generator, count: int, *, split: str = "train") -> list[Episode]:
        """``count`` episodes: a random table and task of ``min..max_task_size`` entities."""
        py = random.Random(int(rng.integers(2 ** 63)))
        return [self.episode(py) for _ in range(count)]

    def episode(self, rng: random.Random, n: int | None = None) -> Episode:
        """One episode of ``n`` entities (default: a size drawn from the config's range)."""
        return Episode.sample(self.cfg, rng, n)

    def size(self, problem: Episode) -> int:
        """The entities asked for."""
        return len(problem.task)

    def split_parts(self, problem: Episode, rng: np.random.Generator) -> int:
        """How many sub-agents a demonstration gives ``problem`` (0: it is done serially)."""
        n = len(problem.task)
        if n < 2 or rng.random() >= self.split_fraction:
            return 0
        chunk = int(rng.integers(1, self.max_chunk + 1))
        return min(-(-n // chunk), self.cfg.max_subagents)


@dataclasses.dataclass(frozen=True)
class WideSearchTask(WideSearchProblems):
    """Text wide-search as a task plug-in (:mod:`swarmjax.envs.task`; the built-in
    ``task="widesearch"``): the agent job's roles on the token world's rules.

    * ``role="orchestrator"``: the environment above (``lookup``, ``create_subagent``,
      ``assign_task``; sub-agents with ``lookup``), at most ``cfg.max_subagents``
      assignments an episode (the task's K, which its demonstrations respect, not the
      job's ``max_subagents``); its verifier reports the counts every PARL channel needs
      (``TextRLConfig.parl``);
    * ``role="single"``: a serial agent with ``lookup`` alone (item-F1 as ``r_perf``).

    Sub-agent turns and the critical-step budget are the rollout's
    (``TextRolloutConfig.subagent_turns`` / ``budget``). Demonstrations: the serial
    script (with the ``summarize`` tool: a summary after every ``summary_every`` lookups,
    :meth:`WideSearchText.summary_script`), or (orchestrators,
    :meth:`WideSearchProblems.split_parts`) one turn delegating chunks of the task.
    ``page_words``: the length of ``lookup``'s pages (:class:`WideSearchText`).
    ``needle_fraction``: the share of needle questions among the problems ("which of
    these entities has value X?", :meth:`Episode.needle`: one pair is the answer, so an
    agent that lost its earlier results can still find it; demonstrations search them in
    a random order and stop at the target).
    """

    summary_every: int = 8
    page_words: int = 0
    needle_fraction: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if self.summary_every < 1 or self.page_words < 0 or not 0.0 <= self.needle_fraction <= 1.0:
            raise ValueError("summary_every must be >= 1, page_words >= 0 and needle_fraction in [0, 1]")

    def episode(self, rng: random.Random, n: int | None = None, *, needle: bool | None = None) -> Episode:
        """One episode of ``n`` entities: a needle question (:meth:`Episode.needle`) when
        ``needle``, or (None) with probability ``needle_fraction``."""
        if needle is None:
            needle = self.needle_fraction > 0 and rng.random() < self.needle_fraction
        return Episode.needle(self.cfg, rng, n) if needle else Episode.sample(self.cfg, rng, n)

    def env(self, problem: Episode, ctx: EnvContext) -> ToolAgentEnv:
        world = WideSearchText(self.cfg, ctx.chat, ctx.runner, seed=self.names_seed, page_words=self.page_words)
        make = world.orchestrator if ctx.role == "orchestrator" else world.single
        return make(problem, summarize=ctx.summarize)

    def demonstration(self, problem: Episode, chat: ChatFormat, rng: np.random.Generator, *,
                      role: str = "single", summarize: bool = False) -> Demo:
        world = WideSearchText(self.cfg, chat, None, seed=self.names_seed, page_words=self.page_words)  # runs no tool
        parts = self.split_parts(problem, rng) if role == "orchestrator" else 0
        if parts:
            turns, workers = world.split_script(problem, parts)
            return Demo(turns, workers)
        # a needle question is searched in a random order (a fresh start after a discard
        # then tries other entities first), wide search in the task's
        order = None if problem.target is None else [problem.task[i] for i in rng.permutation(len(problem.task))]
        return Demo(world.summary_script(problem, self.summary_every, order) if summarize
                    else world.serial_script(problem, order))

    def corpus(self, *, seed: int = 0) -> list[str]:
        """:func:`text_corpus`, and the tools' JSON schemas (the system turns render them:
        a tokenizer that has seen them writes a prompt in about half the ids)."""
        world = WideSearchText(self.cfg, None, None, seed=self.names_seed)
        ep = Episode(table=[0] * self.cfg.num_entities, task=[0])
        tools = [world.lookup_tool(ep), *Orchestration(lambda _: None).tools(), summarize_tool()]
        pages = [page(e, "", self.page_words, seed=self.names_seed) for e in range(self.cfg.num_entities)] \
            if self.page_words else []
        questions = [NEEDLE.format(value=v) for v in _names(self.cfg.num_values, self.names_seed + 1, "value")] \
            if self.needle_fraction else []
        return text_corpus(self.cfg, seed=self.names_seed) + [json.dumps(t.schema()) for t in tools] * 20 + pages \
            + questions


def text_corpus(cfg: WideSearchConfig, *, seed: int = 0, episodes: int = 200) -> list[str]:
    """Text to train a tokenizer for this task on (names, prompts, calls, answers of
    ``episodes`` random episodes): the tests, bench and CPU configs build their BPE
    from it locally."""
    rng = random.Random(seed)
    ents, vals = _names(cfg.num_entities, seed, "entity"), _names(cfg.num_values, seed + 1, "value")
    out = [ORCH_SYSTEM, WORKER_SYSTEM, *ents, *vals]
    for _ in range(episodes):
        ep = Episode.sample(cfg, rng)
        out.append("Entities: " + ", ".join(ents[e] for e in ep.task))
        out.append(format_pairs(ents, vals, [(e, ep.table[e]) for e in ep.task]))
        e = rng.choice(ep.task)
        out.append(f'{{"name": "lookup", "arguments": {{"entity": "{ents[e]}"}}}}')
        out.append(f"Sub-agent 'worker{rng.randrange(8)}' answered:\n{ents[e]}: {vals[ep.table[e]]}")
    return out


FILLER = ("the", "record", "for", "this", "entry", "was", "updated", "in", "an", "archive", "with", "notes",
          "from", "several", "older", "sources", "and", "a", "short", "history", "of", "its", "earlier", "listing")


def page(entity: int, value: str, words: int, *, seed: int = 0) -> str:
    """The page ``lookup`` returns for entity ``entity`` (``page_words``): ``words``
    filler words drawn from :data:`FILLER` (the same for an entity every time), then
    ``Value: <value>``."""
    rng = random.Random(seed * 1_000_003 + entity)
    return " ".join(rng.choice(FILLER) for _ in range(words)) + f". Value: {value}"


@functools.cache
def _names(count: int, seed: int, style: str) -> list[str]:
    return generate_names(count, seed=seed, style=style)
