"""Task plug-ins and the policy a text job starts from: names and import paths, the
checkpointable task streams, and bad input answered with one clear line each."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.cli import main
from swarmjax.envs.arith import ArithTask
from swarmjax.envs.task import ReplayStream, TaskError, check_task, jsonl_records, resolve_task, reward_terms
from swarmjax.models.config import ModelConfig
from swarmjax.models.hf import to_hf
from swarmjax.models.transformer import init_params
from swarmjax.rl.update import Learner, UpdateConfig
from swarmjax.roles import Roles
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.tokenizer import TextTokenizer
from swarmjax.train.policy import PolicySource, prepare_policy
from swarmjax.train.streams import TaskStream, held_out

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Records:
    """A dataset task: its problems are the records of JSON-lines files."""

    def __init__(self, path):
        self.path = path

    def records(self, split):
        return jsonl_records(self.path)

    def tools(self):
        return []

    def messages(self, record):
        return [{"role": "user", "content": record["q"]}]

    def verify(self, record, answer):
        return {"r_perf": float(record["a"] in answer)}


def test_tasks_resolve_by_name_path_or_object_and_bad_ones_say_why():
    assert isinstance(resolve_task("arith"), ArithTask)
    assert isinstance(resolve_task("swarmjax.envs.arith:ArithTask"), ArithTask)
    task = ArithTask()
    assert resolve_task(task) is task
    with pytest.raises(TaskError, match="cannot import 'no_such_module'"):
        resolve_task("no_such_module:Task")
    with pytest.raises(TaskError, match="has no 'Missing'"):
        resolve_task("swarmjax.envs.arith:Missing")
    with pytest.raises(TaskError, match="unknown task 'mytask'"):
        resolve_task("mytask")

    class Half:
        def tools(self):
            return []
    with pytest.raises(TaskError, match=r"lacks a stream: .*, messages, verify"):
        check_task(Half())


def test_cli_refuses_a_task_path_that_does_not_resolve(capsys):
    config = os.path.join(ROOT, "configs", "arith_tools_cpu.py")
    assert main(["train", "--config", config, "--workdir", "unused", "--set", "task=my_tasks.units:UnitsTask"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot import 'my_tasks.units'" in err[0]


def test_streams_resume_where_they_stopped(tmp_path):
    """A generator stream and a dataset stream (shuffled epochs) restored from their state
    draw exactly what the uninterrupted stream draws; held-out splits are their own."""
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"q{i}", "a": str(i)}) for i in range(5)) + "\n\n")
    for task in (ArithTask(), Records(str(path))):
        whole = TaskStream(task, "train", seed=3)
        first, rest = whole.take(4), whole.take(7)
        cut = TaskStream(task, "train", seed=3)
        assert cut.take(4) == first
        again = TaskStream(task, "train", seed=3)
        again.restore(json.loads(json.dumps(cut.state())))
        assert again.take(7) == rest
    # a task's own stream (the text PARL recipe's): its state is the count drawn, replayed
    replay = lambda: ReplayStream(lambda rng, i: (i, rng.randint(0, 10 ** 9)), "parl-3")     # noqa: E731
    whole, cut = replay(), replay()
    first, rest = whole.take(4), whole.take(7)
    assert cut.take(4) == first and cut.ids(2) == ["train/4", "train/5"]
    again = replay()
    again.restore(json.loads(json.dumps(cut.state())))
    assert again.take(7) == rest
    records = Records(str(path))
    seen = TaskStream(records, "train", seed=0).take(10)
    assert sorted(r["q"] for r in seen[:5]) == sorted(r["q"] for r in seen[5:]) == [f"q{i}" for i in range(5)]
    assert held_out(records, "test", 0, 3) == jsonl_records(path)[:3]
    assert len(held_out(records, "test", 0, 50)) == 5                   # all it has; the job reports the count
    assert held_out(ArithTask(), "test", 0, 4) != held_out(ArithTask(), "validation", 0, 4)
    path.write_text('{"q": 1}\nnot json\n')
    with pytest.raises(TaskError, match=r"data.jsonl:2: not a JSON line"):
        jsonl_records(path)


def _checkpoint(tmp_path, *, spare=0, template=True):
    """A tiny HF checkpoint directory with a BPE tokenizer beside it; the model has
    ``spare`` more ids than the tokenizer (fewer when negative)."""
    out = str(tmp_path / "ckpt")
    train_bpe_tokenizer(["The answer is 42."] * 20, out, vocab_size=300, chat_format="qwen3")
    if not template:
        cfg_file = os.path.join(out, "tokenizer_config.json")
        config = json.load(open(cfg_file))
        del config["chat_template"]
        json.dump(config, open(cfg_file, "w"))
    vocab = TextTokenizer.from_dir(out).vocab_size
    cfg = ModelConfig(vocab_size=vocab + spare, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=16, intermediate_size=64)
    to_hf(cfg, init_params(cfg, jax.random.key(0)), out)
    return out


def test_policy_from_a_checkpoint_and_its_bad_inputs(tmp_path):
    ckpt = _checkpoint(tmp_path, spare=3)
    cfg, params, chat = prepare_policy(PolicySource(hf_path=ckpt), str(tmp_path / "run"), fresh=True, corpus=None)
    V = chat.tokenizer.vocab_size + 3
    assert chat.name == "qwen3" and cfg.vocab_size == V and params["embed"].shape == (V, 32)
    assert sorted(os.listdir(tmp_path / "run")) == ["policy.json", "tokenizer"]
    # the resumed run reads the same policy back, without the weights (the checkpoint has them)
    cfg2, params2, _ = prepare_policy(PolicySource(hf_path=ckpt), str(tmp_path / "run"), fresh=False, corpus=None)
    assert cfg2 == cfg and params2 is None

    bare = tmp_path / "bare"
    shutil.copytree(ckpt, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(ValueError, match="holds no tokenizer .*pass tokenizer_path="):
        prepare_policy(PolicySource(hf_path=str(bare)), str(tmp_path / "r1"), fresh=True, corpus=None)
    plain = _checkpoint(tmp_path / "plain", template=False)
    with pytest.raises(ValueError, match="has no chat template: name the chat format"):
        prepare_policy(PolicySource(hf_path=plain), str(tmp_path / "r2"), fresh=True, corpus=None)
    assert prepare_policy(PolicySource(hf_path=plain, chat="qwen3"), str(tmp_path / "r3"), fresh=True,
                          corpus=None)[2].name == "qwen3"
    small = _checkpoint(tmp_path / "small", spare=-1)
    with pytest.raises(ValueError, match=rf"vocabulary \({V - 4} ids.*smaller than its tokenizer's \({V - 3} ids\)"):
        prepare_policy(PolicySource(hf_path=small), str(tmp_path / "r4"), fresh=True, corpus=None)


def test_frozen_params_sharing_the_trained_ones_are_refused():
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64)
    params = init_params(cfg, jax.random.key(0))
    learner = Learner(cfg, UpdateConfig())
    with pytest.raises(ValueError, match=r"frozen\['subagents'\] shares arrays with the params being trained"):
        learner.init(params, {"subagents": params})
    learner.init(params, {"subagents": jax.tree.map(jnp.copy, params)})


def test_episodes_that_never_answered_score_zero_not_nothing():
    """An episode ended by its context never reached its verifier: its terms are zeros
    (the job counts it as ``context_ended``), and a batch where no episode answered
    still has every term."""
    terms = reward_terms({}, 3)
    assert set(terms) >= {"r_perf", "tool_calls", "truncated"} and np.all(terms["r_perf"] == 0)
    kept = reward_terms({"r_perf": np.asarray([1.0, 0.0])}, 2)
    assert kept["r_perf"].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("name,roles", [("widesearch", ("single", "orchestrator")), ("relay", ("orchestrator",))])
def test_wide_search_tasks_are_builtin(tmp_path, name, roles):
    """task="widesearch" / "relay": their demonstrations, played through the environments
    the agent job builds for each role, answer every pair right; the orchestrator's
    delegating ones spawn sub-agents that look their chunks up, and its verifier reports
    the counts the PARL channels read. The relay task refuses the single role."""
    from swarmjax.envs.api import play
    from swarmjax.envs.task import EnvContext, TaskError, demonstration, make_env
    from swarmjax.text.chat import chat_format
    from swarmjax.text.runner import ToolRunner

    task = resolve_task(name)
    check_task(task)
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(task.corpus(), str(tmp_path / "bpe"),
                                                                            vocab_size=600, chat_format="qwen3")))
    problems = task.sample(np.random.default_rng(0), 12)
    rng, runner, spawned = np.random.default_rng(1), ToolRunner([]), 0
    try:
        for role in roles:
            ctx = EnvContext(chat, runner, role=role, max_subagents=4)
            for p in problems:
                demo = demonstration(task, p, chat, rng, role)
                played = play(make_env(task, p, ctx), p, demo.turns, workers=demo.workers)
                assert played.last.done and played.last.rewards["r_perf"] == 1.0, (role, p)
                spawned += len(played.subagents)
                if played.subagents:
                    r = played.last.rewards
                    assert role == "orchestrator" and r["returned"] == len(p.task)
                    if name == "widesearch":       # every delegated item came back right and was copied
                        assert r["sub_correct"] == r["sub_truth"] == r["copy_correct"] == r["copy_truth"] == len(p.task)
                    assert all(s.last.done for s in played.subagents)
        if "single" not in roles:
            with pytest.raises(TaskError, match="orchestrator only"):
                make_env(task, problems[0], EnvContext(chat, runner, role="single"))
    finally:
        runner.close()
    assert spawned > 0


def test_summary_demonstrations_pages_and_a_mixed_warm_start(tmp_path):
    """Wide search with pages for lookup results and the summarize tool: a demonstration
    summarises every ``summary_every`` lookups; played (``play`` follows the restart) it
    is one row per segment, each opening with the task and the pairs found so far, and
    still answers every pair right. ``demonstrations(mix=...)`` adds the other ways of
    working on the same problems; a context too small for some demonstrations is an error,
    or (``overlong="skip"``) leaves them out and counts them."""
    from swarmjax.envs.api import play
    from swarmjax.envs.task import EnvContext, demonstration, make_env
    from swarmjax.envs.widesearch import Episode, WideSearchConfig
    from swarmjax.envs.widesearch_text import WideSearchTask, WideSearchText
    from swarmjax.swarm.text_types import TextRolloutConfig
    from swarmjax.text.chat import chat_format
    from swarmjax.text.runner import ToolRunner
    from swarmjax.train.agent import demonstrations, mix_context

    task = WideSearchTask(WideSearchConfig(num_entities=12, num_values=12, max_task_size=8, max_subagents=4),
                          summary_every=3, page_words=10)
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(task.corpus(), str(tmp_path / "bpe"),
                                                                            vocab_size=600, chat_format="qwen3")))
    runner = ToolRunner([])
    try:
        ctx = EnvContext(chat, runner, role="single", summarize=True)
        ep = Episode(table=list(range(12)), task=[5, 2, 7, 0, 9, 4, 1])
        demo = demonstration(task, ep, chat, np.random.default_rng(0), "single", summarize=True)
        played = play(make_env(task, ep, ctx), ep, demo.turns)
        assert played.last.rewards["r_perf"] == 1.0 and len(played.segments) == 2      # 7 lookups: after 3 and 6
        text = chat.tokenizer.decode(played.segments[0][0])
        assert "Value: " in text and text.count("<tool_response>") == 3
        ids, mask = played.segments[1]
        opening = chat.tokenizer.decode(ids[:int(np.argmax(mask))])          # the ids before its first turn
        world = WideSearchText(task.cfg, chat, None)
        found = [f"{world.entity_names[e]}: {world.value_names[ep.table[e]]}" for e in ep.task[:3]]
        assert "Entities:" in opening and "Your summary of them" in opening and all(f in opening for f in found)
        problems = task.sample(np.random.default_rng(0), 16)
        limits = TextRolloutConfig(contexts=Roles(4096, 4096), max_turn_tokens=512)
        alone = demonstrations(task, problems, ctx, np.random.default_rng(1), limits)
        mixed = demonstrations(task, problems, ctx, np.random.default_rng(1), limits,
                               mix=[mix_context("orchestrator", ctx), mix_context("single", ctx)])
        assert len(alone) > len(problems) and len(mixed) > 2 * len(alone) and mixed.skipped == alone.skipped == 0
        assert set(alone.kinds.tolist()) == {"single+summary"}
        assert set(mixed.kinds.tolist()) == {"single", "single+summary", "orchestrator", "subagent"}
        fits = alone.tokens.shape[1]                  # every summarised segment fits; long serial ones do not
        small = TextRolloutConfig(contexts=Roles(fits, 4096), max_turn_tokens=512)
        with pytest.raises(ValueError, match="more than its context"):
            demonstrations(task, problems, ctx, np.random.default_rng(1), small, mix=[mix_context("single", ctx)])
        kept = demonstrations(task, problems, ctx, np.random.default_rng(1), small, mix=[mix_context("single", ctx)],
                              overlong="skip")
        assert 0 < kept.skipped < len(problems) and kept.tokens.shape[1] <= fits
        with pytest.raises(ValueError, match="sft.mix entry"):
            mix_context("critic", ctx)
    finally:
        runner.close()


def test_the_stateful_example_task_scores_its_demonstrations(tmp_path):
    """examples/ledger (a task written outside swarmjax, with a per-episode world): its
    demonstrations, played through the environments the agent job builds, leave the
    ledger as asked and score 1 in both roles (the orchestrator's sub-agent writes into
    the episode's one ledger); an answer without the writes scores 0 (the verifier reads
    the state, not only the text)."""
    import sys

    from swarmjax.envs.api import play
    from swarmjax.envs.task import EnvContext, demonstration, make_env
    from swarmjax.text.chat import chat_format
    from swarmjax.text.runner import ToolRunner

    sys.path.insert(0, os.path.join(ROOT, "examples", "ledger"))
    try:
        from ledger_task import LedgerTask
    finally:
        sys.path.pop(0)
    task = resolve_task(LedgerTask())
    check_task(task)
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(task.corpus(), str(tmp_path / "bpe"),
                                                                            vocab_size=600, chat_format="qwen3")))
    problems = task.sample(np.random.default_rng(0), 6)
    runner = ToolRunner([])
    try:
        for role in ("single", "orchestrator"):
            ctx = EnvContext(chat, runner, role=role, max_subagents=2)
            for p in problems:
                demo = demonstration(task, p, chat, np.random.default_rng(1), role)
                played = play(make_env(task, p, ctx), p, demo.turns, workers=demo.workers)
                assert played.last.done and played.last.rewards["r_perf"] == 1.0, (role, p)
                assert len(played.subagents) == (role == "orchestrator")
            lazy = play(make_env(task, p, ctx), p, [chat.assistant_ids(f"The value is {p.result}.").tolist()])
            assert lazy.last.done and lazy.last.rewards["r_perf"] == 0.0 and lazy.last.rewards["stored"] == 0.0
    finally:
        runner.close()


def test_handoff_figures_say_which_stage_lost_the_items():
    """handoff_counts: the sub-agents' returns scored against what they were assigned, the
    answer against what came back; episode_figures turns them into return_f1 and
    copy_fidelity (nan without returns, and means that skip those episodes)."""
    from swarmjax.envs.widesearch import Episode, handoff_counts
    from swarmjax.train.agent_eval import episode_figures, mean_figures

    ep = Episode(table=list(range(10)), task=[1, 2, 3, 4])
    # two sub-agents: entities 1, 2 (2 returned wrong) and 3 (returned right); 4 done by the orchestrator
    c = handoff_counts(ep, [[1, 2], [3]], [(1, 1), (2, 5), (3, 3)], [(1, 1), (2, 2), (3, 7), (4, 4)])
    assert (c["sub_correct"], c["sub_answered"], c["sub_truth"]) == (2, 3, 3)
    # came back: (1,1) (2,5) (3,3); the answer copied only (1,1)
    assert (c["copy_correct"], c["copy_answered"], c["copy_truth"]) == (1, 3, 3)
    none = handoff_counts(ep, [], [], [(1, 1)])
    assert none["sub_truth"] == none["copy_truth"] == 0

    class Res:                                        # the fields episode_figures reads, two episodes
        length = np.ones(2)
        rewards = {k: np.asarray([c[k], none[k]], np.float32) for k in c} | {"r_perf": np.asarray([0.75, 0.4])}
        end_reason = orch_steps = spawned = finished = critical_steps = total_steps = np.zeros(2)
        orchestrators = [type("T", (), {"segments": [], "dropped": 0, "peak": 1})()] * 2
        subagents = [[], []]
    figs = episode_figures(Res())
    assert figs["delegated"][0] == pytest.approx(3 / 4) and figs["delegated"][1] == 0.0
    assert figs["return_f1"][0] == pytest.approx(2 / 3) and np.isnan(figs["return_f1"][1])
    assert figs["copy_fidelity"][0] == pytest.approx(1 / 3) and np.isnan(figs["copy_fidelity"][1])
    means = mean_figures(figs)
    assert means["return_f1"] == pytest.approx(2 / 3) and means["accuracy"] == pytest.approx(0.575)
    alone = mean_figures({k: v[1:] for k, v in figs.items()})     # no episode with returns: no figure
    assert "return_f1" not in alone and "copy_fidelity" not in alone and alone["delegated"] == 0.0
    assert json.loads(json.dumps(alone)) == alone                  # what a checkpoint's metadata needs


def test_row_shares_draw_each_kind_of_row_as_asked():
    """sft.shares: rows drawn so that each kind makes up its share of a batch, however many
    rows of each kind the demonstrations hold, in mixed batches or batches of one length
    (sft.by_length); a kind without a share (or a share without
    rows) and a bad config are one-line errors."""
    from swarmjax.train.agent import TextSFTConfig
    from swarmjax.train.demos import Demos, share_weights
    from swarmjax.train.sft import RoleRows

    kinds = np.asarray(["subagent"] * 80 + ["orchestrator"] * 5 + ["single"] * 15)
    w = share_weights(kinds, {"orchestrator": 0.4, "single": 0.3, "subagent": 0.3})
    assert w.sum() == pytest.approx(1.0) and w[80] == pytest.approx(0.4 / 5)
    tokens = np.arange(100, dtype=np.int32)[:, None].repeat(4, 1)
    d = Demos(tokens, np.ones_like(tokens, bool), np.ones_like(tokens, bool), kinds=kinds, weights=w)
    draw, rng = RoleRows(d, 64, 4).sampler(), np.random.default_rng(0)
    drawn = np.concatenate([draw(rng)[0][:, 0] for _ in range(200)])
    assert np.mean(kinds[drawn] == "orchestrator") == pytest.approx(0.4, abs=0.02)
    # by length (sft.by_length): each batch from one length bucket, each kind still at its share
    lengths = np.where(kinds == "subagent", 2, 8)[:, None]
    tokens = np.arange(100, dtype=np.int32)[:, None].repeat(8, 1)
    d = Demos(tokens, np.arange(8)[None] < lengths, np.ones_like(tokens, bool), kinds=kinds, weights=w)
    draw = RoleRows(d, 64, 2, bucketed=True).sampler()
    batches = [draw(rng)[0] for _ in range(400)]
    assert all(len(set(kinds[b[:, 0]] == "subagent")) == 1 for b in batches)    # one bucket a batch
    assert {b.shape[1] for b in batches} == {2, 8}                               # cut to its length
    drawn = np.concatenate([b[:, 0] for b in batches])
    assert np.mean(kinds[drawn] == "orchestrator") == pytest.approx(0.4, abs=0.04)
    assert np.mean(kinds[drawn] == "subagent") == pytest.approx(0.3, abs=0.04)
    with pytest.raises(ValueError, match="give a share to each kind"):
        share_weights(kinds, {"orchestrator": 0.5, "single": 0.5})
    with pytest.raises(ValueError, match="sft.shares"):
        TextSFTConfig(shares=(("critic", 1.0),))
    with pytest.raises(ValueError, match="sft.shares"):
        TextSFTConfig(shares=(("single", 1.0),), per_role=True)


def test_needle_questions_have_one_answer_line_every_way_of_working_finds(tmp_path):
    """A needle question ("which of these has value X?"): its target's value is no other task
    entity's, the user turn names the value, and the demonstrations of every way of working
    (serial in a random order up to the target, with summaries, delegated) answer the one
    line right; the orchestrator's sub-agents return their whole chunks and its copy is
    scored against the target's returned pair."""
    import random

    from swarmjax.envs.api import play
    from swarmjax.envs.task import EnvContext, demonstration, make_env
    from swarmjax.envs.widesearch import WideSearchConfig, score
    from swarmjax.envs.widesearch_text import WideSearchTask, WideSearchText
    from swarmjax.text.chat import chat_format
    from swarmjax.text.runner import ToolRunner

    task = WideSearchTask(WideSearchConfig(num_entities=12, num_values=6, max_task_size=8, max_subagents=4),
                          split_fraction=1.0, max_chunk=4, summary_every=3, page_words=5, needle_fraction=0.5)
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(task.corpus(), str(tmp_path / "bpe"),
                                                                            vocab_size=600, chat_format="qwen3")))
    eps = [task.episode(random.Random(i), 8, needle=True) for i in range(8)]
    assert all(sum(ep.table[e] == ep.table[ep.target] for e in ep.task) == 1 for ep in eps)
    assert score(eps[0], [(eps[0].target, eps[0].table[eps[0].target])]) == (1, 1, 1)
    mixed = task.sample(np.random.default_rng(0), 64)
    assert 10 < sum(p.target is not None for p in mixed) < 54             # needle_fraction of the stream
    world = WideSearchText(task.cfg, chat, None)
    assert world.value_names[eps[0].table[eps[0].target]] in world.question(eps[0])
    runner, rng, lookups = ToolRunner([]), np.random.default_rng(0), []
    try:
        for ep in eps:
            for role, summarize in (("single", False), ("single", True), ("orchestrator", False)):
                ctx = EnvContext(chat, runner, role=role, summarize=summarize, max_subagents=4)
                demo = demonstration(task, ep, chat, rng, role, summarize=summarize)
                played = play(make_env(task, ep, ctx), ep, demo.turns, workers=demo.workers)
                r = played.last.rewards
                assert r["r_perf"] == 1.0 and r["truth"] == 1, (role, summarize)
                if role == "orchestrator":
                    assert r["sub_correct"] == r["sub_truth"] == 8 and r["copy_correct"] == r["copy_truth"] == 1
                elif not summarize:
                    lookups.append(played.last.rewards["tool_calls"])
    finally:
        runner.close()
    assert min(lookups) < 8 and len(set(lookups)) > 1          # stops at the target, wherever the order puts it
