"""Orbax checkpoints: exact round trip, async save while training, retention (last K +
best), restore across mesh shapes, half-written checkpoints, errors."""

import asyncio
import copy
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import threading

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint.path import atomicity

from swarmjax.models import init_params
from swarmjax.rl.advantages import grpo_advantages
from swarmjax.rl.trajectory import TrajectoryBatch
from swarmjax.rl.update import Learner, TrainState, UpdateConfig
from swarmjax.sharding import MeshConfig, make_mesh, shard_tree
from swarmjax.train.checkpoint import Checkpointer, abstract_state

UCFG = UpdateConfig(num_minibatches=1)
B, T = 4, 8
TMP = ".orbax-checkpoint-tmp"          # orbax 0.12.8: <step>.orbax-checkpoint-tmp while writing


def make_batch(vocab, seed=0):
    r = np.random.RandomState(seed)
    loss_mask = np.zeros((B, T), bool)
    loss_mask[:, 3:] = True
    rewards = r.rand(B).astype(np.float32)
    groups = np.repeat(np.arange(2), 2)
    adv = grpo_advantages(jnp.asarray(rewards), jnp.asarray(groups))
    return TrajectoryBatch.create(r.randint(0, vocab, (B, T)), loss_mask, adv,
                                  sampler_logprobs=-np.abs(r.randn(B, T)) * loss_mask,
                                  group_ids=groups, rewards=rewards)


@pytest.fixture(scope="module")
def learner(tiny_cfg):
    return Learner(tiny_cfg, UCFG)


@pytest.fixture(scope="module")
def batch(tiny_cfg):
    return make_batch(tiny_cfg.vocab_size)


@pytest.fixture(scope="module")
def trained(learner, tiny_params, batch):
    """Host copy of a TrainState after one optimizer step (non-trivial Muon/AdamW state),
    with a frozen sub-agent tree."""
    params = jax.tree.map(jnp.copy, tiny_params)
    state = learner.init(params, frozen={"subagents": jax.tree.map(jnp.copy, tiny_params)})
    state, _ = learner.update(state, batch)
    return jax.device_get(state)


DEV0 = jax.sharding.SingleDeviceSharding(jax.devices()[0])


def on_device(host_state):
    return jax.device_put(host_state, jax.devices()[0])


