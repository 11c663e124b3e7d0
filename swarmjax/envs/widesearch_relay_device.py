"""The canonical text wide-search (:mod:`widesearch_relay`) on the device: what an agent
hears, as joined fragments, and how a finished turn changes the episode.

Built once on the host (:meth:`RelayTables.build`): every sentence of the task as a
fragment (:mod:`swarmjax.text.fragments`), checked at build time against the chat
format and the tokenizer (prompts, every response kind, relayed answers), so the ids
said here are the host twin's :class:`~swarmjax.envs.widesearch_relay.RelayEnv` ids.

On the device, per agent row (all pure functions, vmapped over rows):

* :func:`prompt_seq`: a prompt's fragments for a list of entities.
* :func:`turn_calls`: a finished turn's calls (a :class:`CallRecord` of the device
  parser) -> one response fragment per call in order, in a grid ``[C + 1, G]`` (row
  ``C``: the response to calls past ``max_calls``; a row's column 0 holds its sentence,
  columns 1.. the relayed answer lines of a sub-agent filled in by :func:`fill_results`),
  the agents created, the assignments that run (agent, entities) and the counters.
* :func:`fill_results`: the stage's results written into the ``assign_task`` rows.
* :func:`reply_seq`: the grid -> the reply's fragments (the turn's closing ids, the
  tool-response frame, the responses in call order).
* :func:`relay_pairs`: a sub-agent's answer pairs -> the distinct known ones, in order.

:class:`RelayDeviceTask` puts these behind the device-task contract
(:mod:`swarmjax.envs.device_api`) the jitted swarm runs.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.device_api import R_ANSWER, R_CONTEXT, R_TURNS, DeviceTask, TurnOut
from swarmjax.envs.scoring import item_f1
from swarmjax.envs.widesearch import Episode
from swarmjax.envs.widesearch_relay import ERROR_TEXT, LIMIT, LOOKUP_AGAIN, UNKNOWN_ENTITY, RelayTask
from swarmjax.text.device import answers as da
from swarmjax.text.device import calls as dc
from swarmjax.text import fragments
from swarmjax.text.device.calls import fnv1a
from swarmjax.text.device.calls_state import CallRecord
from swarmjax.text.fragments import EMPTY, Fragments, check_joins, common_prefix, compose
from swarmjax.text.toolcalls import CallError

Array = jax.Array
T_LOOKUP, T_CREATE, T_ASSIGN = 0, 1, 2       # tool ids (RelayTask.tools order)


@flax.struct.dataclass
class RelayTables:
    """Fragment ids of every sentence family (arrays) and constant (static ints)."""

    frags: Fragments
    value_seg: Array      # [V]  "\n{value}\n" (a lookup's response)
    error_seg: Array      # [6]  per CallError (0 unused)
    created_seg: Array    # [K]
    unknown_seg: Array    # [K]
    head_seg: Array       # [K]  "\nSub-agent 'k' answered:\n"
    ended_seg: Array      # [3, K] per R_*: row R_ANSWER unused
    line_ent: Array       # [E]  "{entity}:"
    line_val: Array       # [V]  " {value}\n"
    ent_frag: Array       # [E]  " {entity}" (prompts)
    name_hash: Array      # [E]  uint32 FNV-1a of each entity name (lookup's argument)
    c: dict = flax.struct.field(pytree_node=False)   # name -> fragment id of the constants
    max_calls: int = flax.struct.field(pytree_node=False)
    max_pairs: int = flax.struct.field(pytree_node=False)
    max_mentions: int = flax.struct.field(pytree_node=False)

    @classmethod
    def build(cls, task: RelayTask, *, check_samples: int = 64) -> RelayTables:
        """Tokenise every fragment of ``task`` and check the joints (ValueError if unsafe)."""
        chat, tok = task.chat, task.chat.tokenizer
        K = len(task.agent_names)
        pieces: list[np.ndarray] = [np.zeros([0], np.int32)]

        def add(ids) -> int:
            pieces.append(np.asarray(ids, np.int32))
            return len(pieces) - 1

        _, _, _, before, after = chat.tool_response_frame()
        seg = lambda text: add(tok.encode(before + text + after))
        c = {name: add(ids) for name, ids in fragments.reply_frame(chat).items()}
        c.update({"lookup_again": seg(LOOKUP_AGAIN), "limit": seg(LIMIT), "unknown_entity": seg(UNKNOWN_ENTITY),
                  "too_many": seg(task.too_many_text()), "comma": add(tok.encode(","))})
        for role in ("orchestrator", "worker"):
            schemas = [t.schema() for t in task.tools(role)]
            a = chat.prompt_ids(task.messages(role, []), tools=schemas)
            b = chat.prompt_ids(task.messages(role, [0]), tools=schemas)
            head, tail = common_prefix(a, b), common_prefix(a[::-1], b[::-1])
            c[f"{role}_head"], c[f"{role}_tail"] = add(a[:head]), add(a[len(a) - tail:])
        error = np.zeros([len(CallError)], np.int32)
        for code, text in ERROR_TEXT.items():
            error[int(code)] = seg(text)
        ended = np.zeros([3, K], np.int32)
        ended[R_TURNS] = [seg(task.result_text(k, "turns", [])) for k in range(K)]
        ended[R_CONTEXT] = [seg(task.result_text(k, "context", [])) for k in range(K)]
        arrays = dict(
            value_seg=[seg(v) for v in task.value_names], error_seg=error,
            created_seg=[seg(task.created_text(k)) for k in range(K)],
            unknown_seg=[seg(task.unknown_agent_text(k)) for k in range(K)],
            head_seg=[add(tok.encode(before + task.result_text(k, "answer", []) + "\n")) for k in range(K)],
            ended_seg=ended, line_ent=[add(tok.encode(f"{n}:")) for n in task.entity_names],
            line_val=[add(tok.encode(f" {v}\n")) for v in task.value_names],
            ent_frag=[add(tok.encode(" " + n)) for n in task.entity_names])
        tables = cls(frags=Fragments.build(pieces), c=c, max_calls=task.max_calls, max_pairs=task.max_pairs,
                     max_mentions=task.max_mentions,
                     name_hash=jnp.asarray([fnv1a(n.encode()) for n in task.entity_names], jnp.uint32),
                     **{k: jnp.asarray(v, jnp.int32) for k, v in arrays.items()})
        _check(task, tables, pieces, arrays, samples=check_samples)
        return tables

    def widths(self, task: RelayTask) -> dict[str, int]:
        """Static bounds (ids) of an orchestrator's and a sub-agent's reply and of the two prompts."""
        lens = np.asarray(self.frags.lens)
        seg = max(lens[np.asarray(self.value_seg)].max(), lens[np.asarray(self.error_seg)].max(),
                  lens[np.asarray(self.created_seg)].max(), lens[np.asarray(self.unknown_seg)].max(),
                  lens[np.asarray(self.ended_seg)].max(),
                  *(lens[self.c[k]] for k in ("lookup_again", "limit", "unknown_entity")),
                  lens[np.asarray(self.head_seg)].max() + self.max_pairs * (
                      lens[np.asarray(self.line_ent)].max() + lens[np.asarray(self.line_val)].max()))
        c = self.c
        frame = max(lens[c["close_ended"]], lens[c["close_cut"]]) + lens[c["open"]] + lens[c["close"]] \
            + lens[c["too_many"]] + self.max_calls * lens[c["between"]]
        reply = frame + self.max_calls * seg
        # a sub-agent has only lookup: its responses are values and error sentences
        worker_seg = max(lens[np.asarray(self.value_seg)].max(), lens[np.asarray(self.error_seg)].max(),
                         *(lens[self.c[k]] for k in ("lookup_again", "unknown_entity")))
        ent = lens[np.asarray(self.ent_frag)].max() + lens[c["comma"]]
        n = task.cfg.max_task_size
        return {"reply": int(reply), "worker_reply": int(frame + self.max_calls * worker_seg),
                "orchestrator": int(lens[c["orchestrator_head"]] + lens[c["orchestrator_tail"]] + n * ent),
                "worker": int(lens[c["worker_head"]] + lens[c["worker_tail"]] + self.max_mentions * ent)}


# ------------------------------------------------------------------------------ device

def prompt_seq(t: RelayTables, role: str, entities: Array) -> Array:
    """Fragments of a prompt: entities [N] int32 (-1 padded, valid ones first) ->
    [2N + 2] fragment ids (head, `` A``, ``,``, `` B``, .., tail)."""
    valid = entities >= 0
    ent = jnp.where(valid, t.ent_frag[jnp.maximum(entities, 0)], EMPTY)
    comma = jnp.where(valid & (jnp.arange(entities.shape[0]) > 0), t.c["comma"], EMPTY)
    body = jnp.stack([comma, ent], axis=1).reshape(-1)                       # [2N]
    return jnp.concatenate([jnp.asarray([t.c[f"{role}_head"]]), body, jnp.asarray([t.c[f"{role}_tail"]])])


@flax.struct.dataclass
class TurnCalls:
    """What a finished turn's calls did (one row; C = max_calls, G = 1 + 2 * max_pairs)."""

    grid: Array        # [C + 1, G] response fragments per call position
    responses: Array   # [] number of responses (0: the turn is an answer)
    stage: Array       # [C] agent k of an assignment that runs at this position, else -1
    entities: Array    # [C, M] its entities (-1 padded)
    created: Array     # [K] bool, after the turn
    assigned: Array    # [] assignments so far, after the turn


