"""Exported orchestration traces validate against the project's JSON Schema (and, where
it is at hand, the survey's own), carry every agent's turns and tool calls, every
reward channel and a measured wall clock, and keep the critical path."""

import copy
import json
import os
import random
import re

import jsonschema
import pytest

from swarmjax.envs.widesearch import Episode, Vocab, simulate, scripted
from swarmjax.roles import Roles
from swarmjax.traces.export import graph_errors, load_schema, trace_from_outcome, turn_spans, write_jsonl
from test_widesearch import CFG, serial_script, split_scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the survey's schema (arXiv 2605.02801), kept beside the repository, not in it
SURVEY_SCHEMA = os.path.join(os.path.dirname(ROOT), "shared", "reference", "trace_schema.json")


def schemas() -> list[dict]:
    """The project's schema, and the survey's when it is at hand."""
    out = [load_schema()]
    if os.path.exists(SURVEY_SCHEMA):
        with open(SURVEY_SCHEMA) as f:
            out.append(json.load(f))
    return out


def check(trace: dict) -> None:
    """Valid against every schema at hand, and a consistent graph."""
    for schema in schemas():
        jsonschema.Draft202012Validator(schema).validate(trace)
    assert graph_errors(trace) == [], trace["trace_id"]


@pytest.fixture(scope="module")
def episode():
    ep = Episode.sample(CFG, random.Random(0), n=16)
    serial = simulate(CFG, ep, scripted(serial_script(ep)), scripted([]))
    orch, work = split_scripts(ep, 8)
    split = simulate(CFG, ep, scripted(orch), scripted(work))
    return ep, serial, split


@pytest.fixture(scope="module")
def traces(episode):
    ep, serial, split = episode
    rewards = {"r_perf": 1.0, "r_parallel": 0.0, "r_finish": 0.0, "cost": 0.1}
    return [trace_from_outcome(CFG, ep, out, rewards, f"t{i}", "task-0", 0.25)
            for i, out in enumerate((serial, split))]


def test_traces_validate_against_schema(traces, tmp_path):
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for trace in traces:
        check(trace)
    write_jsonl(traces, str(tmp_path / "traces.jsonl"))
    lines = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert [json.loads(line)["trace_id"] for line in lines] == ["t0", "t1"]


def _broken(trace):
    """Traces the survey's schema rejects, by what is wrong with them."""
    def edit(fn):
        bad = copy.deepcopy(trace)
        fn(bad)
        return bad
    return {
        "string metric": edit(lambda t: t["metrics"].update(end_reason="answer")),
        "string reward": edit(lambda t: t["rewards"].update(r_perf="1.0")),
        "unknown top-level field": edit(lambda t: t.update(transcript="...")),
        "no wall clock": edit(lambda t: t["costs"].pop("wall_clock_s")),
        "negative wall clock": edit(lambda t: t["costs"].update(wall_clock_s=-1.0)),
        "unknown event type": edit(lambda t: t["events"][0].update(type="teleport")),
        "no events": edit(lambda t: t.update(events=[])),
        "negative time": edit(lambda t: t["events"][0].update(t=-1)),
        "unknown edge type": edit(lambda t: t["edges"][0].update(type="telepathy")),
        "extra edge field": edit(lambda t: t["edges"][0].update(weight=1)),
        "unknown topology": edit(lambda t: t.update(topology="pipeline")),
    }


