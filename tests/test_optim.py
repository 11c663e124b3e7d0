"""Muon against an independent Newton-Schulz reference; QK-Clip by recomputed forward passes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import MuonDimensionNumbers

from swarmjax.models import ModelConfig, init_params
from swarmjax.models.transformer import forward_jit
from swarmjax.optim import OptimConfig, make_optimizer, muon_dimension_numbers, qk_clip

A, B_, C = 3.4445, -4.7750, 2.0315


def np_newton_schulz(g, steps=5):
    """Quintic NS on G / ||G||_F, transposing tall matrices (float64)."""
    x = g / (np.linalg.norm(g) + 1e-8)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        a = x @ x.T
        x = A * x + (B_ * a + C * a @ a) @ x
    return x.T if tall else x


def np_muon_steps(grads, lr, beta=0.95, rms=0.2):
    """Updates of Muon with optax's bias-corrected Nesterov momentum."""
    mu, out = np.zeros_like(grads[0]), []
    for t, g in enumerate(grads, start=1):
        mu = beta * mu + (1 - beta) * g
        m_hat = beta * mu / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta ** t)
        out.append(-lr * rms * np.sqrt(max(g.shape)) * np_newton_schulz(m_hat))
    return out


@pytest.mark.parametrize("shape", [(16, 24), (24, 16)])
def test_muon_matches_numpy_newton_schulz(shape):
    r = np.random.RandomState(0)
    grads = [r.randn(*shape), r.randn(*shape)]
    cfg = OptimConfig(learning_rate=0.01, max_grad_norm=0.0)
    opt = make_optimizer(cfg, lambda p: {"w": MuonDimensionNumbers(0, 1), "b": None})
    params = {"w": jnp.zeros(shape), "b": jnp.zeros(shape[1])}
    state = opt.init(params)
    ref = np_muon_steps(grads, 0.01)
    for g, expect in zip(grads, ref):
        upd, state = opt.update({"w": jnp.asarray(g, jnp.float32), "b": jnp.ones(shape[1])},
                                state, params)
        np.testing.assert_allclose(upd["w"], expect, rtol=2e-3, atol=1e-6)
    # NS output is near-orthogonal: singular values within the quintic's band
    sv = np.linalg.svd(np_newton_schulz(grads[0]), compute_uv=False)
    assert sv.min() > 0.5 and sv.max() < 1.3


def test_transformer_params_are_labelled_and_orthogonalised_per_layer():
    cfg = ModelConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=4, intermediate_size=24, tie_embeddings=False)
    params = init_params(cfg, jax.random.key(0))
    dims = muon_dimension_numbers(params)
    assert dims["embed"] is None and dims["lm_head"] is None
    assert dims["final_norm"]["scale"] is None and dims["layers"]["attn"]["q_norm"]["scale"] is None
    assert dims["layers"]["attn"]["q_proj"] == MuonDimensionNumbers((1,), (2, 3))
    assert dims["layers"]["mlp"]["down_proj"] == MuonDimensionNumbers((1,), (2,))

    opt = make_optimizer(OptimConfig(learning_rate=0.1, max_grad_norm=0.0))
    r = np.random.RandomState(1)
    grads = jax.tree.map(lambda x: jnp.asarray(r.randn(*x.shape), jnp.float32), params)
    upd, _ = opt.update(grads, opt.init(params), params)
    # layer 0 of q_proj [L, D, H, hd] is NS of its own [D, H*hd] matrix (not of the stack)
    g0 = np.asarray(grads["layers"]["attn"]["q_proj"][0]).reshape(16, 16)
    expect = np_muon_steps([g0], 0.1)[0].reshape(16, 4, 4)
    np.testing.assert_allclose(upd["layers"]["attn"]["q_proj"][0], expect, rtol=2e-3, atol=1e-6)
    # o_proj [L, H, hd, D]: reduction over (H, hd)
    o1 = np.asarray(grads["layers"]["attn"]["o_proj"][1]).reshape(16, 16)
    np.testing.assert_allclose(upd["layers"]["attn"]["o_proj"][1],
                               np_muon_steps([o1], 0.1)[0].reshape(4, 4, 16), rtol=2e-3, atol=1e-6)
    # per-head option: each head's [D, hd] slice on its own
    opt_h = make_optimizer(OptimConfig(learning_rate=0.1, max_grad_norm=0.0, muon_per_head=True))
    upd_h, _ = opt_h.update(grads, opt_h.init(params), params)
    gh = np.asarray(grads["layers"]["attn"]["q_proj"][0, :, 2, :])
    np.testing.assert_allclose(upd_h["layers"]["attn"]["q_proj"][0, :, 2, :],
                               np_muon_steps([gh], 0.1)[0], rtol=2e-3, atol=1e-6)
    # embeddings take AdamW; optax's muon runs that group with Nesterov momentum (NAdamW),
    # so the first step is -lr * (1 + b1 / (1 + b1)) * sign(g)
    np.testing.assert_allclose(upd["embed"], -0.1 * (1 + 0.9 / 1.9) * np.sign(grads["embed"]),
                               rtol=1e-4)


