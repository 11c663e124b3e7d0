"""Generated tool environments: the world's tools and state, the tool graph, the task
generator's determinism, filters and split by environment, the outcome verifier's
partial credit, the task plug-in (its demonstrations played through the generic tool
agent score 1) and ``swarmjax envs synth`` (files, card, TFDS read with grain)."""

import dataclasses
import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.cli import main
from swarmjax.envs.api import play
from swarmjax.envs.synth import device
from swarmjax.envs.synth.device import DeviceEnv
from swarmjax.envs.synth.graph import communities, tool_graph
from swarmjax.envs.synth.task import SynthToolTask, SynthWorld, score_answer, state_f1
from swarmjax.envs.synth.generator import FILTERS, SynthConfig, build_envs, generate, valid_arguments
from swarmjax.envs.synth.world import (MAX_AMOUNT, OPS, EnvSpec, Field, Kind, ToolError, broken, changes, execute,
                                       initial_state, kind_tools, parameters)
from swarmjax.envs.task import EnvContext, check_task, demonstration, make_env
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import chat_format
from swarmjax.text.runner import ToolRunner
from swarmjax.text.tokenizer import TextTokenizer

CFG = SynthConfig(domains=6, tasks=240, max_parts=2, seed=3)


@pytest.fixture(scope="module")
def data():
    return generate(CFG)


def _shop() -> EnvSpec:
    customer = Kind("customer", "Shop", "CUS", (Field("customer_id", "key"),
                                                Field("tier", "category", values=("gold", "silver")),
                                                Field("age", "measure", unit="years")))
    order = Kind("order", "Shop", "ORD", (Field("order_id", "key"),
                                          Field("status", "category", values=("open", "shipped")),
                                          Field("weight", "measure", unit="kg"),
                                          Field("customer_id", "ref", ref="customer")))
    tools = [t for k in (customer, order) for t in kind_tools(k)]
    return EnvSpec("shop", (customer, order), tuple(tools), rows=3)


def test_tools_are_pure_functions_of_the_state_and_the_graph_links_outputs_to_inputs():
    env = _shop()
    state = initial_state(env, 0)
    assert state == initial_state(env, 0) and state != initial_state(env, 1)
    order = state["order"][0]
    after, row = execute(env, env.tool("update_order_status"), state, {"order_id": order["order_id"],
                                                                        "value": "shipped"})
    assert row["status"] == "shipped" and state["order"][0] == order          # the input state is untouched
    assert changes(state, after) == ({("+", "order", order["order_id"], "status", "'shipped'"),
                                      ("-", "order", order["order_id"], "status", repr(order["status"]))}
                                     if order["status"] != "shipped" else set())
    with pytest.raises(ToolError, match="no order has that order_id"):
        execute(env, env.tool("get_order"), state, {"order_id": "ORD-999"})
    with pytest.raises(ToolError, match="no customer has that customer_id"):      # references must exist
        execute(env, env.tool("create_order"), state, {"status": "open", "weight": 3, "customer_id": "CUS-999"})
    with pytest.raises(ToolError, match="amounts are whole numbers"):
        execute(env, env.tool("update_order_weight"), state, {"order_id": order["order_id"], "value": -1})
    gone, _ = execute(env, env.tool("delete_customer"), state, {"customer_id": order["customer_id"]})
    assert any("does not exist" in b for b in broken(env, gone))              # a dangling reference
    assert not broken(env, state)
    assert not valid_arguments(env, env.tool("find_order_by_status"), {"status": "lost"})    # not in the enum
    with pytest.raises(ToolError, match="no order has that order_id"):                     # another kind's key
        execute(env, env.tool("get_order"), state, {"order_id": "CUS-101"})

    kinds = {k.name: k for k in env.kinds}
    g = tool_graph(env.tools, kinds, threshold=0.6)
    assert ("customer_id", "customer_id") in g.edges["get_order", "get_customer"]["io"]
    assert (".", "order_id") in g.edges["find_order_by_status", "get_order"]["io"]
    assert not g.has_edge("get_customer", "get_order") or not g.edges["get_customer", "get_order"]["io"]
    assert g.edges["get_order", "get_customer"]["similar"] > 0              # alike descriptions too
    assert communities(g, seed=0) == communities(g, seed=0)