def test_project_schema_is_at_least_as_strict(traces):
    """Whatever the survey's schema rejects, ours rejects too (and the survey's does
    reject these, where it is at hand); ours also closes events and types the counts."""
    for bad in _broken(traces[1]).values():
        for schema in schemas():
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(bad, schema)
    schema = load_schema()
    assert schema["additionalProperties"] is False
    assert schema["properties"]["metrics"]["additionalProperties"] == {"type": "number"}
    for edit in (lambda t: t["events"][0].update(colour="red"), lambda t: t["costs"].update(tokens=1.5),
                 lambda t: t["events"][1].update(reason="tired"), lambda t: t.update(rewards={})):
        bad = copy.deepcopy(traces[1])
        edit(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_split_trace_shows_the_parallel_stage(traces):
    serial, split = traces
    assert serial["metrics"]["critical_steps"] == 17 and split["metrics"]["critical_steps"] == 5
    kinds = [e["type"] for e in split["events"]]
    assert kinds.count("spawn") == 8 and kinds.count("aggregate") == 1
    returns = [e for e in split["events"] if e["type"] == "return" and e["agent"] != "orchestrator"]
    assert len(returns) == 8 and {e["t"] for e in returns} == {4}    # spawned at 0, 3 worker steps
    assert sum(e["type"] == "spawn" for e in split["edges"]) == 8
    assert max(e["t"] for e in split["events"]) == 5                # the answer turn at 4, the end at 5
    assert max(e["t"] for e in serial["events"]) == 17
    assert split["events"][-1] == {"id": "end", "t": 5, "type": "return", "agent": "orchestrator",
                                   "role": "orchestrator", "from": "orchestrator", "to": "environment",
                                   "reason": "answer"}


def test_every_tool_call_is_an_event_linked_to_its_agent(traces):
    """Each sub-agent's two lookups are tool_call / tool_result events at steps 1..3,
    on a causal chain from its spawn to its return; the costs count all 16."""
    serial, split = traces
    assert serial["costs"]["tool_calls"] == 16 and split["costs"]["tool_calls"] == 16
    assert split["costs"]["messages"] == 16                         # 8 task blocks, 8 results
    by_id = {e["id"]: e for e in split["events"]}
    out = {}
    for edge in split["edges"]:
        out.setdefault(edge["src"], []).append((edge["type"], edge["dst"]))
    for k in range(8):
        agent, node, path = f"worker_{k}", f"w{k}.spawn", []
        while node != f"w{k}.end":
            (kind, node), = [(t, d) for t, d in out[node] if t in ("causal", "tool_dependency")]
            path.append((kind, by_id[node]["type"], by_id[node]["t"]))
        assert path == [("causal", "tool_call", 1), ("tool_dependency", "tool_result", 2),
                        ("causal", "tool_call", 2), ("tool_dependency", "tool_result", 3),
                        ("causal", "return", 4)], agent
        assert out[f"w{k}.end"] == [("return", "o0.agg")]
        calls = [e for e in split["events"] if e["type"] == "tool_call" and e["agent"] == agent]
        assert [c["text"].split()[0] for c in calls] == ["<lookup>", "<lookup>"]
    results = [e for e in split["events"] if e["type"] == "tool_result"]
    assert len(results) == 16 and all(r["ok"] and r["agent"] == "environment" for r in results)


def _covered(trace, agent):
    """The positions of ``agent``'s context that the trace's content_refs point at, and
    the decoded text of each position."""
    seen = {}
    for ev in trace["events"]:
        m = re.fullmatch(r"(\w+)\[(\d+):(\d+)\]", ev.get("content_ref", ""))
        if m and m[1] == agent:
            a, b = int(m[2]), int(m[3])
            for i, word in zip(range(a, b), ev["text"].split()):
                assert seen.setdefault(i, word) == word
    return seen


def test_transcripts_rebuild_from_the_events(episode, traces):
    """Every token of every agent's context is in the text of some event: the
    transcripts need no field of their own."""
    ep, serial, split = episode
    vocab = Vocab(CFG)
    for out, trace in ((serial, traces[0]), (split, traces[1])):
        contexts = {"orchestrator": out.orch_tokens, **{f"worker_{k}": w for k, w in enumerate(out.worker_tokens)}}
        for agent, tokens in contexts.items():
            seen = _covered(trace, agent)
            assert [seen[i] for i in range(len(seen))] == vocab.decode(tokens).split(), agent


def test_turn_spans():
    said = [False, False, True, True, False, False, True, False, True, True]
    assert turn_spans(said) == (2, [(2, 4, 6), (6, 7, 8), (8, 10, 10)])
    assert turn_spans([False, False]) == (2, [])


def test_stopwatch_leaves_out_compilation():
    import jax
    import jax.numpy as jnp

    from swarmjax.traces.timing import stopwatch, union_seconds

    assert union_seconds([(0.0, 2.0), (1.0, 1.5), (3.0, 4.0), (3.5, 5.0)]) == 4.0
    f = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * 3.0) + 7)
    x = jnp.arange(4096.0)
    with stopwatch() as first:
        jax.block_until_ready(f(x))
    with stopwatch() as second:
        jax.block_until_ready(f(x))
    assert first["compile_s"] > 0 and first["seconds"] == pytest.approx(first["elapsed_s"] - first["compile_s"])
    assert second["compile_s"] == 0 and second["seconds"] == second["elapsed_s"] > 0


