"""The device twin of a generated environment: its tables as arrays, its tools as one
jittable function, equal to the host's :func:`~swarmjax.envs.synth.world.execute`.

Encoding (:class:`DeviceEnv`, built once per environment on the host):

* a state is :class:`Tables`: ``cells`` int32 [K, R, F] (kind, row slot, field: a key or
  reference as its number, ``ORD-103`` -> 103; a category as the index of its value; a
  measure as it is), ``alive`` bool [K, R] and ``used`` int32 [K] (slots taken so far: a
  created row takes the next one, so rows keep the host's order). R = the initial rows +
  ``spare`` slots; a create past R is an error the host does not have (the twin's limit,
  like a context limit: generated tasks create at most ``max_calls`` rows);
* a call is a tool index and int32 arguments [A] in the order of the tool's parameters
  (:func:`encode_args`: the same values the state holds);
* an output is :class:`Output`: ``error`` (0 none, 1 no such row, 2 table full, 3 an
  amount out of range), ``kind`` (the kind a missing row was looked up in), ``number``
  (a count, a total, a new key's number, a conversion's hundredths), ``keys`` [R] and
  ``count`` (a list of key numbers, in row order) and ``row`` [F] (a record). An amount
  out of range is refused first, then a key (or, creating, a reference) of no row, as on
  the host.

:func:`step` runs one call with ``lax.switch`` over the operations, so a batch of rows
(``vmap``) can each call a different tool of the same environment; :func:`decode_output`
turns an output back into the host's value (the differential test compares them on
random calls, valid and not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from swarmjax.envs.synth.world import (AMOUNT_TEXT, CONVERSIONS, MAX_AMOUNT, OPS, EnvSpec, State, ToolError,
                                       amount_args, missing_text, parameters)

Array = jax.Array
NO_ERROR, NO_ROW, FULL, BAD_AMOUNT = 0, 1, 2, 3


def full_text(kind: str) -> str:
    """The twin's error of a create past its R rows (the host twin of the device task says it too)."""
    return f"Error: the {kind.replace('_', ' ')} table is full."


@struct.dataclass
class Tables:
    """An environment's state on the device (module docstring)."""

    cells: Array          # [K, R, F] int32
    alive: Array          # [K, R] bool
    used: Array           # [K] int32


@struct.dataclass
class Output:
    """One call's output on the device (module docstring)."""

    error: Array          # [] int32
    kind: Array           # [] int32  the kind of a missing row
    number: Array         # [] int32
    keys: Array           # [R] int32
    count: Array          # [] int32
    row: Array            # [F] int32


@dataclasses.dataclass(frozen=True)
class DeviceEnv:
    """The static tables of one environment: per tool its operation (index in
    :data:`OPS`), kind, field, measure and conversion; per kind its fields' types."""

    env: EnvSpec
    spare: int
    op: np.ndarray         # [T] int32
    kind: np.ndarray       # [T] int32
    field: np.ndarray      # [T] int32  the category / updated field (column), -1 none
    measure: np.ndarray    # [T] int32  the summed measure's column, -1 none
    scale: np.ndarray      # [T] int32  a conversion's scale (1/10000) and offset (1/100)
    offset: np.ndarray     # [T] int32
    fields: np.ndarray     # [K] int32  columns in use per kind (F = max)
    ref: np.ndarray        # [K, F] int32  the kind a reference column names, -1
    amount: np.ndarray     # [T, A] bool  the argument is an amount (0 .. MAX_AMOUNT)

    @staticmethod
    def build(env: EnvSpec, *, spare: int = 4) -> DeviceEnv:
        kinds = [k.name for k in env.kinds]
        cols = lambda k, f: [x.name for x in env.kind(k).fields].index(f) if f else -1       # noqa: E731
        t = env.tools
        F = max(len(k.fields) for k in env.kinds)
        ref = np.full((len(kinds), F), -1, np.int32)
        for i, k in enumerate(env.kinds):
            for c, f in enumerate(k.fields):
                if f.type == "ref":
                    ref[i, c] = kinds.index(f.ref)
        by_name = {k.name: k for k in env.kinds}
        amount = np.zeros((len(t), F), bool)
        for i, x in enumerate(t):
            names = list(parameters(x, by_name)["properties"])
            amount[i, [names.index(n) for n in amount_args(env, x)]] = True
        return DeviceEnv(
            env=env, spare=spare, op=np.array([OPS.index(x.op) for x in t], np.int32),
            kind=np.array([kinds.index(x.kind) if x.kind else 0 for x in t], np.int32),
            field=np.array([cols(x.kind, x.field) if x.kind else -1 for x in t], np.int32),
            measure=np.array([cols(x.kind, x.measure) if x.kind else -1 for x in t], np.int32),
            scale=np.array([CONVERSIONS[x.units][0] if x.op == "convert" else 0 for x in t], np.int32),
            offset=np.array([CONVERSIONS[x.units][1] if x.op == "convert" else 0 for x in t], np.int32),
            fields=np.array([len(k.fields) for k in env.kinds], np.int32), ref=ref, amount=amount)

    @property
    def rows(self) -> int:
        return self.env.rows + self.spare

    @property
    def width(self) -> int:
        return int(self.fields.max())

    def tool_index(self, name: str) -> int:
        return [t.name for t in self.env.tools].index(name)

    # ---- host <-> device values

    def encode_value(self, kind: str, field: str, value: Any) -> int:
        f = self.env.kind(kind).field(field)
        if f.type in ("key", "ref"):
            return int(str(value).rsplit("-", 1)[1])
        return f.values.index(value) if f.type == "category" else int(value)

    def decode_value(self, kind: str, column: int, number: int) -> Any:
        k = self.env.kind(kind)
        f = k.fields[column]
        if f.type in ("key", "ref"):
            prefix = k.prefix if f.type == "key" else self.env.kind(f.ref).prefix
            return f"{prefix}-{int(number)}"
        return f.values[int(number)] if f.type == "category" else int(number)