def test_generation_is_deterministic_filtered_and_split_by_environment(data):
    again = generate(CFG)
    assert again.splits == data.splits and again.envs == data.envs and again.counts == data.counts
    code = ("import json, sys; from swarmjax.envs.synth.generator import SynthConfig, generate; "
            f"print(json.dumps(generate(SynthConfig(**{dataclasses.asdict(CFG)!r})).splits, default=str))")
    for hash_seed in ("1", "2"):                 # another process, another string hashing: the same tasks
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed}).stdout
        assert json.loads(out) == json.loads(json.dumps(data.splits, default=str)), hash_seed
    other = generate(dataclasses.replace(CFG, seed=4))
    assert other.splits["train"] != data.splits["train"]

    c = data.counts
    assert c["kept"] == sum(len(v) for v in data.splits.values()) >= 200
    for name in ("invalid", "corrupted", "unchained", "duplicate"):
        assert c[name] > 0, name                                  # each filter removed something here
    assert c["candidates"] == c["kept"] + sum(c[f] for f in FILTERS)

    held = set(data.split_envs["validation"]) | set(data.split_envs["test"])
    assert not held & set(data.split_envs["train"]) and not set(data.split_envs["validation"]) & set(
        data.split_envs["test"])
    assert data.split_envs["seen"] == data.split_envs["train"]
    for split, names in data.split_envs.items():
        assert {r["env"] for r in data.splits[split]} <= set(names) and data.splits[split], split
        assert {r["env"] for r in data.splits[split][:len(names)]} == set(names), split   # interleaved
    tools = {e.name: {t.name for t in e.tools} for e in data.envs}
    train_tools = set().union(*(tools[n] for n in data.split_envs["train"]))
    for name in held:                                             # held-out tools are never in training
        assert not tools[name] & train_tools
    used = {c["name"] for r in data.splits["train"] for p in r["parts"] for c in p["calls"]}
    assert used <= train_tools
    ids = [r["task_id"] for s in data.splits.values() for r in s]
    assert len(ids) == len(set(ids))
    assert {r["method"] for r in data.splits["train"]} == {"walk", "path"}
    assert {len(r["parts"]) for r in data.splits["train"]} == {1, 2}
    writes = [r for r in data.splits["train"] if r["kind"] == "write"]
    assert 0.2 < len(writes) / len(data.splits["train"]) < 0.4 and all(len(r["parts"]) == 1 for r in writes)
    assert all(r["changes"] for r in writes)                      # a write that changes nothing is filtered

    envs, *_ = build_envs(CFG)
    assert [e.name for e in envs] == [e.name for e in data.envs]
    assert EnvSpec.from_json(json.loads(json.dumps(envs[0].to_json()))) == envs[0]


def test_every_task_replays_to_its_record_and_the_verifier_gives_partial_credit(data):
    envs = {e.name: e for e in data.envs}
    for record in data.splits["train"][:40] + data.splits["test"][:20]:
        world = SynthWorld(envs[record["env"]], record)
        for part in record["parts"]:
            for call in part["calls"]:
                assert json.loads(json.dumps(getattr(world, "_call")(world.env.tool(call["name"]),
                                                                     **call["arguments"]))) == call["output"]
        assert state_f1({tuple(c) for c in record["changes"]}, changes(world.initial, world.state)) == 1.0

    assert score_answer(["ORD-101", "ORD-103"], "ORD-101, ORD-103.") == 1.0
    assert score_answer(["ORD-101", "ORD-103"], "ORD-101") == pytest.approx(2 / 3)
    assert score_answer(12.34, "It is 12.34 lb") == 1.0 and score_answer(12.34, "12.4") == 0.0
    assert score_answer("gold", "'Gold'") == 1.0 and score_answer("gold", "silver") == 0.0

    write = next(r for r in data.splits["train"] if r["kind"] == "write" and r["parts"][0]["calls"][-1][
        "name"].startswith("update_"))
    env, call = envs[write["env"]], write["parts"][0]["calls"][-1]
    world = SynthWorld(env, write)
    assert world.verify("nothing")["state_f1"] == 0.0                 # no change at all
    spec = env.tool(call["name"])
    kind = env.kind(spec.kind)
    others = [r[kind.key] for r in world.initial[kind.name] if r[kind.key] != call["arguments"][kind.key]
              and r[spec.field] != call["arguments"]["value"]]
    getattr(world, "_call")(spec, **{**call["arguments"], kind.key: others[0]})      # the right update, wrong row
    terms = world.verify("nothing")
    assert terms["state_f1"] == 0.0 and terms["r_perf"] == 0.0
    getattr(world, "_call")(spec, **call["arguments"])                # now also the right row: half the cells
    assert 0.0 < world.verify("nothing")["state_f1"] < 1.0


