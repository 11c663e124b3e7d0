"""The host-driven text rollout on wide-search in text: differential against the token
world's reference simulator, drift (recorded log-probs == a teacher-forced forward),
limits (budget, sub-agent turns) and malformed calls."""

import dataclasses
import functools
import random

import jax
import numpy as np
import pytest

from swarmjax.envs import scripts as token_scripts
from swarmjax.envs.widesearch import Episode, WideSearchConfig, scripted, simulate
from swarmjax.envs.widesearch_text import WideSearchText, text_corpus
from swarmjax.models import forward, init_params
from swarmjax.models.config import ModelConfig
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.swarm.text_rollout import END_REASONS, TextRollout, TextRolloutConfig, TextScripts
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import chat_format
from swarmjax.text.tokenizer import TextTokenizer
from swarmjax.text.runner import ToolRunner

CFG = WideSearchConfig(num_entities=24, num_values=24, max_task_size=8, max_subagents=4, budget=None)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    path = train_bpe_tokenizer(text_corpus(CFG), tmp_path_factory.mktemp("tok"), vocab_size=700)
    chat = chat_format("qwen3", TextTokenizer.from_dir(path))
    runner = ToolRunner([], max_workers=8, timeout_s=5.0)
    task = WideSearchText(CFG, chat, runner)
    model = ModelConfig(vocab_size=chat.tokenizer.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                        num_kv_heads=1, head_dim=16, intermediate_size=64)
    params = init_params(model, jax.random.key(0))
    yield task, model, params
    runner.close()


def _rollout(world, episodes, key=0, scripts=None, **overrides):
    """Run ``episodes``; min_window 256 (not the default 128) keeps the compiled window
    widths of these long contexts few (the segmentation test runs narrow ones)."""
    task, model, params = world
    rcfg = TextRolloutConfig(**{**dict(contexts=Roles(2048, 1024), max_turn_tokens=512,
                                       subagent_lanes=3, subagent_turns=CFG.subagent_steps,
                                       prefill_buckets=(16, 64, 256), min_window=256), **overrides})
    engine = TextRollout(model, rcfg, stop_ids=task.chat.stop_ids)
    envs = [task.orchestrator(ep) for ep in episodes]
    return engine(Roles.both(params), envs, episodes, jax.random.key(key), scripts=scripts)


def _episodes(sizes, seed=0):
    rng = random.Random(seed)
    return [Episode.sample(CFG, rng, n=n) for n in sizes]


@pytest.mark.slow
def test_scripted_policies_match_the_token_world(world):
    """Serial and k-way split policies: the same answers, steps, critical steps, total
    steps, spawned / finished sub-agents as the token world's reference simulator."""
    task = world[0]
    eps = _episodes([1, 3, 5, 8, 8, 6])
    parts = [0, 0, 2, 4, 3, 2]                 # 0: serial
    orch, workers = [], []
    for ep, k in zip(eps, parts):
        if k:
            o, w = task.split_script(ep, k)
        else:
            o, w = task.serial_script(ep), []
        orch.append(o)
        workers.append(w)
    res = _rollout(world, eps, scripts=TextScripts(orch=orch, workers=workers))
    for b, (ep, k) in enumerate(zip(eps, parts)):
        if k:
            o, w = token_scripts.split(CFG, ep, k)
            ref = simulate(CFG, ep, scripted(o), None, workers=[scripted(x) for x in w])
        else:
            ref = simulate(CFG, ep, scripted(token_scripts.serial(CFG, ep)), scripted([]))
        assert END_REASONS[res.end_reason[b]] == ref.end_reason == "answer"
        assert task.parse_pairs(res.answers[b]) == ref.answer
        assert (res.orch_steps[b], res.critical_steps[b], res.total_steps[b], res.spawned[b],
                res.finished[b]) == (ref.orch_steps, ref.critical_steps, ref.total_steps, ref.spawned,
                                     ref.finished), b
        assert res.rewards["r_perf"][b] == 1.0
        assert res.rewards["novel"][b] == k and res.rewards["returned"][b] == (len(ep.task) if k else 0)
        assert res.rewards["tool_errors"][b] == 0


@functools.partial(jax.jit, static_argnums=1)
def _logits(params, model, ids, mask):
    return forward(params, model, ids, token_mask=mask).logits


