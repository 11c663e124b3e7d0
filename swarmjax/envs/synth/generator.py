"""Generated environments and their tasks: seeded, executed on an initial state, filtered.

:func:`generate` builds a universe of domains (:mod:`~swarmjax.envs.synth.world`), its
tool graph and Louvain communities (:mod:`~swarmjax.envs.synth.graph`), one
:class:`~swarmjax.envs.synth.world.EnvSpec` per community, then tasks per environment
two ways:

* **random walks** (environment scaling, AgentScaler, arXiv 2509.13311): a start tool, then up to
  ``max_calls - 1`` steps along any edge of the graph inside the environment; each
  input is filled from the previous output (the edge's io pair, else an output field of
  the same name), else a literal drawn from the state;
* **shortest paths** (FunReason-MT, arXiv 2510.24645): a target tool, and the shortest io path to it from
  an entry tool (``list`` / ``find`` / ``count`` / ``total``): a correct, efficient
  trajectory ending in the target call.

Every call is checked against its tool's JSON schema and executed on the task's
initial state (:func:`~swarmjax.envs.synth.world.initial_state` of its ``state_seed``).
Filtered out, and counted in :class:`SynthData` ``counts``: ``malformed`` (arguments that
fail the schema: a same-named field of another kind with other values), ``invalid`` (a
call that raises, or a first key of an empty list), ``corrupted`` (a final state that
:func:`~swarmjax.envs.synth.world.broken` finds wrong: a delete that left references
dangling), ``unchained`` (a step none of whose inputs comes from the previous output),
``empty_answer``, ``no_change`` (a write that leaves the state as it was: doing
nothing would score), ``no_path`` (a target no entry tool reaches) and ``duplicate``
(a query the environment already has).

The query is written from the trajectory by templates (:func:`phrase`); ``rewrite``
(``(query, record) -> query``) is the hook for a model that rewrites it. A task of
several ``parts`` (read-only walks on the same state) asks its questions as a numbered
list: the parts are independent, so sub-agents can take them in parallel.

Splits are by environment: ``train`` and ``seen`` (disjoint tasks of the training
environments), ``validation`` and ``test`` (tasks of held-out environments, whose
tools the policy never saw in training; different environments in each). Each split
interleaves its environments (:func:`interleave`), so its first tasks span them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import networkx as nx

from swarmjax.envs.synth.graph import communities, graph_stats, tool_graph
from swarmjax.envs.synth.world import (OPS, READ, WRITE, EnvSpec, Kind, State, ToolError, ToolSpec, broken, changes,
                                       converter_tools, execute, generate_domain, initial_state, kind_tools,
                                       parameters)

SPLITS = ("train", "seen", "validation", "test")
FILTERS = ("malformed", "invalid", "corrupted", "unchained", "empty_answer", "no_change", "no_path", "duplicate")
ENTRY = ("list", "find", "count", "total")


@dataclasses.dataclass(frozen=True)
class SynthConfig:
    """A generated task set.

    Args:
      domains: domains in the universe (Louvain finds the environments among their tools).
      kinds: (min, max) entity kinds per domain.
      categories, measures: (min, max) category and measure fields per kind.
      ops: the operations tools are generated for (:data:`~swarmjax.envs.synth.world.OPS`).
      rows: rows per table in a task's initial state.
      max_calls: most calls in one part of a task.
      max_parts: most independent parts in one task (read-only when more than one).
      tasks: tasks kept over all environments (each gets an equal share).
      held_out: share of the environments held out (validation and test).
      seen: share of a training environment's tasks kept for the ``seen`` split.
      path_fraction: share of tasks from shortest paths (the rest from random walks).
      write_fraction: share of single-part tasks that end in a write.
      similarity: the TF-IDF cosine of a similarity edge.
      resolution: Louvain's resolution (larger: more, smaller communities).
      min_tools: communities with fewer tools are no environment (counted).
      seed: everything above is deterministic in it.
    """

    domains: int = 16
    kinds: tuple[int, int] = (2, 3)
    categories: tuple[int, int] = (1, 2)
    measures: tuple[int, int] = (1, 2)
    ops: tuple[str, ...] = OPS
    rows: int = 4
    max_calls: int = 3
    max_parts: int = 1
    tasks: int = 2000
    held_out: float = 0.25
    seen: float = 0.1
    path_fraction: float = 0.5
    write_fraction: float = 0.3
    similarity: float = 0.6
    resolution: float = 1.0
    min_tools: int = 8
    seed: int = 0

    def __post_init__(self):
        lo, hi = self.kinds
        if self.domains < 2 or not 1 <= lo <= hi <= 4:
            raise ValueError(f"need domains >= 2 and 1 <= kinds <= 4, got {self.domains}, {self.kinds}")
        if not 1 <= self.categories[0] <= self.categories[1] <= 3 or not 1 <= self.measures[0] <= self.measures[1] <= 3:
            raise ValueError(f"need 1 <= categories, measures <= 3, got {self.categories}, {self.measures}")
        unknown = set(self.ops) - set(OPS)
        if unknown or not set(self.ops) & set(READ):
            raise ValueError(f"ops must be among {OPS} and include a read operation, got {self.ops}")
        if self.rows < 2 or self.max_calls < 1 or self.max_parts < 1 or self.tasks < 1:
            raise ValueError("need rows >= 2, max_calls >= 1, max_parts >= 1, tasks >= 1")
        for name, top in (("held_out", 0.9), ("seen", 0.9), ("path_fraction", 1.0), ("write_fraction", 1.0)):
            if not 0.0 <= getattr(self, name) <= top:
                raise ValueError(f"{name} must be in [0, {top}], got {getattr(self, name)}")


@dataclasses.dataclass
class SynthData:
    """What :func:`generate` returns: the environments, the tasks of each split (records,
    JSON-able), which environments each split holds, the filter counts and the graph's
    statistics."""

    config: SynthConfig
    envs: list[EnvSpec]
    splits: dict[str, list[dict[str, Any]]]
    split_envs: dict[str, list[str]]
    counts: dict[str, int]
    stats: dict[str, Any]


# ------------------------------------------------------------------ phrasing


def _noun(kind: Kind) -> str:
    return kind.name.replace("_", " ")


def _lit(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) and "-" not in value else str(value)


def phrase(env: EnvSpec, spec: ToolSpec, args: Mapping[str, str], ask: str, *, final: bool) -> str:
    """The words for one call: a noun phrase of the value it passes on (``ask``: the
    field of its result used; ``"."`` the result itself), or, ``final``, the question or
    instruction of the whole task. ``args``: each argument as words (a literal, or the
    earlier call's phrase)."""
    if spec.op == "convert":
        text = f"{args['amount']} converted to {spec.units[1]}"
        return f"What is {text}?" if final else text
    kind = env.kind(spec.kind)
    noun, key = _noun(kind), kind.key
    x = args.get(key, "")
    f = args.get(spec.field, "")
    target = f"{noun} {x}" if x and " " not in x else x        # a literal key ("parcel PAR-103"), or a phrase
    if spec.op in ("get", "update") and not final and ask != ".":
        return f"the {ask} of {target}" if spec.op == "get" else \
            f"the {ask} of {target} after setting its {spec.field} to {args['value']}"
    fields = ", ".join(f"{n} {args[n]}" for n in parameters(spec, {k.name: k for k in env.kinds})["properties"])
    texts = {
        "get": lambda: f"What is the {ask} of {target}?",
        "update": lambda: f"Set the {spec.field} of {target} to {args['value']}. Then give its {ask}.",
        "delete": lambda: f"Delete {target}. Then give its {key}.",
        "list": lambda: f"List the {key} of every {noun}." if final else f"the first {noun} on record",
        "find": lambda: (f"Which {noun} records have {spec.field} {f}? Give their {key}." if final
                         else f"the first {noun} whose {spec.field} is {f}"),
        "count": lambda: (f"How many {noun} records have {spec.field} {f}?" if final
                          else f"the number of {noun} records whose {spec.field} is {f}"),
        "total": lambda: (f"What is the total {spec.measure} of the {noun} records whose {spec.field} is {f}?"
                          if final else f"the total {spec.measure} of the {noun} records whose {spec.field} is {f}"),
        "create": lambda: (f"Create a {noun} with {fields}. Then give its {key}." if final
                           else f"the new {noun} with {fields}"),
    }
    return texts[spec.op]()


# ------------------------------------------------------------------ one trajectory


class _Rejected(Exception):
    """A candidate filtered out; ``args[0]`` is the filter (:data:`FILTERS`)."""


@functools.cache
def _validator(params_json: str):
    from jsonschema import Draft202012Validator        # imported on first use, as swarmjax.text.tools does
    return Draft202012Validator(json.loads(params_json))


def valid_arguments(env: EnvSpec, spec: ToolSpec, args: Mapping[str, Any]) -> bool:
    """Whether ``args`` satisfy ``spec``'s JSON schema (:func:`~swarmjax.envs.synth.world.parameters`)."""
    schema = parameters(spec, {k.name: k for k in env.kinds})
    return _validator(json.dumps(schema, sort_keys=True)).is_valid(dict(args))


def _literal(env: EnvSpec, spec: ToolSpec, param: str, state: State, rng: random.Random) -> Any:
    """A value for ``param`` drawn from ``state``: mostly one the tables hold (an id that
    exists, a category some row has), sometimes not (an id past the table, any value
    of the category), as a person asking would."""
    if spec.op == "convert":
        return rng.randint(1, 400)
    kind = env.kind(spec.kind)
    field = kind.field(spec.field if param == "value" else param) if param != kind.key else kind.fields[0]
    rows = state[kind.name]
    if field.type == "key":
        return rng.choice(rows)[kind.key] if rng.random() < 0.95 else f"{kind.prefix}-{100 + len(rows) + 9}"
    if field.type == "ref":
        return rng.choice(state[field.ref])[env.kind(field.ref).key]
    if field.type == "category":
        held = sorted({r[field.name] for r in rows})
        if param == "value":
            return rng.choice(field.values)
        return rng.choice(held) if rng.random() < 0.8 else rng.choice(field.values)
    return rng.randint(1, 400)


def _carried(output: Any, field: str) -> Any:
    """The value an output passes on: a field of a record, the first key of a list."""
    if field == ".":
        if isinstance(output, list):
            if not output:
                raise _Rejected("invalid")
            return output[0]
        return output
    return output[field]


def run_chain(env: EnvSpec, g: nx.DiGraph, chain: Sequence[str], state: State, rng: random.Random
              ) -> tuple[list[dict[str, Any]], State, str]:
    """Execute the tools ``chain`` on ``state``: (calls ``{"name", "arguments", "output",
    "from"}`` (``from``: which argument came from which output of the call before; the
    last call's ``ask``: the field of its result the question asks for), the state
    after, the question). Raises :class:`_Rejected` (module docstring)."""
    kinds = {k.name: k for k in env.kinds}
    calls: list[dict[str, Any]] = []
    before: tuple[ToolSpec, dict[str, str]] | None = None
    for i, name in enumerate(chain):
        spec = env.tool(name)
        props = parameters(spec, kinds)["properties"]
        args: dict[str, Any] = {}
        said: dict[str, str] = {}
        source: dict[str, str] = {}
        if before is not None:
            prev = calls[-1]
            edge = g.edges[chain[i - 1], name] if g.has_edge(chain[i - 1], name) else {"io": []}
            pairs = {param: out for out, param in edge["io"]}
            for p in props:
                out = pairs.get(p) or (p if isinstance(prev["output"], dict) and p in prev["output"] else None)
                if out is not None:
                    args[p] = _carried(prev["output"], out)
                    said[p] = phrase(env, before[0], before[1], out, final=False)
                    source[p] = out
            if not args:
                raise _Rejected("unchained")
        for p in props:
            if p not in args:
                args[p] = _literal(env, spec, p, state, rng)
                said[p] = _lit(args[p])
        if not valid_arguments(env, spec, args):
            raise _Rejected("malformed")
        try:
            state, output = execute(env, spec, state, args)
        except ToolError:
            raise _Rejected("invalid") from None
        calls.append({"name": name, "arguments": args, "output": output, "from": source})
        before = (spec, said)
    spec, said = before
    ask = "."
    if spec.op in ("get", "update"):
        fields = [f.name for f in env.kind(spec.kind).fields[1:]]
        ask = rng.choice([f for f in fields if f != spec.field] or fields)
    calls[-1]["ask"] = ask
    return calls, state, phrase(env, spec, said, ask, final=True)


def answer_of(call: Mapping[str, Any]) -> Any:
    """The expected answer of a part: its last call's output, the asked field of a
    record, the key a delete removed."""
    out, ask = call["output"], call.get("ask", ".")
    if call["name"].startswith("delete_"):
        return out["deleted"]
    return out[ask] if ask != "." else out


# ------------------------------------------------------------------ chains


def _env_graph(g: nx.DiGraph, env: EnvSpec) -> nx.DiGraph:
    """The environment's part of the tool graph, as a graph of its own, nodes in the
    environment's tool order and edges in the whole graph's (``g.subgraph`` iterates a
    small node subset in set order, which follows Python's string hashing: the tasks
    then differed from one process to the next)."""
    names = [t.name for t in env.tools]
    keep = set(names)
    sub = nx.DiGraph()
    sub.add_nodes_from((n, g.nodes[n]) for n in names)
    sub.add_edges_from((a, b, d) for a, b, d in g.edges(data=True) if a in keep and b in keep)
    return sub


def walk_chain(env: EnvSpec, g: nx.DiGraph, rng: random.Random, *, length: int, write: bool) -> list[str]:
    """A random walk of up to ``length`` tools along any edge inside the environment;
    only the last tool may write (and does when ``write`` and a write tool is in reach)."""
    ops = {t.name: t.op for t in env.tools}
    reads = [t for t in ops if ops[t] not in WRITE]
    if length == 1 and write:
        return [rng.choice([t for t in ops if ops[t] in WRITE] or reads)]
    chain = [rng.choice(reads)]
    while len(chain) < length:
        last = len(chain) + 1 == length
        nexts = [b for b in sorted(g.successors(chain[-1])) if b != chain[-1]
                 and ((ops[b] in WRITE) == (last and write) or (not write and ops[b] in READ))]
        if not nexts:
            break
        chain.append(rng.choice(nexts))
    return chain


class EntryPaths:
    """Shortest io paths from the entry tools (``list`` / ``find`` / ``count`` /
    ``total``) of one environment: its io graph with a source before every entry tool,
    built once; each target's path found once (FunReason-MT's correct, efficient
    trajectories to a target call)."""

    def __init__(self, env: EnvSpec, g: nx.DiGraph):
        self.env = env
        self.io = nx.DiGraph([(a, b) for a, b, d in g.edges(data=True) if d["io"]])
        self.io.add_nodes_from(g.nodes)
        self.io.add_edges_from(("", t.name) for t in env.tools if t.op in ENTRY)
        self._found: dict[str, list[str] | None] = {}

    def to(self, target: str) -> list[str] | None:
        """The tools from an entry tool to ``target`` (None: no entry reaches it)."""
        if target not in self._found:
            try:
                self._found[target] = nx.shortest_path(self.io, "", target)[1:]
            except nx.NetworkXNoPath:
                self._found[target] = None
        return self._found[target]


def path_chain(env: EnvSpec, paths: EntryPaths, rng: random.Random, *, write: bool) -> list[str] | None:
    """The shortest io path from an entry tool to a random target tool that is no entry
    tool itself (a write one when ``write``): None when no entry reaches the target."""
    targets = [t.name for t in env.tools if (t.op in WRITE) == write and t.op not in ENTRY]
    if not targets:
        return None
    return paths.to(rng.choice(sorted(targets)))


# ------------------------------------------------------------------ the task set


def build_envs(cfg: SynthConfig) -> tuple[list[EnvSpec], nx.DiGraph, dict[str, Any], int]:
    """The universe's environments: (environments, the whole tool graph, its statistics,
    communities dropped as smaller than ``min_tools``)."""
    rng = random.Random(cfg.seed)
    used: set[str] = set()
    kinds: list[Kind] = []
    for _ in range(cfg.domains):
        kinds += generate_domain(rng, used, kinds=rng.randint(*cfg.kinds), categories=cfg.categories,
                                 measures=cfg.measures)
    by_name = {k.name: k for k in kinds}
    tools = [t for k in kinds for t in kind_tools(k, cfg.ops)] + converter_tools(cfg.ops)
    g = tool_graph(tools, by_name, threshold=cfg.similarity)
    groups = communities(g, seed=cfg.seed, resolution=cfg.resolution)
    envs, small = [], 0
    for group in groups:
        if len(group) < cfg.min_tools:
            small += 1
            continue
        touched = {g.nodes[n]["spec"].kind for n in group} - {""}
        while True:                                     # the tables the referenced keys live in
            more = {f.ref for k in touched for f in by_name[k].of_type("ref")} - touched
            if not more:
                break
            touched |= more
        envs.append(EnvSpec(f"env{len(envs):03d}", tuple(k for k in kinds if k.name in touched),
                            tuple(g.nodes[n]["spec"] for n in group), rows=cfg.rows))
    return envs, g, graph_stats(g, groups), small


def env_tasks(cfg: SynthConfig, env: EnvSpec, g: nx.DiGraph, count: int, counts: dict[str, int], *,
              rewrite: Callable[[str, dict[str, Any]], str] | None = None) -> list[dict[str, Any]]:
    """``count`` tasks of one environment, ``write_fraction`` of them writes (the other
    kind makes up for one whose candidates keep failing: :func:`_tried`; fewer tasks when
    too many candidates are filtered: at most 20 candidates per task are tried);
    ``counts`` gains the filter counts."""
    rng = random.Random(f"{cfg.seed}/{env.name}")
    sub = _env_graph(g, env)
    paths = EntryPaths(env, sub)
    out: list[dict[str, Any]] = []
    queries: set[str] = set()
    writes = round(cfg.write_fraction * count) if any(t.op in WRITE for t in env.tools) else 0
    left = {False: count - writes, True: writes}           # tasks still wanted: reads, writes
    tries = {k: TRIES * n for k, n in left.items()}        # candidates each kind may still try
    attempt = 0
    while sum(left.values()) and attempt < 20 * count:
        attempt += 1
        counts["candidates"] += 1
        state_seed = rng.randrange(2 ** 31)
        state = initial_state(env, state_seed)
        write = rng.random() * sum(left.values()) < left[True]
        n_parts = 1 if write else rng.randint(1, cfg.max_parts)
        method = "path" if rng.random() < cfg.path_fraction else "walk"
        try:
            parts, final = [], state
            for _ in range(n_parts):
                chain = (path_chain(env, paths, rng, write=write) if method == "path" else
                         walk_chain(env, sub, rng, length=rng.randint(1, cfg.max_calls), write=write))
                if not chain or len(chain) > cfg.max_calls:
                    raise _Rejected("no_path")
                calls, final, question = run_chain(env, sub, chain, final, rng)
                answer = answer_of(calls[-1])
                if answer == [] or answer == "":
                    raise _Rejected("empty_answer")
                parts.append({"question": question, "calls": calls, "answer": answer})
            if broken(env, final):
                raise _Rejected("corrupted")
            if write and not changes(state, final):
                raise _Rejected("no_change")
        except _Rejected as e:
            counts[e.args[0]] += 1
            _tried(tries, left, write, can_write=writes > 0)
            continue
        query = parts[0]["question"] if n_parts == 1 else (
            "Answer each question on its own line as <number>: <answer>.\n"
            + "\n".join(f"{i + 1}. {p['question']}" for i, p in enumerate(parts)))
        record = {"task_id": f"{env.name}/{len(out)}", "env": env.name, "method": method,
                  "kind": "write" if write else "read", "state_seed": state_seed, "parts": parts,
                  "changes": sorted(list(c) for c in changes(state, final))}
        record["query"] = rewrite(query, record) if rewrite is not None else query
        if record["query"] in queries:
            counts["duplicate"] += 1
            _tried(tries, left, write, can_write=writes > 0)
            continue
        queries.add(record["query"])
        left[write] -= 1
        _tried(tries, left, write, can_write=writes > 0)
        out.append(record)
    return out


TRIES = 10          # candidates a kind may try per task of its quota before its quota moves to the other kind


def _tried(tries: dict[bool, int], left: dict[bool, int], write: bool, *, can_write: bool) -> None:
    """Count a candidate of kind ``write``; once the kind has used its tries (an
    environment whose distinct reads or writes run out), hand its remaining quota, with
    tries for it, to the other kind (reads always; writes when the environment has write
    tools)."""
    tries[write] -= 1
    if tries[write] <= 0 and left[write] and (write or can_write):
        tries[not write] += TRIES * left[write]
        left[not write] += left[write]
        left[write] = 0


def generate(cfg: SynthConfig, *, rewrite: Callable[[str, dict[str, Any]], str] | None = None,
             progress: Callable[[int, int], None] | None = None) -> SynthData:
    """The whole task set of ``cfg`` (module docstring), deterministic in ``cfg``.
    ``progress(done, total)`` is called after each environment."""
    envs, g, stats, small = build_envs(cfg)
    order = random.Random(cfg.seed).sample(envs, len(envs))
    held = max(2, round(cfg.held_out * len(envs))) if cfg.held_out > 0 else 0
    if len(envs) - held < 1:
        raise ValueError(f"{len(envs)} environments leave none to train on with held_out={cfg.held_out}: "
                         "generate more domains")
    split_envs = {"train": sorted(e.name for e in order[held:]), "validation": sorted(e.name for e in order[:held:2]),
                  "test": sorted(e.name for e in order[1:held:2])}
    split_envs["seen"] = split_envs["train"]
    counts = {"candidates": 0, **{f: 0 for f in FILTERS}, "small_communities": small}
    groups: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in SPLITS}     # split -> per environment
    per_env = -(-cfg.tasks // len(envs))
    for i, env in enumerate(envs):
        tasks = env_tasks(cfg, env, g, per_env, counts, rewrite=rewrite)
        if env.name in split_envs["train"]:
            cut = round(cfg.seen * len(tasks))
            groups["seen"].append(tasks[:cut])
            groups["train"].append(tasks[cut:])
        else:
            groups["validation" if env.name in split_envs["validation"] else "test"].append(tasks)
        if progress is not None:
            progress(i + 1, len(envs))
    splits = {s: interleave(groups[s]) for s in SPLITS}
    counts["kept"] = sum(len(v) for v in splits.values())
    return SynthData(cfg, envs, splits, split_envs, counts, stats)


def interleave(groups: Sequence[Sequence[Any]]) -> list[Any]:
    """Round robin over ``groups`` (item 0 of each, then item 1, ...): a split's tasks in
    this order, so any prefix of it (an evaluation's first N tasks) spans its environments."""
    longest = max((len(g) for g in groups), default=0)
    return [g[i] for i in range(longest) for g in groups if i < len(g)]