def test_demonstrations_play_through_the_tool_agent_and_score_one(data, tmp_path_factory):
    task = check_task(SynthToolTask(cfg=CFG))
    path = train_bpe_tokenizer(task.corpus(), tmp_path_factory.mktemp("tok"), vocab_size=700)
    chat = chat_format("qwen3", TextTokenizer.from_dir(path))
    rng = np.random.default_rng(0)
    with ToolRunner([]) as runner:
        for role in ("single", "orchestrator"):
            ctx = EnvContext(chat, runner, role=role)
            spawned = 0
            for record in task.records("train")[:12] + task.records("test")[:12]:
                demo = demonstration(task, record, chat, rng, role)
                played = play(make_env(task, record, ctx), record, demo.turns, workers=demo.workers)
                assert played.last.rewards["r_perf"] == 1.0, record["query"]
                assert len(played.subagents) == (len(record["parts"]) if role == "orchestrator"
                                                 and len(record["parts"]) > 1 else 0)
                spawned += len(played.subagents)
            assert spawned > 0 or role == "single"
        env = make_env(task, record, EnvContext(chat, runner))         # a key that does not exist: an error reply
        env.reset(record)
        get = next(t for t in task.envs()[record["env"]].tools if t.op == "get")
        key = task.envs()[record["env"]].kind(get.kind).key
        step = env.step(chat.assistant_ids("", [{"name": get.name, "arguments": {key: "ZZZ-1"}}]))
        assert not step.done and env.errors == 1 and "Error" in chat.tokenizer.decode(step.reply)