def assert_identical(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, jax.tree_util.keystr(path)
        assert np.array_equal(a, b), jax.tree_util.keystr(path)      # bit-identical (no NaNs here)


def one_line(excinfo):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


class HeldFinalize:
    """Hold orbax's finalisation of a save (the rename of ``<step>.orbax-checkpoint-tmp``)
    until released: a deterministic "save still being written" for the tests."""

    def __init__(self, monkeypatch):
        self.entered, self.gate = threading.Event(), threading.Event()
        orig = atomicity.AtomicRenameTemporaryPath.finalize

        async def held(tmp_path_self):
            self.entered.set()
            await asyncio.to_thread(self.gate.wait, 120)
            return await orig(tmp_path_self)
        monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", held)

    def wait_entered(self):
        assert self.entered.wait(120), "the background save never reached finalisation"

    def release(self):
        self.gate.set()


# ---------------------------------------------------------------------------- round trip
def test_round_trip_is_bit_identical(tmp_path, trained):
    rng = np.random.default_rng(0)
    rng.random(5)
    data = grain.MapDataset.range(64).shuffle(seed=7).batch(4).to_iter_dataset()
    it = iter(data)
    next(it), next(it)
    meta = {"seed": 1234, "host_rng": rng.bit_generator.state,       # nested, 128-bit ints
            "data": it.get_state(),                                    # grain iterator state
            "schedule": {"lambda1": 0.25, "phase": "parl", "history": [1, 2.5, None, True]}}
    want_meta = copy.deepcopy(meta)

    ckpt = Checkpointer(tmp_path, save_every=10)
    state = on_device(trained)
    assert not ckpt.save(5, state, meta)                   # not a multiple of save_every
    assert ckpt.save(10, state, meta)
    meta["seed"] = -1                                      # the job keeps mutating its dict
    meta["schedule"]["history"].append(99)
    assert not ckpt.save(10, state, meta, force=True)      # already saved: not written twice
    assert ckpt.save(13, state, want_meta, force=True)     # force: off the interval
    ckpt.close()
    assert sorted(os.listdir(tmp_path)) == ["10", "13"]

    ckpt = Checkpointer(tmp_path, save_every=10)           # a restarted job
    assert ckpt.latest_step() == 13 and ckpt.all_steps() == [10, 13]
    restored, got_meta = ckpt.restore(10, abstract_state(trained, DEV0))
    assert isinstance(restored, TrainState)
    assert_identical(restored, trained)                    # params, opt_state, frozen, step
    assert int(restored.step) == 1 and set(restored.frozen) == {"subagents"}
    assert got_meta == want_meta

    # resuming from the meta continues the host RNG and the data stream exactly
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = got_meta["host_rng"]
    np.testing.assert_array_equal(rng2.random(4), rng.random(4))
    it2 = iter(data)
    it2.set_state(got_meta["data"])
    np.testing.assert_array_equal(next(it2), next(it))

    _, latest_meta = ckpt.restore(None, abstract_state(trained, DEV0))
    assert latest_meta == want_meta
    ckpt.close()


# ---------------------------------------------------------------------------- async
def test_async_save_while_training_continues(tmp_path, trained, learner, batch, monkeypatch):
    ckpt = Checkpointer(tmp_path, save_every=10, keep_last=3)
    state = on_device(trained)
    assert ckpt.save(10, state, {"step": 10}, metrics={"item_f1": 0.5})
    ckpt.wait()

    state, _ = learner.update(state, batch)
    at_save = jax.device_get(state)
    held = HeldFinalize(monkeypatch)
    try:
        assert ckpt.save(20, state, {"step": 20}, metrics={"item_f1": 0.9})
        held.wait_entered()
        # being written: only the tmp directory exists and nothing reports step 20
        assert (tmp_path / f"20{TMP}").is_dir() and not (tmp_path / "20").exists()
        assert ckpt.latest_step() == 10 and ckpt.all_steps() == [10]
        assert ckpt.best_step() == 10
        # training continues; the saved state's buffers are donated (or deleted here:
        # CPU may not donate), which is safe once save() has returned
        new_state, _ = learner.update(state, batch)
        live = {id(x) for x in jax.tree.leaves(new_state)}
        for x in jax.tree.leaves(state):
            if id(x) not in live and not x.is_deleted():
                x.delete()
        new_state, _ = learner.update(new_state, batch)
        jax.block_until_ready(new_state)
        assert int(new_state.step) == int(at_save.step) + 2
    finally:
        held.release()
    ckpt.wait()
    assert ckpt.latest_step() == 20 and ckpt.best_step() == 20
    restored, meta = ckpt.restore(None, abstract_state(trained, DEV0))
    assert meta == {"step": 20}
    assert_identical(restored, at_save)
    ckpt.close()


# ---------------------------------------------------------------------------- retention
def _small(step):
    return {"w": jnp.full((3,), step, jnp.float32), "step": jnp.asarray(step, jnp.int32)}


def test_retention_keeps_last_k_plus_best(tmp_path):
    ckpt = Checkpointer(tmp_path, save_every=1, keep_last=2)
    f1 = {1: 0.3, 2: 0.9, 3: 0.4, 4: None, 5: 0.5, 6: 0.2}
    for s, v in f1.items():
        assert ckpt.save(s, _small(s), {"s": s}, metrics=None if v is None else {"item_f1": v, "loss": 1.0})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 5, 6] and ckpt.best_step() == 2
    assert sorted(p for p in os.listdir(tmp_path) if p.isdigit()) == ["2", "5", "6"]
    ckpt.close()

    ckpt = Checkpointer(tmp_path, save_every=1, keep_last=2)     # restart: best still known
    assert ckpt.best_step() == 2 and ckpt.latest_step() == 6
    ckpt.save(7, _small(7), {}, metrics={"item_f1": 0.95})
    ckpt.save(8, _small(8), {}, metrics={"item_f1": float("nan")})  # non-finite: never best
    ckpt.save(9, _small(9), {}, metrics={"loss": 0.1})               # no item_f1: never best
    ckpt.wait()
    assert ckpt.all_steps() == [7, 8, 9] and ckpt.best_step() == 7
    state, meta = ckpt.restore(7, abstract_state(_small(0), DEV0))
    assert int(state["step"]) == 7 and meta == {}
    ckpt.close()


def test_retention_min_mode_and_no_metrics(tmp_path):
    ckpt = Checkpointer(tmp_path / "min", save_every=1, keep_last=1, best_metric="loss",
                        best_mode="min", async_save=False)
    for s, loss in enumerate([3.0, 1.0, 2.0, 4.0], start=1):
        ckpt.save(s, _small(s), {}, metrics={"loss": loss})
    assert ckpt.all_steps() == [2, 4] and ckpt.best_step() == 2
    ckpt.close()

    ckpt = Checkpointer(tmp_path / "none", save_every=1, keep_last=2)   # never any metrics
    for s in range(1, 5):
        ckpt.save(s, _small(s), {})
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4] and ckpt.best_step() is None
    ckpt.close()

    ckpt = Checkpointer(tmp_path / "off", save_every=1, keep_last=1, best_metric=None)
    for s, v in enumerate([0.9, 0.1], start=1):
        ckpt.save(s, _small(s), {}, metrics={"item_f1": v})
    ckpt.wait()
    assert ckpt.all_steps() == [2] and ckpt.best_step() is None
    ckpt.close()


