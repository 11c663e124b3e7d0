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


# ----------------------------------------------------------------------------- show / render


def test_trace_show_prints_timeline_and_draws_png(tmp_path, capsys):
    from swarmjax.cli import main

    path = str(tmp_path / "demo.jsonl")
    assert main(["trace", "demo", path]) == 0
    png = str(tmp_path / "swarm.png")
    assert main(["trace", "show", path, "--id", "swarm-8x2", "--png", png]) == 0
    out = capsys.readouterr().out
    assert "critical steps 5  total steps 26  sub-agents 8 (8 returned)" in out
    rows = [line for line in out.splitlines() if line.startswith(("orchestrator ", "worker_"))]
    assert rows[0].split()[1:] == ["S", "A"] and len(rows) == 9
    assert all(line.rstrip().endswith("===") for line in rows[1:])      # 8 workers over steps 1..3
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 300
    assert main(["trace", "show", path, "--all"]) == 0
    assert "LLLLLLLLLLLLLLLLA" in capsys.readouterr().out          # the serial episode: 16 lookups


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


def test_engine_rollout_traces_validate():
    """Traces exported from jitted-engine episodes (random model: malformed turns,
    failed workers) validate against the schema and keep the episode's metrics."""
    import jax

    from swarmjax.envs import widesearch_jax as wsj
    from swarmjax.rl.parl import PARLConfig
    from swarmjax.swarm.outcome import episode_rewards, rollout_traces
    from swarmjax.traces.render import segments
    from test_swarm import SMALL, model_for

    from swarmjax.models import init_params
    from swarmjax.swarm.engine import RolloutConfig, SwarmRollout

    mcfg = model_for(SMALL)
    params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, init_params(mcfg, jax.random.key(1)))
    tasks = wsj.reset(jax.random.key(3), SMALL, 16)
    result = SwarmRollout(RolloutConfig(env=SMALL), mcfg)(params, params, tasks, jax.random.key(4))
    _, channels = episode_rewards(result, PARLConfig(), 0)
    traces = rollout_traces(SMALL, tasks, result, channels=channels)
    schema = load_schema()
    for b, trace in enumerate(traces):
        jsonschema.validate(trace, schema)
        assert trace["metrics"]["critical_steps"] == int(result.critical_steps[b])
        assert set(trace["rewards"]) >= {"r_perf", "r_parallel", "r_finish", "cost"}
        assert max([end for _, _, end, _ in segments(trace)] + [0]) <= int(result.critical_steps[b])
