"""A generated tool environment as a device task: its tasks run inside the jitted swarm
(:class:`~swarmjax.swarm.text_engine.TextSwarm`), tool calls parsed, executed and
answered on the device.

:class:`SynthDeviceTask` (one environment; the contract of
:mod:`swarmjax.envs.device_api`) holds, built once on the host:

* the environment's tables as arrays and its tools as one jittable step
  (:mod:`swarmjax.envs.synth.device`), per episode of the batch;
* how a parsed call (:class:`~swarmjax.text.device.calls_state.CallRecord`) becomes that
  step's arguments: a category by its enum index, an amount by its integer, a key or a
  reference by the FNV-1a hash of the string against the hashes of every key
  ``PREFIX-n`` a table can hold (``n <= 100 + R``; any other string names no row, as
  on the host, exact up to a 32-bit hash collision);
* every response as fragments (:mod:`swarmjax.text.fragments`): a record
  ``{"order_id": "ORD-103", "status": "open", "weight": 120}`` is per-field joints
  (``, "weight": ``) and values (digits, category words), a list of keys is
  ``["`` + ``ORD-`` + digits + ``", "`` .. ``"]``, a number its digits (a conversion's
  hundredths as Python prints the float), errors one sentence each. The joints sit at
  the tokenizer's pre-token boundaries; :meth:`SynthDeviceTask.build_check` renders
  random calls' outputs on the device and refuses to build where they differ from
  the chat format's ids of the host's text.

The orchestrator works alone (K = 0: the generated tasks' parts are its own calls).
The episode's answer is scored on the host after the rollout, by the task set's
verifier (:func:`~swarmjax.envs.synth.task.verify`) on the final tables.

:class:`SynthTwinEnv` is the host twin (a :class:`~swarmjax.envs.api.HostEnv` for the
host-driven :class:`~swarmjax.swarm.text_rollout.TextRollout`): the host tools
(:func:`~swarmjax.envs.synth.world.execute`), the same sentences, the chat format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.api import Step
from swarmjax.envs.device_api import CALL_ERROR_TEXT, DeviceTask, TurnOut
from swarmjax.envs.synth import device
from swarmjax.envs.synth.device import DeviceEnv, Tables, full_text
from swarmjax.envs.synth.task import env_tools, task_messages, verify
from swarmjax.envs.synth.world import (AMOUNT_TEXT, OPS, EnvSpec, ToolError, execute, initial_state, missing_text,
                                       parameters)
from swarmjax.text import fragments
from swarmjax.text.chat import ChatFormat
from swarmjax.text.device.calls import CallGrammar, fnv1a
from swarmjax.text.fragments import EMPTY, Fragments, common_prefix, compose
from swarmjax.text.toolcalls import CallError, parse_turn
from swarmjax.text.tools import ToolSet

Array = jax.Array
A_NONE, A_KEY, A_CAT, A_INT = 0, 1, 2, 3          # how a tool's argument slot is encoded
AMOUNT_DIGITS, NUMBER_DIGITS, UNITS_DIGITS = 6, 10, 8


def too_many_text(max_calls: int) -> str:
    return f"Error: a turn may make at most {max_calls} calls; the later ones were not run."


@flax.struct.dataclass
class SynthState:
    """A batch's tables ([B, K, R, F] cells, [B, K, R] alive, [B, K] used)."""

    tables: Tables


