"""A generated tool environment in the jitted text swarm (swarmjax.envs.synth.device_task)
against its host twin (SynthTwinEnv: the host tools, the same sentences) in the
host-driven text rollout: on scripted episodes (the recorded calls of read and write
tasks, several calls a turn, every error path: a call error of each kind, a key of no
row, an amount out of range, a create with a dangling reference and past the twin's
table, calls past max_calls, a cut turn) and on random-model episodes, the ids, masks,
log-probs, turns, counts, end reasons and rewards agree. (The swarm on 8 devices equals one
device whatever the task: tests/test_text_engine.py, on the relay task.)"""

import jax
import pytest

from swarmjax.envs.synth.device_task import SynthDeviceTask
from swarmjax.envs.synth.task import SynthToolTask, answer_text
from swarmjax.envs.synth.generator import SynthConfig
from swarmjax.models import ModelConfig, init_params
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.swarm.text_engine import TextSwarm
from swarmjax.swarm.text_rollout import TextRollout
from swarmjax.swarm.text_types import SwarmConfig, TextRolloutConfig, TextScripts
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import Qwen3Format, chat_format
from swarmjax.text.tokenizer import TextTokenizer

from conftest import spread
from test_text_engine import _assert_same

CFG = SynthConfig(domains=4, kinds=(2, 2), categories=(1, 1), measures=(1, 1), tasks=160, held_out=0.0,
                  max_parts=2, seed=0)
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    task = SynthToolTask(cfg=CFG)
    texts = task.corpus() + [Qwen3Format.TOOLS_HEAD, Qwen3Format.TOOLS_TAIL] * 5
    tok = TextTokenizer.from_dir(train_bpe_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=1500))
    chat = chat_format("qwen3", tok)
    env = task.envs()["env000"]
    assert {t.op for t in env.tools} >= {"get", "list", "find", "count", "total", "convert", "create", "update",
                                         "delete"}
    dt = SynthDeviceTask(env, chat, spare=2, max_calls=4)
    records = [r for split in ("train", "seen") for r in task.records(split) if r["env"] == env.name]
    model = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=8, intermediate_size=64)
    head = len(dt.head_ids("orchestrator"))
    rcfg = TextRolloutConfig(contexts=Roles(head + 1280, 64), max_turn_tokens=96, subagent_lanes=1,
                             subagent_turns=1, budget=6, sampling=Roles.both(GREEDY),
                             min_window=1024, prefill_buckets=(128,), segment_exit=1.0)
    return dt, records, model, spread(init_params(model, jax.random.key(0)), 4.0), rcfg


def _scripts(dt, records):
    """Eight episodes: two recorded read tasks, two recorded writes (all calls in one
    turn for one of them), the error paths, then the random model (after a call, or
    from the start)."""
    chat, env = dt.chat, dt.env
    call = lambda name, **args: {"name": name, "arguments": args}                       # noqa: E731
    turn = lambda *calls, content="": chat.assistant_ids(content, list(calls))         # noqa: E731
    answer = lambda r: chat.assistant_ids("\n".join(f"{i + 1}: {answer_text(p['answer'])}" for i, p in  # noqa: E731
                                                    enumerate(r["parts"])) if len(r["parts"]) > 1
                                          else answer_text(r["parts"][0]["answer"]))
    reads = [r for r in records if r["kind"] == "read"]
    writes = [r for r in records if r["kind"] == "write"]
    eps = [reads[0], next(r for r in reads if len(r["parts"]) > 1), writes[0], writes[1]]
    scripts = [[turn(call(c["name"], **c["arguments"])) for p in r["parts"] for c in p["calls"]] + [answer(r)]
               for r in eps[:3]]
    scripts.append([turn(*[call(c["name"], **c["arguments"]) for c in eps[3]["parts"][0]["calls"]]),
                    answer(eps[3])])
    kind = env.kinds[0]
    get, create = f"get_{kind.name}", f"create_{kind.name}"
    spec = {t.name: t for t in env.tools}
    convert = next(t.name for t in env.tools if t.op == "convert")
    other = next(k for k in env.kinds if k is not kind)
    fields = {f.name: (f.values[0] if f.type == "category" else 5 if f.type == "measure"
                       else f"{env.kind(f.ref).prefix}-101") for f in kind.fields[1:]}
    dangling = dict(fields, **{f.name: f"{env.kind(f.ref).prefix}-999" for f in kind.of_type("ref")})
    assert spec[create].op == "create"
    errors = [
        turn(call(get, **{kind.key: f"{kind.prefix}-999"}), call(get, **{kind.key: f"{other.prefix}-101"}),
             call("no_such_tool"), call(get)),                                           # no row x2, unknown, missing
        chat.tokenizer.encode('<tool_call>\n{"name": "' + get + '", "arguments": {"' + kind.key + '": 3}}\n'
                              '</tool_call><tool_call>\n{"name": ' + get + '}\n</tool_call><|im_end|>'),
        turn(call(convert, amount=-3), call(convert, amount=12345), call(create, **dangling),
             call(create, **dict(fields, **{kind.fields[1].name: "nope"}))),             # amount, ref, bad enum
        turn(*[call(create, **fields)] * 3),                                           # full (spare 2)
        turn(*[call(f"list_{kind.name}"), call(f"list_{other.name}")] * 3),              # 6 calls: too many
        turn(call(get, **{kind.key: f"{kind.prefix}-101"}))[:-4],                      # cut inside the call
    ]
    scripts += [errors, [turn(call(f"list_{other.name}"))], [], []]                   # then the random model
    eps += [reads[1], reads[2], writes[2], reads[3]]
    return eps, TextScripts(orch=scripts)


def _host(setup, eps, scripts):
    dt, _, model, params, rcfg = setup
    rollout = TextRollout(model, rcfg, stop_ids=dt.chat.stop_ids, pad_id=dt.chat.tokenizer.token_id(dt.chat.pad_token))
    try:
        return rollout(Roles.both(params), [dt.orchestrator(r) for r in eps], [None] * len(eps), jax.random.key(0),
                       scripts=scripts)
    finally:
        rollout.close()


@pytest.mark.slow
def test_a_generated_environment_runs_in_the_jitted_engine_as_on_the_host(setup):
    dt, records, model, params, rcfg = setup
    eps, scripts = _scripts(dt, records)
    want = _host(setup, eps, scripts)
    swarm = TextSwarm(dt, model, rcfg, swarm=SwarmConfig(chunk=16, buckets=2))
    got = swarm(Roles.both(params), eps, jax.random.key(0), scripts=scripts)
    _assert_same(want, got)
    assert got.rewards["correct"][:4].tolist() == [1.0] * 4                       # the recorded tasks solve
    assert got.rewards["state_f1"][2:4].tolist() == [1.0, 1.0] and len(eps) == 8
    text = dt.chat.tokenizer.decode(got.tokens[4, :got.length[4]])
    for needle in ("has that", "amounts are whole", "table is full", "at most 4 calls", "cut off",
                   "no tool of that name", "misses a required", "not one of the allowed", "not a JSON object", '["'):
        assert needle in text, needle                                           # every error path was taken


def test_bad_input_is_refused(setup):
    dt, records, model, params, rcfg = setup
    with pytest.raises(ValueError, match="one environment a batch"):
        dt.batch([records[0], dict(records[1], env="elsewhere")])
    with pytest.raises(ValueError, match="no sub-agents"):
        dt.grammar("worker")
