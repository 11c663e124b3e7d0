"""LoRA adapters over the frozen base: the forward equals the merged model's, each row of
a batch uses its own adapter (or the bare base), in training and in a cached decode."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.models.config import LoraConfig, ModelConfig
from swarmjax.models.lora import init_lora, merge
from swarmjax.models.transformer import forward, init_cache, init_params, param_logical_axes

BASE = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                   intermediate_size=48)
CFG = BASE.replace(lora=LoraConfig(rank=4, alpha=8.0))


def _with(params, key, n):
    """``params`` with ``n`` adapters of non-zero B (a fresh one adds nothing)."""
    lora = init_lora(CFG, key, adapters=n)
    noise = lambda path, x: x if path[-1].key.endswith("_clip") else \
        x + 0.05 * jax.random.normal(jax.random.fold_in(key, x.size), x.shape)
    return {**params, "lora": jax.tree_util.tree_map_with_path(noise, lora)}


def test_fresh_adapters_add_nothing_and_trained_ones_equal_the_merged_model():
    fresh = init_params(CFG, jax.random.key(0))
    params = {k: v for k, v in fresh.items() if k != "lora"}
    np.testing.assert_array_equal(params["embed"], init_params(BASE, jax.random.key(0))["embed"])
    assert fresh["lora"]["attn"]["q_proj"]["a"].shape == (2, 1, 32, 4)
    assert fresh["lora"]["attn"]["o_proj"]["b"].shape == (2, 1, 4, 32)
    axes = param_logical_axes(CFG)["lora"]["attn"]
    assert tuple(axes["q_proj"]["b"]) == ("layers", "adapters", "lora_rank", "heads", "head_dim")
    assert tuple(axes["o_proj"]["a"]) == ("layers", "adapters", "heads", "head_dim", "lora_rank")
    tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, CFG.vocab_size)
    base = forward(params, BASE, tokens).logits
    np.testing.assert_array_equal(forward(fresh, CFG, tokens).logits, base)
    adapted = _with(params, jax.random.key(3), 1)
    got = forward(adapted, CFG, tokens).logits
    want = forward(merge(adapted, CFG), BASE, tokens).logits
    assert float(jnp.abs(got - base).max()) > 1e-2                  # the adapters do something
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_each_row_uses_its_own_adapter_in_training_and_in_a_cached_decode():
    """Rows with adapters 0, 1 and -1 (the bare base) in one batch give what each merged
    model gives alone, for a whole-sequence forward and for a prefill then decode steps."""
    params = _with(init_params(BASE, jax.random.key(0)), jax.random.key(4), 2)
    tokens = jax.random.randint(jax.random.key(5), (3, 9), 0, CFG.vocab_size)
    adapter = jnp.array([1, -1, 0])
    models = {i: merge(params, CFG, index=i) for i in (0, 1)}
    models[-1] = {k: v for k, v in params.items() if k != "lora"}
    want = jnp.stack([forward(models[int(i)], BASE, tokens[b:b + 1]).logits[0] for b, i in enumerate(adapter)])
    got = forward(params, CFG, tokens, adapter=adapter).logits
    np.testing.assert_allclose(got, want, atol=2e-5)
    # prefill 6 ids, then 3 single-id steps through the cache
    cache = init_cache(CFG, 3, 16)
    out = forward(params, CFG, tokens[:, :6], cache=cache, cache_index=0, adapter=adapter)
    steps = [out.logits[:, -1]]
    for t in range(6, 9):
        out = forward(params, CFG, tokens[:, t:t + 1], cache=out.cache, cache_index=t, adapter=adapter,
                      positions=jnp.full((3, 1), t))
        steps.append(out.logits[:, -1])
    np.testing.assert_allclose(jnp.stack(steps[:-1], 1), want[:, 5:8], atol=2e-5)


def test_gradients_reach_only_the_adapters_and_dropout_needs_a_key():
    params = init_params(CFG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(7), (2, 5), 0, CFG.vocab_size)

    def loss(params, key=None, cfg=CFG):
        return forward(params, cfg, tokens, lora_key=key).logits.mean()
    grads = jax.grad(loss)(params)
    assert float(jnp.abs(grads["lora"]["mlp"]["down_proj"]["b"]).sum()) > 0   # B gets a gradient at once
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves({k: v for k, v in grads.items() if k != "lora"}))
    drop = CFG.replace(lora=dataclasses.replace(CFG.lora, dropout=0.5))
    trained = _with(params, jax.random.key(8), 1)
    assert loss(trained, None, drop) == loss(trained, None, CFG)           # no key: no dropout
    assert loss(trained, jax.random.key(9), drop) != loss(trained, None, drop)


def test_bad_lora_configs_are_one_line_errors():
    with pytest.raises(ValueError, match="rank must be an int >= 1"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="'qkv' matches no module"):
        LoraConfig(targets=("q_proj", "qkv"))
    with pytest.raises(ValueError, match="mixture of experts"):
        BASE.replace(num_experts=4, experts_per_token=2, moe_intermediate_size=16,
                     lora=LoraConfig(targets=("q_proj", "up_proj")))
    with pytest.raises(ValueError, match="params hold no adapters"):
        forward(init_params(BASE, jax.random.key(0)), CFG, jnp.zeros((1, 2), jnp.int32))


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_a_training_step_moves_only_the_adapters(name):
    """Warm-start steps on a LoRA model: the base weights stay bit for bit, the adapters
    move (B at once, A from the second step), and the optimizer (``lora.optimizer``, not
    the job's) holds state for the adapters alone."""
    from swarmjax.optim import OptimConfig
    from swarmjax.train.sft import sft_step

    cfg = CFG.replace(lora=dataclasses.replace(CFG.lora, optimizer=name))      # the adapters' own optimizer
    params = init_params(cfg, jax.random.key(0))
    new_params, opt_state, step = sft_step(params, cfg, OptimConfig(name="muon" if name == "adamw" else "adamw",
                                                                    learning_rate=1e-2), roles=("agent",))
    state_leaves = sum(x.size for x in jax.tree.leaves(opt_state) if hasattr(x, "size") and x.ndim)
    trained = sum(x.size for k, x in jax.tree_util.tree_leaves_with_path(params["lora"]) if k[-1].key in "ab")
    moments = {"adamw": 2, "muon": 1}[name] * trained                # of the adapters only, by lora.optimizer
    assert moments <= state_leaves <= moments + 8
    tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, CFG.vocab_size)
    ones = jnp.ones((2, 6), bool)
    after, opt_state, _ = step(new_params, opt_state, (tokens, ones, ones))
    after, _, _ = step(after, opt_state, (tokens, ones, ones))       # A moves once B is not zero
    for k in ("embed", "final_norm", "layers"):
        jax.tree.map(np.testing.assert_array_equal, after[k], params[k])
    moved = jax.tree_util.tree_map_with_path(lambda p, a, b: (p[-1].key, float(jnp.abs(a - b).max())),
                                             after["lora"], params["lora"])
    moved = jax.tree.leaves(moved, is_leaf=lambda x: isinstance(x, tuple))
    assert all(m > 0 for k, m in moved if k in "ab") and all(m == 0 for k, m in moved if k.endswith("_clip"))