def test_adamw_registry_and_bad_names():
    opt = make_optimizer(OptimConfig(name="adamw", learning_rate=0.1, max_grad_norm=0.0))
    p = {"w": jnp.ones((3, 3))}
    upd, _ = opt.update({"w": jnp.full((3, 3), 2.0)}, opt.init(p), p)
    np.testing.assert_allclose(upd["w"], -0.1, rtol=1e-4)
    with pytest.raises(ValueError, match="unknown optimizer"):
        OptimConfig(name="lion")


# ------------------------------------------------------------------ QK-Clip

TAU = 100.0


def _explode(params, cfg, layer, head_factors):
    """Scale chosen query heads of one layer (projection, or the shared q-norm)."""
    attn = params["layers"]["attn"]
    if cfg.qk_norm:
        scale = attn["q_norm"]["scale"].at[layer].multiply(head_factors)
        return {**params, "layers": {**params["layers"], "attn": {**attn, "q_norm": {"scale": scale}}}}
    f = jnp.ones(cfg.num_heads).at[jnp.arange(cfg.num_heads)].set(head_factors)
    q = attn["q_proj"].at[layer].multiply(f[None, :, None])
    b = attn["q_bias"].at[layer].multiply(f[:, None])
    return {**params, "layers": {**params["layers"], "attn": {**attn, "q_proj": q, "q_bias": b}}}


def _max_logits(params, cfg, tokens):
    return np.asarray(forward_jit(params, cfg, tokens, return_max_logits=True).max_logits)


def test_qk_clip_per_head_under_gqa():
    # Llama-style (no qk-norm) with 2 query heads per kv head, and q/k biases
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, intermediate_size=48, qk_norm=False, attention_bias=True)
    params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x + 0.1, init_params(cfg, jax.random.key(0)))
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, (3, 12)))
    base = _max_logits(params, cfg, tokens)
    assert base.max() < TAU
    # last layer: head 0 explodes (its group-mate head 1 does not); heads 2, 3 both explode
    factors = np.ones(4)
    for h, target in ((0, 4 * TAU), (2, 2 * TAU), (3, 3 * TAU)):
        factors[h] = target / base[1, h]     # q (and its bias) x f -> that head's logits x f
    factors = jnp.asarray(factors)
    hot = _explode(params, cfg, 1, factors)
    before = _max_logits(hot, cfg, tokens)
    assert (before[1, [0, 2, 3]] > TAU).all() and before[1, 1] < TAU
    clipped, metrics = qk_clip(hot, jnp.asarray(before), cfg, tau=TAU, alpha=0.5)
    after = _max_logits(clipped, cfg, tokens)
    assert int(metrics["qk_clip_heads"]) == 3
    np.testing.assert_allclose(after[1, [0, 2, 3]], TAU, rtol=1e-4)      # clipped to exactly tau
    np.testing.assert_allclose(after[1, 1], before[1, 1], rtol=1e-5)      # group-mate unchanged
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6)            # other layer untouched
    # the key of group 1 took gamma_min^(1-alpha), its query heads the rest
    k0 = np.asarray(hot["layers"]["attn"]["k_proj"][1])
    k1 = np.asarray(clipped["layers"]["attn"]["k_proj"][1])
    gmin = TAU / before[1, 2:4].max()
    np.testing.assert_allclose(k1[:, 1], k0[:, 1] * gmin ** 0.5, rtol=1e-5)


