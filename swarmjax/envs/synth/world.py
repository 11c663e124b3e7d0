"""Typed entities, their tables and the tools over them: what a generated environment is.

A *domain* (generated, seeded) holds 2-4 entity *kinds*; a kind has a key
(``parcel_id``: ``"PAR-103"``), category fields (``status`` in a fixed set of values),
measure fields (``weight`` in kg, an integer) and references to kinds earlier in its
domain (``courier_id``). The *state* is one table per kind (a list of rows, dicts of
field -> value), generated from a seed.

Tools are functions over the state, one :class:`ToolSpec` each, in three groups:

* read: ``get_K(K_id)`` (the row), ``list_K()`` (every key), ``find_K_by_F(F)`` (keys
  whose category F has the value);
* compute: ``count_K_by_F(F)``, ``total_K_M_by_F(F)`` (sum of measure M over the rows
  whose F has the value), ``convert_U_to_V(amount)`` (units, affine);
* write: ``create_K(fields...)`` (the new key), ``update_K_F(K_id, value)`` (the row
  after), ``delete_K(K_id)``.

Each tool's parameters are a JSON schema (enums for categories; keys are strings and
amounts integers, which :func:`execute` checks: a schema keyword the device's call
parser does not read stays out of it, so a call means the same on the host and on the
device, :mod:`~swarmjax.envs.synth.device_task`);
:func:`slots` gives the typed *slots* it reads and writes (``id:Domain.kind``,
``cat:Domain.kind.field``, ``num:unit``), from which :mod:`~swarmjax.envs.synth.graph`
draws output -> input edges. :func:`execute` runs one call as a pure function:
``(state, args) -> (state', output)``; a call that cannot run raises :class:`ToolError`
with one fixed sentence per cause (:func:`missing_text`, :data:`AMOUNT_TEXT`): an agent
learns what went wrong, and the sentence never echoes what it wrote.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping
from typing import Any

State = dict[str, list[dict[str, Any]]]       # kind name -> rows (field -> value)

CATEGORIES: dict[str, tuple[str, ...]] = {
    "status": ("open", "closed", "pending", "shipped", "lost", "active", "archived"),
    "city": ("Lyon", "Osaka", "Quito", "Perth", "Oslo", "Accra", "Lima", "Pune"),
    "tier": ("bronze", "silver", "gold", "platinum"),
    "color": ("red", "blue", "green", "amber", "violet", "grey"),
    "priority": ("low", "medium", "high", "urgent"),
    "region": ("north", "south", "east", "west", "central"),
    "genre": ("jazz", "folk", "drama", "comedy", "science", "travel"),
    "shift": ("morning", "evening", "night"),
}
MEASURES: dict[str, str] = {"weight": "kg", "price": "usd", "distance": "km", "duration": "min", "stock": "count",
                            "capacity": "count", "rating": "points", "age": "years", "length": "m",
                            "temperature": "celsius"}
# (from unit, to unit) -> (scale in 1/10000, offset in 1/100): integer fixed point, so the host
# and the device twin (swarmjax.envs.synth.device) compute the same hundredths
CONVERSIONS: dict[tuple[str, str], tuple[int, int]] = {
    ("kg", "lb"): (22046, 0), ("usd", "eur"): (9200, 0), ("km", "mi"): (6214, 0), ("min", "h"): (167, 0),
    ("m", "cm"): (1_000_000, 0), ("celsius", "fahrenheit"): (18000, 3200)}
MAX_AMOUNT = 100_000          # a conversion's largest amount: its hundredths stay in int32 on the device
KINDS = ("order", "customer", "product", "parcel", "courier", "warehouse", "flight", "passenger", "airport",
         "hotel", "guest", "room", "patient", "doctor", "clinic", "book", "author", "library", "course",
         "student", "teacher", "invoice", "vendor", "account", "vehicle", "driver", "route", "event", "venue",
         "ticket", "song", "artist", "album", "recipe", "chef", "ingredient", "device", "owner", "repair",
         "project", "employee", "team", "plant", "garden", "sensor", "ship", "port", "cargo")
READ, COMPUTE, WRITE = ("get", "list", "find"), ("count", "total", "convert"), ("create", "update", "delete")
OPS = READ + COMPUTE + WRITE
_SYLLABLES = ("ka", "lo", "mi", "ren", "tor", "va", "sel", "dun", "pa", "ri", "zo", "bel", "nu", "ta", "gor")


class ToolError(Exception):
    """A call that cannot run on the state (a key that does not exist, ...): its message
    is the error text the agent reads."""


@dataclasses.dataclass(frozen=True)
class Field:
    """One column: ``type`` is ``"key"``, ``"ref"`` (``ref``: the kind it points to),
    ``"category"`` (``values``) or ``"measure"`` (``unit``; non-negative integers)."""

    name: str
    type: str
    values: tuple[str, ...] = ()
    ref: str = ""
    unit: str = ""


@dataclasses.dataclass(frozen=True)
class Kind:
    """An entity kind of a domain: its name (unique in the universe), id prefix and fields
    (``fields[0]`` the key)."""

    name: str
    domain: str
    prefix: str
    fields: tuple[Field, ...]

    @property
    def key(self) -> str:
        return self.fields[0].name

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def of_type(self, type_: str) -> list[Field]:
        return [f for f in self.fields if f.type == type_]


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, operation (:data:`OPS`), the kind it works on ("" for
    ``convert``), the category or updated ``field``, the summed ``measure``, the
    ``units`` of a conversion and its description."""

    name: str
    op: str
    kind: str = ""
    field: str = ""
    measure: str = ""
    units: tuple[str, str] = ("", "")
    description: str = ""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """A generated environment: its kinds (every table its tools touch, references
    included), its tools and the rows per table of an initial state."""

    name: str
    kinds: tuple[Kind, ...]
    tools: tuple[ToolSpec, ...]
    rows: int = 4

    def kind(self, name: str) -> Kind:
        return next(k for k in self.kinds if k.name == name)

    def tool(self, name: str) -> ToolSpec:
        return next(t for t in self.tools if t.name == name)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> EnvSpec:
        kinds = tuple(Kind(k["name"], k["domain"], k["prefix"],
                           tuple(Field(f["name"], f["type"], tuple(f["values"]), f["ref"], f["unit"])
                                 for f in k["fields"])) for k in d["kinds"])
        tools = tuple(ToolSpec(**{**t, "units": tuple(t["units"])}) for t in d["tools"])
        return EnvSpec(d["name"], kinds, tools, int(d["rows"]))