@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_clip_rescales_the_merged_model_and_leaves_the_base(qk_norm):
    """QK-Clip on a LoRA model lowers its per-head query/key factors, not the frozen
    weights, and the merged model equals QK-Clip applied to the merged weights."""
    from swarmjax.optim import qk_clip

    cfg = CFG.replace(qk_norm=qk_norm)
    params = _with(init_params(cfg.replace(lora=None), jax.random.key(0)), jax.random.key(10), 1)
    params["lora"]["attn"].update(q_clip=jnp.ones((2, 4)), k_clip=jnp.ones((2, 2)))
    max_logits = jnp.array([[50.0, 250.0, 10.0, 120.0], [5.0, 6.0, 7.0, 300.0]])    # [L, N]
    clipped, m = qk_clip(params, max_logits, cfg, tau=100.0)
    assert int(m["qk_clip_heads"]) == 3
    jax.tree.map(np.testing.assert_array_equal, clipped["layers"], params["layers"])
    base_cfg = cfg.replace(lora=None)
    want, _ = qk_clip(merge(params, cfg), max_logits, base_cfg, tau=100.0)
    tokens = jax.random.randint(jax.random.key(11), (2, 6), 0, CFG.vocab_size)
    np.testing.assert_allclose(forward(clipped, cfg, tokens).logits, forward(want, base_cfg, tokens).logits,
                               atol=2e-5)
    np.testing.assert_allclose(forward(merge(clipped, cfg), base_cfg, tokens).logits,
                               forward(want, base_cfg, tokens).logits, atol=2e-5)


