"""The LLM judge reward (swarmjax.rl.judge): yes/no scores equal a one-prompt-at-a-time
host reference of p(yes) / (p(yes) + p(no)); the batch size, the padding and an 8-device
mesh change no score; unanswered episodes score 0; a score reply without a readable tag
gets the defined score and is counted; bad configurations are one clear error."""

import jax
import numpy as np
import pytest

from swarmjax.models import ModelConfig, init_params
from swarmjax.models.transformer import forward
from swarmjax.rl.judge import (Judge, JudgeConfig, JudgeReward, RewardMix, Rubric, judge_messages, mix_rewards,
                               parse_score)
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import chat_format
from swarmjax.text.tokenizer import TextTokenizer

from conftest import spread

TASKS = ["What is 2 + 3?", "Name a red fruit.", "What is 10 - 4?", "Spell cat.", "What is 7 * 2?", "Name a city."]
ANSWERS = ["5", "apple", None, "c a t", "15", "Lyon, probably"]
RUBRICS = (Rubric("right", "Is the answer right?", weight=2.0), Rubric("brief", "Is the answer brief?"))


@pytest.fixture(scope="module")
def judge_parts(tmp_path_factory):
    texts = [f"Task:\n{t}\n\nAnswer:\n{a}\n\nIs the answer right? Reply yes or no." for t, a in zip(TASKS, ANSWERS)]
    texts += ["yes", "no", "Reply yes or no.", "<score>7</score>"] * 30
    tok = TextTokenizer.from_dir(train_bpe_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=400))
    chat = chat_format("qwen3", tok)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, intermediate_size=64)
    return chat, cfg, spread(init_params(cfg, jax.random.key(3)), 4.0)


@pytest.mark.slow
def test_yes_no_scores_equal_the_reference_whatever_the_batch_and_mesh(judge_parts):
    from swarmjax.sharding.mesh import MeshConfig, make_mesh
    chat, cfg, params = judge_parts
    jc = JudgeConfig(rubrics=RUBRICS, batch=4, bucket=16)
    got = Judge(jc, cfg, params, chat)(TASKS, ANSWERS)
    yes, no = chat.tokenizer.encode("yes")[0], chat.tokenizer.encode("no")[0]
    for rubric in RUBRICS:
        want = np.zeros(len(TASKS))
        for i, (t, a) in enumerate(zip(TASKS, ANSWERS)):
            if a is None:
                continue
            ids = chat.prompt_ids(judge_messages(jc, rubric, t, a))
            logits = np.asarray(forward(params, cfg, ids[None]).logits[0, -1], np.float64)
            p = np.exp(logits - logits.max())
            want[i] = p[yes] / (p[yes] + p[no])
        np.testing.assert_allclose(got.rubrics[rubric.name], want, atol=1e-5, err_msg=rubric.name)
        assert len(set(np.round(want, 3))) > 3                          # the scores differ between answers
    np.testing.assert_allclose(got.total, (2 * got.rubrics["right"] + got.rubrics["brief"]) / 3, atol=1e-6)
    assert got.total[2] == 0 and got.unparseable == {"right": 0, "brief": 0}
    one = Judge(JudgeConfig(rubrics=RUBRICS, batch=1, bucket=8), cfg, params, chat)(TASKS, ANSWERS)
    mesh = make_mesh(MeshConfig(data=8, fsdp=1, tensor=1))
    on8 = Judge(JudgeConfig(rubrics=RUBRICS, batch=8, bucket=32), cfg, params, chat, mesh=mesh)(TASKS, ANSWERS)
    for other in (one, on8):
        for name in got.rubrics:
            np.testing.assert_allclose(other.rubrics[name], got.rubrics[name], atol=1e-5, err_msg=name)
    verifier = np.asarray([1, 0, 0, 1, 0, 0.5], np.float32)                         # K2.5's mix of both
    mixed = mix_rewards({"r_perf": verifier, "tool_calls": np.ones(6)}, got, RewardMix(verifier=0.5, judge=0.5))
    np.testing.assert_allclose(mixed["r_perf"], 0.5 * verifier + 0.5 * got.total, atol=1e-6)
    assert set(mixed) == {"r_perf", "r_verifier", "tool_calls", "judge", "judge/right", "judge/brief"}
    np.testing.assert_array_equal(mixed["r_verifier"], verifier)
    with pytest.raises(ValueError, match="not both 0"):
        RewardMix(verifier=0.0, judge=0.0)