def turn_calls(t: RelayTables, rec: CallRecord, count: Array, table: Array, created: Array,
               assigned: Array, *, max_subagents: int) -> TurnCalls:
    """One row's turn (module docstring). rec: leaves [C, ...]; count [] calls made;
    table [E] the episode's values; created [K] bool; assigned [] int32. Calls are
    answered in order (a sub-agent created earlier in the turn can be assigned)."""
    C, G = t.max_calls, 1 + 2 * t.max_pairs

    def call(carry, i):
        lookups, created, assigned = carry
        live, err, tool = i < count, rec.error[i], rec.tool[i]
        ok = live & (err == CallError.NONE)
        is_lookup, is_create, is_assign = ok & (tool == T_LOOKUP), ok & (tool == T_CREATE), ok & (tool == T_ASSIGN)
        lookups = lookups + is_lookup
        # lookup's entity: the name whose hash the string has and which it mentions
        # (exact up to a 32-bit FNV-1a collision between the name and a string containing it)
        hit = (t.name_hash == rec.hash[i, 0]) & jnp.any(
            rec.mentions[i, 0][None, :] == jnp.arange(t.name_hash.shape[0])[:, None], axis=1)   # [E]
        e = jnp.argmax(hit)
        k = jnp.clip(rec.enum[i, 0], 0, created.shape[0] - 1)
        runs = is_assign & created[k] & (assigned < max_subagents)
        seg = jnp.select(
            [live & ~ok, is_lookup & (lookups > 1), is_lookup & ~jnp.any(hit), is_lookup, is_create,
             is_assign & ~created[k], is_assign & ~runs, runs],
            [t.error_seg[err], t.c["lookup_again"], t.c["unknown_entity"], t.value_seg[table[e]],
             t.created_seg[k], t.unknown_seg[k], t.c["limit"], EMPTY], EMPTY)
        created = created.at[k].set(created[k] | is_create)
        ents = jnp.where(runs, rec.mentions[i, 1, :t.max_mentions], -1)
        return (lookups, created, assigned + runs), (seg, jnp.where(runs, k, -1), ents)

    (_, created, assigned), (seg, stage, ents) = jax.lax.scan(
        call, (jnp.int32(0), created, assigned), jnp.arange(C))
    extra = jnp.where(count > C, t.c["too_many"], EMPTY)
    grid = jnp.zeros([C + 1, G], jnp.int32).at[:, 0].set(jnp.append(seg, extra))
    return TurnCalls(grid=grid, responses=jnp.minimum(count, C) + (count > C), stage=stage, entities=ents,
                     created=created, assigned=assigned)


