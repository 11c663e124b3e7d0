"""Exported orchestration traces validate against the JSON Schema and keep the critical path."""

import json
import random

import jsonschema
import pytest

from swarmjax.envs.widesearch import Episode, simulate, scripted
from swarmjax.traces.export import load_schema, trace_from_outcome, write_jsonl
from test_widesearch import CFG, serial_script, split_scripts


@pytest.fixture(scope="module")
def traces():
    ep = Episode.sample(CFG, random.Random(0), n=16)
    serial = simulate(CFG, ep, scripted(serial_script(ep)), scripted([]))
    orch, work = split_scripts(ep, 8)
    split = simulate(CFG, ep, scripted(orch), scripted(work))
    rewards = {"r_perf": 1.0, "r_parallel": 0.0, "r_finish": 0.0, "cost": 0.1}
    return [trace_from_outcome(CFG, ep, out, rewards, f"t{i}", "task-0")
            for i, out in enumerate((serial, split))]


def test_traces_validate_against_schema(traces, tmp_path):
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for trace in traces:
        jsonschema.validate(trace, schema)
    write_jsonl(traces, str(tmp_path / "traces.jsonl"))
    lines = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert [json.loads(line)["trace_id"] for line in lines] == ["t0", "t1"]


def test_schema_rejects_broken_traces(traces):
    schema = load_schema()
    bad = json.loads(json.dumps(traces[0]))
    bad["events"][0]["type"] = "teleport"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = json.loads(json.dumps(traces[0]))
    bad["events"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_split_trace_shows_the_parallel_stage(traces):
    serial, split = traces
    assert serial["metrics"]["critical_steps"] == 17 and split["metrics"]["critical_steps"] == 5
    kinds = [e["type"] for e in split["events"]]
    assert kinds.count("spawn") == 8 and kinds.count("return") == 8 and kinds.count("aggregate") == 1
    returns = [e for e in split["events"] if e["type"] == "return"]
    assert {e["t"] for e in returns} == {4}                     # spawned at 0, 3 worker steps
    assert sum(e["type"] == "spawn" for e in split["edges"]) == 8
    assert max(e["t"] for e in split["events"]) == 4            # the answer turn starts at 4
    assert max(e["t"] for e in serial["events"]) == 16