def _teacher_forced(params, model, seqs):
    """log p(ids[t] | ids[<t]) [T - 1] of each sequence, by one forward over them all
    (right-padded to a multiple of 256 ids and 4 rows: few shapes to compile)."""
    T = -(-max(len(x) for x in seqs) // 256) * 256
    ids = np.zeros((-(-len(seqs) // 4) * 4, T), np.int32)
    mask = np.zeros(ids.shape, bool)
    for i, x in enumerate(seqs):
        ids[i, :len(x)], mask[i, :len(x)] = x, True
    logits = _logits(params, model, ids, mask)
    logp = np.asarray(jax.nn.log_softmax(logits), np.float64)                        # [N, T, V]
    return [np.take_along_axis(logp[i, :len(x) - 1], np.asarray(x)[1:, None], axis=1)[:, 0]
            for i, x in enumerate(seqs)]


@pytest.mark.parametrize("scripted_run", [False])
def test_recorded_logprobs_equal_a_teacher_forced_forward(world, scripted_run):
    """Drift: every log-prob the rollout recorded (orchestrators and sub-agents, every
    turn) equals a teacher-forced forward over the stored conversation to 1e-4: the ids
    the learner gets are exactly the ones the model saw, nothing re-tokenised. Sampled
    episodes here; scripted ones (split, with sub-agents, and compacted into segments)
    in test_context_strategies_split_an_episode_into_segments."""
    task, model, params = world
    eps = _episodes([4, 6, 3])
    scripts = None
    if scripted_run:
        plans = [task.split_script(ep, 2) for ep in eps]
        scripts = TextScripts(orch=[p[0] for p in plans], workers=[p[1] for p in plans])
    res = _rollout(world, eps, key=3, scripts=scripts, max_turn_tokens=512 if scripted_run else 24,
                   sampling=Roles.both(SamplingConfig(temperature=1.0)))
    traces = [t for b in range(len(eps)) for t in [res.orchestrators[b], *res.subagents[b]]]
    assert sum(t.steps for t in traces) >= (8 if scripted_run else 3)
    arrays = [t.arrays() for t in traces]
    for a, tf in zip(arrays, _teacher_forced(params, model, [a["ids"] for a in arrays])):
        mask = a["sampled"][1:]
        np.testing.assert_allclose(a["model_logprobs"][1:][mask], tf[mask], atol=1e-4)
    b = 0
    n = res.length[b]
    np.testing.assert_array_equal(res.tokens[b, :n], res.orchestrators[b].arrays()["ids"])
    assert res.loss_mask[b, :n].sum() == res.orchestrators[b].arrays()["sampled"].sum() > 0
    # no context strategy, no compaction, no extra learner rows: the plain GRPO/GSPO batch
    from swarmjax.train.agent_rl import _segment_rows
    B = len(eps)
    assert res.stats["compactions"] == 0 and not res.segment_rows()
    assert _segment_rows(res, np.zeros(B, np.float32), np.zeros(B, np.float32), np.arange(B), np.ones(B, bool), 4) \
        is None


@pytest.mark.slow
def test_segmentation_and_windows_change_only_the_time(world):
    """segment_exit, decode_slack and min_window decide where decode segments end and how
    wide their windows are, never the trajectory: a run cut into many short segments in
    narrow windows (rows resume every few tokens) records the same ids, log-probs and
    counts as one that decodes each turn in one segment over a full window. Scripted
    split episodes (multi-turn, sub-agents; the replayed ids are scored by the model)
    and one greedy episode on the random model."""
    task = world[0]
    eps = _episodes([4, 6, 3])
    plans = [task.split_script(ep, k) for ep, k in zip(eps, (2, 3))]
    common = dict(max_turn_tokens=200, sampling=Roles.both(SamplingConfig(temperature=0.0)),
                  scripts=TextScripts(orch=[p[0] for p in plans], workers=[p[1] for p in plans]))
    whole = _rollout(world, eps, segment_exit=1.0, decode_slack=None, min_window=256, **common)
    cut = _rollout(world, eps, segment_exit=0.25, decode_slack=8, min_window=64, **common)
    assert cut.stats["segments"] >= 2 * whole.stats["segments"]
    pairs = [(x, y) for b in range(len(eps))
             for x, y in zip([whole.orchestrators[b], *whole.subagents[b]], [cut.orchestrators[b], *cut.subagents[b]])]
    assert len(pairs) == sum(1 + len(s) for s in whole.subagents) == sum(1 + len(s) for s in cut.subagents)
    for x, y in pairs:
        a, b = x.arrays(), y.arrays()
        np.testing.assert_array_equal(a["ids"], b["ids"])
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)
    for field in ("critical_steps", "total_steps", "end_reason"):
        np.testing.assert_array_equal(getattr(whole, field), getattr(cut, field))


@pytest.mark.slow
def test_budget_ends_an_episode_and_subagents_are_stopped_at_their_turn_limit(world):
    task = world[0]
    eps = _episodes([6, 4])
    serial = task.serial_script(eps[0])
    orch, workers = task.split_script(eps[1], 1)       # one worker with 4 entities
    res = _rollout(world, eps, scripts=TextScripts(orch=[serial, orch], workers=[[], workers]),
                   budget=4, subagent_turns=3)
    assert END_REASONS[res.end_reason[0]] == "budget" and res.critical_steps[0] == 4
    assert res.spawned[1] == 1 and res.finished[1] == 0
    sub = res.subagents[1][0]
    assert (sub.steps, sub.ok, sub.reason) == (3, False, "turns")
    # the stage cost 1 + 3: the answer would be the 5th critical step, over the budget
    assert res.critical_steps[1] == 1 + 3 and END_REASONS[res.end_reason[1]] == "budget"


@pytest.mark.slow
def test_malformed_calls_cost_a_step_and_get_an_error_reply(world):
    task = world[0]
    ep = _episodes([2])[0]
    chat = task.chat
    bad = [chat.tokenizer.encode('<tool_call>\n{"name": "lookup", "arguments": {"entity": \n</tool_call>').tolist()
           + [int(chat.stop_ids[0])],
           task.turn_ids(calls=[("teleport", {"to": "x"})]),
           task.turn_ids(calls=[("lookup", {"entity": task.entity_names[ep.task[0]]}),
                                ("lookup", {"entity": task.entity_names[ep.task[1]]})]),
           task.answer_turn(ep)]
    res = _rollout(world, [ep], scripts=TextScripts(orch=[bad]))
    assert res.orch_steps[0] == 4 and END_REASONS[res.end_reason[0]] == "answer"
    assert res.rewards["tool_errors"][0] == 3            # bad JSON, unknown tool, the second lookup
    text = chat.tokenizer.decode(res.tokens[0, :res.length[0]])
    assert "Error:" in text and "unknown tool 'teleport'" in text and "per turn" in text


@pytest.mark.slow
def test_context_strategies_split_an_episode_into_segments(world):
    """discard_all and keep_last_round past a threshold: the episode goes on in new
    segments, each its own id stream that opens with the first prompt re-rendered with the
    strategy's note (keep_last_round: then the latest turn as sampled and its reply); the
    sampled ids over all segments are the turns, once each; every segment's recorded
    log-probs equal a teacher-forced forward over that segment, as the sub-agents' over
    their conversations (drift); the counts are the reference simulator's (a compaction
    changes no count); the learner gets every earlier segment as a row with its episode's
    advantage."""
    from swarmjax.envs.context_notes import DISCARD_NOTE, KEEP_NOTE
    from swarmjax.swarm.context import ContextConfig
    from swarmjax.train.agent_rl import _segment_rows

    task, model, params = world
    eps = _episodes([8, 8], seed=5)
    o, w = task.split_script(eps[1], 2)
    turns = [task.serial_script(eps[0]), o]
    scripts = TextScripts(orch=turns, workers=[[], w])
    o_tok, w_tok = token_scripts.split(CFG, eps[1], 2)
    refs = [simulate(CFG, eps[0], scripted(token_scripts.serial(CFG, eps[0])), scripted([])),
            simulate(CFG, eps[1], scripted(o_tok), None, workers=[scripted(x) for x in w_tok])]
    threshold = len(task.orchestrator(eps[0]).reset(eps[0])) + 250      # about three lookup rounds past the prompt
    convs = []                                                         # every conversation, for one forward
    for strategy, note in (("discard_all", DISCARD_NOTE), ("keep_last_round", KEEP_NOTE)):
        res = _rollout(world, eps, scripts=scripts, context=ContextConfig(strategy, threshold=threshold))
        assert res.stats["compactions"] >= 2 and res.stats["context_dropped"] > 0, strategy
        for b, ref in enumerate(refs):
            assert END_REASONS[res.end_reason[b]] == ref.end_reason == "answer"
            assert (res.orch_steps[b], res.critical_steps[b], res.total_steps[b], res.spawned[b],
                    res.finished[b]) == (ref.orch_steps, ref.critical_steps, ref.total_steps, ref.spawned,
                                         ref.finished), (strategy, b)
        assert res.rewards["r_perf"].tolist() == [1.0, 1.0]
        for b, ep in enumerate(eps):
            trace = res.orchestrators[b]
            segs = [*trace.segments, trace.arrays()]
            assert len(segs) >= 2 and trace.peak <= threshold + 512 and len(res.subagents[b]) == 2 * b
            sampled = np.concatenate([s["ids"][s["sampled"]] for s in segs])
            np.testing.assert_array_equal(sampled, np.concatenate(turns[b]), err_msg=strategy)
            env = task.orchestrator(ep)
            env.reset(ep)
            head = env.restart_ids(note)
            for before, seg in zip(segs, segs[1:]):
                np.testing.assert_array_equal(seg["ids"][:len(head)], head)
                if strategy == "keep_last_round":
                    last = before["ids"][before["sampled"] & (before["turn"] == before["turn"].max())]
                    np.testing.assert_array_equal(seg["ids"][len(head):len(head) + len(last)], last)
            convs += segs + [t.arrays() for t in res.subagents[b]]
        adv = np.asarray([0.5, -0.5], np.float32)
        rows = _segment_rows(res, adv, np.asarray([1.0, 0.0], np.float32), np.arange(2), np.ones(2, bool), 4)
        count = len(res.segment_rows())
        assert len(rows["tokens"]) == -(-count // 4) * 4
        episode = [b for b, _ in res.segment_rows()]
        np.testing.assert_array_equal(rows["advantages"][:count], adv[episode])
        assert rows["loss_mask"][:count].sum() == sum(s["sampled"].sum() for _, s in res.segment_rows())
        assert not rows["token_mask"][count:].any()
        for i, (_, seg) in enumerate(res.segment_rows()):     # each row: the segment's ids and log-probs as recorded
            n = len(seg["ids"])
            np.testing.assert_array_equal(rows["tokens"][i, :n], seg["ids"])
            np.testing.assert_array_equal(rows["logprobs"][i, :n], seg["logprobs"])
            np.testing.assert_array_equal(rows["loss_mask"][i, :n], seg["sampled"])
            assert rows["token_mask"][i].sum() == n
        for b in range(2):                  # the compactions as trace events, valid against the schemas
            trace = _checked_trace(task, res, b, len(eps[b].task))
            compactions = [e for e in trace["events"] if e.get("role") == "context_compaction"]
            assert len(compactions) == len(res.orchestrators[b].segments) == trace["metrics"]["compactions"]
            assert note in compactions[0]["text"] and compactions[0]["content_ref"].startswith("orchestrator_s1[")
    for conv, tf in zip(convs, _teacher_forced(params, model, [c["ids"] for c in convs])):
        mask = conv["sampled"][1:]
        np.testing.assert_allclose(conv["model_logprobs"][1:][mask], tf[mask], atol=1e-4)


def _checked_trace(task, res, b, size):
    """Episode ``b`` of a text rollout as an orchestration trace, checked against the
    project's schema (and the survey's, when at hand) and for a consistent graph."""
    from test_traces import check
    from swarmjax.traces.text import text_trace

    trace = text_trace(res, b, task.chat.tokenizer.decode, trace_id=f"ep{b}", task_id=f"task{b}", task_size=size)
    check(trace)
    return trace


@pytest.mark.slow
def test_summary_strategy_restarts_from_the_agents_summary(world):
    """ReSum: a turn that calls ``summarize`` ends its segment (the summary's ids sampled,
    in that segment's loss) and the next segment is the first prompt with the summary,
    as environment ids; past the threshold the reply asks for a summary (its last tool
    response ends with the request); without the tool the strategy cannot act. A frozen
    summariser instead: a one-turn agent with other params reads the segment and the
    request in a lane of its own, the conversation restarts from its answer, the policy
    samples only its own turns, and the summariser's log-probs are its params' (drift)."""
    from swarmjax.envs.context_notes import SUMMARY_NOTE, SUMMARY_REQUEST
    from swarmjax.swarm.context import ContextConfig

    task, model, params = world
    eps = _episodes([5, 5], seed=5)
    summary = "Found so far: the first two values."
    serial = [task.serial_script(ep) for ep in eps]
    call = task.chat.assistant_ids("", [{"name": "summarize", "arguments": {"summary": summary}}])
    scripts = TextScripts(orch=[[*serial[0][:2], call, *serial[0][2:]], serial[1]])
    envs = [task.orchestrator(ep, summarize=True) for ep in eps]
    prompt = len(envs[0].reset(eps[0]))                       # the threshold: about two rounds past it
    rcfg = TextRolloutConfig(contexts=Roles(2048, 2048), max_turn_tokens=64, subagent_lanes=3,
                             subagent_turns=CFG.subagent_steps, min_window=256,     # a summariser's lane (below)
                             context=ContextConfig("summary", threshold=prompt + 150))  # holds the conversation
    engine = TextRollout(model, rcfg, stop_ids=task.chat.stop_ids)
    envs = [task.orchestrator(ep, summarize=True) for ep in eps]
    res = engine(Roles.both(params), envs, eps, jax.random.key(0), scripts=scripts)
    assert res.rewards["r_perf"].tolist() == [1.0, 1.0] and res.orch_steps.tolist() == [7, 6], res.length
    first, rest = res.orchestrators[0].segments[0], res.orchestrators[0].arrays()
    np.testing.assert_array_equal(first["ids"][first["sampled"]][-len(call):], call)  # the summary, sampled
    env = task.orchestrator(eps[0], summarize=True)
    env.reset(eps[0])
    head = env.restart_ids(SUMMARY_NOTE.format(summary=summary))
    np.testing.assert_array_equal(rest["ids"][:len(head)], head)
    assert not rest["sampled"][:len(head)].any()
    trace = _checked_trace(task, res, 0, 5)
    (event,) = [e for e in trace["events"] if e.get("role") == "context_compaction"]
    assert summary in event["text"] and trace["metrics"]["context_dropped"] == res.orchestrators[0].dropped > 0
    text = task.chat.tokenizer.decode(res.orchestrators[1].arrays()["ids"])  # never summarised: asked
    assert SUMMARY_REQUEST in text and not res.orchestrators[1].segments
    # an agent that summarises again and again: its own summaries count toward
    # max_compactions, and the one past it ends the episode as out of context
    from swarmjax.envs.widesearch_jax import END_ANSWER, END_CONTEXT

    bounded = TextRollout(model, dataclasses.replace(rcfg, context=ContextConfig("summary", max_compactions=2)),
                          stop_ids=task.chat.stop_ids)
    envs = [task.orchestrator(ep, summarize=True) for ep in eps]
    res = bounded(Roles.both(params), envs, eps, jax.random.key(0), scripts=TextScripts(orch=[[call] * 6, serial[1]]))
    assert res.end_reason.tolist() == [END_CONTEXT, END_ANSWER] and len(res.orchestrators[0].segments) == 2
    assert res.rewards["r_perf"].tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="lacks restart_ids"):
        from swarmjax.swarm.context import check_env
        check_env("summary", object())

    # a frozen summariser (other params, in a sub-agent lane) writes the summaries instead
    frozen = init_params(model, jax.random.key(7))
    rcfg = dataclasses.replace(rcfg, context=ContextConfig("summary", threshold=prompt + 150, summarizer="frozen"))
    engine = TextRollout(model, rcfg, stop_ids=task.chat.stop_ids)
    envs = [task.orchestrator(ep, summarize=True) for ep in eps]
    written = [[task.chat.assistant_ids("", [{"name": "summarize", "arguments": {"summary": f"part {b}.{k}"}}])
                for k in range(4)] for b in range(2)]            # the summarisers' turns, forced
    res = engine(Roles(params, frozen), envs, eps, jax.random.key(0),
                 scripts=TextScripts(orch=serial, summarizers=written))
    assert res.rewards["r_perf"].tolist() == [1.0, 1.0] and res.spawned.tolist() == [0, 0] and not any(res.subagents)
    for b in range(2):
        trace, sums = res.orchestrators[b], res.summarizers[b]
        segs = [*trace.segments, trace.arrays()]
        assert len(sums) == len(trace.segments) >= 1 and all(s.ok and s.steps == 1 for s in sums)
        sampled = np.concatenate([s["ids"][s["sampled"]] for s in segs])     # the policy wrote its turns only
        np.testing.assert_array_equal(sampled, np.concatenate(serial[b]))
        env = task.orchestrator(eps[b], summarize=True)
        env.reset(eps[b])
        for before, after, summarizer in zip(segs, segs[1:], sums):
            said = summarizer.arrays()
            np.testing.assert_array_equal(said["ids"][:len(before["ids"])], before["ids"])   # it read the segment
            assert summarizer.answer == f"part {b}.{sums.index(summarizer)}"
            head = env.restart_ids(SUMMARY_NOTE.format(summary=summarizer.answer))
            np.testing.assert_array_equal(after["ids"][:len(head)], head)
    convs = [s.arrays() for sums in res.summarizers for s in sums]     # read with the frozen params: drift
    for conv, tf in zip(convs, _teacher_forced(frozen, model, [c["ids"] for c in convs])):
        mask = conv["sampled"][1:]
        np.testing.assert_allclose(conv["model_logprobs"][1:][mask], tf[mask], atol=1e-4)
    with pytest.raises(ValueError, match="needs strategy='summary'"):
        ContextConfig("discard_all", summarizer="frozen")