def first_occurrences(pairs: Array, valid: Array) -> Array:
    """[..., P] bool: the valid pairs ([..., P, 2], valid [..., P]) no earlier valid pair
    equals (a set's members, in order of first appearance)."""
    P = pairs.shape[-2]
    same = jnp.all(pairs[..., :, None, :] == pairs[..., None, :, :], axis=-1)     # [..., P, P]
    earlier = jnp.tril(jnp.ones([P, P], bool), k=-1)
    return valid & ~jnp.any(same & earlier & valid[..., None, :], axis=-1)


def id_mask(ids: Array, size: int) -> Array:
    """[B, size] bool: which ids of each row appear in ``ids`` [B, N] (-1: none)."""
    rows = jnp.arange(ids.shape[0])[:, None]
    return jnp.zeros((ids.shape[0], size), bool).at[rows, jnp.maximum(ids, 0)].max(ids >= 0)


def relay_pairs(pairs: Array) -> Array:
    """A sub-agent's answer pairs [P, 2] (-1 padded) -> the distinct ones with a known
    entity and value, in order of first appearance, at the front; -1 padded [P, 2]."""
    P = pairs.shape[0]
    keep = first_occurrences(pairs, (pairs[:, 0] >= 0) & (pairs[:, 1] >= 0))
    dest = jnp.where(keep, jnp.cumsum(keep) - 1, P)
    return jnp.full([P + 1, 2], -1, jnp.int32).at[dest].set(pairs)[:P]


