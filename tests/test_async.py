"""The asynchronous rollout queue (swarmjax.train.async_rl) with a scripted rollout: which
policy version each batch decodes with, the staleness bound (drop or regenerate), and a
checkpoint taken mid-stream that resumes with every task trained on exactly once. The
token-world job's run under kill -9 and SIGTERM is in test_resume.py."""

import threading

import numpy as np
import pytest

from swarmjax.rl.update import TrainState
from swarmjax.train.async_rl import AsyncConfig, AsyncRollouts, staleness_of, token_versions
from swarmjax.train.subagents import SubagentRefresh, refresh_subagents

TASKS = 2       # tasks per batch


def queue(cfg, position=0):
    """AsyncRollouts over a stream of batches ``[t2j, t2j+1]``; the "params" are the
    learner's version (an int), so a collected batch shows which version it decoded with."""
    stream = {"position": position}
    threads = set()

    def draw():
        j = stream["position"]
        stream["position"] += 1
        return j, [f"t{TASKS * j + i}" for i in range(TASKS)]

    def collect(step, tasks, params, frozen):
        threads.add(threading.current_thread().name)
        assert step == tasks and frozen is None
        return {"params": params, "loss_mask": np.array([[False, True, True], [False, True, False]])}

    rollouts = AsyncRollouts(cfg, draw=draw, stream_state=lambda: stream["position"], collect=collect,
                             loss_mask=lambda c: c["loss_mask"], publish=lambda params: params)
    return rollouts, stream, threads


def run(cfg, steps, *, start=0, stop=None, saved=None):
    """Train steps ``start..stop`` (the learner's version: updates applied); returns the
    rows (step, ids, decoded-with version, staleness, trained) and the queue."""
    rollouts, stream, threads = queue(cfg, position=saved["stream"] if saved else 0)
    version = saved["version"] if saved else 0
    rollouts.begin(version, step=start, steps=steps, version=version,
                   dropped=saved["dropped"] if saved else 0)
    out = []
    try:
        for _ in range(start, steps if stop is None else stop):
            ready = rollouts.take(version)
            out.append((ready.step, ready.ids, ready.collected["params"], ready.staleness, ready.train))
            if ready.train:
                version += 1
                rollouts.trained(version)
            figures = rollouts.figures(ready)
            assert figures["async/staleness"] == ready.staleness and figures["async/trained"] == ready.train
        return out, rollouts.checkpoint(), threads
    finally:
        rollouts.close()


def test_versions_and_staleness_follow_the_schedule():
    # depth 1: batch j decodes with version j - 1 while the learner trains batch j - 1
    rows, _, threads = run(AsyncConfig(depth=1), 5)
    assert [r[2] for r in rows] == [0, 0, 1, 2, 3] and [r[3] for r in rows] == [0, 1, 1, 1, 1]
    assert threads == {next(iter(threads))} and threads.pop().startswith("swarmjax-rollout")
    # depth 2, weights pushed every 2 updates: staleness up to depth + sync_every - 1 = 3
    rows, _, _ = run(AsyncConfig(depth=2, sync_every=2), 7)
    assert [r[2] for r in rows] == [0, 0, 0, 0, 2, 2, 4]
    assert [r[3] for r in rows] == [0, 1, 2, 3, 2, 3, 2] and all(r[4] for r in rows)


@pytest.mark.parametrize("on_stale", ["drop", "regenerate"])
def test_staleness_bound(on_stale):
    rows, saved, _ = run(AsyncConfig(depth=2, sync_every=2, max_staleness=2, on_stale=on_stale), 7)
    if on_stale == "drop":      # the batches 3 updates old are not trained on; the learner does not advance
        assert [r[4] for r in rows] == [True, True, True, False, True, True, False]
        assert [r[3] for r in rows] == [0, 1, 2, 3, 1, 2, 3] and saved["dropped"] == 2 and saved["version"] == 5
    else:                       # rolled out again with the learner's weights (3, then 5): staleness 0
        assert all(r[4] for r in rows) and [r[3] for r in rows] == [0, 1, 2, 0, 2, 0, 2]
        assert [r[2] for r in rows] == [0, 0, 0, 3, 2, 5, 4] and saved["regenerated"] == 2
    assert max(r[3] for r in rows if r[4]) <= 2


def test_checkpoint_mid_stream_resumes_every_task_once():
    cfg = AsyncConfig(depth=2)
    whole, _, _ = run(cfg, 8)
    first, saved, _ = run(cfg, 8, stop=3)       # stopped with batches 3 and 4 in flight
    assert [q["step"] for q in saved["queue"]] == [3, 4] and saved["stream"] == 3
    assert saved["queue"][0]["ids"] == ["t6", "t7"]
    rest, _, _ = run(cfg, 8, start=3, saved=saved)
    trained = [i for r in first + rest if r[4] for i in r[1]]
    assert trained == [f"t{i}" for i in range(8 * TASKS)]              # once each, in stream order
    assert [r[1] for r in first + rest] == [r[1] for r in whole]
    assert [r[3] for r in rest][0] == 0       # the re-drawn batch decodes with the restored policy


def test_versions_and_config_errors():
    v = token_versions(np.array([[False, True], [False, False]]), 5)
    assert v.tolist() == [[-1, 5], [-1, -1]] and staleness_of(v, 7, 5) == 2 and staleness_of(v[1:], 7, 4) == 3
    with pytest.raises(ValueError, match="on_stale"):
        AsyncConfig(depth=1, on_stale="skip")
    with pytest.raises(ValueError, match="one process"):
        AsyncConfig(depth=1).check(8, 2)
    with pytest.raises(ValueError, match="leaves the learner none"):
        AsyncConfig(depth=1, rollout_devices=8).check(8, 1)
    with pytest.raises(ValueError, match="depth >= 1"):
        AsyncRollouts(AsyncConfig(), draw=None, stream_state=None, collect=None, loss_mask=None, publish=None)


def test_subagent_refresh():
    r = SubagentRefresh(every=3, at=(2,))
    assert [d for d in range(1, 10) if r.due(d)] == [2, 3, 6, 9] and not SubagentRefresh().due(5)
    state = TrainState(step=np.int32(0), params={"w": np.ones(2)}, opt_state=(),
                       frozen={"subagents": {"w": np.zeros(2)}})
    assert refresh_subagents(state, "subagents").frozen["subagents"]["w"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="no frozen 'subagents'"):
        refresh_subagents(TrainState(step=np.int32(0), params={"w": np.ones(2)}, opt_state=(), frozen={}), "subagents")
    with pytest.raises(ValueError, match="refresh_subagents"):
        SubagentRefresh(at=(0,))