def test_frozen_copies_are_the_adapters_alone_over_one_base():
    """A LoRA job's frozen trees (sub-agents, judge, KL reference) hold the adapters
    alone; the rollout's sub-agents are them over the trained policy's base arrays (held
    once), and a refresh copies the adapters."""
    from swarmjax.config_file import apply_overrides
    from swarmjax.rl.update import Learner
    from swarmjax.models.lora import over_base
    from swarmjax.train.agent_job import AgentJob, _frozen
    from swarmjax.train.agent_rl import rollout_params
    from swarmjax.train.subagents import refresh_subagents

    job = apply_overrides(AgentJob(role="orchestrator", lora=CFG.lora), ["rl.update.loss.kl_beta=0.01"])
    params = _with(init_params(CFG, jax.random.key(0)), jax.random.key(1), 1)
    frozen = _frozen(job, params)
    assert {k: set(v) for k, v in frozen.items()} == {"subagents": {"lora"}, "reference": {"lora"}}
    state = Learner(CFG, job.rl.update).init(params, frozen)
    roles = rollout_params(state)
    assert roles.subagents["layers"] is state.params["layers"] and roles.subagents["embed"] is state.params["embed"]
    assert roles.subagents["lora"] is state.frozen["subagents"]["lora"]
    moved = state.replace(params={**state.params, "lora": _with(params, jax.random.key(2), 1)["lora"]})
    fresh = refresh_subagents(moved, "subagents").frozen["subagents"]
    assert set(fresh) == {"lora"}
    jax.tree.map(np.testing.assert_array_equal, fresh["lora"], moved.params["lora"])
    # sub-agents on the bare base: their adapters add nothing (B zero); not with shared sub-agents
    based = dataclasses.replace(job, lora=dataclasses.replace(CFG.lora, subagents="base"))
    sub = over_base(_frozen(based, params)["subagents"], params)
    tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, CFG.vocab_size)
    np.testing.assert_array_equal(forward(sub, CFG, tokens).logits,
                                  forward({k: v for k, v in params.items() if k != "lora"}, BASE, tokens).logits)
    with pytest.raises(ValueError, match="shared sub-agents train the adapters"):
        dataclasses.replace(based, subagents="shared").validate()


def test_the_sampler_decodes_rows_of_several_adapters_in_one_batch():
    """Sampler(adapter=[B]): rows of two adapters (and the bare base) in one greedy decode
    give each row the ids and log-probs of its own merged model decoded alone."""
    from swarmjax.sampling import Sampler, SamplingConfig

    params = _with(init_params(BASE, jax.random.key(0)), jax.random.key(1), 2)
    prompts = np.asarray(jax.random.randint(jax.random.key(2), (3, 5), 1, BASE.vocab_size))
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    both = Sampler(CFG, greedy)(params, prompts, adapter=np.array([0, 1, -1]))
    alone = Sampler(BASE, greedy)
    for row, index in enumerate([0, 1, None]):
        merged = merge(params, CFG, index=index) if index is not None else \
            {k: v for k, v in params.items() if k != "lora"}
        want = alone(merged, prompts[row:row + 1])
        np.testing.assert_array_equal(both.tokens[row], want.tokens[0])
        np.testing.assert_allclose(both.logprobs[row], want.logprobs[0], atol=1e-4)
    with pytest.raises(ValueError, match="has no lora"):
        alone(params, prompts, adapter=np.array([0, 1, 0]))