def fill_results(t: RelayTables, grid: Array, stage: Array, reason: Array, pairs: Array) -> Array:
    """Write a stage's results into one row's grid [C + 1, G]: stage [C] agent k or -1;
    reason [C] R_* and pairs [C, P, 2] (relayed) of the sub-agent at each position."""
    k = jnp.maximum(stage, 0)
    ok = reason == R_ANSWER
    e, v = pairs[..., 0], pairs[..., 1]                                        # [C, P]
    lines = jnp.stack([jnp.where(e >= 0, t.line_ent[jnp.maximum(e, 0)], EMPTY),
                       jnp.where(v >= 0, t.line_val[jnp.maximum(v, 0)], EMPTY)], axis=-1).reshape(e.shape[0], -1)
    head = jnp.where(ok, t.head_seg[k], t.ended_seg[jnp.clip(reason, 0, 2), k])
    row = jnp.concatenate([head[:, None], jnp.where(ok[:, None], lines, EMPTY)], axis=1)  # [C, G]
    filled = jnp.where((stage >= 0)[:, None], row, grid[:-1])
    return grid.at[:-1].set(filled)


def reply_seq(t: RelayTables, grid: Array, responses: Array, cut: Array) -> Array:
    """A turn's reply fragments (:func:`swarmjax.text.fragments.reply_seq`): grid [C + 1, G].
    -> [2 + (C + 1) (G + 1)] fragment ids."""
    return fragments.reply_seq(t.c, grid, responses, cut)


# ------------------------------------------------------------------------------ build checks