# ------------------------------------------------------------------ generation


def domain_name(rng: random.Random) -> str:
    """A pronounceable domain name ("Kalotor")."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def generate_domain(rng: random.Random, used: set[str], *, kinds: int, categories: tuple[int, int] = (1, 2),
                    measures: tuple[int, int] = (1, 2)) -> list[Kind]:
    """One domain of ``kinds`` entity kinds, each with ``categories`` and ``measures``
    (min, max) fields of those types, and a reference to an earlier kind. A noun
    already used elsewhere is qualified with the domain's name (``kalotor_parcel``), so
    every kind (and so every tool name) is unique in the universe."""
    domain = domain_name(rng)
    while f"domain:{domain}" in used:                 # domain names are unique too
        domain = domain_name(rng)
    used.add(f"domain:{domain}")
    out: list[Kind] = []
    for noun in rng.sample(KINDS, kinds):
        name = noun if noun not in used else f"{domain.lower()}_{noun}"
        if name in used:
            raise ValueError(f"kind {name!r} generated twice")
        used.add(noun)
        used.add(name)
        fields = [Field(f"{name}_id", "key")]
        for cat in rng.sample(sorted(CATEGORIES), rng.randint(*categories)):
            values = rng.sample(CATEGORIES[cat], min(rng.randint(3, 4), len(CATEGORIES[cat])))
            fields.append(Field(cat, "category", values=tuple(values)))
        for m in rng.sample(sorted(MEASURES), rng.randint(*measures)):
            fields.append(Field(m, "measure", unit=MEASURES[m]))
        if out:
            ref = rng.choice(out)
            fields.append(Field(ref.key, "ref", ref=ref.name))
        out.append(Kind(name, domain, prefix=noun[:3].upper(), fields=tuple(fields)))
    return out


def kind_tools(kind: Kind, ops: tuple[str, ...] = OPS) -> list[ToolSpec]:
    """The tools of one kind whose operation is in ``ops`` (module docstring), with
    descriptions."""
    k, d = kind.name, f"the {kind.domain} registry"
    noun = k.replace("_", " ")
    tools = [ToolSpec(f"get_{k}", "get", k, description=f"Get one {noun} record from {d} by its {kind.key}."),
             ToolSpec(f"list_{k}", "list", k, description=f"List the {kind.key} of every {noun} in {d}."),
             ToolSpec(f"create_{k}", "create", k, description=f"Create a {noun} in {d}; returns its new {kind.key}."),
             ToolSpec(f"delete_{k}", "delete", k, description=f"Delete the {noun} with this {kind.key} from {d}.")]
    for f in kind.of_type("category"):
        tools += [ToolSpec(f"find_{k}_by_{f.name}", "find", k, f.name,
                           description=f"Find the {kind.key} of every {noun} whose {f.name} is the given value."),
                  ToolSpec(f"count_{k}_by_{f.name}", "count", k, f.name,
                           description=f"Count the {noun} records whose {f.name} is the given value.")]
        for m in kind.of_type("measure"):
            tools.append(ToolSpec(f"total_{k}_{m.name}_by_{f.name}", "total", k, f.name, m.name,
                                  description=f"Total {m.name} ({m.unit}) of the {noun} records whose {f.name} "
                                              "is the given value."))
    for f in kind.fields[1:]:
        if f.type != "ref":
            tools.append(ToolSpec(f"update_{k}_{f.name}", "update", k, f.name,
                                  description=f"Set the {f.name} of the {noun} with this {kind.key}; "
                                              "returns the record."))
    return [t for t in tools if t.op in ops]


def converter_tools(ops: tuple[str, ...] = OPS) -> list[ToolSpec]:
    """The unit conversions (:data:`CONVERSIONS`), shared by every domain (none unless
    ``"convert"`` is in ``ops``)."""
    return [ToolSpec(f"convert_{a}_to_{b}", "convert", units=(a, b),
                     description=f"Convert an amount in {a} to {b}.") for a, b in CONVERSIONS if "convert" in ops]


# ------------------------------------------------------------------ schemas and slots


def _key_schema(kind: Kind) -> dict[str, Any]:
    return {"type": "string", "description": f"A {kind.key} such as {kind.prefix}-101."}


def _amount_schema(unit: str) -> dict[str, Any]:
    return {"type": "integer", "description": f"In {unit}, 0 to {MAX_AMOUNT}."}


def _field_schema(f: Field, kinds: Mapping[str, Kind]) -> dict[str, Any]:
    if f.type == "category":
        return {"type": "string", "enum": list(f.values)}
    if f.type == "measure":
        return _amount_schema(f.unit)
    return _key_schema(kinds[f.ref])


def parameters(spec: ToolSpec, kinds: Mapping[str, Kind]) -> dict[str, Any]:
    """The JSON schema (Draft 2020-12 object) of ``spec``'s arguments."""
    props: dict[str, Any] = {}
    if spec.op == "convert":
        props["amount"] = _amount_schema(spec.units[0])
    else:
        kind = kinds[spec.kind]
        if spec.op in ("get", "update", "delete"):
            props[kind.key] = _key_schema(kind)
        if spec.op in ("find", "count", "total"):
            props[spec.field] = _field_schema(kind.field(spec.field), kinds)
        if spec.op == "update":
            props["value"] = _field_schema(kind.field(spec.field), kinds)
        if spec.op == "create":
            props.update({f.name: _field_schema(f, kinds) for f in kind.fields[1:]})
    return {"type": "object", "properties": props, "required": list(props)}     # Tool refuses unknown names