def encode_state(dev: DeviceEnv, state: State) -> Tables:
    """A host state as :class:`Tables` (raises ``ValueError`` when a table has more rows than R)."""
    K, R, F = len(dev.env.kinds), dev.rows, dev.width
    cells, alive, used = np.zeros((K, R, F), np.int32), np.zeros((K, R), bool), np.zeros((K,), np.int32)
    for i, kind in enumerate(dev.env.kinds):
        rows = state[kind.name]
        if len(rows) > R:
            raise ValueError(f"{kind.name}: {len(rows)} rows, the device twin holds {R}")
        for r, row in enumerate(rows):
            cells[i, r, :len(kind.fields)] = [dev.encode_value(kind.name, f.name, row[f.name]) for f in kind.fields]
        alive[i, :len(rows)], used[i] = True, len(rows)
    return Tables(jnp.asarray(cells), jnp.asarray(alive), jnp.asarray(used))


def decode_state(dev: DeviceEnv, tables: Tables) -> State:
    """:class:`Tables` as a host state (rows in slot order)."""
    cells, alive = np.asarray(tables.cells), np.asarray(tables.alive)
    out: State = {}
    for i, kind in enumerate(dev.env.kinds):
        out[kind.name] = [{f.name: dev.decode_value(kind.name, c, cells[i, r, c]) for c, f in enumerate(kind.fields)}
                          for r in range(dev.rows) if alive[i, r]]
    return out


def encode_args(dev: DeviceEnv, tool: str, args: Mapping[str, Any]) -> np.ndarray:
    """A call's arguments (valid against its schema) as int32 [A], A = the widest kind's
    fields: in the order of :func:`~swarmjax.envs.synth.world.parameters`."""
    spec = dev.env.tool(tool)
    out = np.zeros((dev.width,), np.int32)
    names = list(parameters(spec, {k.name: k for k in dev.env.kinds})["properties"])
    for i, name in enumerate(names):
        if spec.op == "convert":
            out[i] = int(args[name])
        else:
            field = spec.field if name == "value" else name
            out[i] = dev.encode_value(spec.kind, field, args[name])
    return out


def decode_output(dev: DeviceEnv, tool: str, out: Output) -> Any:
    """The host value of a device :class:`Output` of ``tool``; raises
    :class:`~swarmjax.envs.synth.world.ToolError` for an error (the host's message for
    a missing row)."""
    spec = dev.env.tool(tool)
    error = int(out.error)
    if error == NO_ROW:
        raise ToolError(missing_text(dev.env.kinds[int(out.kind)]))
    if error == FULL:
        raise ToolError(full_text(spec.kind))
    if error == BAD_AMOUNT:
        raise ToolError(AMOUNT_TEXT)
    if spec.op == "convert":
        return int(out.number) / 100
    kind = dev.env.kind(spec.kind)
    if spec.op in ("count", "total"):
        return int(out.number)
    if spec.op in ("list", "find"):
        return [f"{kind.prefix}-{int(x)}" for x in np.asarray(out.keys)[:int(out.count)]]
    if spec.op == "create":
        return f"{kind.prefix}-{int(out.number)}"
    if spec.op == "delete":
        return {"deleted": f"{kind.prefix}-{int(out.number)}"}
    return {f.name: dev.decode_value(kind.name, c, int(out.row[c])) for c, f in enumerate(kind.fields)}