def _check(task: RelayTask, t: RelayTables, pieces: list, arrays: dict[str, Any], *, samples: int) -> None:
    """The fragments join to the host twin's ids: each text family's joints (tokenizer),
    then whole prompts and replies against the chat format."""
    tok, chat = task.chat.tokenizer, task.chat
    enc = lambda parts: tok.encode("".join(parts))
    ents, vals = task.entity_names, task.value_names
    heads = [task.result_text(k, "answer", []) for k in range(len(task.agent_names))]
    check_joins(enc, [["\n" + h + "\n" for h in heads], [f"{n}:" for n in ents], [f" {v}\n" for v in vals],
                      [f"{n}:" for n in ents], [f" {v}\n" for v in vals]], name="relayed answer lines")
    check_joins(enc, [["Entities:"], [" " + n for n in ents], [","], [" " + n for n in ents]],
                name="prompt entities")
    rng = np.random.RandomState(0)
    for s in range(samples):
        role = ("orchestrator", "worker")[s % 2]
        n = rng.randint(0, task.cfg.max_task_size + 1)
        ep_ents = [int(x) for x in rng.permutation(len(ents))[:n]]
        want = chat.prompt_ids(task.messages(role, ep_ents), tools=[x.schema() for x in task.tools(role)])
        got = compose(pieces, np.asarray(prompt_seq(t, role, jnp.asarray(ep_ents + [-1], jnp.int32))))
        if not np.array_equal(want, got):
            raise ValueError(f"relay fragments: the {role} prompt for {ep_ents} differs from the chat format's")
        texts, seq = [], []
        for _ in range(rng.randint(1, 4)):
            kind = rng.randint(3)
            if kind == 0:
                v = rng.randint(len(vals))
                texts.append(vals[v])
                seq.append([int(arrays["value_seg"][v])])
            elif kind == 1:
                code = list(ERROR_TEXT)[rng.randint(len(ERROR_TEXT))]
                texts.append(ERROR_TEXT[code])
                seq.append([int(arrays["error_seg"][int(code)])])
            else:
                k, m = rng.randint(len(heads)), rng.randint(0, 4)
                pairs = [(rng.randint(len(ents)), rng.randint(len(vals))) for _ in range(m)]
                texts.append(task.result_text(k, "answer", pairs))
                seq.append([int(arrays["head_seg"][k])] + [int(x) for e, v in pairs
                                                           for x in (arrays["line_ent"][e], arrays["line_val"][v])])
        want = chat.tool_responses_ids(texts)
        flat = [t.c["open"]] + [x for i, s_ in enumerate(seq) for x in ([t.c["between"]] if i else []) + s_] \
            + [t.c["close"]]
        if not np.array_equal(want, compose(pieces, flat)):
            raise ValueError(f"relay fragments: the tool responses {texts} differ from the chat format's")


