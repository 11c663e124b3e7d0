"""The jitted text swarm (swarmjax.swarm.text_engine) against the host-driven text rollout
running the host twin of the same task (swarmjax.envs.widesearch_relay.RelayEnv): on
scripted episodes (serial, split, and every error path), on random-model episodes and
on mixes, the orchestrators' ids, masks, log-probs, turns, step counts, end reasons,
rewards and the sub-agents' conversations must agree."""

import dataclasses

import numpy as np
import jax
import pytest

from swarmjax.envs.orchestration import ASSIGN, CREATE
from swarmjax.envs.widesearch import Episode, WideSearchConfig
from swarmjax.envs.widesearch_relay import RelayTask, relay_corpus
from swarmjax.envs.widesearch_relay_device import RelayDeviceTask
from swarmjax.models import ModelConfig, init_params
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.swarm.context import ContextConfig
from swarmjax.swarm.text_engine import TextSwarm
from swarmjax.swarm.text_rollout import END_ANSWER, END_BUDGET, TextRollout
from swarmjax.swarm.text_types import SwarmConfig, TextRolloutConfig, TextScripts
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import Qwen3Format, chat_format
from swarmjax.text.tokenizer import TextTokenizer

from conftest import spread

CFG = WideSearchConfig(num_entities=12, num_values=12, min_task_size=1, max_task_size=4, max_subagents=3,
                       subagent_steps=3, budget=None)
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    texts = relay_corpus(CFG) + [Qwen3Format.TOOLS_HEAD, Qwen3Format.TOOLS_TAIL] * 5
    tok = TextTokenizer.from_dir(train_bpe_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=1000))
    chat = chat_format("qwen3", tok)
    task = RelayTask(CFG, chat, max_calls=4, max_mentions=4, max_pairs=6)
    model = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=8, intermediate_size=64)
    params = spread(init_params(model, jax.random.key(0)), 4.0)
    worker_params = spread(init_params(model, jax.random.key(1)), 4.0)
    return task, model, params, worker_params


def _rcfg(**kw):
    base = dict(contexts=Roles(896, 384), max_turn_tokens=200, subagent_lanes=8 * CFG.max_subagents,
                subagent_turns=CFG.subagent_steps, budget=8, sampling=Roles.both(GREEDY),
                min_window=1024, prefill_buckets=(64,), segment_exit=1.0)   # few host compiles
    return TextRolloutConfig(**{**base, **kw})


SCRIPTED = _rcfg()
_ENGINES: dict = {}      # one compiled TextSwarm per (config, mesh) in this module


def _lookup(task, name):
    return task.turn_ids(calls=[("lookup", {"entity": name})])


def _engine(setup, rcfg, mesh=None):
    key = (rcfg, mesh is not None)
    if key not in _ENGINES:
        _ENGINES[key] = TextSwarm(RelayDeviceTask(setup[0]), setup[1], rcfg, swarm=SwarmConfig(chunk=16, buckets=2),
                                  mesh=mesh)   # fewer compiles
    return _ENGINES[key]


def _run_both(setup, episodes, scripts, rcfg, mesh=None, *, host=True, device=True):
    """(host rollout result, TextSwarm result); either may be skipped (None)."""
    task, model, params, worker_params = setup
    want = got = None
    if host:
        rollout = TextRollout(model, rcfg, stop_ids=task.chat.stop_ids,
                              pad_id=task.chat.tokenizer.token_id(task.chat.pad_token))
        try:
            want = rollout(Roles(params, worker_params), [task.orchestrator(ep) for ep in episodes],
                           [None] * len(episodes), jax.random.key(0), scripts=scripts)
        finally:
            rollout.close()
    if not device:
        return want, None
    got = _engine(setup, rcfg, mesh)(Roles(params, worker_params), episodes, jax.random.key(0), scripts=scripts)
    return want, got