def test_cli_writes_a_card_and_a_tfds_set_read_with_grain(tmp_path, capsys):
    out = str(tmp_path / "synth")
    assert main(["envs", "synth", "--envs", "5", "--tasks", "60", "--seed", "1", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "| malformed |" in printed and "modularity" in printed
    for name in ("envs.json", "card.md", "card.json", "train.jsonl", "seen.jsonl", "validation.jsonl", "test.jsonl"):
        assert os.path.exists(os.path.join(out, name)), name
    card = json.load(open(os.path.join(out, "card.json")))
    assert card["filters"]["kept"] == sum(s["tasks"] for s in card["splits"].values())
    task = SynthToolTask(data=out)
    fresh = SynthToolTask(cfg=SynthConfig(**{**card["config"], "kinds": tuple(card["config"]["kinds"]),
                                             "categories": tuple(card["config"]["categories"]),
                                             "measures": tuple(card["config"]["measures"]),
                                             "ops": tuple(card["config"]["ops"])}))
    for split in ("train", "test"):
        source = task.records(split)                       # grain over the TFDS ArrayRecord files
        assert type(source).__module__.startswith("grain")
        got = sorted((source[i] for i in range(len(source))), key=lambda r: r["task_id"])
        assert got == sorted(fresh.records(split), key=lambda r: r["task_id"])
    assert main(["envs", "synth", "--out", out]) == 2                    # not empty: refused
    assert "--overwrite" in capsys.readouterr().err
    assert main(["envs", "show", out]) == 0 and "walk / path" in capsys.readouterr().out


def _random_args(env, spec, state, rng, *, runs=False):
    """Arguments valid against ``spec``'s schema, drawn widely: keys that exist or not,
    any category value, any measure, any amount (one in ten out of range); ``runs``:
    amounts in range and keys of existing rows (the call runs)."""
    kinds = {k.name: k for k in env.kinds}
    out = {}
    for name, schema in parameters(spec, kinds)["properties"].items():
        if "enum" in schema:
            out[name] = str(rng.choice(schema["enum"]))
        elif schema["type"] == "integer":
            out[name] = int(rng.choice([-1, MAX_AMOUNT + 1])) if rng.random() < 0.1 and not runs \
                else int(rng.integers(0, 401))
        else:                                                   # a key of some kind: as its description shows
            prefix = schema["description"].split(" such as ")[1].split("-")[0]
            kind = next(k for k in env.kinds if k.prefix == prefix)
            out[name] = str(rng.choice([r[kind.key] for r in state[kind.name]])) if runs \
                else f"{prefix}-{int(rng.integers(99, 110))}"
    return out


def test_the_device_twin_equals_the_host_tools_on_random_calls(data):
    """Every tool of every generated environment, called with random valid arguments
    (keys that exist and keys that do not), 50 calls a state: the device twin's outputs,
    errors and state equal the host's after every call, one call at a time and vmapped
    over a batch of states calling different tools."""
    rng = np.random.default_rng(0)
    for env in data.envs[:2]:
        assert {t.op for t in env.tools} == set(OPS)          # every operation's tools
        dev = DeviceEnv.build(env, spare=4)
        run = jax.jit(functools.partial(device.step, dev))
        state = initial_state(env, 7)
        tables = device.encode_state(dev, state)
        assert device.decode_state(dev, tables) == state
        batch = []
        for _ in range(50):
            spec = env.tools[int(rng.integers(len(env.tools)))]
            if spec.op == "create" and int(tables.used[[k.name for k in env.kinds].index(spec.kind)]) == dev.rows:
                continue                                      # the twin's table is full: the host's is not
            args = _random_args(env, spec, state, rng)
            assert valid_arguments(env, spec, args)
            enc = device.encode_args(dev, spec.name, args)
            batch.append((tables, dev.tool_index(spec.name), enc))
            try:
                state, want = execute(env, spec, state, args)
            except ToolError as e:
                want = e
            tables, out = run(tables, jnp.int32(dev.tool_index(spec.name)), jnp.asarray(enc))
            try:
                got = device.decode_output(dev, spec.name, out)
            except ToolError as e:
                got = e
            if isinstance(want, ToolError):
                assert isinstance(got, ToolError) and str(got) == str(want), (spec.name, args)
            else:
                assert got == want, (spec.name, args, got, want)
            assert device.decode_state(dev, tables) == state, (spec.name, args)
        for spec in env.tools:                   # the edge cases random calls rarely hit
            if spec.op == "convert":             # every amount's rounding, 0..3000
                amounts = np.arange(3001, dtype=np.int32)[:, None] * np.eye(1, dev.width, dtype=np.int32)
                _, outs = jax.vmap(lambda a: run(tables, jnp.int32(dev.tool_index(spec.name)), a))(amounts)
                assert [int(n) / 100 for n in outs.number] == [execute(env, spec, state, {"amount": a})[1]
                                                               for a in range(3001)]
            room = spec.kind and int(tables.used[[k.name for k in env.kinds].index(spec.kind)]) < dev.rows
            if spec.op == "delete" and f"create_{spec.kind}" in {t.name for t in env.tools} and state[spec.kind] \
                    and room:
                last = max(state[spec.kind], key=lambda r: int(r[env.kind(spec.kind).key].split("-")[1]))
                key = {env.kind(spec.kind).key: last[env.kind(spec.kind).key]}   # delete the largest key, create
                state, _ = execute(env, spec, state, key)
                tables, _ = run(tables, jnp.int32(dev.tool_index(spec.name)), jnp.asarray(
                    device.encode_args(dev, spec.name, key)))
                create = env.tool(f"create_{spec.kind}")
                args = _random_args(env, create, state, rng, runs=True)
                state, want = execute(env, create, state, args)
                tables, out = run(tables, jnp.int32(dev.tool_index(create.name)), jnp.asarray(
                    device.encode_args(dev, create.name, args)))
                assert device.decode_output(dev, create.name, out) == want
                assert device.decode_state(dev, tables) == state
        stacked = jax.tree.map(lambda *x: jnp.stack(x), *[b[0] for b in batch])
        tools, encs = jnp.asarray([b[1] for b in batch]), jnp.asarray(np.stack([b[2] for b in batch]))
        many, outs = jax.jit(jax.vmap(functools.partial(device.step, dev)))(stacked, tools, encs)
        for i in (0, len(batch) // 2, len(batch) - 1):
            one, o = run(batch[i][0], tools[i], encs[i])
            assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a[i], b)), many, one))
            assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a[i], b)), outs, o))