def field_slot(kind: Kind, f: Field) -> str:
    """The typed slot of a field: ``id:<domain>.<kind>``, ``cat:<domain>.<kind>.<field>``
    or ``num:<domain>.<kind>.<field>@<unit>`` (a measure fills that field's inputs, and
    any ``num:<unit>`` input: :func:`fits`). References stay in their domain."""
    if f.type in ("key", "ref"):
        return f"id:{kind.domain}.{f.ref or kind.name}"
    if f.type == "category":
        return f"cat:{kind.domain}.{kind.name}.{f.name}"
    return f"num:{kind.domain}.{kind.name}.{f.name}@{f.unit}"


def fits(output: str, input_: str) -> bool:
    """Whether a value of slot ``output`` can fill an input of slot ``input_``: the same
    slot, or a measure into a bare unit (``num:...@kg`` into ``num:kg``)."""
    return output == input_ or (output.startswith("num:") and "@" in output
                                and input_ == "num:" + output.rpartition("@")[2])


def slots(spec: ToolSpec, kinds: Mapping[str, Kind]) -> tuple[dict[str, str], dict[str, str]]:
    """(inputs, outputs) of ``spec`` as {name: slot}: inputs by parameter, outputs by the
    field of the result they come from (``"."``: the result itself; a list of keys
    gives its first key)."""
    if spec.op == "convert":
        return {"amount": f"num:{spec.units[0]}"}, {".": f"num:{spec.units[1]}"}
    kind = kinds[spec.kind]
    ins: dict[str, str] = {}
    if spec.op in ("get", "update", "delete"):
        ins[kind.key] = field_slot(kind, kind.fields[0])
    if spec.op in ("find", "count", "total"):
        ins[spec.field] = field_slot(kind, kind.field(spec.field))
    if spec.op == "update":
        ins["value"] = field_slot(kind, kind.field(spec.field))
    if spec.op == "create":
        ins.update({f.name: field_slot(kind, f) for f in kind.fields[1:]})
    outs = {"get": lambda: {f.name: field_slot(kind, f) for f in kind.fields},
            "count": lambda: {".": "num:count"},
            "total": lambda: {".": field_slot(kind, kind.field(spec.measure))},
            "delete": dict}.get(spec.op, lambda: {".": field_slot(kind, kind.fields[0])})()
    if spec.op == "update":
        outs = {f.name: field_slot(kind, f) for f in kind.fields}
    return ins, outs


