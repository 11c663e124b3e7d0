"""The wide-search protocol as pure JAX: task sampling (``reset``), the per-token
transition of one episode (orchestrator + its K sub-agent slots) and the verifier.

Same rules as the reference simulator in :mod:`swarmjax.envs.widesearch` (its
docstring lists them); the differential tests drive both with the same tokens.

Each agent is a small state machine whose ``phase`` says what its next context
token is: one the agent samples (``TURN``, ``LOOKUP_ARG``, ``SPAWN_*``, ``ANS_*``,
``RET_*``) or one the environment forces (``ENV`` replays a queued tool reply,
``RESULTS`` the sub-agents' results, ``PROMPT`` a sub-agent's task; ``SPAWN_NEXT``
is forced to ``<wait>`` after the block of the episode's K-th sub-agent). One call to
:func:`episode_tick` appends at most one token to every agent of an episode:

1. the orchestrator emits (its sampled token, or the forced one) and parses it;
   a ``<wait>`` launches the spawned sub-agent slots;
2. every running sub-agent emits and parses;
3. a waiting orchestrator whose sub-agents have all stopped books the stage
   (critical steps += max, total += sum) and starts hearing the results.

Everything is per episode and scalar; the engine ``vmap``s it over the batch.
"""

from __future__ import annotations


import flax.struct
import jax
import jax.numpy as jnp

from swarmjax.envs.widesearch import PROTOCOL, Vocab, WideSearchConfig

Array = jax.Array
T = {sym: i for i, sym in enumerate(PROTOCOL)}   # protocol token ids

# orchestrator phases
O_TURN, O_LOOKUP_ARG, O_ENV, O_SPAWN_ENT, O_SPAWN_NEXT, O_WAIT, O_RESULTS, O_ANS_E, O_ANS_V, O_DONE = range(10)
O_SAMPLES = (O_TURN, O_LOOKUP_ARG, O_SPAWN_ENT, O_SPAWN_NEXT, O_ANS_E, O_ANS_V)
# worker phases
W_IDLE, W_PROMPT, W_TURN, W_LOOKUP_ARG, W_ENV, W_RET_E, W_RET_V, W_DONE = range(8)
W_SAMPLES = (W_TURN, W_LOOKUP_ARG, W_RET_E, W_RET_V)
# end reasons (0: still running)
END_REASONS = ("running", "answer", "budget", "context")
RUNNING, END_ANSWER, END_BUDGET, END_CONTEXT = range(4)


@flax.struct.dataclass
class Tasks:
    """A batch of episodes. table [B, E] hidden values; entities [B, N_max] asked-for
    entities (the first ``n`` are real, the rest -1); n [B] task sizes."""

    table: Array
    entities: Array
    n: Array


def problems(tasks: Tasks) -> list[dict]:
    """``tasks`` [B] as a problem list (what engines take, :mod:`swarmjax.train.engines`):
    one ``{"table" [E], "entities" [N_max], "n" []}`` record of host int32 arrays each."""
    import numpy as np

    table, entities, n = (np.asarray(x, np.int32) for x in jax.device_get((tasks.table, tasks.entities, tasks.n)))
    return [{"table": table[b], "entities": entities[b], "n": n[b]} for b in range(len(n))]


def stack(problems: list[dict]) -> Tasks:
    """A problem list (:func:`problems`) as host task arrays [B]."""
    import numpy as np

    return Tasks(*(np.stack([np.asarray(p[k], np.int32) for p in problems]) for k in ("table", "entities", "n")))


def reset(key: Array, cfg: WideSearchConfig, batch: int, n: Array | int | None = None) -> Tasks:
    """Sample ``batch`` fresh tasks: a random table and ``n`` distinct entities each
    (``n`` uniform in [min_task_size, max_task_size] unless given, scalar or [B])."""
    k_table, k_ent, k_n = jax.random.split(key, 3)
    E, N = cfg.num_entities, cfg.max_task_size
    table = jax.random.randint(k_table, (batch, E), 0, cfg.num_values, jnp.int32)
    if n is None:
        n = jax.random.randint(k_n, (batch,), cfg.min_task_size, N + 1, jnp.int32)
    n = jnp.broadcast_to(jnp.asarray(n, jnp.int32), (batch,))
    perm = jax.vmap(lambda k: jax.random.permutation(k, E)[:N])(jax.random.split(k_ent, batch))
    entities = jnp.where(jnp.arange(N)[None] < n[:, None], perm, -1).astype(jnp.int32)
    return Tasks(table=table, entities=entities, n=n)


