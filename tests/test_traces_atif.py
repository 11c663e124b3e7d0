"""Rollout episodes as ATIF v1.8 trajectories (swarmjax.traces.atif), validated with the
atif package's models: an orchestrator's turns with their exact ids and log-probs, its
sub-agents embedded and referenced from the turn that started them, a single agent's
tool calls, and the token world's episodes."""

import jax
import numpy as np
import pytest

atif = pytest.importorskip("atif")

from swarmjax.text.toolcalls import parse_turn  # noqa: E402
from swarmjax.text.tools import ToolSet  # noqa: E402
from swarmjax.traces.atif import episode_trajectory  # noqa: E402
from swarmjax.swarm.text_rollout import TextScripts  # noqa: E402
from test_text_rollout import _episodes, _rollout, world  # noqa: E402,F401


def _check(doc, res, b):
    """Valid ATIF; the agent steps' completions are exactly the sampled ids and
    log-probs; each step's prompt is the conversation before it; refs resolve."""
    atif.Trajectory.model_validate(doc)
    agent = [s for s in doc["steps"] if s["source"] == "agent"]
    assert len(agent) == res.orch_steps[b]
    n = res.length[b]
    mask = res.loss_mask[b, :n]
    np.testing.assert_array_equal(np.concatenate([s["metrics"]["completion_token_ids"] for s in agent]),
                                  res.tokens[b, :n][mask])
    np.testing.assert_allclose(np.concatenate([s["metrics"]["logprobs"] for s in agent]), res.logprobs[b, :n][mask])
    last = agent[-1]["metrics"]
    whole = last["prompt_token_ids"] + last["completion_token_ids"]
    assert whole == res.tokens[b, :len(whole)].tolist()
    ids = {s["trajectory_id"] for s in doc.get("subagent_trajectories", [])}
    refs = [r["trajectory_id"] for s in agent for o in s.get("observation", {}).get("results", [])
            for r in o.get("subagent_trajectory_ref", [])]
    assert sorted(refs) == sorted(ids) and len(ids) == res.spawned[b]


def test_orchestrator_episodes_with_subagents_are_atif(world):
    task = world[0]
    eps = _episodes([1, 3, 5])
    scripts = [task.serial_script(eps[0]), *(task.split_script(ep, 2) for ep in eps[1:])]
    orch = [scripts[0], scripts[1][0], scripts[2][0]]
    workers = [[], scripts[1][1], scripts[2][1]]
    res = _rollout(world, eps, scripts=TextScripts(orch=orch, workers=workers))
    tools = ToolSet(task.orchestrator(eps[0]).tools.values())
    parse = lambda text: parse_turn(text, tools)           # noqa: E731
    decode = task.chat.tokenizer.decode
    for b in range(len(eps)):
        doc = episode_trajectory(res, b, decode, parse=parse, trajectory_id=f"ep{b}", model_name="tiny",
                                 tools=tools.schemas())
        _check(doc, res, b)
        calls = [c["function_name"] for s in doc["steps"] for c in s.get("tool_calls", [])]
        assert ("assign_task" in calls) == (b > 0) and doc["extra"]["rewards"]["r_perf"] == 1.0
        for sub in doc.get("subagent_trajectories", []):
            assert sub["extra"]["ok"] and any(c["function_name"] == "lookup" for s in sub["steps"]
                                              for c in s.get("tool_calls", []))


def test_token_world_episodes_are_atif(tmp_path):
    from swarmjax.envs import widesearch_jax as wsj
    from swarmjax.envs.widesearch import Vocab, WideSearchConfig
    from swarmjax.models import init_params
    from swarmjax.models.config import preset
    from swarmjax.roles import Roles
    from swarmjax.swarm.engine import RolloutConfig, SwarmRollout
    from swarmjax.swarm.outcome import text_result

    env = WideSearchConfig(num_entities=8, num_values=8, max_task_size=3, max_subagents=2)
    mcfg = preset("tiny").replace(vocab_size=Vocab(env).size)
    tasks = wsj.reset(jax.random.key(1), env, 4)
    out = SwarmRollout(RolloutConfig(env=env), mcfg)(Roles.both(init_params(mcfg, jax.random.key(0))), tasks,
                                                     jax.random.key(2))
    res = text_result(env, out)
    docs = [episode_trajectory(res, b, Vocab(env).decode, trajectory_id=f"final/n{b}") for b in range(4)]
    for b in range(4):
        if res.orch_steps[b]:
            _check(docs[b], res, b)
    _export(tmp_path, docs)


def _export(tmp_path, docs):
    """`swarmjax trace export`: one validated file per record, ids as file names; bad
    input refused with one line and nothing written."""
    import json

    from swarmjax.cli import main
    from swarmjax.traces.files import export

    run = tmp_path / "run"
    run.mkdir()
    (run / "atif.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    assert main(["trace", "export", str(run), "--format", "atif", "--out", str(tmp_path / "all")]) == 0
    got = sorted((tmp_path / "all").iterdir())
    assert [p.name for p in got] == sorted(d["trajectory_id"].replace("/", "_") + ".json" for d in docs)
    assert sorted((json.loads(p.read_text()) for p in got), key=lambda d: d["trajectory_id"]) == \
        sorted(docs, key=lambda d: d["trajectory_id"])
    one, _ = export(str(run / "atif.jsonl"), str(tmp_path / "one"), ids=[docs[1]["trajectory_id"]])
    assert len(one) == 1 and json.loads(open(one[0]).read()) == docs[1]
    bad = dict(docs[0], steps=[{"step_id": 1, "source": "nobody", "message": "x"}])
    for records, why in (([docs[0], docs[0]], "repeat"), ([bad], "is not valid atif"), ([{"x": 1}], "no trajectory_id"),
                         ([{"trajectory_id": 7}], "record 0 has no trajectory_id")):
        (run / "atif.jsonl").write_text("".join(json.dumps(d) + "\n" for d in records))
        with pytest.raises(ValueError, match=why):
            export(str(run), str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="has no traces.jsonl"):
        export(str(run), str(tmp_path / "bad"), fmt="survey")