def episode_arrays(eps: list[Episode], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Host: episodes -> table [B, E] int32 and task [B, n] int32 (-1 padded)."""
    table = np.asarray([ep.table for ep in eps], np.int32)
    task = np.full((len(eps), n), -1, np.int32)
    for b, ep in enumerate(eps):
        task[b, :len(ep.task)] = ep.task
    return table, task


# ------------------------------------------------------------------------------ the device task

@flax.struct.dataclass
class RelayState:
    """A batch's canonical wide-search state (B episodes, S = B K sub-agent slots).

    table [B, E], task [B, N] (-1 padded): the episodes; created [B, K] bool; assigned
    [B] (assignments that ran); seen [B, E] (entities some assignment mentioned);
    returned [B, E] (asked-for entities relayed back); novel [B]; parallel [B]
    (asked-for entities relayed beside each stage's busiest sub-agent, summed over
    stages: ``r_parallel = "parallel"``); answer [B, P, 2], answer_count [B]: the
    orchestrator's answer lines; pairs [S, P, 2]: each sub-agent's relayed answer.
    """

    table: Array
    task: Array
    created: Array
    assigned: Array
    seen: Array
    returned: Array
    novel: Array
    parallel: Array
    answer: Array
    answer_count: Array
    pairs: Array


class RelayDeviceTask(DeviceTask):
    """The canonical text wide-search (:class:`RelayTask`) as a device task
    (:mod:`swarmjax.envs.device_api`); its host twin is
    :class:`~swarmjax.envs.widesearch_relay.RelayEnv`."""

    def __init__(self, task: RelayTask):
        self.task, self.chat = task, task.chat
        tok = task.chat.tokenizer
        self.tables = RelayTables.build(task)
        self.frags, self.widths = self.tables.frags, self.tables.widths(task)
        self.max_subagents, self.agent_names = task.cfg.max_subagents, task.agent_names
        self.max_calls, self.grid_width = task.max_calls, 1 + 2 * task.max_pairs
        self.answer_grammar = da.AnswerGrammar.build(tok, task.entity_names, task.value_names,
                                                     max_pairs=task.max_pairs)
        self._grammars = {role: dc.CallGrammar.build(tok, task.tools(role), max_calls=task.max_calls,
                                                     max_mentions=task.max_mentions,
                                                     mention_phrases=task.entity_names)
                          for role in ("orchestrator", "worker")}
        ids, lens = np.asarray(self.frags.ids), np.asarray(self.frags.lens)
        self._pieces = [ids[i, :lens[i]] for i in range(len(lens))]
        self._heads = {role: self._pieces[self.tables.c[f"{role}_head"]] for role in ("orchestrator", "worker")}

    # ---- host
    def grammar(self, role: str):
        return self._grammars[role]

    def head_ids(self, role: str) -> np.ndarray:
        return self._heads[role]

    def batch(self, problems):
        cfg = self.task.cfg
        for i, ep in enumerate(problems):
            if not 1 <= len(ep.task) <= cfg.max_task_size or len(ep.table) != cfg.num_entities \
                    or not all(0 <= e < cfg.num_entities for e in ep.task):
                raise ValueError(f"episode {i}: a task of 1..{cfg.max_task_size} entity ids below "
                                 f"{cfg.num_entities} and a table of {cfg.num_entities} values expected, got "
                                 f"task {list(ep.task)} and a table of {len(ep.table)}")
        table, task = episode_arrays(list(problems), cfg.max_task_size)
        seq = np.asarray(jax.vmap(lambda x: prompt_seq(self.tables, "orchestrator", x))(jnp.asarray(task)))
        prompts = [compose(self._pieces, row) for row in seq]
        return {"table": table, "task": task}, prompts

    def rewards(self, problems, state: RelayState, answers):
        """The host twin's reward terms (:func:`swarmjax.envs.widesearch_relay.verify`)
        on episodes that answered (0 elsewhere)."""
        pairs = jnp.asarray(state.answer)                                                     # [B, P, 2]
        P = pairs.shape[1]
        live = jnp.arange(P)[None, :] < jnp.minimum(jnp.asarray(state.answer_count), P)[:, None]
        first = first_occurrences(pairs, live)                                                # score()'s set
        ent = pairs[..., 0]
        table, task = jnp.asarray(state.table), jnp.asarray(state.task)
        asked = jnp.take_along_axis(id_mask(task, table.shape[1]), jnp.maximum(ent, 0), axis=1) & (ent >= 0)
        right = asked & (jnp.take_along_axis(table, jnp.maximum(ent, 0), axis=1) == pairs[..., 1])
        correct = jnp.sum(first & right, axis=1).astype(jnp.float32)
        answered = jnp.sum(first, axis=1).astype(jnp.float32)
        truth = jnp.sum(task >= 0, axis=1).astype(jnp.float32)
        f1 = item_f1(correct, answered, truth, True)
        done = jnp.asarray([a is not None for a in answers])
        z = lambda x: np.asarray(jnp.where(done, x, 0.0), np.float32)                        # noqa: E731
        return {"r_perf": z(f1), "correct": z(correct), "answered": z(answered), "truth": z(truth),
                "novel": z(state.novel), "returned": z(jnp.sum(jnp.asarray(state.returned), 1)),
                "parallel": z(state.parallel)}

    # ---- device
    def init(self, arrays) -> RelayState:
        table, task = arrays["table"], arrays["task"]
        B, E = table.shape
        K, P = self.max_subagents, self.task.max_pairs
        z = jnp.zeros((B,), jnp.int32)
        return RelayState(table=table, task=task, created=jnp.zeros((B, K), bool), assigned=z,
                          seen=jnp.zeros((B, E), bool), returned=jnp.zeros((B, E), bool), novel=z, parallel=z,
                          answer=jnp.full((B, P, 2), -1, jnp.int32), answer_count=z,
                          pairs=jnp.full((B * K, P, 2), -1, jnp.int32))

    def orch_turn(self, s: RelayState, rec, count, acted):
        tc = jax.vmap(lambda r, n, t, c, a: turn_calls(self.tables, r, n, t, c, a, max_subagents=self.max_subagents))(
            rec, count, s.table, s.created, s.assigned)
        runs = acted[:, None] & (tc.stage >= 0)                                              # [B, C]
        seen, novel = s.seen, s.novel
        E = seen.shape[1]
        asked = id_mask(s.task, E)
        for i in range(runs.shape[1]):              # assignments in call order (C is small)
            hit = id_mask(tc.entities[:, i], E)                                             # [B, E]
            novel = novel + (runs[:, i] & jnp.any(hit & asked & ~seen, axis=1))
            seen = seen | (hit & runs[:, i][:, None])
        keep = lambda new, old: jnp.where(acted.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
        s = s.replace(created=keep(tc.created, s.created), assigned=keep(tc.assigned, s.assigned), seen=seen,
                      novel=novel)
        return s, TurnOut(grid=tc.grid, responses=tc.responses, spawn=jnp.where(runs, tc.stage, -1),
                          args=tc.entities)

    def orch_answer(self, s: RelayState, answers, mask):
        pairs, count = da.pairs(answers)
        return s.replace(answer=jnp.where(mask[:, None, None], pairs, s.answer),
                         answer_count=jnp.where(mask, count, s.answer_count))

    def worker_prompt(self, args):
        return jax.vmap(lambda x: prompt_seq(self.tables, "worker", x))(args)

    def worker_turn(self, s: RelayState, rec, count, acted):
        S, K = count.shape[0], self.max_subagents
        owner = jnp.arange(S) // K
        tc = jax.vmap(lambda r, n, t, c, a: turn_calls(self.tables, r, n, t, c, a, max_subagents=K))(
            rec, count, s.table[owner], jnp.zeros((S, K), bool), jnp.zeros((S,), jnp.int32))
        return s, TurnOut(grid=tc.grid, responses=tc.responses, spawn=jnp.full_like(tc.stage, -1),
                          args=tc.entities)

    def worker_answer(self, s: RelayState, answers, mask):
        pairs, _ = da.pairs(answers)
        return s.replace(pairs=jnp.where(mask[:, None, None], jax.vmap(relay_pairs)(pairs), s.pairs))

    def stage_over(self, s: RelayState, over, grid, spawn, slot, reason):
        member = spawn >= 0
        ok = member & (reason == R_ANSWER)
        pairs = s.pairs[slot]                                                                # [B, C, P, 2]
        B, E = s.returned.shape
        back = id_mask(jnp.where((ok & over[:, None])[..., None], pairs[..., 0], -1).reshape(B, -1), E)
        # parallel work: asked-for entities each member relayed first (call order, after
        # earlier stages), summed beside the stage's busiest member
        asked, prior, own = id_mask(s.task, E), s.returned, []
        for i in range(member.shape[1]):
            new = id_mask(jnp.where((ok[:, i] & over)[:, None], pairs[:, i, :, 0], -1), E) & asked & ~prior
            own.append(new.sum(1))
            prior = prior | new
        own = jnp.stack(own, axis=1)                                                         # [B, C]
        filled = jax.vmap(lambda g, k, r, p: fill_results(self.tables, g, k, r, p))(grid, spawn, reason, pairs)
        s = s.replace(returned=s.returned | (back & asked), parallel=s.parallel + own.sum(1) - own.max(1))
        return s, jnp.where(over[:, None, None], filled, grid)

    def reply_seq(self, grid, responses, cut):
        return reply_seq(self.tables, grid, responses, cut)

