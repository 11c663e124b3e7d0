"""Task-set pipeline: TFDS builder (array_record, no TensorFlow) and grain iterators."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.data import check_source, prepare, task_iterator, to_tasks
from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.roles import Roles

ENV = WideSearchConfig(num_entities=32, num_values=32, min_task_size=1, max_task_size=16,
                       max_subagents=8, subagent_steps=4, budget=8, contexts=Roles(160, 24))
SIZES = dict(train_size=128, validation_size=32, test_size=32, seed=3)


def records(src):
    return [src[i] for i in range(len(src))]


def key(rec):
    return np.asarray(rec["table"]).tobytes() + np.asarray(rec["entities"]).tobytes()


def files(root):
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, fs in os.walk(root) for f in fs}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def sources(data_dir):
    return prepare(ENV, data_dir, **SIZES)


def test_prepare_without_tensorflow(sources):
    assert set(sources) == {"train", "validation", "test"}
    assert {s: len(v) for s, v in sources.items()} == dict(train=128, validation=32, test=32)
    assert "tensorflow" not in sys.modules


def test_features_valid(sources):
    E, N = ENV.num_entities, ENV.max_task_size
    for split, src in sources.items():
        ids = set()
        for rec in records(src):
            table, ents, n = np.asarray(rec["table"]), np.asarray(rec["entities"]), int(rec["n"])
            assert table.shape == (E,) and table.dtype == np.int32
            assert ents.shape == (N,) and ents.dtype == np.int32
            assert ((0 <= table) & (table < ENV.num_values)).all()
            assert ENV.min_task_size <= n <= ENV.max_task_size
            real = ents[:n]
            assert ((0 <= real) & (real < E)).all() and len(set(real.tolist())) == n
            assert (ents[n:] == -1).all()
            assert rec["task_id"].decode().startswith(split + "/")
            ids.add(rec["task_id"])
        assert len(ids) == len(src)


def test_splits_disjoint(sources):
    keys = {s: {key(r) for r in records(src)} for s, src in sources.items()}
    assert len(keys["train"]) == 128
    assert not keys["train"] & keys["validation"]
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]


def test_deterministic_across_dirs(sources, tmp_path):
    other = prepare(ENV, str(tmp_path), **SIZES)
    for split, src in sources.items():
        a, b = records(src), records(other[split])
        assert [r["task_id"] for r in a] == [r["task_id"] for r in b]
        assert [key(r) for r in a] == [key(r) for r in b]


def test_config_name_encodes_everything():
    from swarmjax.data.builder import WideSearchTasksConfig

    base = WideSearchTasksConfig.make(ENV, **SIZES).name
    bigger = WideSearchConfig(num_entities=64, num_values=32, max_task_size=16,
                              contexts=Roles(160, 24))
    names = {base, WideSearchTasksConfig.make(bigger, **SIZES).name,
             WideSearchTasksConfig.make(ENV, **{**SIZES, "seed": 4}).name,
             WideSearchTasksConfig.make(ENV, **{**SIZES, "train_size": 64}).name}
    assert len(names) == 4
    with pytest.raises(ValueError):
        WideSearchTasksConfig.make(ENV, train_size=-1)


def test_second_prepare_reuses_files(sources, data_dir, monkeypatch):
    from swarmjax.data import builder

    before = files(data_dir)

    def fail(*a, **k):
        raise AssertionError("regenerated a prepared task set")

    monkeypatch.setattr(builder.WideSearchTasks, "_split_generators", fail)
    again = prepare(ENV, data_dir, **SIZES)
    assert files(data_dir) == before
    assert [key(r) for r in records(again["test"])] == [key(r) for r in records(sources["test"])]


def test_batches_have_env_shapes(sources):
    it = task_iterator(sources["train"], 16, seed=0, env=ENV)
    for _ in range(10):   # crosses the epoch boundary (8 batches per epoch)
        b = next(it)
        assert b["table"].shape == (16, 32) and b["table"].dtype == np.int32
        assert b["entities"].shape == (16, 16) and b["entities"].dtype == np.int32
        assert b["n"].shape == (16,) and b["n"].dtype == np.int32
        assert b["task_id"].shape == (16,)


def test_one_epoch_covers_every_example_once(sources):
    src = sources["train"]
    batches = list(task_iterator(src, 8, seed=5, num_epochs=1))
    assert len(batches) == 16
    seen = [t for b in batches for t in b["task_id"].tolist()]
    assert sorted(seen) == sorted(r["task_id"] for r in records(src))
    unshuffled = [t for b in task_iterator(src, 8, shuffle=False, num_epochs=1)
                  for t in b["task_id"].tolist()]
    assert unshuffled == [r["task_id"] for r in records(src)] and seen != unshuffled
    other_seed = [t for b in task_iterator(src, 8, seed=6, num_epochs=1)
                  for t in b["task_id"].tolist()]
    assert other_seed != seen


@pytest.mark.parametrize("skip", [3, 14])   # 14: the resumed batches cross an epoch
def test_resume_from_state(sources, skip):
    it = task_iterator(sources["train"], 8, seed=7)
    for _ in range(skip):
        next(it)
    state = it.get_state()
    state_json = json.loads(json.dumps(state))
    expected = [next(it) for _ in range(5)]
    for st in (state, state_json):
        resumed = task_iterator(sources["train"], 8, seed=7)
        resumed.set_state(st)
        for want in expected:
            got = next(resumed)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])


def test_focus_oversamples_large_tasks_and_resumes(sources):
    src = sources["train"]
    base = np.mean([int(src[i]["n"]) >= 12 for i in range(len(src))])     # about 5/16
    it = task_iterator(src, 8, seed=1, focus_min_n=12, focus_fraction=0.5)
    batches = [next(it) for _ in range(40)]                                # 2.5 epochs of the focus stream
    large = np.mean([b["n"] >= 12 for b in batches])
    assert large == pytest.approx(0.5 + 0.5 * base, abs=0.08) and large > base + 0.2
    ids = [t for b in batches[:8] for t in b["task_id"]]
    assert len(set(ids)) > 48                     # both streams shuffled, not one task repeated
    state = json.loads(json.dumps(it.get_state()))
    want = [next(it) for _ in range(3)]
    resumed = task_iterator(src, 8, seed=1, focus_min_n=12, focus_fraction=0.5)
    resumed.set_state(state)
    for w in want:
        np.testing.assert_array_equal(next(resumed)["task_id"], w["task_id"])
    for kwargs in (dict(focus_fraction=1.0, focus_min_n=12), dict(focus_fraction=0.5),
                   dict(focus_fraction=0.5, focus_min_n=17), dict(focus_fraction=0.5, focus_min_n=12, num_epochs=1)):
        with pytest.raises(ValueError):
            task_iterator(src, 8, seed=1, **kwargs)


@pytest.mark.parametrize("count", [2, 3])
def test_process_shards_disjoint(sources, count):
    src = sources["validation"]   # 32 records
    shards = [[t for b in task_iterator(src, 2, seed=1, num_epochs=1, process_index=p,
                                        process_count=count) for t in b["task_id"].tolist()]
              for p in range(count)]
    assert all(len(s) == len(shards[0]) == 32 // count // 2 * 2 for s in shards)
    flat = [t for s in shards for t in s]
    assert len(set(flat)) == len(flat)
    if count == 2:
        assert sorted(flat) == sorted(r["task_id"] for r in records(src))


def test_to_tasks_feeds_the_env(sources):
    tasks = to_tasks(next(task_iterator(sources["test"], 4, seed=0)))
    assert isinstance(tasks, wsj.Tasks)
    assert tasks.table.shape == (4, 32) and tasks.entities.shape == (4, 16)
    assert tasks.n.shape == (4,)
    assert all(a.dtype == jnp.int32 for a in (tasks.table, tasks.entities, tasks.n))
    rep, groups = wsj.repeat_groups(tasks, 3)
    assert rep.table.shape == (12, 32) and rep.n.shape == (12,)
    np.testing.assert_array_equal(rep.entities[3:6], jnp.repeat(tasks.entities[1:2], 3, 0))
    np.testing.assert_array_equal(groups, np.repeat(np.arange(4), 3))
    tokens, mask = wsj.orch_prompt(ENV, rep)
    np.testing.assert_array_equal(mask.sum(1), rep.n + 3)


def test_bad_inputs_raise(sources, tmp_path):
    src = sources["validation"]
    bad = [
        dict(batch_size=0), dict(batch_size=33), dict(batch_size=20, process_count=2),
        dict(batch_size=4, process_index=2, process_count=2), dict(batch_size=4, num_epochs=0),
        dict(batch_size=4, env=WideSearchConfig(num_entities=64, num_values=32,
                                                max_task_size=16, contexts=Roles(160, 24))),
        dict(batch_size=4, env=WideSearchConfig(num_entities=32, num_values=32,
                                                max_task_size=8, contexts=Roles(160, 24))),
    ]
    for kwargs in bad:
        with pytest.raises(ValueError):
            task_iterator(src, seed=0, **kwargs)
    with pytest.raises(ValueError, match="too small"):   # every task is the same one
        prepare(WideSearchConfig(num_entities=1, num_values=1, max_task_size=1), tmp_path,
                train_size=2, validation_size=1, test_size=1)
    with pytest.raises(ValueError):
        check_source([{"table": np.zeros(32, np.int32), "n": 1}], ENV)
    with pytest.raises(ValueError):
        to_tasks({"table": np.zeros((2, 32)), "entities": np.zeros((3, 16)), "n": np.ones(2)})
    with pytest.raises(ValueError):
        to_tasks({"table": np.zeros((2, 32)), "n": np.ones(2)})


def test_pipeline_imports_without_tfds():
    code = ("import sys; sys.modules['tensorflow_datasets'] = None\n"
            "import swarmjax.data.pipeline, swarmjax.data\n"
            "assert callable(swarmjax.data.task_iterator)\n"
            "assert 'tensorflow' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr


def test_token_task_streams_and_held_out(sources, data_dir):
    """The token world as a task (envs/widesearch_token_task.py): its train stream draws the
    records of a batched grain iterator in the same order, ids first (async rollouts) then the
    problems, and resumes from its state; held-out problems are the first of each size in
    the split, size by size; its host form resets on a problem record."""
    from swarmjax.envs.task import EnvContext, make_env, resolve_task
    from swarmjax.envs.widesearch_token_task import TaskSetConfig, WideSearchTokens
    from swarmjax.train.streams import held_out, task_stream

    counts = np.bincount([int(r["n"]) for r in records(sources["test"])])
    sizes = tuple(int(n) for n in np.argsort(-counts, kind="stable")[:2])        # two sizes with >= 2 tasks
    task = WideSearchTokens(cfg=ENV, data=TaskSetConfig(data_dir=data_dir, focus_fraction=0.5,
                                                        focus_min_n=ENV.max_task_size, **SIZES),
                            eval_sizes=sizes)
    assert resolve_task(task) is task and resolve_task("widesearch-tokens").cfg == WideSearchConfig()
    stream = task_stream(task, "train", 3)
    batches = task_iterator(sources["train"], 4, seed=3, focus_min_n=ENV.max_task_size, focus_fraction=0.5)
    for _ in range(3):
        want = next(batches)
        ids = stream.ids(4)
        assert ids == [bytes(t).decode() for t in want["task_id"]]
        got = stream.take(4)
        np.testing.assert_array_equal(np.stack([p["table"] for p in got]), want["table"])
        np.testing.assert_array_equal([int(p["n"]) for p in got], want["n"])
    saved = json.loads(json.dumps(stream.state()))
    after = stream.ids(4)
    again = task_stream(task, "train", 3)
    again.restore(saved)
    assert again.ids(4) == after

    problems = held_out(task, "test", 0, 4)
    assert [int(p["n"]) for p in problems] == [sizes[0]] * 2 + [sizes[1]] * 2
    firsts = [r for r in records(sources["test"]) if int(r["n"]) == sizes[0]][:2]
    for p, r in zip(problems, firsts):
        np.testing.assert_array_equal(p["entities"], r["entities"])
    with pytest.raises(ValueError, match="multiple of the 2"):
        held_out(task, "test", 0, 5)
    env = make_env(task, problems[0], EnvContext(None, None))
    assert len(env.reset(problems[0])) == sizes[0] + 3            # <orch> <task> e.. </task>