def repeat_groups(tasks: Tasks, group_size: int) -> tuple[Tasks, Array]:
    """Each task ``group_size`` times in a row (G rollouts per task for group-relative
    advantages). Returns the [B * G] tasks and their group ids [B * G]."""
    rep = jax.tree.map(lambda a: jnp.repeat(a, group_size, axis=0), tasks)
    groups = jnp.repeat(jnp.arange(tasks.n.shape[0], dtype=jnp.int32), group_size)
    return rep, groups


def orch_prompt(cfg: WideSearchConfig, tasks: Tasks) -> tuple[Array, Array]:
    """``<orch> <task> e.. </task>`` right-padded: tokens, mask [B, N_max + 3]."""
    vocab = Vocab(cfg)
    B, N = tasks.entities.shape
    j = jnp.arange(N + 3)[None]                                          # [1, N + 3]
    n = tasks.n[:, None]
    ents = jnp.pad(tasks.entities, ((0, 0), (2, 1)), constant_values=-1)  # aligned with j
    tok = jnp.where(j == 0, T["<orch>"], jnp.where(j == 1, T["<task>"],
                    jnp.where(j < n + 2, vocab.entity_base + ents, T["</task>"])))
    mask = j < n + 3
    return jnp.where(mask, tok, T["<pad>"]).astype(jnp.int32), mask


# ----------------------------------------------------------------------------- state


@flax.struct.dataclass
class OrchState:
    """Per-episode orchestrator state (scalars unless noted)."""

    phase: Array
    ctx_len: Array           # tokens in its context
    orch_steps: Array
    critical: Array
    total: Array
    spawned: Array           # sub-agents launched so far (= next free slot)
    finished: Array
    nblocks: Array           # spawn blocks opened in the current turn
    nents: Array             # entities in the current block
    queue: Array             # [2] tool reply being heard
    qpos: Array
    qlen: Array
    res_k: Array             # results cursor: slot, token within its block
    res_j: Array
    stage_first: Array       # slots of the stage being waited on
    stage_n: Array
    ans_e: Array             # entity of the answer pair being read
    ans_len: Array           # pairs answered
    answer: Array            # [A, 2] answered (entity, value) pairs
    seen: Array              # [E * V] bool, pair already answered (distinct count)
    correct: Array
    answered: Array          # distinct pairs
    end: Array               # END_* code


@flax.struct.dataclass
class WorkerState:
    """Per-slot sub-agent state; every field has a leading [K] axis in an episode."""

    phase: Array
    ctx_len: Array
    steps: Array
    task: Array              # [K, max_block] entity ids
    ntask: Array
    stage: Array             # orchestrator step that spawned it
    cursor: Array            # prompt cursor
    queue: Array             # [K, 2]
    qpos: Array
    qlen: Array
    ret_e: Array
    ret: Array               # [K, W] returned "e v" token ids
    ret_len: Array           # tokens in ret
    ok: Array                # returned (vs failed); valid once DONE