def _assert_same(want, got):
    assert got.stats["cut_by_max_ticks"] == 0
    for name in ("length", "tokens", "loss_mask", "stage_ids", "orch_steps", "critical_steps", "total_steps",
                 "spawned", "finished", "end_reason"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=2e-4)
    np.testing.assert_allclose(got.model_logprobs, want.model_logprobs, atol=2e-4)
    assert sorted(got.rewards) == sorted(want.rewards) or not want.rewards
    for k, v in want.rewards.items():
        np.testing.assert_allclose(got.rewards[k], v, atol=1e-6, err_msg=k)
    assert got.answers == want.answers
    for ws, gs in zip(want.subagents, got.subagents):
        assert [s.name for s in gs] == [s.name for s in ws]
        assert [s.steps for s in gs] == [s.steps for s in ws]
        for w, g in zip(ws, gs):
            np.testing.assert_array_equal(g.arrays()["ids"], w.arrays()["ids"])
            np.testing.assert_array_equal(g.arrays()["sampled"], w.arrays()["sampled"])


def _episodes(n_eps, seed=0, n=None):
    rng = __import__("random").Random(seed)
    return [Episode.sample(CFG, rng, n) for _ in range(n_eps)]


@pytest.fixture(scope="module")
def scripted(setup):
    """Eight scripted episodes and the host rollout's result: serial, split in one turn,
    split after a turn of creations (6 calls: more than max_calls in one turn), every
    error path (a second lookup, an unknown entity and tool, a bad argument, bad JSON,
    an assignment before its creation, calls past max_calls, a cut call, then the random
    model), sub-agents stopped at their turn limit or answering wrong lines, an
    orchestrator that never answers (budget), one whose turns outgrow its context, and a
    sub-agent that outgrows its own."""
    task = setup[0]
    eps = _episodes(8, seed=1, n=4)
    names = task.entity_names
    ep = eps[3]
    two, two_w = task.split_script(eps[1], 2)
    three, three_w = task.split_script(eps[2], 3, create_first=True)
    bad = [
        task.turn_ids(calls=[("lookup", {"entity": names[ep.task[0]]}), ("lookup", {"entity": names[ep.task[1]]}),
                           ("lookup", {"entity": "Nobody Here"}), ("nope", {})]),
        task.chat.tokenizer.encode('<tool_call>\n{"name": "lookup", "arguments": {"entity": 3}}\n</tool_call>'
                                   '<tool_call>\n{"name": lookup}\n</tool_call><|im_end|>'),
        task.turn_ids(calls=[(ASSIGN, {"agent": "worker1", "prompt": names[ep.task[0]]}),
                           (CREATE, {"name": "worker1"}), (ASSIGN, {"agent": "worker1", "prompt": "x"}),
                           (ASSIGN, {"agent": "worker1", "prompt": names[ep.task[2]] + names[ep.task[1]]}),
                           (CREATE, {"name": "worker2"})]),
        task.answer_turn(ep, ep.task[:2]),
    ]
    stuck = [_lookup(task, names[ep.task[0]])] * 5
    wrong = [task.turn_ids(f"{names[ep.task[2]]}: {task.value_names[0]}\nfoo: bar\n{names[ep.task[2]]}: "
                         f"{task.value_names[0]}")]
    cut = [task.turn_ids(calls=[("lookup", {"entity": names[eps[4].task[0]]})])[:-3]]
    forever = [_lookup(task, names[eps[5].task[0]])] * 9                          # never answers: budget
    chatty = [task.turn_ids(calls=[("lookup", {"entity": names[eps[6].task[0]], "x": "x " * 120})])] * 6  # context
    one, _ = task.split_script(eps[7], 1)
    chatty_w = [task.turn_ids(calls=[("lookup", {"entity": names[eps[7].task[0]], "y": "y " * 120})])] * 3
    scripts = TextScripts(orch=[task.serial_script(eps[0]), two, three, bad, cut, forever, chatty, one],
                          workers=[[], two_w, three_w, [stuck, wrong], [], [], [], [chatty_w]])
    want, _ = _run_both(setup, eps, scripts, SCRIPTED, device=False)
    return eps, scripts, want