# ------------------------------------------------------------------ state and execution


def initial_state(env: EnvSpec, seed: int) -> State:
    """``env.rows`` rows per table, deterministic in ``seed``: categories uniform over
    their values, measures in [1, 400] (temperatures in [-20, 40] are shifted to [0, 60]:
    measures are non-negative), references to existing rows of the referenced kind."""
    rng = random.Random(seed)
    state: State = {}
    pending = list(env.kinds)
    while pending:                                  # referenced kinds first
        kind = next(k for k in pending if all(f.ref in state for f in k.of_type("ref")))
        pending.remove(kind)
        rows = []
        for i in range(env.rows):
            row: dict[str, Any] = {kind.key: f"{kind.prefix}-{101 + i}"}
            for f in kind.fields[1:]:
                if f.type == "category":
                    row[f.name] = rng.choice(f.values)
                elif f.type == "measure":
                    row[f.name] = rng.randint(0, 60) if f.unit == "celsius" else rng.randint(1, 400)
                else:
                    row[f.name] = rng.choice(state[f.ref])[env.kind(f.ref).key]
            rows.append(row)
        state[kind.name] = rows
    return state


def convert(units: tuple[str, str], amount: int) -> float:
    """``amount`` (an integer >= 0) in ``units[1]``, to the hundredth (half up):
    ``((amount * scale + 50) // 100 + offset) / 100`` in integers (:data:`CONVERSIONS`)."""
    scale, offset = CONVERSIONS[units]
    return ((amount * scale + 50) // 100 + offset) / 100


def missing_text(kind: Kind) -> str:
    """The error of a key (or reference) that names no row of ``kind``."""
    return f"Error: no {kind.name.replace('_', ' ')} has that {kind.key}."


AMOUNT_TEXT = f"Error: amounts are whole numbers from 0 to {MAX_AMOUNT}."


def _row(state: State, kind: Kind, key: str) -> int:
    for i, row in enumerate(state[kind.name]):
        if row[kind.key] == key:
            return i
    raise ToolError(missing_text(kind))


def amount_args(env: EnvSpec, spec: ToolSpec) -> list[str]:
    """The arguments of ``spec`` that are amounts (integers from 0 to :data:`MAX_AMOUNT`)."""
    if spec.op == "convert":
        return ["amount"]
    kind = env.kind(spec.kind)
    if spec.op == "create":
        return [f.name for f in kind.of_type("measure")]
    return ["value"] if spec.op == "update" and kind.field(spec.field).type == "measure" else []


def execute(env: EnvSpec, spec: ToolSpec, state: State, args: Mapping[str, Any]) -> tuple[State, Any]:
    """Run one call (arguments already valid against :func:`parameters`) as a pure
    function: (the state after it, the output). Raises :class:`ToolError`: an amount
    out of range first, then a key or (creating) a reference that names no row."""
    if any(not 0 <= args[n] <= MAX_AMOUNT for n in amount_args(env, spec)):
        raise ToolError(AMOUNT_TEXT)
    if spec.op == "convert":
        return state, convert(spec.units, int(args["amount"]))
    kind = env.kind(spec.kind)
    rows = state[kind.name]
    if spec.op == "get":
        return state, dict(rows[_row(state, kind, args[kind.key])])
    if spec.op == "list":
        return state, [r[kind.key] for r in rows]
    match = [r for r in rows if spec.field and r[spec.field] == args.get(spec.field)]
    if spec.op == "find":
        return state, [r[kind.key] for r in match]
    if spec.op == "count":
        return state, len(match)
    if spec.op == "total":
        return state, sum(r[spec.measure] for r in match)
    if spec.op == "create":
        for f in kind.of_type("ref"):
            _row(state, env.kind(f.ref), args[f.name])
        number = max([int(r[kind.key].split("-")[1]) for r in rows] + [100]) + 1
        row = {kind.key: f"{kind.prefix}-{number}", **{f.name: args[f.name] for f in kind.fields[1:]}}
        return {**state, kind.name: [*rows, row]}, row[kind.key]
    i = _row(state, kind, args[kind.key])
    if spec.op == "update":
        row = {**rows[i], spec.field: args["value"]}
        return {**state, kind.name: [*rows[:i], row, *rows[i + 1:]]}, row
    if spec.op == "delete":
        return {**state, kind.name: [*rows[:i], *rows[i + 1:]]}, {"deleted": args[kind.key]}
    raise ValueError(f"unknown operation {spec.op!r}")


def broken(env: EnvSpec, state: State) -> list[str]:
    """What is wrong with ``state`` (empty when nothing): references to rows that do not
    exist (a delete that left them dangling), negative measures, values outside a
    category, duplicate keys."""
    out = []
    for kind in env.kinds:
        keys = [r[kind.key] for r in state[kind.name]]
        if len(set(keys)) != len(keys):
            out.append(f"{kind.name}: duplicate keys")
        for r in state[kind.name]:
            for f in kind.fields[1:]:
                v = r[f.name]
                if f.type == "ref" and v not in {x[env.kind(f.ref).key] for x in state[f.ref]}:
                    out.append(f"{kind.name} {r[kind.key]}: {f.name} {v} does not exist")
                elif f.type == "measure" and v < 0:
                    out.append(f"{kind.name} {r[kind.key]}: negative {f.name}")
                elif f.type == "category" and v not in f.values:
                    out.append(f"{kind.name} {r[kind.key]}: {f.name} {v!r} is not a value")
    return out


def facts(state: State) -> set[tuple[str, str, str, str]]:
    """Every cell of ``state`` as (kind, row key, field, value as text): the unit a final
    state is scored in. The row key is the row's first field."""
    out = set()
    for kind, rows in state.items():
        for r in rows:
            key = str(next(iter(r.values())))
            out |= {(kind, key, f, repr(v)) for f, v in r.items()}
    return out


def changes(before: State, after: State) -> set[tuple[str, ...]]:
    """What a sequence of writes did: cells added (``("+", ...)``) and removed
    (``("-", ...)``) between two states (an update is one of each)."""
    a, b = facts(before), facts(after)
    return {("+", *f) for f in b - a} | {("-", *f) for f in a - b}


_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    """Lower-case words of a description (underscores split), for similarity."""
    return _WORD.findall(text.lower().replace("_", " "))