def init_state(cfg: WideSearchConfig, tasks: Tasks) -> tuple[OrchState, WorkerState]:
    """Initial states for a batch [B] (orchestrator after its prompt, workers idle)."""
    B = tasks.n.shape[0]
    K, W, mb = cfg.max_subagents, cfg.contexts.subagents, cfg.max_block_entities
    z = jnp.zeros((B,), jnp.int32)
    zk = jnp.zeros((B, K), jnp.int32)
    orch = OrchState(
        phase=z + O_TURN, ctx_len=tasks.n + 3, orch_steps=z, critical=z, total=z, spawned=z,
        finished=z, nblocks=z, nents=z, queue=jnp.zeros((B, 2), jnp.int32), qpos=z, qlen=z,
        res_k=z, res_j=z, stage_first=z, stage_n=z, ans_e=z, ans_len=z,
        answer=jnp.full((B, cfg.contexts.orchestrator // 2, 2), -1, jnp.int32),
        seen=jnp.zeros((B, cfg.num_entities * cfg.num_values), bool), correct=z, answered=z, end=z)
    workers = WorkerState(
        phase=zk + W_IDLE, ctx_len=zk, steps=zk, task=jnp.zeros((B, K, mb), jnp.int32), ntask=zk,
        stage=zk, cursor=zk, queue=jnp.zeros((B, K, 2), jnp.int32), qpos=zk, qlen=zk, ret_e=zk,
        ret=jnp.zeros((B, K, W), jnp.int32), ret_len=zk, ok=jnp.zeros((B, K), bool))
    return orch, workers


# ----------------------------------------------------------------------------- transition


def _in(x: Array, values) -> Array:
    return jnp.any(x == jnp.asarray(values, jnp.int32))


def _lookup_reply(vocab: Vocab, table: Array, tok: Array) -> tuple[Array, Array]:
    """Tool reply to ``<lookup> tok``: ``<val> v`` for an entity, else ``<fail>``."""
    is_e = (tok >= vocab.entity_base) & (tok < vocab.value_base)
    value = vocab.value_base + table[jnp.clip(tok - vocab.entity_base, 0, vocab.cfg.num_entities - 1)]
    queue = jnp.where(is_e, jnp.stack([T["<val>"], value]), jnp.array([T["<fail>"], 0]))
    return queue.astype(jnp.int32), jnp.where(is_e, 2, 1).astype(jnp.int32)


def _result_token(w: WorkerState, k: Array, j: Array) -> tuple[Array, Array]:
    """Token j of slot k's ``<result> .. </result>`` block, and whether it is the last."""
    ok, n = w.ok[k], w.ret_len[k]
    size = jnp.where(ok, n + 2, 3)
    body = jnp.where(ok, w.ret[k, jnp.clip(j - 1, 0, w.ret.shape[1] - 1)], T["<fail>"])
    tok = jnp.where(j == 0, T["<result>"], jnp.where(j == size - 1, T["</result>"], body))
    return tok.astype(jnp.int32), j == size - 1


def orch_emit(cfg: WideSearchConfig, o: OrchState, w: WorkerState, table: Array, asked: Array,
              sampled: Array) -> tuple[OrchState, WorkerState, Array, Array, Array]:
    """The orchestrator's next context token and its parse. ``sampled`` is the token
    the policy drew this tick (used only in a sampling phase); table [E]; asked [E]
    bool marks the task's entities (an answered pair is correct when asked and right).

    Returns (orch, workers, token, emitted, was_sampled); ``emitted`` is False when
    the orchestrator waits, has ended, or ends now (budget, full context).
    """
    vocab = Vocab(cfg)
    K, C = cfg.max_subagents, cfg.contexts.orchestrator
    budget = cfg.budget if cfg.budget is not None else jnp.iinfo(jnp.int32).max - 1
    ph = o.phase
    # after the block of the episode's K-th sub-agent the environment says <wait>
    at_cap = (ph == O_SPAWN_NEXT) & (o.spawned + o.nblocks >= K)
    is_sample = _in(ph, O_SAMPLES) & ~at_cap
    res_tok, res_last = _result_token(w, o.res_k, o.res_j)
    forced = jnp.where(at_cap, T["<wait>"],
                       jnp.where(ph == O_ENV, o.queue[jnp.clip(o.qpos, 0, 1)], res_tok))
    wants = is_sample | at_cap | (ph == O_ENV) | (ph == O_RESULTS)
    over_budget = (ph == O_TURN) & (o.critical + 1 > budget)
    full = o.ctx_len >= C
    emit = wants & ~over_budget & ~full
    end = jnp.where(wants & over_budget, END_BUDGET,
                    jnp.where(wants & full, jnp.where(_in(ph, (O_ANS_E, O_ANS_V)), END_ANSWER,
                                                      END_CONTEXT), RUNNING))
    tok = jnp.where(is_sample, sampled, forced).astype(jnp.int32)
    is_e = (tok >= vocab.entity_base) & (tok < vocab.value_base)
    is_v = (tok >= vocab.value_base) & (tok < vocab.size)

    fail = jnp.zeros((), bool)
    nxt = ph
    # TURN: a step starts
    turn = emit & (ph == O_TURN)
    steps_inc = turn.astype(jnp.int32)
    spawn_ok = o.spawned < K
    nxt = jnp.where(turn, jnp.where(tok == T["<lookup>"], O_LOOKUP_ARG,
                    jnp.where(tok == T["<answer>"], O_ANS_E,
                              jnp.where((tok == T["<spawn>"]) & spawn_ok, O_SPAWN_ENT, O_ENV))), nxt)
    fail |= turn & ~_in(tok, (T["<lookup>"], T["<answer>"])) & ~((tok == T["<spawn>"]) & spawn_ok)
    nblocks = jnp.where(turn, 1, o.nblocks)
    nents = jnp.where(turn, 0, o.nents)
    # LOOKUP_ARG: the environment answers
    lk = emit & (ph == O_LOOKUP_ARG)
    lq, lqlen = _lookup_reply(vocab, table, tok)
    # SPAWN_ENT: entity into the open block, or </spawn>
    se = emit & (ph == O_SPAWN_ENT)
    slot = o.spawned + o.nblocks - 1
    add_ent = se & is_e & (o.nents < cfg.max_block_entities)
    close = se & (tok == T["</spawn>"]) & (o.nents > 0)
    fail |= se & ~add_ent & ~close
    nxt = jnp.where(close, O_SPAWN_NEXT, nxt)
    task = w.task.at[jnp.clip(slot, 0, K - 1), jnp.clip(o.nents, 0, cfg.max_block_entities - 1)].set(
        jnp.where(add_ent, tok - vocab.entity_base,
                  w.task[jnp.clip(slot, 0, K - 1), jnp.clip(o.nents, 0, cfg.max_block_entities - 1)]))
    ntask = w.ntask.at[jnp.clip(slot, 0, K - 1)].set(
        jnp.where(add_ent, o.nents + 1, w.ntask[jnp.clip(slot, 0, K - 1)]))
    nents = jnp.where(add_ent, o.nents + 1, nents)
    # SPAWN_NEXT: <wait> (said, or forced at the K-th sub-agent) launches the stage,
    # <spawn> opens another block
    sn = emit & (ph == O_SPAWN_NEXT)
    launch = sn & (tok == T["<wait>"])
    reopen = sn & (tok == T["<spawn>"]) & ~at_cap
    fail |= sn & ~launch & ~reopen
    nxt = jnp.where(launch, O_WAIT, jnp.where(reopen, O_SPAWN_ENT, nxt))
    nblocks = jnp.where(reopen, o.nblocks + 1, nblocks)
    nents = jnp.where(reopen, 0, nents)
    slots = jnp.arange(K)
    launched = launch & (slots >= o.spawned) & (slots < o.spawned + o.nblocks)     # [K]
    w = w.replace(task=task, ntask=ntask,
                  phase=jnp.where(launched, W_PROMPT, w.phase),
                  stage=jnp.where(launched, o.orch_steps, w.stage))
    # ANSWER pairs
    ae = emit & (ph == O_ANS_E)
    av = emit & (ph == O_ANS_V)
    pair = av & is_v
    answer_end = (ae & ~is_e) | (av & ~is_v)
    nxt = jnp.where(ae & is_e, O_ANS_V, jnp.where(pair, O_ANS_E, nxt))
    e, v = o.ans_e, tok - vocab.value_base
    key = jnp.clip(e * cfg.num_values + v, 0, o.seen.shape[0] - 1)
    new_pair = pair & ~o.seen[key]
    e_idx = jnp.clip(e, 0, cfg.num_entities - 1)
    right = (table[e_idx] == v) & asked[e_idx]
    answer = o.answer.at[jnp.clip(o.ans_len, 0, o.answer.shape[0] - 1)].set(
        jnp.where(pair, jnp.stack([e, v]), o.answer[jnp.clip(o.ans_len, 0, o.answer.shape[0] - 1)]))
    # ENV / RESULTS cursors
    env = emit & (ph == O_ENV)
    qpos = jnp.where(env, o.qpos + 1, o.qpos)
    nxt = jnp.where(env & (qpos >= o.qlen), O_TURN, nxt)
    res = emit & (ph == O_RESULTS)
    res_k = jnp.where(res & res_last, o.res_k + 1, o.res_k)
    res_j = jnp.where(res, jnp.where(res_last, 0, o.res_j + 1), o.res_j)
    nxt = jnp.where(res & res_last & (res_k >= o.stage_first + o.stage_n), O_TURN, nxt)
    # a malformed turn or a lookup queues its reply
    queue = jnp.where(lk, lq, jnp.where(fail, jnp.array([T["<fail>"], 0], jnp.int32), o.queue))
    qlen = jnp.where(lk, lqlen, jnp.where(fail, 1, o.qlen))
    qpos = jnp.where(lk | fail, 0, qpos)
    nxt = jnp.where(lk | fail, O_ENV, nxt)
    end = jnp.where(answer_end, END_ANSWER, end)
    nxt = jnp.where(end != RUNNING, O_DONE, nxt)
    o = o.replace(
        phase=nxt.astype(jnp.int32), ctx_len=o.ctx_len + emit, orch_steps=o.orch_steps + steps_inc,
        critical=o.critical + steps_inc, total=o.total + steps_inc,
        spawned=jnp.where(launch, o.spawned + o.nblocks, o.spawned),
        nblocks=nblocks, nents=nents, queue=queue, qpos=qpos, qlen=qlen, res_k=res_k, res_j=res_j,
        stage_first=jnp.where(launch, o.spawned, o.stage_first),
        stage_n=jnp.where(launch, o.nblocks, o.stage_n),
        ans_e=jnp.where(ae & is_e, tok - vocab.entity_base, o.ans_e),
        ans_len=o.ans_len + pair, answer=answer, seen=o.seen.at[key].set(o.seen[key] | pair),
        answered=o.answered + new_pair, correct=o.correct + (new_pair & right),
        end=jnp.where(o.end == RUNNING, end, o.end))
    return o, w, tok, emit, emit & is_sample


def worker_emit(cfg: WideSearchConfig, w: WorkerState, table: Array, sampled: Array,
                ready: Array = True) -> tuple[WorkerState, Array, Array, Array]:
    """One sub-agent slot's next context token and its parse (fields of ``w`` are
    scalars here; vmap over slots). ``ready`` False holds the slot for this tick (it
    has no KV-cache lane yet). Returns (state, token, emitted, was_sampled)."""
    vocab = Vocab(cfg)
    W = cfg.contexts.subagents
    ph = w.phase
    is_sample = _in(ph, W_SAMPLES)
    j = w.cursor
    prompt_tok = jnp.where(j == 0, T["<worker>"], jnp.where(j == 1, T["<task>"], jnp.where(
        j < w.ntask + 2, vocab.entity_base + w.task[jnp.clip(j - 2, 0, w.task.shape[0] - 1)],
        T["</task>"])))
    forced = jnp.where(ph == W_PROMPT, prompt_tok, w.queue[jnp.clip(w.qpos, 0, 1)])
    wants = (is_sample | (ph == W_PROMPT) | (ph == W_ENV)) & ready
    out_of_steps = (ph == W_TURN) & (w.steps >= cfg.subagent_steps)
    full = w.ctx_len >= W
    emit = wants & ~out_of_steps & ~full
    stop_fail = wants & (out_of_steps | (full & ~_in(ph, (W_RET_E, W_RET_V))))
    stop_ok = wants & full & _in(ph, (W_RET_E, W_RET_V))
    tok = jnp.where(is_sample, sampled, forced).astype(jnp.int32)
    is_e = (tok >= vocab.entity_base) & (tok < vocab.value_base)
    is_v = (tok >= vocab.value_base) & (tok < vocab.size)

    nxt = ph
    pr = emit & (ph == W_PROMPT)
    nxt = jnp.where(pr & (j + 1 >= w.ntask + 3), W_TURN, nxt)
    turn = emit & (ph == W_TURN)
    fail = turn & (tok != T["<lookup>"]) & (tok != T["<return>"])
    nxt = jnp.where(turn & (tok == T["<lookup>"]), W_LOOKUP_ARG,
                    jnp.where(turn & (tok == T["<return>"]), W_RET_E, nxt))
    lk = emit & (ph == W_LOOKUP_ARG)
    lq, lqlen = _lookup_reply(vocab, table, tok)
    env = emit & (ph == W_ENV)
    qpos = jnp.where(env, w.qpos + 1, w.qpos)
    nxt = jnp.where(env & (qpos >= w.qlen), W_TURN, nxt)
    re = emit & (ph == W_RET_E)
    rv = emit & (ph == W_RET_V)
    pair = rv & is_v
    returned = stop_ok | (re & ~is_e) | (rv & ~is_v)
    nxt = jnp.where(re & is_e, W_RET_V, jnp.where(pair, W_RET_E, nxt))
    n = jnp.clip(w.ret_len, 0, w.ret.shape[0] - 2)
    ret = jnp.where(pair, w.ret.at[n].set(vocab.entity_base + w.ret_e).at[n + 1].set(tok), w.ret)
    queue = jnp.where(lk, lq, jnp.where(fail, jnp.array([T["<fail>"], 0], jnp.int32), w.queue))
    qlen = jnp.where(lk, lqlen, jnp.where(fail, 1, w.qlen))
    qpos = jnp.where(lk | fail, 0, qpos)
    nxt = jnp.where(lk | fail, W_ENV, nxt)
    nxt = jnp.where(returned | stop_fail, W_DONE, nxt)
    w = w.replace(phase=nxt.astype(jnp.int32), ctx_len=w.ctx_len + emit, steps=w.steps + turn,
                  cursor=j + pr, queue=queue, qpos=qpos, qlen=qlen,
                  ret_e=jnp.where(re & is_e, tok - vocab.entity_base, w.ret_e), ret=ret,
                  ret_len=w.ret_len + 2 * pair, ok=jnp.where(returned, True, w.ok))
    return w, tok, emit, emit & is_sample


def resolve_wait(o: OrchState, w: WorkerState) -> OrchState:
    """A waiting orchestrator whose stage has fully stopped books the stage's cost
    (critical += max worker steps, total += sum, finished += returned) and starts
    hearing the results in spawn order."""
    slots = jnp.arange(w.phase.shape[0])
    mine = (slots >= o.stage_first) & (slots < o.stage_first + o.stage_n)
    ready = (o.phase == O_WAIT) & jnp.all(jnp.where(mine, w.phase == W_DONE, True))
    steps = jnp.where(mine, w.steps, 0)
    return o.replace(
        phase=jnp.where(ready, O_RESULTS, o.phase),
        critical=o.critical + ready * jnp.max(steps), total=o.total + ready * jnp.sum(steps),
        finished=o.finished + ready * jnp.sum(mine & w.ok),
        res_k=jnp.where(ready, o.stage_first, o.res_k), res_j=jnp.where(ready, 0, o.res_j))


def episode_tick(cfg: WideSearchConfig, o: OrchState, w: WorkerState, table: Array, asked: Array,
                 orch_sampled: Array, worker_sampled: Array, worker_ready: Array | None = None):
    """Advance one episode by one token per agent (see the module docstring).

    Args: per-episode states; table [E]; asked [E] bool (entities of the task);
      orch_sampled [] and worker_sampled [K]: what the policies drew this tick;
      worker_ready [K] bool: slots allowed to emit this tick (default all).
    Returns (orch, workers, orch (token, emitted, sampled), workers (token, emitted,
    sampled) [K] each, ctx positions the tokens were written at (orch [], workers [K])).
    """
    o_pos = o.ctx_len
    o, w, o_tok, o_emit, o_smp = orch_emit(cfg, o, w, table, asked, orch_sampled)
    w_pos = w.ctx_len
    ready = jnp.ones(worker_sampled.shape, bool) if worker_ready is None else worker_ready
    w, w_tok, w_emit, w_smp = jax.vmap(lambda ws, s, r: worker_emit(cfg, ws, table, s, r))(
        w, worker_sampled, ready)
    o = resolve_wait(o, w)
    return o, w, (o_tok, o_emit, o_smp, o_pos), (w_tok, w_emit, w_smp, w_pos)