def test_unparseable_score_replies_are_counted_not_raised(judge_parts):
    chat, cfg, params = judge_parts
    assert parse_score("I think <score>7</score>", 10) == 0.7
    assert parse_score("<score>3</score> no, <score>12</score>", 10) == 1.0        # the last, clipped
    assert parse_score("<score>-2.5</score>", 10) == 0.0
    assert parse_score("<score>seven</score>", 10) is None and parse_score("", 10) is None
    jc = JudgeConfig(rubrics=(Rubric("quality", "How good is the answer?", mode="score"),), unparseable=0.25,
                     max_new_tokens=8, batch=4, bucket=16)
    judge = Judge(jc, cfg, params, chat)
    key = jax.random.key(1)
    got = judge(TASKS, ANSWERS, key=key)
    live = [i for i, a in enumerate(ANSWERS) if a is not None]
    texts = [got.replies["quality"][i] for i in live]
    assert all(isinstance(t, str) for t in texts) and got.replies["quality"][2] is None
    bad = sum(parse_score(t, 10) is None for t in texts)
    assert bad > 0 and got.unparseable["quality"] == bad                         # a random judge rambles
    expected = [0.0 if a is None else (parse_score(t, 10) if parse_score(t, 10) is not None else 0.25)
                for a, t in zip(ANSWERS, got.replies["quality"])]
    np.testing.assert_allclose(got.total, expected, atol=1e-6)
    again = judge(TASKS, ANSWERS, key=key)
    assert again.replies == got.replies                                           # deterministic for a key


def test_bad_configurations_are_one_clear_error(judge_parts):
    chat, cfg, params = judge_parts
    jc = JudgeConfig(rubrics=RUBRICS)
    with pytest.raises(ValueError, match="do not belong together"):
        Judge(jc, cfg.replace(vocab_size=64), params, chat)
    with pytest.raises(ValueError, match="single-token words"):
        Judge(JudgeConfig(rubrics=RUBRICS, yes="absolutely certain"), cfg, params, chat)
    with pytest.raises(ValueError, match="mode must be one of"):
        Rubric("x", "?", mode="stars")
    with pytest.raises(ValueError, match="names must differ"):
        JudgeConfig(rubrics=(RUBRICS[0], RUBRICS[0]))
    with pytest.raises(ValueError, match="sum to 0"):
        JudgeConfig(rubrics=(Rubric("x", "?", weight=0.0),))
    with pytest.raises(ValueError, match="2 tasks and 1 answers"):
        Judge(jc, cfg, params, chat)(TASKS[:2], ANSWERS[:1])


def test_a_judge_from_a_hugging_face_checkpoint(tmp_path):
    """A job's judge may be a checkpoint with its own tokenizer and chat format; one whose
    vocabulary is smaller than its tokenizer's is refused."""
    from swarmjax.train.job_engines import build_judge
    from test_task_plugins import _checkpoint
    jc = JudgeConfig(rubrics=(Rubric("right", "Is the answer right?", mode="score"),), max_new_tokens=4, batch=2,
                     bucket=16, unparseable=0.5)
    judge = build_judge(JudgeReward(jc, hf_path=_checkpoint(tmp_path / "a")), None, None, None)
    assert judge.chat.name == "qwen3" and judge.model_cfg.vocab_size == judge.chat.tokenizer.vocab_size
    got = judge(["What is 6 x 7?", "What is 2 + 2?"], ["The answer is 42.", None])
    assert got.unparseable["right"] + (parse_score(got.replies["right"][0], 10) is not None) == 1
    assert got.total[1] == 0.0 and got.replies["right"][1] is None
    with pytest.raises(ValueError, match="do not belong together"):
        build_judge(JudgeReward(jc, hf_path=_checkpoint(tmp_path / "b", spare=-1)), None, None, None)


@pytest.mark.slow
def test_a_judge_trained_on_verdicts_reads_them_back(judge_parts):
    """SFT on (task, answer, verdict) rows, then the judge's p(yes) at the position the
    rows trained: it tells the answers apart (here by a surface cue: the mechanics, not
    a claim about judging), where it could not before."""
    from swarmjax.optim import OptimConfig
    from swarmjax.train.agent import TextSFTConfig
    from swarmjax.train.judge_sft import agreement, judge_rows, train_judge
    chat, cfg, params = judge_parts
    rubric = Rubric("right", "Is the answer right?")
    jc = JudgeConfig(rubrics=(rubric,), batch=8, bucket=32)
    triples = [(f"What is {a} + {a}?", str(2 * a) if a % 2 else "no idea", bool(a % 2)) for a in range(1, 17)]
    other = Rubric("short", "Is the answer short?")         # a second rubric: its own prompt and verdicts
    rows = judge_rows(jc, [(rubric, triples[:2]), (other, [triples[2][:2] + (False,)])], chat)
    yes, no = chat.tokenizer.encode("yes")[0], chat.tokenizer.encode("no")[0]
    first = rows.loss_mask.argmax(1)
    assert [rows.tokens[i, first[i]] for i in range(3)] == [yes, no, no] and rows.loss_mask.sum(1).tolist() == [2] * 3
    assert chat.tokenizer.decode(rows.tokens[2, :first[2]]).count("Is the answer short?") == 1
    before = agreement(Judge(jc, cfg, params, chat), triples)
    # 60 steps: at 40 the last verdict was a coin flip of float rounding (remat none 16/16, dots 15/16)
    scfg = TextSFTConfig(steps=60, batch=8, bucket=32, optim=OptimConfig(learning_rate=1e-2, warmup_steps=5,
                                                                        decay_steps=60))
    trained = train_judge(params, cfg, chat, jc, [(rubric, triples)], scfg)
    after = agreement(Judge(jc, cfg, trained, chat), triples)
    assert after["accuracy"] == 1.0 and before["accuracy"] < 0.9, (before, after)
    assert after["score_right"] > 0.8 > 0.2 > after["score_wrong"]