def test_qk_clip_with_qk_norm_is_per_layer():
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, intermediate_size=48)
    params = init_params(cfg, jax.random.key(1))
    tokens = jnp.asarray(np.random.RandomState(1).randint(0, 64, (3, 12)))
    base = _max_logits(params, cfg, tokens)
    hot = _explode(params, cfg, 1, jnp.full((cfg.head_dim,), 3 * TAU / base[1].max()))
    before = _max_logits(hot, cfg, tokens)
    assert before[1].max() > TAU
    clipped, _ = qk_clip(hot, jnp.asarray(before), cfg, tau=TAU, alpha=0.5)
    after = _max_logits(clipped, cfg, tokens)
    assert after.max() <= TAU * (1 + 1e-4)
    np.testing.assert_allclose(after[1].max(), TAU, rtol=1e-4)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6)
    # nothing over tau: identity
    same, m = qk_clip(params, jnp.asarray(base), cfg, tau=TAU, alpha=0.5)
    jax.tree.map(np.testing.assert_array_equal, same, params)
    assert int(m["qk_clip_heads"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["muon", "adamw"])
def test_bfloat16_params_keep_a_float32_optimizer_state(name):
    """bf16 params and compute: the optimizer's state and arithmetic stay float32 and the
    update equals the float32 optimizer's on the same (bf16-representable) values,
    cast to bf16; the params stay bf16 through a learner step."""
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                      intermediate_size=64, param_dtype="bfloat16", dtype="bfloat16")
    params = init_params(cfg, jax.random.key(0))
    grads = jax.tree.map(lambda p: (jax.random.normal(jax.random.key(1), p.shape) * 0.1).astype(p.dtype), params)
    ocfg = OptimConfig(name=name, learning_rate=1e-2)
    opt = make_optimizer(ocfg)
    state = opt.init(params)
    assert all(x.dtype != jnp.bfloat16 for x in jax.tree.leaves(state))
    upd, state = opt.update(grads, state, params)
    assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(upd))
    ref_opt = make_optimizer(dataclasses.replace(ocfg, float32_state=False))
    f32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)
    ref, _ = ref_opt.update(f32(grads), ref_opt.init(f32(params)), f32(params))
    for a, b in zip(jax.tree.leaves(upd), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b.astype(jnp.bfloat16)))
    new = optax.apply_updates(params, upd)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(new))


@pytest.mark.slow
def test_distributed_muon_equals_optax_muon_and_the_single_device_update():
    """On one device the Muon here is ``optax.contrib.muon`` (to float rounding); on a (2, 2, 2) mesh,
    with the layers spread over the devices for Newton-Schulz (3 layers padded to 8),
    its updates equal the single-device ones to float tolerance, per layer and per head."""
    from optax.contrib import muon as optax_muon

    from swarmjax.models.transformer import param_logical_axes
    from swarmjax.optim import learning_rate_schedule
    from swarmjax.optim.muon import NS_COEFFS
    from swarmjax.sharding.mesh import MeshConfig, make_mesh, tree_shardings

    cfg_m = ModelConfig(vocab_size=32, hidden_size=16, num_layers=3, num_heads=4, num_kv_heads=2,
                        head_dim=4, intermediate_size=24)
    params = init_params(cfg_m, jax.random.key(0))
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2), devices=jax.devices()[:8])
    sharded = jax.device_put(params, tree_shardings(param_logical_axes(cfg_m), params, mesh))
    grads = [jax.tree.map(lambda x: jax.random.normal(jax.random.key(i), x.shape), params) for i in range(2)]
    for per_head in (False, True):
        cfg = OptimConfig(learning_rate=0.1, max_grad_norm=0.0, weight_decay=0.01, muon_per_head=per_head,
                          float32_state=False)
        reference = optax_muon(
            learning_rate=learning_rate_schedule(cfg), ns_coeffs=NS_COEFFS, ns_steps=5, beta=cfg.muon_beta,
            eps=cfg.eps, weight_decay=0.01, adam_b1=cfg.b1, adam_b2=cfg.b2, adam_weight_decay=0.01,
            consistent_rms=0.2, muon_weight_dimension_numbers=lambda p: muon_dimension_numbers(p, per_head))
        runs = [(reference, params), (make_optimizer(cfg), params), (make_optimizer(cfg, mesh=mesh), sharded)]
        updates = []
        for opt, p in runs:
            state, out = opt.init(p), []
            for g in grads:
                u, state = jax.jit(opt.update)(g, state, p)
                out.append(u)
            updates.append(out)
        # the same state tree as optax's (checkpoints restore across the two)
        assert jax.tree.structure(runs[0][0].init(params)) == jax.tree.structure(runs[1][0].init(params))
        for a, b in zip(jax.tree.leaves(updates[0]), jax.tree.leaves(updates[1])):   # optax merges the
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)   # per-head batch axes, we keep them apart
        for a, b in zip(jax.tree.leaves(updates[1]), jax.tree.leaves(updates[2])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