def test_saves_without_eval_metrics_log_no_orbax_warning(tmp_path, caplog):
    """The job's pattern (train/loop.py): a forced save of the warm start, periodic saves
    between evaluations (no metrics), a save with the eval metrics. Orbax used to log
    "Requested `tracked_metric`; did not provide metrics." on every save without them."""
    ckpt = Checkpointer(tmp_path, save_every=2, keep_last=1, best_metric="item_f1")
    with caplog.at_level(logging.INFO):
        assert ckpt.save(0, _small(0), {"parl_step": 0}, force=True)
        assert ckpt.save(2, _small(2), {"parl_step": 2}, metrics=None)
        assert ckpt.save(4, _small(4), {"parl_step": 4}, metrics={"item_f1": 0.5}, force=True)
        assert ckpt.save(6, _small(6), {"parl_step": 6})
        ckpt.wait()
    assert any(r.name == "absl" for r in caplog.records)          # orbax's log is captured
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "tracked_metric" in w or "metrics" in w], warnings
    assert ckpt.all_steps() == [4, 6] and ckpt.best_step() == 4
    ckpt.close()


# ---------------------------------------------------------------------------- meshes
def test_restore_onto_another_mesh_and_back(tmp_path, tiny_cfg, trained):
    mesh = make_mesh(MeshConfig(2, 2, 2))
    shapes = jax.eval_shape(lambda: trained)
    mesh_shardings = Learner(tiny_cfg, UCFG, mesh=mesh).state_shardings(shapes)

    # saved from one device, restored onto the 2x2x2 mesh with the learner's shardings
    ckpt = Checkpointer(tmp_path / "one", save_every=1)
    ckpt.save(1, on_device(trained), {"saved_on": "1 device"})
    restored, meta = ckpt.restore(None, abstract_state(shapes, mesh_shardings))
    ckpt.close()
    assert meta == {"saved_on": "1 device"}
    assert_identical(restored, trained)
    for x, s in zip(jax.tree.leaves(restored), jax.tree.leaves(mesh_shardings)):
        assert x.sharding.is_equivalent_to(s, x.ndim)
    q = restored.params["layers"]["attn"]["q_proj"]
    assert q.sharding.shard_shape(q.shape) != q.shape                  # really split
    mu = restored.frozen["subagents"]["layers"]["mlp"]["up_proj"]
    assert mu.sharding.shard_shape(mu.shape) != mu.shape

    # and the reverse: saved from the mesh, restored onto one device
    ckpt = Checkpointer(tmp_path / "mesh", save_every=1)
    ckpt.save(1, shard_tree(trained, mesh_shardings), {"saved_on": "2x2x2"})
    back, meta = ckpt.restore(1, abstract_state(shapes, DEV0))
    ckpt.close()
    assert meta == {"saved_on": "2x2x2"}
    assert_identical(back, trained)
    assert all(x.sharding.is_equivalent_to(DEV0, x.ndim) for x in jax.tree.leaves(back))

    # on a machine with fewer devices (trained on a pod, exported on a laptop): a process
    # with one device reads it whole, with no target tree (export) and with one (eval, resume)
    code = ("import sys, jax, numpy as np\n"
            "from swarmjax.train.checkpoint import Checkpointer, abstract_state\n"
            "assert jax.device_count() == 1\n"
            "with Checkpointer(sys.argv[1], save_every=1, read_only=True) as c:\n"
            "    state, meta = c.read(1)\n"
            "    again, _ = c.restore(1, abstract_state(state, jax.sharding.SingleDeviceSharding(jax.devices()[0])))\n"
            "assert meta == {'saved_on': '2x2x2'}\n"
            "np.savez(sys.argv[2], *[np.asarray(x) for x in jax.tree.leaves((state, again))])\n")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "mesh"), str(tmp_path / "leaves.npz")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    leaves = np.load(tmp_path / "leaves.npz")
    want = [np.asarray(x) for x in jax.tree.leaves(trained)]
    got = [leaves[f"arr_{i}"] for i in range(len(leaves.files))]
    assert len(got) == 2 * len(want)
    for a, b in zip(sorted(got[:len(want)], key=_key), sorted(want, key=_key)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got[:len(want)], got[len(want):]):
        np.testing.assert_array_equal(a, b)


def _key(x):
    return (x.shape, x.dtype.str, float(np.sum(x, dtype=np.float64)))