class SynthDeviceTask(DeviceTask):
    """One generated environment's tasks on the device (module docstring).

    Args:
      env: the environment (:class:`~swarmjax.envs.synth.world.EnvSpec`).
      chat: the chat format (a ``tool_response_frame`` is needed: Qwen3's).
      spare: rows a table holds past its initial ones (creates past them: an error).
      max_calls: calls per turn that are read and answered (later ones get one
        sentence together).
      check_samples: random calls rendered at build time against the host's ids.
    """

    def __init__(self, env: EnvSpec, chat: ChatFormat, *, spare: int = 4, max_calls: int = 4,
                 check_samples: int = 96):
        self.env, self.chat, self.max_calls = env, chat, max_calls
        self.dev = DeviceEnv.build(env, spare=spare)
        self.max_subagents, self.agent_names, self.answer_grammar = 0, [], None
        kinds = {k.name: k for k in env.kinds}
        self.tools = list(env_tools(env))
        self.toolset = ToolSet(self.tools)
        self._grammar = CallGrammar.build(chat.tokenizer, self.tools, max_calls=max_calls)
        self._slots(kinds)
        self._fragments()
        self.build_check(check_samples)

    # ------------------------------------------------------------------ build

    def _slots(self, kinds) -> None:
        """Per tool and argument slot (schema order): how it is encoded, and a key's kind."""
        T, A = len(self.env.tools), self.dev.width
        self.arg_type, self.arg_kind = np.zeros((T, A), np.int32), np.zeros((T, A), np.int32)
        names = [k.name for k in self.env.kinds]
        for i, spec in enumerate(self.env.tools):
            for a, (name, schema) in enumerate(parameters(spec, kinds)["properties"].items()):
                if "enum" in schema:
                    self.arg_type[i, a] = A_CAT
                elif schema["type"] == "integer":
                    self.arg_type[i, a] = A_INT
                else:
                    kind = kinds[spec.kind]
                    self.arg_type[i, a] = A_KEY
                    self.arg_kind[i, a] = names.index(spec.kind if name == kind.key else kind.field(name).ref)
        N = 101 + self.dev.rows
        self.key_hash = np.asarray([[fnv1a(f"{k.prefix}-{n}".encode()) for n in range(N)] for k in self.env.kinds],
                                   np.uint32)                                                   # [K, N]

    def _fragments(self) -> None:
        chat, enc = self.chat, self.chat.tokenizer.encode
        _, _, _, before, after = chat.tool_response_frame()
        pieces: list[np.ndarray] = [np.zeros([0], np.int32)]

        def add(text_or_ids) -> int:
            pieces.append(np.asarray(enc(text_or_ids) if isinstance(text_or_ids, str) else text_or_ids, np.int32))
            return len(pieces) - 1
        c = {name: add(ids) for name, ids in fragments.reply_frame(chat).items()}
        c.update(before=add(before), after=add(after), dot=add("."), amount=add(before + AMOUNT_TEXT + after),
                 too_many=add(before + too_many_text(self.max_calls) + after), list_open=add(before + '["'),
                 list_sep=add('", "'), list_close=add('"]' + after), list_empty=add(before + "[]" + after),
                 deleted_open=add(before + '{"deleted": "'), deleted_close=add('"}' + after))
        env, K, F = self.env, len(self.env.kinds), self.dev.width
        error = np.zeros([len(CallError)], np.int32)
        for code, text in CALL_ERROR_TEXT.items():
            error[int(code)] = add(before + text + after)
        string = lambda f: f.type in ("key", "ref", "category")                            # noqa: E731
        prefix = lambda k, f: k.prefix if f.type == "key" else env.kind(f.ref).prefix      # noqa: E731
        V = max([len(f.values) for k in env.kinds for f in k.of_type("category")] + [1])
        joint, values = np.zeros((K, F), np.int32), np.zeros((K, F, V), np.int32)
        end = np.zeros((K,), np.int32)
        field_type = np.zeros((K, F), np.int32)                 # 0 unused, A_KEY, A_CAT, A_INT per column
        for i, k in enumerate(env.kinds):
            for j, f in enumerate(k.fields):
                field_type[i, j] = A_CAT if f.type == "category" else A_INT if f.type == "measure" else A_KEY
                lead = ((before + "{") if j == 0 else ('"' if string(k.fields[j - 1]) else "") + ", ")
                joint[i, j] = add(lead + f'"{f.name}": ' + ('"' if string(f) else "")
                                  + (prefix(k, f) + "-" if f.type in ("key", "ref") else ""))
                if f.type == "category":
                    values[i, j, :len(f.values)] = [add(v) for v in f.values]
            end[i] = add(('"' if string(k.fields[-1]) else "") + "}" + after)
        self.c = c
        self.error_seg = error
        self.digit = np.asarray([add(str(d)) for d in range(10)], np.int32)
        self.lead = np.asarray([add(f"{k.prefix}-") for k in env.kinds], np.int32)
        self.missing_seg = np.asarray([add(before + missing_text(k) + after) for k in env.kinds], np.int32)
        self.full_seg = np.asarray([add(before + full_text(k.name) + after) for k in env.kinds], np.int32)
        self.joint, self.values, self.end, self.field_type = joint, values, end, field_type
        self.pieces = pieces
        self.frags = Fragments.build(pieces)
        self.key_digits = len(str(100 + self.dev.rows))
        self.grid_width = max(F * (1 + AMOUNT_DIGITS) + 1, 2 + self.dev.rows * (2 + self.key_digits),
                              2 + NUMBER_DIGITS, 4 + UNITS_DIGITS + 2, 3 + self.key_digits)
        lens = np.asarray(self.frags.lens)
        top = lambda ids: int(lens[np.asarray(ids)].max())                                  # noqa: E731
        d = top(self.digit)
        row = max(int(lens[joint[i]].sum()) + int(lens[end[i]]) + F * max(AMOUNT_DIGITS * d, top(values[i]))
                  for i in range(K))
        listed = top(c["list_open"]) + self.dev.rows * (top(c["list_sep"]) + top(self.lead) + self.key_digits * d) \
            + top(c["list_close"])
        other = max(top(error), top(self.missing_seg), top(self.full_seg), top(c["amount"]), top(c["too_many"]),
                    top(c["list_empty"]), top(c["before"]) + top(c["after"]) + NUMBER_DIGITS * d + top(c["dot"]),
                    top(c["deleted_open"]) + top(c["deleted_close"]) + top(self.lead) + self.key_digits * d)
        response = max(row, listed, other)
        frame = max(top(c["close_ended"]), top(c["close_cut"])) + top(c["open"]) + top(c["close"])
        reply = frame + self.max_calls * top(c["between"]) + (self.max_calls + 1) * response
        self.widths = {"reply": reply, "worker_reply": 0, "worker": 0}     # no sub-agents: nothing said to them

    def build_check(self, samples: int) -> None:
        """Render ``samples`` random calls' outputs (and errors) on the device and compare
        them, in pairs inside one reply, with the chat format's ids of the host's texts;
        ValueError where a joint is unsafe for this tokenizer."""
        if not samples:
            return
        rng = np.random.default_rng(0)
        state = initial_state(self.env, 0)
        tables = device.encode_state(self.dev, state)
        kinds = {k.name: k for k in self.env.kinds}
        texts, tools, args = [], [], []
        for s in range(samples):
            spec = self.env.tools[s % len(self.env.tools)]
            props = parameters(spec, kinds)["properties"]
            call = {}
            for name, schema in props.items():
                if "enum" in schema:
                    call[name] = str(rng.choice(schema["enum"]))
                elif schema["type"] == "integer":
                    call[name] = int(rng.choice([0, 7, 99, 1000, 99_999, -1])) if rng.random() < 0.3 \
                        else int(rng.integers(0, 100_001))
                else:
                    k = self.env.kinds[self.arg_kind[self.env.tools.index(spec), list(props).index(name)]]
                    keys = [r[k.key] for r in state[k.name]]
                    call[name] = str(rng.choice(keys)) if rng.random() < 0.9 else f"{k.prefix}-99"
            texts.append(self._host_text(state, spec, call)[1])
            tools.append(self.env.tools.index(spec))
            args.append(device.encode_args(self.dev, spec.name, call))

        def one(tool, a):
            _, out = device.step(self.dev, tables, tool, a)
            return self._render(out, tool)
        run = jax.jit(jax.vmap(one))
        seqs = np.asarray(run(jnp.asarray(tools, jnp.int32), jnp.asarray(np.stack(args))))
        c = self.c
        for i in range(0, samples - 1, 2):
            want = self.chat.tool_responses_ids([texts[i], texts[i + 1]])
            got = compose(self.pieces, [c["open"], *seqs[i], c["between"], *seqs[i + 1], c["close"]])
            if not np.array_equal(want, got):
                raise ValueError(f"synth fragments: the responses {texts[i]!r}, {texts[i + 1]!r} differ from the chat "
                                 "format's ids (a fragment joint is not a pre-token boundary for this tokenizer)")

    def _host_text(self, state, spec, args) -> tuple[Any, str]:
        """(state after, response text) of one valid call on the host, with the twin's table limit."""
        try:
            after, out = execute(self.env, spec, state, args)
        except ToolError as e:
            return state, str(e)
        if spec.op == "create" and len(after[spec.kind]) > self.dev.rows:
            return state, full_text(spec.kind)
        return after, out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)

    # ------------------------------------------------------------------ device

    def _digits(self, v: Array, width: int) -> Array:
        """[width] fragments of the decimal digits of ``v`` >= 0 (leading ones EMPTY)."""
        p = jnp.asarray([10 ** i for i in range(width - 1, -1, -1)], jnp.int32)
        show = (v >= p) | (p == 1)
        return jnp.where(show, jnp.asarray(self.digit)[(v // p) % 10], EMPTY)

    def _render(self, out: device.Output, tool: Array) -> Array:
        """One call's response fragments [G] from its device output."""
        G, R, F, c = self.grid_width, self.dev.rows, self.dev.width, self.c
        op, kind = jnp.asarray(self.dev.op)[tool], jnp.asarray(self.dev.kind)[tool]
        pad = lambda x: jnp.concatenate([x, jnp.zeros((G - x.shape[0],), jnp.int32)])       # noqa: E731
        one = lambda *xs: pad(jnp.concatenate([jnp.atleast_1d(jnp.asarray(x, jnp.int32)) for x in xs]))  # noqa: E731
        keyd = lambda n: self._digits(n, self.key_digits)                                   # noqa: E731
        lead = jnp.asarray(self.lead)[kind]
        # a record: per column its joint and value (digits or a category word)
        types = jnp.asarray(self.field_type)[kind]                                          # [F]
        cells = out.row
        digits = jax.vmap(lambda v: self._digits(v, AMOUNT_DIGITS))(cells)                 # [F, D]
        word = jnp.asarray(self.values)[kind, jnp.arange(F), jnp.clip(cells, 0, self.values.shape[2] - 1)]  # [F]
        value = jnp.where((types == A_CAT)[:, None], jnp.zeros_like(digits).at[:, 0].set(word), digits)
        cols = jnp.concatenate([jnp.asarray(self.joint)[kind][:, None], value], axis=1)    # [F, 1 + D]
        cols = jnp.where((types > 0)[:, None], cols, EMPTY).reshape(-1)
        record = one(cols, jnp.asarray(self.end)[kind])
        # a list of keys
        live = jnp.arange(R) < out.count
        items = jnp.concatenate([jnp.where(jnp.arange(R) > 0, c["list_sep"], EMPTY)[:, None],
                                 jnp.broadcast_to(lead, (R, 1)), jax.vmap(keyd)(out.keys)], axis=1)   # [R, 2 + D]
        listed = jnp.where(out.count > 0, one(c["list_open"], jnp.where(live[:, None], items, EMPTY).reshape(-1),
                                              c["list_close"]), one(c["list_empty"]))
        h = out.number
        digit = jnp.asarray(self.digit)
        tenths, hundredths = digit[(h // 10) % 10], digit[h % 10]
        frac = jnp.where(h % 100 == 0, jnp.asarray([self.digit[0], EMPTY]),                  # 2.0, 2.5, 2.05
                         jnp.where(h % 10 == 0, jnp.stack([tenths, EMPTY]), jnp.stack([tenths, hundredths])))
        number = one(c["before"], self._digits(h, NUMBER_DIGITS), c["after"])
        by_op = {
            "get": record, "update": record, "list": listed, "find": listed, "count": number, "total": number,
            "convert": one(c["before"], self._digits(h // 100, UNITS_DIGITS), c["dot"], frac, c["after"]),
            "create": one(c["before"], lead, keyd(h), c["after"]),
            "delete": one(c["deleted_open"], lead, keyd(h), c["deleted_close"])}
        ok = jnp.stack([by_op[o] for o in OPS])[op]
        return jnp.select([out.error == device.NO_ROW, out.error == device.FULL, out.error == device.BAD_AMOUNT],
                          [one(jnp.asarray(self.missing_seg)[out.kind]), one(jnp.asarray(self.full_seg)[kind]),
                           one(c["amount"])], ok)

    def _args(self, tool: Array, rec: Any, i: Array) -> Array:
        """[A] int32 step arguments of call ``i`` of a row's record (its slots, in schema
        order, are the step's arguments; the record may hold fewer slots than A)."""
        n = rec.hash.shape[-1]
        types, kinds = jnp.asarray(self.arg_type)[tool, :n], jnp.asarray(self.arg_kind)[tool, :n]   # [n]
        table = jnp.asarray(self.key_hash)[kinds]                                            # [n, N]
        hit = table == rec.hash[i][:, None]
        key = jnp.where(jnp.any(hit, axis=1), jnp.argmax(hit, axis=1), -1)
        vals = jnp.select([types == A_KEY, types == A_CAT, types == A_INT], [key, rec.enum[i], rec.ival[i]], 0)
        return jnp.zeros((self.dev.width,), jnp.int32).at[:n].set(vals.astype(jnp.int32))

    def _row_turn(self, tables: Tables, rec: Any, count: Array) -> tuple[Tables, Array, Array]:
        """One row's turn: every call in order on its tables. -> (tables, grid [C + 1, G], responses)."""
        C, G = self.max_calls, self.grid_width
        err_row = lambda seg: jnp.zeros((G,), jnp.int32).at[0].set(seg)                      # noqa: E731

        def call(tables, i):
            live, err = i < count, rec.error[i]
            ok = live & (err == CallError.NONE)
            tool = jnp.clip(rec.tool[i], 0, len(self.env.tools) - 1)
            new, out = device.step(self.dev, tables, tool, self._args(tool, rec, i))
            tables = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, tables)
            seq = jnp.where(ok, self._render(out, tool),
                            jnp.where(live, err_row(jnp.asarray(self.error_seg)[err]), EMPTY))
            return tables, seq

        tables, seqs = jax.lax.scan(call, tables, jnp.arange(C))
        extra = jnp.where(count > C, err_row(self.c["too_many"]), EMPTY)
        return tables, jnp.concatenate([seqs, extra[None]]), jnp.minimum(count, C) + (count > C)

    # ------------------------------------------------------------------ the contract

    def grammar(self, role: str) -> CallGrammar:
        if role != "orchestrator":
            raise ValueError("a generated environment's device task has no sub-agents")
        return self._grammar

    def head_ids(self, role: str) -> np.ndarray:
        probe = lambda q: self.chat.prompt_ids(task_messages({"env": self.env.name, "query": q}),  # noqa: E731
                                               tools=self.toolset.schemas())
        a = probe("a")
        return a[:common_prefix(a, probe("b"))]

    def batch(self, problems):
        cells, alive, used, prompts = [], [], [], []
        for i, p in enumerate(problems):
            if p.get("env") != self.env.name:
                raise ValueError(f"episode {i}: a task of environment {p.get('env')!r}; this device task runs "
                                 f"{self.env.name!r} (one environment a batch)")
            t = device.encode_state(self.dev, initial_state(self.env, int(p["state_seed"])))
            cells.append(np.asarray(t.cells))
            alive.append(np.asarray(t.alive))
            used.append(np.asarray(t.used))
            prompts.append(self.chat.prompt_ids(task_messages(p), tools=self.toolset.schemas()))
        return {"cells": np.stack(cells), "alive": np.stack(alive), "used": np.stack(used)}, prompts

    def content(self, answer: str) -> str:
        """The answer a verifier reads from a final turn's text (think block and stop id out)."""
        return parse_turn(answer, self.toolset, syntax=self.chat.call_syntax).content

    def rewards(self, problems, state: SynthState, answers):
        keys = ("r_perf", "correct", "answer_score", "state_f1", "parts")
        out = {k: np.zeros((len(problems),), np.float32) for k in keys}
        t = state.tables
        for b, (p, answer) in enumerate(zip(problems, answers)):
            if answer is None:
                continue
            final = device.decode_state(self.dev, Tables(t.cells[b], t.alive[b], t.used[b]))
            terms = verify(p, initial_state(self.env, int(p["state_seed"])), final, self.content(answer))
            for k in keys:
                out[k][b] = terms[k]
        return out

    def init(self, arrays) -> SynthState:
        return SynthState(Tables(cells=arrays["cells"], alive=arrays["alive"], used=arrays["used"]))

    def orch_turn(self, state: SynthState, rec, count, acted):
        tables, grid, responses = jax.vmap(self._row_turn)(state.tables, rec, count)
        keep = lambda new, old: jnp.where(acted.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
        B, C = count.shape[0], self.max_calls
        return SynthState(jax.tree.map(keep, tables, state.tables)), TurnOut(
            grid=grid, responses=responses, spawn=jnp.full((B, C), -1, jnp.int32), args=jnp.zeros((B, C, 1), jnp.int32))

    def stage_over(self, state, over, grid, spawn, slot, reason):
        return state, grid

    def reply_seq(self, grid, responses, cut):
        return fragments.reply_seq(self.c, grid, responses, cut)

    # ------------------------------------------------------------------ host twin

    def orchestrator(self, problem: dict[str, Any]) -> SynthTwinEnv:
        return SynthTwinEnv(self, problem)


class SynthTwinEnv:
    """The host twin of one episode (a :class:`~swarmjax.envs.api.HostEnv`): the host
    tools on the task's state, the device task's sentences (module docstring)."""

    def __init__(self, task: SynthDeviceTask, problem: dict[str, Any]):
        self.task, self.problem = task, problem
        self.initial = initial_state(task.env, int(problem["state_seed"]))
        self.state = self.initial

    def reset(self, _: Any = None) -> np.ndarray:
        return self.task.chat.prompt_ids(task_messages(self.problem), tools=self.task.toolset.schemas())

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        t, chat = self.task, self.task.chat
        text = chat.tokenizer.decode(turn)
        calls = parse_turn(text, t.toolset, syntax=chat.call_syntax).calls
        if not calls:
            return Step(done=True, answer=text, rewards=verify(self.problem, self.initial, self.state,
                                                               t.content(text)))
        replies = []
        for call in calls[:t.max_calls]:
            if call.error != CallError.NONE:
                replies.append(CALL_ERROR_TEXT[call.error])
            else:
                self.state, text = t._host_text(self.state, t.env.tool(call.name), call.arguments)
                replies.append(text)
        if len(calls) > t.max_calls:
            replies.append(too_many_text(t.max_calls))
        return Step(reply=np.concatenate([chat.after_turn_ids(turn), chat.tool_responses_ids(replies)]))

    def resume(self, results: Sequence[Any]) -> Step:
        raise RuntimeError("a generated environment's episode starts no sub-agents")
