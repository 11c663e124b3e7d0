"""Losses and advantages against NumPy references written from the formulas in docs/design.md
sections 7-8."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.rl import advantages as adv_lib
from swarmjax.rl.losses import LossConfig, chunked_token_logprobs, policy_loss, token_logprobs

B, T = 5, 6


# ------------------------------------------------------------------ NumPy reference


def np_loss(logp, old, A, mask, cfg, sampler=None, ref=None):
    """Written loop-by-loop from the formulas; float64."""
    el, eh = cfg.eps_low, cfg.eps_high
    clip = lambda r: min(max(r, 1 - el), 1 + eh)
    obj = np.zeros_like(logp)
    for i in range(logp.shape[0]):
        toks = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not toks:
            continue
        s_i = np.exp(np.mean([logp[i, t] - old[i, t] for t in toks]))
        for t in toks:
            a = A[i] if A.ndim == 1 else A[i, t]
            r = np.exp(logp[i, t] - old[i, t]) if cfg.name == "grpo" else s_i
            o = min(r * a, clip(r) * a)
            if cfg.is_cap:
                if cfg.is_level == "token":
                    w = np.exp(old[i, t] - sampler[i, t])
                else:
                    w = np.exp(np.mean([old[i, u] - sampler[i, u] for u in toks]))
                if cfg.is_mode == "truncate":
                    o *= min(w, cfg.is_cap)
                else:                                   # masked: out of [floor, cap] leaves the loss
                    o *= w if cfg.is_floor <= w <= cfg.is_cap else 0.0
            if cfg.kl_beta:
                d = ref[i, t] - logp[i, t]
                o -= cfg.kl_beta * (np.exp(d) - d - 1)
            obj[i, t] = o
    rows = [i for i in range(logp.shape[0]) if mask[i].any()]
    if cfg.aggregation == "seq_mean_token_mean":
        J = np.mean([obj[i][mask[i] > 0].mean() for i in rows])
    elif cfg.aggregation == "token_mean":
        J = obj[mask > 0].sum() / mask.sum()
    else:
        J = obj[mask > 0].sum() / (len(rows) * (cfg.norm_length or logp.shape[1]))
    return -J


def _inputs(seed, spread=0.3):
    r = np.random.RandomState(seed)
    old = -np.abs(r.randn(B, T)) - 0.5
    logp = old + spread * r.randn(B, T)
    mask = (r.rand(B, T) > 0.3).astype(np.float64)
    mask[0] = 0                  # fully masked row
    mask[1] = 0
    mask[1, 3] = 1               # length-1 sequence
    A = r.randn(B)
    sampler = old + 0.2 * r.randn(B, T)
    ref = old + 0.2 * r.randn(B, T)
    return logp, old, A, mask, sampler, ref


CONFIGS = [
    LossConfig("gspo"),
    LossConfig("gspo", eps_low=0.1, eps_high=0.15),
    LossConfig("gspo", eps_low=0.1, eps_high=0.15, aggregation="token_mean"),
    LossConfig("gspo_token", eps_low=0.1, eps_high=0.15),
    LossConfig("grpo", eps_low=0.2, eps_high=0.2),
    LossConfig("grpo", eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
    LossConfig("grpo", eps_low=0.2, eps_high=0.28, aggregation="seq_mean_token_sum_norm", norm_length=8),
    LossConfig("grpo", eps_low=0.2, eps_high=0.2, kl_beta=0.05),
    LossConfig("grpo", eps_low=0.2, eps_high=0.2, is_cap=1.1),
    LossConfig("gspo", eps_low=0.1, eps_high=0.15, is_cap=1.05, is_level="sequence"),
    LossConfig("grpo", eps_low=0.2, eps_high=0.2, is_cap=1.1, is_mode="mask", is_floor=0.9),
    LossConfig("gspo", eps_low=0.1, eps_high=0.15, is_cap=1.05, is_level="sequence", is_mode="mask"),
]


@pytest.mark.parametrize("cfg,seed", list(itertools.product(CONFIGS, [0, 1])),
                         ids=lambda x: x.name + "-" + x.aggregation if isinstance(x, LossConfig) else str(x))
def test_loss_value_and_gradient_match_numpy(cfg, seed):
    logp, old, A, mask, sampler, ref = _inputs(seed)
    f = lambda lp: policy_loss(lp, jnp.asarray(old), jnp.asarray(A), jnp.asarray(mask), cfg,
                               sampler_logp=jnp.asarray(sampler), ref_logp=jnp.asarray(ref))[0]
    ref_val = np_loss(logp, old, A, mask, cfg, sampler, ref)
    np.testing.assert_allclose(f(jnp.asarray(logp, jnp.float32)), ref_val, rtol=1e-4, atol=1e-6)
    grad = np.asarray(jax.grad(f)(jnp.asarray(logp, jnp.float32)))
    fd = np.zeros_like(logp)
    h = 1e-6
    for i, t in itertools.product(range(B), range(T)):
        up, dn = logp.copy(), logp.copy()
        up[i, t] += h
        dn[i, t] -= h
        fd[i, t] = (np_loss(up, old, A, mask, cfg, sampler, ref)
                    - np_loss(dn, old, A, mask, cfg, sampler, ref)) / (2 * h)
    np.testing.assert_allclose(grad, fd, atol=2e-4, rtol=1e-3)
    assert np.all(grad[mask == 0] == 0)      # nothing flows to unmasked tokens


@pytest.mark.parametrize("mode,level", [("truncate", "token"), ("mask", "token"), ("mask", "sequence")])
def test_importance_weight_metrics_match_numpy(mode, level):
    """The off-policy correction's figures against loops over the loss tokens: the mean
    weight, the fraction truncated or masked, and the k3 mismatch KL(pi_sampler || pi_old)."""
    logp, old, A, mask, sampler, _ = _inputs(4)
    sampler = old + 0.3 * np.random.RandomState(5).randn(B, T)        # a wider mismatch: both bounds bind
    cfg = LossConfig("grpo", eps_low=0.2, eps_high=0.2, is_cap=1.1, is_floor=0.8 if mode == "mask" else 0.0,
                     is_mode=mode, is_level=level)
    _, m = policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old), jnp.asarray(A), jnp.asarray(mask), cfg,
                       sampler_logp=jnp.asarray(sampler))
    ws, changed, kls = [], [], []
    for i, t in zip(*np.nonzero(mask)):
        toks = np.nonzero(mask[i])[0]
        rho = np.exp(old[i, t] - sampler[i, t]) if level == "token" else np.exp(np.mean(old[i, toks] - sampler[i, toks]))
        out = rho > 1.1 or (mode == "mask" and rho < 0.8)
        ws.append((1.1 if mode == "truncate" else 0.0) if out else rho)
        changed.append(out)
        d = old[i, t] - sampler[i, t]
        kls.append(np.exp(d) - d - 1)
    assert 0 < np.mean(changed) < 1                               # the check is not vacuous
    np.testing.assert_allclose(m["is_weight_mean"], np.mean(ws), rtol=1e-5)
    np.testing.assert_allclose(m["is_clipped_fraction"], np.mean(changed), rtol=1e-6)
    np.testing.assert_allclose(m["mismatch_kl"], np.mean(kls), rtol=1e-4)
    logged = policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old), jnp.asarray(A), jnp.asarray(mask),
                         LossConfig("grpo", log_mismatch=True), sampler_logp=jnp.asarray(sampler))[1]
    np.testing.assert_allclose(logged["mismatch_kl"], np.mean(kls), rtol=1e-4)
    assert "is_weight_mean" not in logged                           # logged, not corrected


def test_gspo_token_equals_gspo_for_sequence_advantages():
    logp, old, A, mask, _, _ = _inputs(3)
    args = (jnp.asarray(old), jnp.asarray(A), jnp.asarray(mask))
    for eps in (0.1, 3e-4):
        fs = [lambda lp, n=n: policy_loss(lp, *args, LossConfig(n, eps_low=eps, eps_high=eps))[0]
              for n in ("gspo", "gspo_token")]
        x = jnp.asarray(logp, jnp.float32)
        np.testing.assert_allclose(fs[0](x), fs[1](x), rtol=1e-6)
        np.testing.assert_allclose(jax.grad(fs[0])(x), jax.grad(fs[1])(x), atol=1e-6)


def test_on_policy_gspo_gradient_is_advantage_weighted_mean_logprob():
    # at pi_theta = pi_old the clip is inactive and dJ/dlogp = A_i / |y_i| / n_seqs
    logp, _, A, mask, _, _ = _inputs(4)
    g = jax.grad(lambda lp: policy_loss(lp, jnp.asarray(logp), jnp.asarray(A), jnp.asarray(mask),
                                        LossConfig("gspo"))[0])(jnp.asarray(logp, jnp.float32))
    n = mask.sum(1, keepdims=True)
    rows = (n[:, 0] > 0).sum()
    expect = -np.where(mask > 0, A[:, None] / np.maximum(n, 1) / rows, 0)
    np.testing.assert_allclose(g, expect, rtol=1e-5, atol=1e-7)


def test_clip_metrics_and_engagement():
    logp, old, A, mask, _, _ = _inputs(5, spread=0.0)
    cfg = LossConfig("gspo")
    _, m = policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(A), jnp.asarray(mask), cfg)
    assert float(m["clip_fraction"]) == 0 and abs(float(m["ratio_mean"]) - 1) < 1e-6
    moved = logp + 0.01 * np.sign(A)[:, None]          # every ratio moved past 1 +- 4e-4
    _, m = policy_loss(jnp.asarray(moved), jnp.asarray(old), jnp.asarray(A), jnp.asarray(mask), cfg)
    assert float(m["clip_fraction"]) == 1.0 and float(m["approx_kl"]) > 0


def test_microbatch_totals_make_losses_additive():
    logp, old, A, mask, _, _ = _inputs(6)
    for agg in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"):
        cfg = LossConfig("grpo", eps_low=0.2, eps_high=0.2, aggregation=agg)
        full = policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(A), jnp.asarray(mask), cfg)[0]
        from swarmjax.rl.losses import batch_totals
        totals = batch_totals(jnp.asarray(mask))
        parts = sum(policy_loss(jnp.asarray(logp[s]), jnp.asarray(old[s]), jnp.asarray(A[s]),
                                jnp.asarray(mask[s]), cfg, totals=totals)[0]
                    for s in (slice(0, 2), slice(2, 5)))
        np.testing.assert_allclose(parts, full, rtol=1e-6)


def test_token_logprobs_alignment():
    r = np.random.RandomState(0)
    logits = r.randn(2, 4, 7).astype(np.float32)
    tokens = r.randint(0, 7, (2, 4))
    got = np.asarray(token_logprobs(jnp.asarray(logits), jnp.asarray(tokens)))
    assert (got[:, 0] == 0).all()
    for b, t in itertools.product(range(2), range(1, 4)):
        l = logits[b, t - 1].astype(np.float64)
        np.testing.assert_allclose(got[b, t], l[tokens[b, t]] - np.log(np.exp(l).sum()), rtol=1e-5)


def test_presets():
    from swarmjax.rl.losses import loss_preset
    dapo = loss_preset("dapo", kl_beta=0.01)
    assert (dapo.name, dapo.eps_high, dapo.aggregation, dapo.kl_beta) == ("grpo", 0.28, "token_mean", 0.01)
    assert loss_preset("gspo") == LossConfig()
    with pytest.raises(ValueError, match="unknown loss preset"):
        loss_preset("ppo")


def test_bad_loss_config():
    for bad in (dict(name="ppo2"), dict(aggregation="sum"), dict(is_level="row"), dict(eps_low=1.0)):
        with pytest.raises(ValueError):
            LossConfig(**bad)


# ------------------------------------------------------------------ advantages


def test_group_advantages_match_numpy():
    r = np.random.RandomState(0)
    rewards = r.rand(9).astype(np.float32)
    groups = np.array([7, 7, 7, 3, 3, 3, 100, 100, 42])       # arbitrary ids, a singleton
    rewards[3:6] = 0.5                                        # zero-variance group
    got = {k: np.asarray(adv_lib.compute_advantages(k, jnp.asarray(rewards), jnp.asarray(groups)))
           for k in adv_lib.ADVANTAGES}
    expect_grpo, expect_dr = np.zeros(9), np.zeros(9)
    for g in np.unique(groups):
        idx = groups == g
        expect_dr[idx] = rewards[idx] - rewards[idx].mean()
        std = rewards[idx].std()
        expect_grpo[idx] = expect_dr[idx] / (std + 1e-6) if std > 0 else 0
    np.testing.assert_allclose(got["grpo"], expect_grpo, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["drgrpo"], expect_dr, atol=1e-6)
    np.testing.assert_allclose(got["batch_std"], expect_dr / (expect_dr.std() + 1e-6), rtol=1e-4, atol=1e-6)
    assert (got["grpo"][3:6] == 0).all() and got["grpo"][8] == 0
    assert all(np.isfinite(v).all() for v in got.values())
    with pytest.raises(ValueError, match="unknown advantage"):
        adv_lib.compute_advantages("ppo", jnp.asarray(rewards), jnp.asarray(groups))


def test_uniform_groups_and_overlong():
    rewards = jnp.asarray([1.0, 1.0, 0.0, 1.0, 0.3, 0.3])
    groups = jnp.asarray([0, 0, 1, 1, 2, 2])
    assert adv_lib.uniform_groups(rewards, groups).tolist() == [True, True, False, False, True, True]
    pen = adv_lib.overlong_penalty(jnp.asarray([10, 16, 18, 20, 25]), max_length=20, cache_length=4)
    np.testing.assert_allclose(pen, [0, 0, -0.5, -1.0, -1.0])


def test_chunked_token_logprobs_equal_the_full_ones_with_their_gradients():
    """Log-probs a chunk of positions at a time (T - 1 = 12 positions in chunks of 5:
    the last one padded) equal log_softmax of the full logits, and so do the gradients
    with respect to the hidden states and the head."""
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(3, 13, 8)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(8, 50)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 50, (3, 13)), jnp.int32)
    w = jnp.asarray(rng.normal(size=(3, 13)), jnp.float32)
    full = lambda h, W: token_logprobs(jnp.einsum("btd,dv->btv", h, W), tokens)
    chunked = lambda h, W: chunked_token_logprobs(h, W, tokens, chunk=5)
    np.testing.assert_allclose(chunked(hidden, head), full(hidden, head), rtol=1e-5, atol=1e-5)
    g_full = jax.grad(lambda h, W: jnp.sum(full(h, W) * w), argnums=(0, 1))(hidden, head)
    g_chunk = jax.grad(lambda h, W: jnp.sum(chunked(h, W) * w), argnums=(0, 1))(hidden, head)
    for a, b in zip(g_full, g_chunk):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", [LossConfig("gspo"), LossConfig("grpo", eps_low=0.2, eps_high=0.28),
                                 LossConfig("grpo", eps_low=0.2, eps_high=0.28, aggregation="token_mean")],
                         ids=lambda c: c.name + "-" + c.aggregation)
def test_segment_weights_folded_into_the_advantage_weigh_each_row_exactly(cfg):
    """ReSum-GRPO's rows: episode e split into K_e + 1 segment rows sharing its advantage.
    Folding a segment weight into the advantage scales that row's term of J by exactly the
    weight (NumPy reference: each row's own objective, weighted, over the batch's
    normaliser); "episode" weights sum to 1 per episode, and an episode never compacted
    has weight 1 under both choices (the plain GRPO/GSPO row)."""
    from swarmjax.train.agent import SEGMENT_WEIGHTS
    from swarmjax.train.agent_rl import segment_weights

    logp, old, _, mask, _, _ = _inputs(3)
    mask[0, 0] = mask[1, 1] = 1                       # every row has loss tokens
    episode = np.array([0, 0, 1, 2, 2])               # rows -> episode: K = 1, 0, 1
    A = np.array([0.8, -1.3, 0.5])
    K = np.bincount(episode) - 1
    n_rows, n_tok = len(episode), mask.sum()
    never = np.zeros(4, int)                          # no compaction: weight 1 either way
    assert segment_weights(never, "segment").tolist() == segment_weights(never, "episode").tolist() == [1.0] * 4
    for mode in SEGMENT_WEIGHTS:
        w = segment_weights(K, mode)
        np.testing.assert_allclose(np.bincount(episode, w[episode]), K + 1.0 if mode == "segment" else 1.0)
        loss, _ = policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray((A * w)[episode]), jnp.asarray(mask),
                              cfg)
        rows = [-np_loss(logp[i:i + 1], old[i:i + 1], A[episode[i:i + 1]], mask[i:i + 1], cfg) for i in range(n_rows)]
        if cfg.aggregation == "token_mean":           # row i's mean over its tokens, back to a sum over N_tok
            J = sum(w[episode[i]] * rows[i] * mask[i].sum() for i in range(n_rows)) / n_tok
        else:
            J = sum(w[episode[i]] * rows[i] for i in range(n_rows)) / n_rows
        np.testing.assert_allclose(float(loss), -J, rtol=1e-5, atol=1e-6)


def test_auto_logits_chunk_keeps_a_chunk_within_its_budget():
    from swarmjax.rl.losses import LOGITS_CHUNK_BYTES, auto_logits_chunk

    assert auto_logits_chunk(16, 151936) == 27 and 4 * 16 * 27 * 151936 <= LOGITS_CHUNK_BYTES
    assert auto_logits_chunk(32, 512) == 4096 and auto_logits_chunk(1 << 20, 151936) == 1