# ---------------------------------------------------------------------------- half-written
def test_half_written_checkpoints_are_ignored(tmp_path, trained, monkeypatch):
    s10, s20 = on_device(trained), jax.tree.map(lambda x: x + 1, on_device(trained))
    src = tmp_path / "src"
    ckpt = Checkpointer(src, save_every=10)
    ckpt.save(10, s10, {"step": 10})
    ckpt.wait()
    held = HeldFinalize(monkeypatch)
    try:
        ckpt.save(20, s20, {"step": 20})
        held.wait_entered()           # what a job killed now leaves behind
        shutil.copytree(src / f"20{TMP}", tmp_path / "killed")
    finally:
        held.release()
    ckpt.close()
    monkeypatch.undo()
    assert (src / "20" / "commit_success.txt").is_file()   # orbax's commit marker

    run = tmp_path / "run"
    shutil.copytree(src / "10", run / "10")
    shutil.copytree(tmp_path / "killed", run / f"20{TMP}")             # killed mid-save
    shutil.copytree(src / "20", run / "30")                            # step dir without
    os.remove(run / "30" / "commit_success.txt")                       # its commit marker

    ckpt = Checkpointer(run, save_every=10)
    assert ckpt.latest_step() == 10 and ckpt.all_steps() == [10]
    restored, meta = ckpt.restore(None, abstract_state(trained, DEV0))
    assert meta == {"step": 10}
    assert_identical(restored, trained)
    for bad in (20, 30):
        with pytest.raises(ValueError, match=f"step {bad} in {run}") as e:
            ckpt.restore(bad, abstract_state(trained, DEV0))
        one_line(e)
    # the resumed job saves those steps again, over the leftovers
    assert ckpt.save(20, s20, {"step": 20}) and ckpt.save(30, s20, {"step": 30})
    ckpt.wait()
    assert ckpt.all_steps() == [10, 20, 30] and not (run / f"20{TMP}").exists()
    assert ckpt.restore(30, abstract_state(trained, DEV0))[1] == {"step": 30}
    ckpt.close()


# ---------------------------------------------------------------------------- errors
def test_errors(tmp_path, tiny_cfg, trained):
    abstract = abstract_state(trained, DEV0)
    empty = Checkpointer(tmp_path / "missing", save_every=1)
    with pytest.raises(ValueError, match=f"no finalised checkpoint in {tmp_path / 'missing'}") as e:
        empty.restore(None, abstract)
    one_line(e)
    empty.close()

    ckpt = Checkpointer(tmp_path / "run", save_every=10)
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        ckpt.save(10, on_device(trained), {"x": object()})
    with pytest.raises(ValueError, match="JSON round trip"):
        ckpt.save(10, on_device(trained), {"x": (1, 2)})
    with pytest.raises(ValueError, match="numbers"):
        ckpt.save(10, on_device(trained), {}, metrics={"item_f1": "good"})
    assert ckpt.latest_step() is None and os.listdir(tmp_path / "run") == []   # nothing written

    ckpt.save(10, on_device(trained), {})
    ckpt.wait()
    with pytest.raises(ValueError, match=r"step 7 in .*finalised steps: \[10\]") as e:
        ckpt.restore(7, abstract)
    one_line(e)
    assert not ckpt.save(5, on_device(trained), {})               # not after the latest: skipped
    with pytest.raises(ValueError, match="before the latest checkpoint 10"):
        ckpt.save(5, on_device(trained), {}, force=True)

    # tree structure: the checkpoint has frozen trees the abstract state does not
    with pytest.raises(ValueError, match=r"not in abstract_state: frozen\.subagents\.") as e:
        ckpt.restore(10, abstract.replace(frozen=None))
    one_line(e)
    # ... and the other way round
    extra = abstract.replace(frozen={**abstract.frozen, "reference": abstract.params})
    with pytest.raises(ValueError, match=r"not in the checkpoint: frozen\.reference\.") as e:
        ckpt.restore(10, extra)
    one_line(e)

    # shapes: a model with a bigger vocabulary
    other_cfg = dataclasses.replace(tiny_cfg, vocab_size=tiny_cfg.vocab_size + 32)
    other = Learner(other_cfg, UCFG)
    shapes = jax.eval_shape(lambda: other.init(init_params(other_cfg, jax.random.key(0)),
                                               frozen={"subagents": init_params(other_cfg, jax.random.key(1))}))
    with pytest.raises(ValueError, match=r"shape mismatch: .*params\.embed saved \(96, 32\) "
                                         r"vs wanted \(128, 32\)") as e:
        ckpt.restore(10, abstract_state(shapes, DEV0))
    one_line(e)

    # no shardings: the target layout must be explicit
    with pytest.raises(ValueError, match="has no sharding") as e:
        ckpt.restore(10, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      jax.eval_shape(lambda: trained)))
    one_line(e)
    ckpt.close()

    with pytest.raises(ValueError, match="save_every"):
        Checkpointer(tmp_path / "x", save_every=0)
    with pytest.raises(ValueError, match="best_mode"):
        Checkpointer(tmp_path / "x", save_every=1, best_mode="largest")