# ----------------------------------------------------------------------------- show / render


def test_trace_show_prints_timeline_and_draws_png(tmp_path, capsys):
    from swarmjax.cli import main

    path = str(tmp_path / "demo.jsonl")
    assert main(["trace", "demo", path]) == 0
    for line in open(path):
        trace = json.loads(line)
        check(trace)
        assert trace["costs"]["wall_clock_s"] > 0 and trace["rewards"] == {"r_perf": 1.0}
    png = str(tmp_path / "swarm.png")
    assert main(["trace", "show", path, "--id", "swarm-8x2", "--png", png]) == 0
    out = capsys.readouterr().out
    assert "critical steps 5  total steps 26  sub-agents 8 (8 returned)" in out and "end: answer" in out
    rows = [line for line in out.splitlines() if line.startswith(("orchestrator ", "worker_"))]
    assert rows[0].split()[1:] == ["S", "A"] and len(rows) == 9       # the Gantt chart's rows
    assert all(line.rstrip().endswith("===") for line in rows[1:])      # 8 workers over steps 1..3
    assert "<lookup> e" in out and "tool_result" in out                  # the sub-agents' lookups
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 300
    assert main(["trace", "show", path, "--all"]) == 0
    assert "LLLLLLLLLLLLLLLLA" in capsys.readouterr().out          # the serial episode: 16 lookups
    out = tmp_path / "one_each"                                      # export: one validated file per trace
    assert main(["trace", "export", path, "--format", "survey", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["serial.json", "swarm-8x2.json"]
    assert "validated against the trace schema" in capsys.readouterr().out


def test_trace_show_reads_first_format_traces(tmp_path, capsys):
    """Traces written before the schema fix (metrics.end_reason, content_ref turn:i:kind) still draw."""
    from swarmjax.cli import main

    old = {"trace_id": "a", "task_id": "b", "events": [
        {"id": "e0", "t": 0, "type": "orchestrator_decision", "agent": "orchestrator", "content_ref": "turn:0:<lookup>"},
        {"id": "e1", "t": 1, "type": "orchestrator_decision", "agent": "orchestrator", "content_ref": "turn:1:<answer>"}],
        "edges": [], "rewards": {}, "costs": {"tokens": 12, "wall_clock_s": 0.0},
        "metrics": {"critical_steps": 2, "end_reason": "answer", "task_size": 1}}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    assert main(["trace", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "end: answer" in out and any(line.split()[1:] == ["LA"] for line in out.splitlines()
                                        if line.startswith("orchestrator "))


def test_trace_show_bad_input_is_one_line(tmp_path, capsys):
    from swarmjax.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trace_id": "a"}\nnot json\n')
    assert main(["trace", "show", str(bad)]) == 2
    assert "bad.jsonl:2: not JSON" in capsys.readouterr().err
    bad.write_text('{"trace_id": "a"}\n')
    assert main(["trace", "show", str(bad)]) == 2
    assert "missing task_id" in capsys.readouterr().err
    assert main(["trace", "show", str(tmp_path / "none.jsonl")]) == 2


# ----------------------------------------------------------------------------- real rollouts


def _check_rollout_trace(trace):
    """What every trace of a PARL rollout must hold, beyond the schemas."""
    check(trace)
    r = trace["rewards"]
    assert set(r) == {"reward", "r_perf", "r_parallel", "r_finish", "cost", "lambda1", "lambda2"}
    assert r["reward"] == pytest.approx(r["r_perf"] + r["lambda1"] * r["r_parallel"]
                                        + r["lambda2"] * r["r_finish"] - r["cost"], abs=1e-5)
    assert r["r_perf"] == pytest.approx(trace["metrics"]["item_f1"], abs=1e-6)
    costs, events = trace["costs"], trace["events"]
    assert costs["tool_calls"] == sum(e["type"] == "tool_call" for e in events)
    assert costs["wall_clock_s"] == pytest.approx(costs["batch_wall_clock_s"] / costs["batch_episodes"])
    spawned = trace["metrics"]["subagents"]
    assert sum(e["type"] == "spawn" for e in events) == spawned
    assert sum(e["id"].startswith("w") and e["id"].endswith(".end") for e in events) == spawned
    # every context is covered by the events' content_refs, from its first token on
    lengths = [len(_covered(trace, a)) for a in ["orchestrator"] + [f"worker_{k}" for k in range(spawned)]]
    for agent, n in zip(["orchestrator"] + [f"worker_{k}" for k in range(spawned)], lengths):
        assert sorted(_covered(trace, agent)) == list(range(n)), agent
    assert sum(lengths) == costs["tokens"]


def test_engine_rollout_traces_validate():
    """Traces exported from jitted-engine episodes validate and keep the episode's
    metrics: random scripted turns of every kind on the small config (malformed turns,
    failed lookups, sub-agents stopped at the step limit or a full context, every end)."""
    import jax

    from swarmjax.envs import widesearch_jax as wsj
    from swarmjax.models import init_params
    from swarmjax.swarm.engine import RolloutConfig, SwarmRollout
    from swarmjax.swarm.outcome import text_result
    from swarmjax.traces.render import segments, timeline
    from swarmjax.traces.rollout import rollout_traces
    from swarmjax.train.agent_rl import episode_rewards
    from swarmjax.train.parl import PARLTrainConfig
    from test_swarm import SMALL, model_for, pad_scripts, random_batch, tasks_from

    mcfg = model_for(SMALL)
    params = init_params(mcfg, jax.random.key(1))
    eps, orch, workers = random_batch(SMALL, 1, 48)
    tasks = tasks_from(SMALL, eps)
    rcfg = PARLTrainConfig(rollout=RolloutConfig(env=SMALL))
    result = text_result(SMALL, SwarmRollout(rcfg.rollout, mcfg)(
        Roles.both(params), tasks, jax.random.key(0), scripts=pad_scripts(orch, workers, SMALL.max_subagents)))
    reward, channels = episode_rewards(result, rcfg, 0)               # every job's reward, PARL's channels
    traces = rollout_traces(SMALL, wsj.problems(tasks), result, rewards={"reward": reward, **channels},
                            wall_clock_s=4.8, prefix="rand")
    reasons = {(e["type"], e.get("reason")) for t in traces for e in t["events"] if "reason" in e}
    assert reasons == {("message", "malformed_turn"), ("despawn", "step_limit"), ("despawn", "context_full"),
                       ("return", "answer"), ("despawn", "budget"), ("despawn", "context")}, reasons
    assert any(e["type"] == "tool_result" and not e["ok"] for t in traces for e in t["events"])
    assert any(e["type"] == "tool_call" and e["agent"].startswith("worker") for t in traces for e in t["events"])
    for b, trace in enumerate(traces):
        _check_rollout_trace(trace)
        assert trace["trace_id"] == f"rand-{b}" and trace["costs"]["wall_clock_s"] == pytest.approx(0.1)
        assert trace["metrics"]["critical_steps"] == int(result.critical_steps[b])
        assert max([end for _, _, end, _ in segments(trace)] + [0]) <= int(result.critical_steps[b])
        assert trace["trace_id"] in timeline(trace)