@pytest.mark.slow
def test_scripted_episodes_agree(setup, scripted):
    eps, scripts, want = scripted
    _, got = _run_both(setup, eps, scripts, SCRIPTED, host=False)
    _assert_same(want, got)
    assert list(got.end_reason[:3]) == [1, 1, 1] and got.rewards["r_perf"][:3].tolist() == [1.0, 1.0, 1.0]
    assert got.critical_steps[:3].tolist() == [5, 1 + 3 + 1, 2 + 3 + 1] and got.spawned[:4].tolist() == [0, 2, 3, 2]
    assert got.finished[3] == 1 and [s.steps for s in got.subagents[3]] == [CFG.subagent_steps, 1]
    # work beside each stage's busiest sub-agent: 2 + 2, 2 + 1 + 1, and one wrong line beside a stopped one
    assert got.rewards["parallel"][:4].tolist() == [0.0, 2.0, 2.0, 0.0]
    assert got.end_reason[5] == 2 and got.end_reason[6] == 3                     # budget, context
    assert got.spawned[7] == 1 and got.finished[7] == 0 and got.subagents[7][0].steps < 3


@pytest.mark.slow
def test_budget_is_an_argument_of_the_one_program(setup, scripted):
    """``budget=None`` lifts the critical-step budget in the compiled program the config's
    budget runs (no new compile): the orchestrator the budget stopped goes on; episodes
    that answered within the budget are unchanged."""
    task, model, params, worker_params = setup
    eps, scripts, want = scripted
    engine = _engine(setup, SCRIPTED)
    engine(Roles(params, worker_params), eps, jax.random.key(0), scripts=scripts)     # the config's budget: compiled
    compiled = dict(engine._jitted)
    got = engine(Roles(params, worker_params), eps, jax.random.key(0), scripts=scripts, budget=None, greedy=True)
    assert engine._jitted == compiled
    assert want.end_reason[5] == END_BUDGET and got.end_reason[5] != END_BUDGET
    assert got.critical_steps[5] > want.critical_steps[5]
    same = want.end_reason == END_ANSWER
    assert same.sum() >= 3
    np.testing.assert_array_equal(got.tokens[same], want.tokens[same])
    np.testing.assert_array_equal(got.critical_steps[same], want.critical_steps[same])


@pytest.mark.slow
def test_eight_devices_agree(setup, scripted):
    """The same episodes split over 8 devices (one each)."""
    from swarmjax.sharding.mesh import MeshConfig, make_mesh
    eps, scripts, want = scripted
    _, got = _run_both(setup, eps, scripts, SCRIPTED, mesh=make_mesh(MeshConfig(data=8, fsdp=1, tensor=1)),
                       host=False)
    _assert_same(want, got)


def test_bad_input_is_refused(setup, scripted):
    task, model, params, _ = setup
    engine = _engine(setup, SCRIPTED)
    eps = scripted[0]
    with pytest.raises(ValueError, match="no episodes"):
        engine(Roles.both(params), [], jax.random.key(0))
    with pytest.raises(ValueError, match="episode 1: a task of 1..4"):
        engine(Roles.both(params), [eps[0], Episode(table=eps[1].table, task=list(range(5)))], jax.random.key(0))
    twin = RelayDeviceTask(task)
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        TextSwarm(twin, model.replace(vocab_size=64), SCRIPTED)
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        TextSwarm(twin, model, SCRIPTED, swarm=SwarmConfig(buckets=0))
    with pytest.raises(ValueError, match="the device swarm has none"):
        TextSwarm(twin, model, dataclasses.replace(SCRIPTED, context=ContextConfig("discard_all")))
    with pytest.raises(TypeError, match="runs a DeviceTask, got RelayTask"):
        TextSwarm(task, model, SCRIPTED)