def step(dev: DeviceEnv, tables: Tables, tool: Array, args: Array) -> tuple[Tables, Output]:
    """One call on the device: ``tool`` [] int32 (index in the environment's tools),
    ``args`` [A] int32 (:func:`encode_args`). Returns the tables after it and its
    :class:`Output`; jittable and vmappable (every operation is a ``lax.switch`` branch)."""
    R = dev.rows
    op, kind = jnp.asarray(dev.op)[tool], jnp.asarray(dev.kind)[tool]
    col, meas = jnp.asarray(dev.field)[tool], jnp.asarray(dev.measure)[tool]
    cells, alive = tables.cells[kind], tables.alive[kind]                     # [R, F], [R]
    slot = jnp.argmax(alive & (cells[:, 0] == args[0]))                       # the row of a key argument
    found = jnp.any(alive & (cells[:, 0] == args[0]))
    match = alive & (jnp.take(cells, jnp.maximum(col, 0), axis=1) == args[0])  # rows whose category matches
    empty = Output(error=jnp.int32(NO_ERROR), kind=kind, number=jnp.int32(0), keys=jnp.zeros((R,), jnp.int32),
                   count=jnp.int32(0), row=jnp.zeros((dev.width,), jnp.int32))

    def listed(rows):                   # key numbers of ``rows`` [R], in slot order, packed to the front
        order = jnp.argsort(~rows, stable=True)
        return empty.replace(keys=jnp.where(jnp.arange(R) < rows.sum(), cells[order, 0], 0),
                             count=rows.sum().astype(jnp.int32))

    def missing():
        return tables, empty.replace(error=jnp.int32(NO_ROW), number=args[0])

    def put(new_cells, new_alive, used=None):
        t = tables.replace(cells=tables.cells.at[kind].set(new_cells), alive=tables.alive.at[kind].set(new_alive))
        return t if used is None else t.replace(used=t.used.at[kind].set(used))

    def get():
        return lax_if(found, lambda: (tables, empty.replace(row=cells[slot])), missing)

    def update():
        def ok():
            new = cells.at[slot, col].set(args[1])
            return put(new, alive), empty.replace(row=new[slot])
        return lax_if(found, ok, missing)

    def delete():
        return lax_if(found, lambda: (put(cells, alive.at[slot].set(False)), empty.replace(number=args[0])),
                      missing)

    def create():
        used = tables.used[kind]
        number = jnp.maximum(jnp.max(jnp.where(alive, cells[:, 0], 100)), 100) + 1
        row = jnp.concatenate([number[None], args[:dev.width - 1]])
        row = jnp.where(jnp.arange(dev.width) < jnp.asarray(dev.fields)[kind], row, 0)
        ref = jnp.asarray(dev.ref)[kind]                                                  # [F]
        there = jnp.any(tables.alive[jnp.maximum(ref, 0)] & (tables.cells[jnp.maximum(ref, 0), :, 0] == row[:, None]),
                        axis=1)                                                           # [F]
        dangling = (ref >= 0) & ~there
        bad_ref = (tables, empty.replace(error=jnp.int32(NO_ROW), kind=ref[jnp.argmax(dangling)]))
        full = (tables, empty.replace(error=jnp.int32(FULL)))
        made = lambda: (put(cells.at[used].set(row), alive.at[used].set(True), used + 1),  # noqa: E731
                        empty.replace(number=number))
        return lax_if(jnp.any(dangling), lambda: bad_ref, lambda: lax_if(used < R, made, lambda: full))

    def convert():                      # (a s + 50) // 100 as a (s // 100) + (a (s % 100) + 50) // 100: int32-safe
        q, r = jnp.divmod(jnp.asarray(dev.scale)[tool], 100)
        return tables, empty.replace(number=args[0] * q + (args[0] * r + 50) // 100 + jnp.asarray(dev.offset)[tool])

    branches = {
        "get": get,
        "list": lambda: (tables, listed(alive)),
        "find": lambda: (tables, listed(match)),
        "count": lambda: (tables, empty.replace(number=match.sum().astype(jnp.int32))),
        "total": lambda: (tables, empty.replace(number=jnp.sum(jnp.where(match, jnp.take(
            cells, jnp.maximum(meas, 0), axis=1), 0)).astype(jnp.int32))),
        "convert": convert,
        "create": create, "update": update, "delete": delete}
    bad = jnp.any(jnp.asarray(dev.amount)[tool] & ((args < 0) | (args > MAX_AMOUNT)))
    return lax_if(bad, lambda: (tables, empty.replace(error=jnp.int32(BAD_AMOUNT))),
                  lambda: jax.lax.switch(op, [branches[o] for o in OPS]))


def lax_if(pred: Array, yes, no):
    """``lax.cond`` of two thunks."""
    return jax.lax.cond(pred, lambda _: yes(), lambda _: no(), None)
