"""The wide-search swarm task (DESIGN.md section 3): config, vocabulary, and a readable
pure-Python reference simulator of the protocol.

The reference simulator is the oracle the jitted engine is tested against: it is
driven one *token* at a time by two policies (orchestrator, worker), parses turns
exactly as the engine must, appends the environment's tokens, and counts steps,
critical steps and the outcome. It is deliberately plain Python, with no JAX.

Protocol decisions where DESIGN.md is silent (the engine must match them):

* A turn that starts with an unexpected token, a lookup of a non-entity, a spawn
  block with no entities or a non-entity inside, more than ``max_subagents`` spawn
  blocks, or a worker turn other than lookup/return: the environment appends
  ``<fail>``; the turn counts as one step of that agent, and it ends at the token
  that broke it (what follows is read as the next turn).
* An answer ends the episode with the pairs parsed before the first token that
  breaks the ``e v`` pattern (a malformed answer is a short answer).
* A turn is only started while ``critical_steps + 1 <= budget``; otherwise the
  episode ends with reason ``budget`` (so an answer always fits in the budget).
* A worker that has not returned after ``subagent_steps`` steps, or fills its
  context, is stopped and reports ``<result> <fail> </result>``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence

PROTOCOL = ("<pad>", "<eos>", "<orch>", "<worker>", "<task>", "</task>", "<lookup>", "<val>",
            "<spawn>", "</spawn>", "<wait>", "<result>", "</result>", "<fail>", "<answer>",
            "</answer>", "<return>", "</return>")


@dataclasses.dataclass(frozen=True)
class WideSearchConfig:
    """Sizes of the task. Defaults: the largest task costs 17 critical steps serially and 5
    with the best split (8 sub-agents x 2 lookups: 1 + 3 + 1)."""

    num_entities: int = 64        # E
    num_values: int = 64          # V
    min_task_size: int = 1
    max_task_size: int = 16       # N_max
    max_subagents: int = 8        # K, per episode
    subagent_steps: int = 5       # S_sub
    budget: int | None = 8        # critical-step budget B (None: lifted)
    orch_context: int = 256       # tokens
    worker_context: int = 48

    def __post_init__(self):
        if not 1 <= self.min_task_size <= self.max_task_size <= self.num_entities:
            raise ValueError("need 1 <= min_task_size <= max_task_size <= num_entities")
        if self.budget is not None and self.budget < 2:
            raise ValueError(f"budget {self.budget} is below 2, the cheapest possible episode "
                             "(one lookup stage and an answer)")
        for name in ("num_values", "max_subagents", "subagent_steps", "orch_context", "worker_context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    def serial_critical_steps(self, n: int) -> int:
        """n lookups then an answer."""
        return n + 1


class Vocab:
    """Token ids: protocol symbols first, then one token per entity, then per value."""

    def __init__(self, cfg: WideSearchConfig):
        self.cfg = cfg
        self.ids = {sym: i for i, sym in enumerate(PROTOCOL)}
        self.entity_base = len(PROTOCOL)
        self.value_base = self.entity_base + cfg.num_entities
        self.size = self.value_base + cfg.num_values

    def __getitem__(self, symbol: str) -> int:
        return self.ids[symbol]

    def entity(self, e: int) -> int:
        return self.entity_base + e

    def value(self, v: int) -> int:
        return self.value_base + v

    def is_entity(self, tok: int) -> bool:
        return self.entity_base <= tok < self.value_base

    def is_value(self, tok: int) -> bool:
        return self.value_base <= tok < self.size

    def symbol(self, tok: int) -> str:
        if tok < self.entity_base:
            return PROTOCOL[tok]
        if self.is_entity(tok):
            return f"e{tok - self.entity_base}"
        if self.is_value(tok):
            return f"v{tok - self.value_base}"
        return f"<unk:{tok}>"

    def decode(self, toks: Sequence[int]) -> str:
        return " ".join(self.symbol(t) for t in toks)

    def encode(self, text: str) -> list[int]:
        out = []
        for word in text.split():
            if word in self.ids:
                out.append(self.ids[word])
            elif word[0] == "e" and word[1:].isdigit():
                out.append(self.entity(int(word[1:])))
            elif word[0] == "v" and word[1:].isdigit():
                out.append(self.value(int(word[1:])))
            else:
                raise ValueError(f"unknown symbol {word!r}")
        return out


@dataclasses.dataclass
class Episode:
    """One task: the hidden table (entity -> value) and the entities asked for."""

    table: list[int]
    task: list[int]

    @classmethod
    def sample(cls, cfg: WideSearchConfig, rng: random.Random, n: int | None = None) -> "Episode":
        n = rng.randint(cfg.min_task_size, cfg.max_task_size) if n is None else n
        table = [rng.randrange(cfg.num_values) for _ in range(cfg.num_entities)]
        return cls(table=table, task=rng.sample(range(cfg.num_entities), n))


@dataclasses.dataclass
class Outcome:
    """What the reference simulator reports for one episode."""

    orch_tokens: list[int]            # the orchestrator's whole context (prompt, its own and env tokens)
    sampled: list[bool]               # per token of orch_tokens: sampled by the orchestrator
    answer: list[tuple[int, int]] | None
    end_reason: str                   # "answer" | "budget" | "context"
    orch_steps: int
    critical_steps: int
    total_steps: int
    spawned: int
    finished: int
    stages: list[dict]                # per orchestrator step: kind, worker steps, worker results


Policy = Callable[[list[int]], int]   # context token ids -> next token id


def _run_worker(cfg: WideSearchConfig, vocab: Vocab, ep: Episode, entities: list[int],
                policy: Policy) -> tuple[int, list[tuple[int, int]] | None]:
    """Returns (steps taken, returned pairs or None on failure)."""
    ctx = [vocab["<worker>"], vocab["<task>"], *(vocab.entity(e) for e in entities), vocab["</task>"]]
    steps = 0
    while steps < cfg.subagent_steps:
        steps += 1
        tok = policy(ctx)
        ctx.append(tok)
        if tok == vocab["<lookup>"]:
            arg = policy(ctx)
            ctx.append(arg)
            ctx += ([vocab["<val>"], vocab.value(ep.table[arg - vocab.entity_base])]
                    if vocab.is_entity(arg) else [vocab["<fail>"]])
        elif tok == vocab["<return>"]:
            pairs = _read_pairs(vocab, ctx, policy, vocab["</return>"], cfg.worker_context)
            return steps, pairs
        else:
            ctx.append(vocab["<fail>"])
        if len(ctx) >= cfg.worker_context:
            break
    return steps, None


def _read_pairs(vocab: Vocab, ctx: list[int], policy: Policy, close: int, limit: int) -> list[tuple[int, int]]:
    """Read ``e v e v .. close`` from the policy, stopping at the first break of the pattern."""
    pairs = []
    while len(ctx) < limit:
        e = policy(ctx)
        ctx.append(e)
        if not vocab.is_entity(e):
            break
        v = policy(ctx)
        ctx.append(v)
        if not vocab.is_value(v):
            break
        pairs.append((e - vocab.entity_base, v - vocab.value_base))
    return pairs


def simulate(cfg: WideSearchConfig, ep: Episode, orch: Policy, worker: Policy) -> Outcome:
    """Run one episode token by token with the two policies (see the module docstring)."""
    vocab = Vocab(cfg)
    ctx = [vocab["<orch>"], vocab["<task>"], *(vocab.entity(e) for e in ep.task), vocab["</task>"]]
    sampled = [False] * len(ctx)
    budget = cfg.budget if cfg.budget is not None else 10 ** 9
    crit = orch_steps = total = spawned = finished = 0
    stages: list[dict] = []
    answer, reason = None, "context"

    def say() -> int:
        tok = orch(ctx)
        ctx.append(tok)
        sampled.append(True)
        return tok

    def env(*toks: int):
        ctx.extend(toks)
        sampled.extend([False] * len(toks))

    while len(ctx) < cfg.orch_context:
        if crit + 1 > budget:
            reason = "budget"
            break
        orch_steps += 1
        crit += 1
        total += 1
        tok = say()
        stage = {"kind": vocab.symbol(tok), "worker_steps": [], "results": []}
        stages.append(stage)
        if tok == vocab["<lookup>"]:
            arg = say()
            if vocab.is_entity(arg):
                env(vocab["<val>"], vocab.value(ep.table[arg - vocab.entity_base]))
            else:
                env(vocab["<fail>"])
        elif tok == vocab["<answer>"]:
            limit = cfg.orch_context
            before = len(ctx)
            answer = _read_pairs(vocab, ctx, orch, vocab["</answer>"], limit)
            sampled.extend([True] * (len(ctx) - before))
            reason = "answer"
            break
        elif tok == vocab["<spawn>"]:
            blocks, ok = [], True
            while ok and len(ctx) < cfg.orch_context:
                ents = []
                while len(ctx) < cfg.orch_context:
                    t = say()
                    if vocab.is_entity(t):
                        ents.append(t - vocab.entity_base)
                    else:
                        ok = t == vocab["</spawn>"] and bool(ents)
                        break
                blocks.append(ents)
                if not ok:
                    break
                nxt = say()
                if nxt == vocab["<wait>"]:
                    break
                ok = nxt == vocab["<spawn>"]
            ok = ok and ctx[-1] == vocab["<wait>"] and spawned + len(blocks) <= cfg.max_subagents
            if not ok:
                env(vocab["<fail>"])
                continue
            results = []
            for ents in blocks:
                steps, pairs = _run_worker(cfg, vocab, ep, ents, worker)
                stage["worker_steps"].append(steps)
                results.append(pairs)
            stage["results"] = results
            spawned += len(blocks)
            finished += sum(r is not None for r in results)
            total += sum(stage["worker_steps"])
            crit += max(stage["worker_steps"])
            for pairs in results:
                body = ([vocab["<fail>"]] if pairs is None else
                        [t for e, v in pairs for t in (vocab.entity(e), vocab.value(v))])
                env(vocab["<result>"], *body, vocab["</result>"])
        else:
            env(vocab["<fail>"])
    return Outcome(orch_tokens=ctx, sampled=sampled, answer=answer, end_reason=reason,
                   orch_steps=orch_steps, critical_steps=crit, total_steps=total,
                   spawned=spawned, finished=finished, stages=stages)


def scripted(tokens: Sequence[int]) -> Policy:
    """A policy that emits ``tokens`` in order (then ``<eos>``), ignoring the context."""
    it = iter(tokens)
    return lambda ctx: next(it, PROTOCOL.index("<eos>"))
