"""The jitted learner step: sharding, accumulation, skipping, frozen trees, and learning."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.models import ModelConfig, init_params
from swarmjax.optim import OptimConfig
from swarmjax.rl.advantages import grpo_advantages
from swarmjax.rl.losses import LossConfig
from swarmjax.rl.trajectory import TrajectoryBatch, shared_head
from swarmjax.rl.update import Learner, UpdateConfig
from swarmjax.sampling import Sampler, SamplingConfig
from swarmjax.sharding import MeshConfig, make_mesh

CFG = ModelConfig(vocab_size=32, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, intermediate_size=64, tie_embeddings=False)
B, T = 16, 10


def make_batch(seed=0, nan=False):
    r = np.random.RandomState(seed)
    tokens = r.randint(0, CFG.vocab_size, (B, T))
    loss_mask = np.zeros((B, T), bool)
    loss_mask[:, 4:] = True
    token_mask = np.ones((B, T), bool)
    token_mask[::3, -2:] = False              # some right padding
    loss_mask &= token_mask
    rewards = r.rand(B).astype(np.float32)
    groups = np.repeat(np.arange(4), 4)
    adv = grpo_advantages(jnp.asarray(rewards), jnp.asarray(groups))
    if nan:
        adv = adv.at[3].set(jnp.nan)
    return TrajectoryBatch.create(tokens, loss_mask, adv, token_mask=token_mask,
                                  sampler_logprobs=-np.abs(r.randn(B, T)) * loss_mask,
                                  group_ids=groups, rewards=rewards)


# loss tokens per row: with 2 minibatches x 2 microbatches (strided), microbatch 0 of each
# minibatch holds rows i with (i // 2) % 2 == 0 (5-8 loss tokens each), microbatch 1 the
# others (0-2 tokens, rows 3 and 10 none), so a mean of per-microbatch means is far off
RAGGED_LENGTHS = [8, 7, 1, 0, 6, 8, 2, 1, 5, 8, 0, 2, 7, 6, 1, 1]


def make_ragged_batch(seed=0):
    """:func:`make_batch` with loss spans of very unequal lengths (``RAGGED_LENGTHS``,
    cut by the padding of every third row)."""
    batch = make_batch(seed)
    lengths = np.asarray(RAGGED_LENGTHS)[:, None]
    loss_mask = (np.arange(T)[None, :] >= T - lengths) & np.asarray(batch.token_mask)
    return batch.replace(loss_mask=jnp.asarray(loss_mask).at[:, 0].set(False),
                         sampler_logprobs=batch.sampler_logprobs * loss_mask)


def assert_metrics_close(got, want, skip=()):
    assert set(got) == set(want)
    for k in sorted(set(want) - set(skip)):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def _params(seed=0):
    return init_params(CFG, jax.random.key(seed))


UCFG = UpdateConfig(loss=LossConfig("gspo", eps_low=0.05, eps_high=0.05),
                    optim=OptimConfig(learning_rate=3e-3, qk_clip_tau=5.0),
                    num_minibatches=2, num_microbatches=2)


@pytest.fixture(scope="module")
def learner():
    return Learner(CFG, UCFG)


@pytest.fixture(scope="module")
def single(learner):
    state, metrics = learner.update(learner.init(_params()), make_batch())
    return jax.device_get((state, metrics))


def test_update_changes_params_and_reports_metrics(single):
    state, metrics = single
    assert int(state.step) == 2 and int(metrics["skipped"]) == 0
    before = _params()
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), state.params, before)
    assert all(v > 0 for v in jax.tree.leaves(moved))
    for key in ("loss", "grad_norm", "clip_fraction", "ratio_mean", "approx_kl",
                "qk_clip_heads", "max_attn_logit"):
        assert np.isfinite(metrics[key]), key


def test_sharded_update_matches_single_device(single):
    mesh = make_mesh(MeshConfig(2, 2, 2))
    learner = Learner(CFG, UCFG, mesh=mesh)
    state = learner.init(_params())
    q = state.params["layers"]["attn"]["q_proj"]
    assert q.sharding.shard_shape(q.shape) != q.shape                 # really sharded
    state, metrics = learner.update(state, make_batch())
    assert state.params["layers"]["attn"]["q_proj"].sharding.spec == q.sharding.spec
    # float32 with a different reduction order across 8 devices: 1e-5 absolute
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4),
                 jax.device_get(state.params), single[0].params)
    assert_metrics_close(jax.device_get(metrics), single[1])


def test_a_lora_update_on_a_mesh_matches_one_device():
    """LoRA adapters (rank 4 on every linear map, AdamW, QK-Clip on their per-head factors)
    split over a (2, 2, 2) mesh as their weights are: the update gives one device's adapters
    and metrics, and leaves the base bit for bit."""
    from swarmjax.models.config import LoraConfig

    cfg = CFG.replace(lora=LoraConfig(rank=4))
    params = init_params(cfg, jax.random.key(0))
    params["lora"] = jax.tree_util.tree_map_with_path(      # trained-looking adapters: B not zero
        lambda p, x: x + 0.1 * jax.random.normal(jax.random.key(x.size), x.shape) if p[-1].key == "b" else x,
        params["lora"])
    params = jax.device_get(params)                       # host copies: each update donates its own
    ucfg = dataclasses.replace(UCFG, optim=dataclasses.replace(UCFG.optim, learning_rate=1e-2, qk_clip_tau=2.5))
    runs = []
    for mesh in (None, make_mesh(MeshConfig(2, 2, 2))):
        learner = Learner(cfg, ucfg, mesh=mesh)
        state, metrics = learner.update(learner.init(params), make_batch())
        if mesh is not None:
            a = state.params["lora"]["attn"]["q_proj"]["a"]                  # [L, A, D, R]
            assert a.sharding.shard_shape(a.shape) != a.shape                 # really split
        runs.append(jax.device_get((state.params, metrics)))
    (one, m1), (split, m8) = runs
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), split, one)
    assert_metrics_close(m8, m1)
    assert float(m1["qk_clip_heads"]) > 0 and float(np.min(one["lora"]["attn"]["q_clip"])) < 1    # the clip acted
    jax.tree.map(np.testing.assert_array_equal, {k: v for k, v in split.items() if k != "lora"},
                 {k: v for k, v in params.items() if k != "lora"})
    assert np.abs(split["lora"]["attn"]["q_proj"]["a"] - params["lora"]["attn"]["q_proj"]["a"]).max() > 0


MICRO_LOSSES = [
    UCFG.loss,                                                      # GSPO, seq_mean_token_mean
    LossConfig("grpo", eps_low=0.02, eps_high=0.02, aggregation="token_mean", is_cap=1.5,
               kl_beta=0.05),
    LossConfig("grpo", eps_low=0.02, eps_high=0.02, aggregation="seq_mean_token_sum_norm",
               norm_length=12),
]


@pytest.mark.parametrize("loss", MICRO_LOSSES, ids=lambda c: f"{c.name}-{c.aggregation}")
def test_microbatching_equals_one_big_batch(loss):
    """Params and every metric of a microbatched update equal the un-microbatched ones,
    with microbatches holding very different numbers of loss tokens and valid rows."""
    mask = np.asarray(make_ragged_batch().loss_mask)
    per_micro = [mask[m::2][mb::2].sum() for m in range(2) for mb in range(2)]  # [mini][micro]
    assert per_micro[0] > 4 * per_micro[1] and per_micro[2] > 4 * per_micro[3]
    # a larger step and a low QK-Clip threshold so that clipping and QK-Clip both engage
    optim = dataclasses.replace(UCFG.optim, learning_rate=1e-2, qk_clip_tau=2.5)
    runs = {}
    for n_micro in (1, 2):
        learner = Learner(CFG, dataclasses.replace(UCFG, loss=loss, optim=optim,
                                                   num_microbatches=n_micro))
        frozen = {"reference": _params(1)} if loss.kl_beta else None   # donated: fresh each run
        state = learner.init(_params(), frozen=frozen)
        runs[n_micro] = jax.device_get(learner.update(state, make_ragged_batch()))
    (state1, metrics1), (state2, metrics2) = runs[1], runs[2]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4),
                 state2.params, state1.params)
    assert_metrics_close(metrics2, metrics1)
    for k in ("clip_fraction", "approx_kl", "qk_clip_heads"):
        assert float(metrics1[k]) > 0, k


def test_non_finite_step_is_skipped_and_params_unchanged(learner):
    state, metrics = learner.update(learner.init(_params()), make_batch(nan=True))
    assert int(metrics["skipped"]) == 1 and int(state.step) == 1     # row 3 poisons one minibatch
    batch = make_batch()
    batch = batch.replace(advantages=batch.advantages.at[0].set(jnp.inf).at[1].set(jnp.nan))
    state, metrics = learner.update(learner.init(_params()), batch)   # rows 0, 1: both minibatches
    assert int(metrics["skipped"]) == 2 and int(state.step) == 0
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), _params())
    # nothing applied: every step metric is an empty mean (0), not NaN
    for k, v in jax.device_get(metrics).items():
        if k not in ("reward_mean", "advantage_abs_mean"):            # of the input batch
            assert float(v) == (2 if k == "skipped" else 0), k


@pytest.mark.parametrize("poisoned", [0, 1])
def test_skipped_step_is_counted_and_kept_out_of_the_metrics(learner, poisoned):
    """One minibatch (strided: rows of parity ``poisoned``) gets a NaN advantage: the update
    reports exactly what one step on the other minibatch alone reports, plus ``skipped``."""
    batch = make_ragged_batch()
    state, metrics = learner.update(learner.init(_params()),
                                    batch.replace(advantages=batch.advantages.at[poisoned].set(jnp.nan)))
    metrics = jax.device_get(metrics)
    assert int(metrics["skipped"]) == 1 and int(state.step) == 1
    # the skipped step changed nothing, so the applied one ran from the initial params
    alone = Learner(CFG, dataclasses.replace(UCFG, num_minibatches=1))
    ref_state, ref = alone.update(alone.init(_params()),
                                  jax.tree.map(lambda x: x[1 - poisoned::2], batch))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5),
                 jax.device_get(state.params), jax.device_get(ref_state.params))
    assert_metrics_close(metrics, jax.device_get(ref),
                         skip=("skipped", "reward_mean", "advantage_abs_mean"))
    assert int(ref["skipped"]) == 0
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "advantage_abs_mean")


def test_frozen_reference_passes_through_with_kl():
    cfg = UpdateConfig(loss=LossConfig("grpo", eps_low=0.2, eps_high=0.28, kl_beta=0.1),
                       optim=OptimConfig(name="adamw", learning_rate=1e-2, qk_clip_tau=0.0),
                       num_minibatches=2)
    learner = Learner(CFG, cfg)
    state, metrics = learner.update(learner.init(_params(), frozen={"reference": _params(1)}),
                                    make_batch())
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.frozen["reference"]), _params(1))
    assert float(metrics["kl_ref"]) > 0
    with pytest.raises(ValueError, match="reference"):
        learner.update(learner.init(_params()), make_batch())


def test_gspo_clipping_engages_after_the_first_minibatch():
    # paper GSPO (eps 3e-4 / 4e-4), 4 minibatches: the first is on-policy (ratio exactly 1,
    # no clipping; see test_losses), minibatches 2..4 see a moved policy and clip
    learner = Learner(CFG, UpdateConfig(optim=OptimConfig(learning_rate=1e-2), num_minibatches=4))
    metrics = learner.update(learner.init(_params()), make_batch())[1]
    assert float(metrics["clip_fraction"]) > 0.2


def test_bad_batch_size_is_a_clear_error(learner):
    batch = jax.tree.map(lambda x: x[:6], make_batch())
    with pytest.raises(ValueError, match="not divisible"):
        learner.update(learner.init(_params()), batch)


@pytest.mark.slow
def test_gspo_learns_a_bandit():
    """Prompt = one token; reward = fraction of 4 sampled tokens equal to TARGET."""
    target, G, prompts, n = 7, 8, 4, 4
    cfg = ModelConfig(vocab_size=16, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=16, intermediate_size=64, tie_embeddings=False)
    learner = Learner(cfg, UpdateConfig(optim=OptimConfig(learning_rate=2e-2), num_minibatches=2))
    sampler = Sampler(cfg, SamplingConfig(temperature=1.0, max_new_tokens=n))
    state = learner.init(init_params(cfg, jax.random.key(0)))
    prompt = jnp.repeat(jnp.arange(1, prompts + 1), G)[:, None]       # [32, 1]
    groups = jnp.repeat(jnp.arange(prompts), G)
    rewards_seen = []
    for step in range(25):
        out = sampler(state.params, prompt, key=jax.random.key(step))
        rewards = jnp.mean(out.tokens == target, axis=1)
        rewards_seen.append(float(rewards.mean()))
        tokens = jnp.concatenate([prompt, out.tokens], axis=1)
        loss_mask = jnp.concatenate([jnp.zeros_like(prompt, bool), out.token_mask], axis=1)
        logps = jnp.concatenate([jnp.zeros(prompt.shape), out.logprobs], axis=1)
        batch = TrajectoryBatch.create(tokens, loss_mask, grpo_advantages(rewards, groups),
                                       sampler_logprobs=logps, group_ids=groups, rewards=rewards)
        state, _ = learner.update(state, batch)
    assert np.mean(rewards_seen[:3]) < 0.2
    assert np.mean(rewards_seen[-3:]) > 0.6, rewards_seen


@pytest.mark.slow
def test_shared_head_equals_the_whole_rows():
    """Rows that open with the same ids, the head given once (``update(head=)``: one
    cascade forward of it per pass), update the params exactly as the whole rows do:
    microbatches, chunked log-probs, QK-Clip (the head's attention logits count) and the
    reference's log-probs (KL) included."""
    P = 6
    tail = make_ragged_batch()
    head = np.random.RandomState(3).randint(0, CFG.vocab_size, P)
    pad = lambda x, v: jnp.concatenate([jnp.full((B, P), v, x.dtype), x], axis=1)   # noqa: E731
    whole = tail.replace(tokens=jnp.concatenate([jnp.tile(jnp.asarray(head, jnp.int32), (B, 1)), tail.tokens], 1),
                         token_mask=pad(tail.token_mask, True), loss_mask=pad(tail.loss_mask, False),
                         sampler_logprobs=pad(tail.sampler_logprobs, 0.0))
    assert shared_head(whole.tokens, whole.token_mask, whole.loss_mask) == P
    assert shared_head(whole.tokens, whole.token_mask, whole.loss_mask, multiple=4) == 4
    got_head, rest = whole.split_head(P)
    np.testing.assert_array_equal(got_head, head)
    jax.tree.map(np.testing.assert_array_equal, rest, tail)
    optim = dataclasses.replace(UCFG.optim, learning_rate=1e-2, qk_clip_tau=2.5)
    loss = MICRO_LOSSES[1]                   # with a KL term: the reference's log-probs use the head too
    runs = []
    cube = make_mesh(MeshConfig(2, 2, 2))
    for batch, h, mesh in ((whole, None, None), (rest, got_head, None), (rest, got_head, cube)):
        learner = Learner(CFG, dataclasses.replace(UCFG, loss=loss, optim=optim, logits_chunk=4), mesh=mesh)
        state = learner.init(_params(), frozen={"reference": _params(1)} if loss.kl_beta else None)
        runs.append(jax.device_get(learner.update(state, batch, head=h)))
    (state1, metrics1) = runs[0]
    for state2, metrics2 in runs[1:]:      # one device, and rows split over a 2x2x2 mesh
        # float32, the head's softmax merged with the rows' (another summation order): 5e-5
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4), state2.params,
                     state1.params)
        assert_metrics_close(metrics2, metrics1)
    assert float(metrics1["qk_clip_heads"]) > 0