def test_played_demonstrations_match_the_rollouts(setup, scripted):
    """The warm start's demonstrations (played on the host without a model,
    swarmjax.envs.api.play, as the agent job plays every task's) are the conversations a
    rollout that samples those turns builds."""
    from swarmjax.envs.api import play
    task = setup[0]
    eps, scripts, want = scripted
    for b in (0, 1, 2):
        played = play(task.orchestrator(eps[b]), eps[b].task, scripts.orch[b], workers=scripts.workers[b])
        ids, mask, rows = played.ids, played.mask, [(s.ids, s.mask) for s in played.subagents]
        rewards = dict(played.last.rewards)
        L = int(want.length[b])
        np.testing.assert_array_equal(ids, want.tokens[b, :L])
        np.testing.assert_array_equal(mask, want.loss_mask[b, :L])
        assert rewards["r_perf"] == 1.0 and rewards["parallel"] == want.rewards["parallel"][b]
        assert len(rows) == len(want.subagents[b])
        for (w_ids, w_mask), sub in zip(rows, want.subagents[b]):
            np.testing.assert_array_equal(w_ids, sub.arrays()["ids"])
            np.testing.assert_array_equal(w_mask, sub.arrays()["sampled"])


def test_compacted_forward_equals_every_row_over_the_whole_cache():
    """compact_forward (the rows fed, gathered into a row bucket, over a window bucket;
    only what they wrote scattered back) leaves the caches, logits and positions that
    forward_rows of every row over the whole cache leaves, for every bucket choice: padding
    entries of a bucket must write nothing (they once overwrote row 0)."""
    from swarmjax.models.transformer import init_cache
    from swarmjax.swarm import text_engine_feed as te
    from swarmjax.swarm.text_device import Rows, make_prefix
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                      intermediate_size=64)
    params = init_params(cfg, jax.random.key(0))
    m = te.RoleModel(cfg, None, 64, None)
    R, X, P = 8, 48, 5
    rng = np.random.default_rng(0)
    trace = jax.numpy.asarray(rng.integers(0, 64, (R, 64)), jax.numpy.int32)
    fill = jax.numpy.asarray(rng.integers(0, 20, R), int)

    @jax.jit
    def start():                 # rows over a shared prefix, filled to random lengths
        rows = Rows(cache=init_cache(cfg, R, X), logits=jax.numpy.zeros((R, 64)), pos=jax.numpy.zeros((R,), int),
                    offset=jax.numpy.full((R,), P, int), prefix=make_prefix(params, cfg, jax.numpy.arange(P), P))
        return te.forward_rows(params, m, rows, trace, fill, 20, rows.rope(cfg, X))
    rows = start()
    rope = rows.rope(cfg, X)
    assert te.sizes(8, 3) == (2, 4, 8) and te.sizes(48, 3, least=2, linear=True) == (16, 32, 48)
    plain = jax.jit(lambda rows, counts, width: te.forward_rows(params, m, rows, trace, counts, width, rope),
                    static_argnums=2)
    compact = jax.jit(lambda rows, counts, *static: te.compact_forward(params, m, rows, trace, counts, *static, rope),
                      static_argnums=(2, 3, 4))
    for width, sizes, windows in [(1, (4, 8), (24, 48)), (4, (2, 4), (48,))]:
        for fed in (0.3, 0.9):
            counts = rng.integers(1, width + 1, R) * (rng.random(R) < fed)
            counts[np.cumsum(counts > 0) > sizes[-1]] = 0                  # at most the largest bucket is fed
            counts = jax.numpy.asarray(counts, int)
            want = plain(rows, counts, width)
            got = compact(rows, counts, width, sizes, windows)
            valid = np.asarray(want.cache.valid)
            np.testing.assert_array_equal(np.asarray(got.cache.valid), valid)
            np.testing.assert_array_equal(np.asarray(got.pos), np.asarray(want.pos))
            np.testing.assert_allclose(np.asarray(got.logits), np.asarray(want.logits), atol=1e-4, rtol=1e-4)
            for a, b in zip(got.cache.k + got.cache.v, want.cache.k + want.cache.v):
                slot_last = a.shape[-1] == X                       # keys [R, K, hd, S], values [R, K, S, hd]
                mask = valid[:, None, None, :] if slot_last else valid[:, None, :, None]
                np.testing.assert_allclose(np.where(mask, np.asarray(a), 0), np.where(mask, np.asarray(b), 0),
                                           atol=1e-4, rtol=1e-4)
