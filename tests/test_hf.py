"""Parity with Hugging Face transformers (random tiny models, no download)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from swarmjax.models.config import ModelConfig, YarnScaling  # noqa: E402
from swarmjax.models.hf import CheckpointError, config_from_hf, config_to_hf, from_hf, to_hf  # noqa: E402
from swarmjax.models.transformer import abstract_params, forward_jit, rope_attention_factor, rope_inv_freq  # noqa: E402
from swarmjax.sampling import Sampler, SamplingConfig, pad_prompts  # noqa: E402

COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=96,
              max_position_embeddings=256, initializer_range=0.2)

FAMILIES = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(tie_word_embeddings=False, rope_theta=1_000_000.0)),
    "qwen3_tied": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                   dict(tie_word_embeddings=True)),
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
               dict(tie_word_embeddings=False, attention_bias=True,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16})),
    # Qwen2 / Qwen2.5: biases on q, k, v (not o), no q/k norm
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=False, rope_theta=1_000_000.0, use_sliding_window=False)),
    "qwen2_tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                   dict(tie_word_embeddings=True)),
    # Qwen3-MoE: 8 experts, 2 a token, renormalised (as the released models set it)
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=32, norm_topk_prob=True)),
    # YaRN past a 16-position original context (TOKENS has 24; generation reaches 17)
    "qwen3_yarn": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                   dict(tie_word_embeddings=True, max_position_embeddings=64,
                        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 16})),
}


def _hf_model(name):
    config_cls, model_cls, extra = FAMILIES[name]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**COMMON, **extra})).eval()
    with torch.no_grad():  # non-trivial norm weights, so a swapped norm would show
        for n, p in model.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def hf_checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    # sharded save: exercises model.safetensors.index.json
    model.save_pretrained(path, max_shard_size="40KB")
    return request.param, model, str(path)


TOKENS = np.random.RandomState(0).randint(0, 128, (2, 24))


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def test_logits_match_transformers(hf_checkpoint):
    name, model, path = hf_checkpoint
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    cfg, params = from_hf(path)
    assert cfg.qk_norm == name.startswith("qwen3")
    assert (cfg.attention_bias, cfg.has_o_bias) == {"llama3": (True, True), "qwen2": (True, False),
                                                    "qwen2_tied": (True, False)}.get(name, (False, False))
    assert cfg.rope_type == {"llama3": "llama3", "qwen3_yarn": "yarn"}.get(name, "default")
    assert (cfg.num_experts, cfg.experts_per_token) == ((8, 2) if name == "qwen3_moe" else (0, 0))
    ours = forward_jit(params, cfg, jnp.asarray(TOKENS)).logits
    np.testing.assert_allclose(ours, _hf_logits(model, TOKENS), atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_transformers(hf_checkpoint):
    _, model, path = hf_checkpoint
    cfg, params = from_hf(path)
    prompts = [[3, 17, 99, 4, 60], [8, 1, 2], [120]]
    n = 12
    tokens, mask = pad_prompts(prompts)
    ours = Sampler(cfg, SamplingConfig(temperature=0.0, max_new_tokens=n))(params, tokens, prompt_mask=mask)
    with torch.no_grad():
        ref = model.generate(torch.tensor(tokens, dtype=torch.long),
                             attention_mask=torch.tensor(mask, dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    np.testing.assert_array_equal(np.asarray(ours.tokens), ref[:, tokens.shape[1]:].numpy())


def test_round_trip_through_transformers(hf_checkpoint, tmp_path):
    _, model, path = hf_checkpoint
    cfg, params = from_hf(path)
    to_hf(cfg, params, str(tmp_path))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path),
                                                                 dtype=torch.float32).eval()
    assert type(reloaded) is type(model)
    np.testing.assert_allclose(_hf_logits(reloaded, TOKENS), _hf_logits(model, TOKENS), atol=1e-5)
    # and back in: identical parameters
    cfg2, params2 = from_hf(str(tmp_path))
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_sharded_write_and_bfloat16_load(tmp_path, tiny_cfg, tiny_params):
    to_hf(tiny_cfg, tiny_params, str(tmp_path), max_shard_bytes=20_000)
    index = json.load(open(tmp_path / "model.safetensors.index.json"))
    assert len(set(index["weight_map"].values())) > 1
    cfg, params = from_hf(str(tmp_path), param_dtype="bfloat16")
    assert cfg.param_dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))


# ----------------------------------------------------------------- broken checkpoints


@pytest.fixture
def saved(tmp_path, tiny_cfg, tiny_params):
    to_hf(tiny_cfg, tiny_params, str(tmp_path))
    return tmp_path


def _rewrite(path, edit):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_tensor_is_named(saved):
    _rewrite(saved, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.weight'"):
        from_hf(str(saved))


def test_wrong_shape_is_named(saved):
    def edit(t):
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"].T.copy()
    _rewrite(saved, edit)
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight' has shape \(32, 64\), expected \(64, 32\)"):
        from_hf(str(saved))


def test_unexpected_tensor_is_named(saved):
    def edit(t):
        t["model.layers.2.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"]
    _rewrite(saved, edit)
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.2\.mlp\.up_proj\.weight'"):
        from_hf(str(saved))


def test_unknown_architecture(saved):
    cfg = json.load(open(saved / "config.json"))
    cfg["architectures"] = ["MixtralForCausalLM"]
    json.dump(cfg, open(saved / "config.json", "w"))
    with pytest.raises(CheckpointError, match="unknown architecture.*MixtralForCausalLM"):
        from_hf(str(saved))


def test_corrupt_file(saved):
    data = (saved / "model.safetensors").read_bytes()
    (saved / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        from_hf(str(saved))


def test_missing_weights_and_config(tmp_path, saved):
    with pytest.raises(CheckpointError, match="config.json"):
        from_hf(str(tmp_path / "nowhere"))
    os.remove(saved / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        from_hf(str(saved))


def _edit_config(path, edit):
    cfg = json.load(open(path / "config.json"))
    edit(cfg)
    json.dump(cfg, open(path / "config.json", "w"))


@pytest.mark.parametrize("field", ["num_attention_heads", "vocab_size", "hidden_size",
                                   "num_hidden_layers", "intermediate_size"])
def test_missing_config_field_names_field_and_file(saved, field):
    _edit_config(saved, lambda c: c.pop(field))
    with pytest.raises(CheckpointError) as e:
        from_hf(str(saved))
    assert str(e.value) == f"{saved / 'config.json'}: lacks required field {field!r}"


def test_bad_config_values_name_the_file(saved):
    config = str(saved / "config.json")
    _edit_config(saved, lambda c: c.update(rope_parameters={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(CheckpointError, match=f"^{config}: lacks required field "
                                              r"rope_scaling\.'low_freq_factor'$"):
        from_hf(str(saved))
    _edit_config(saved, lambda c: c.update(rope_parameters=None, num_attention_heads="4"))
    with pytest.raises(CheckpointError, match=f"^{config}: .*num_heads must be a positive int"):
        from_hf(str(saved))
    (saved / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match=f"^{config}: not valid JSON"):
        from_hf(str(saved))


def test_fused_expert_layout_loads_as_the_per_expert_one(tmp_path):
    """transformers' in-memory layout (gate_up_proj [E, 2F, D], down_proj [E, D, F]) reads
    as the Hub's per-expert one; a config with dense layers between is refused by name."""
    from safetensors.numpy import load_file, save_file
    _hf_model("qwen3_moe").save_pretrained(tmp_path)
    cfg, params = from_hf(str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for i in range(cfg.num_layers):
        base = f"model.layers.{i}.mlp.experts."
        per = {n: np.stack([tensors.pop(f"{base}{j}.{n}.weight") for j in range(cfg.num_experts)])
               for n in ("gate_proj", "up_proj", "down_proj")}
        tensors[base + "gate_up_proj"] = np.concatenate([per["gate_proj"], per["up_proj"]], axis=1)
        tensors[base + "down_proj"] = per["down_proj"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    jax.tree.map(np.testing.assert_array_equal, from_hf(str(tmp_path))[1], params)
    _edit_config(tmp_path, lambda c: c.update(decoder_sparse_step=2))
    with pytest.raises(CheckpointError, match="decoder_sparse_step=2"):
        from_hf(str(tmp_path))


# ----------------------------------------------------------------- Qwen2 biases, YaRN


def test_qwen2_biases_are_q_k_v_only(tiny_cfg):
    qwen2 = tiny_cfg.replace(qk_norm=False, attention_bias=True, o_bias=False)
    attn = abstract_params(qwen2)["layers"]["attn"]
    assert {"q_bias", "k_bias", "v_bias"} <= set(attn) and "o_bias" not in attn
    assert sum(x.size for x in jax.tree.leaves(abstract_params(qwen2))) == qwen2.num_params()
    hf = config_to_hf(qwen2)
    assert hf["architectures"] == ["Qwen2ForCausalLM"] and "attention_bias" not in hf
    assert config_from_hf(hf)[0] == qwen2
    with pytest.raises(CheckpointError, match="no Hugging Face family"):   # Qwen3 has all four or none
        config_to_hf(qwen2.replace(qk_norm=True))


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16,
     "beta_slow": 2, "truncate": False},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.707,
     "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "attention_factor": 0.9},
    {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 16},   # factor 64 / 16
])
def test_yarn_frequencies_and_attention_factor_match_transformers(rope):
    """Against transformers' own ``_compute_yarn_parameters`` (not our port of it)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hf_cfg = transformers.Qwen3Config(**{**COMMON, "max_position_embeddings": 64, "rope_scaling": dict(rope)})
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu")
    ours, _ = config_from_hf({**COMMON, "max_position_embeddings": 64, "rope_scaling": dict(rope),
                              "architectures": ["Qwen3ForCausalLM"]})
    assert ours.rope_type == "yarn" and isinstance(ours.rope_scaling, YarnScaling)
    np.testing.assert_allclose(rope_inv_freq(ours), inv.numpy(), rtol=1e-6)
    assert rope_attention_factor(ours) == pytest.approx(factor, rel=1e-12)
    assert config_from_hf(config_to_hf(ours))[0] == ours
    # the default attention factor: 0.1 ln(factor) + 1
    if set(rope) <= {"rope_type", "factor", "original_max_position_embeddings"}:
        assert factor == pytest.approx(0.1 * np.log(rope["factor"] or 64 / 16) + 1)


def test_yarn_config_is_hashable_and_validated():
    y = YarnScaling(factor=4.0, original_max_position_embeddings=16)
    cfg = ModelConfig(rope_type="yarn", rope_scaling=y)
    assert hash(cfg) == hash(ModelConfig(rope_type="yarn", rope_scaling=YarnScaling(4.0, 16)))
    with pytest.raises(ValueError, match="rope_type='yarn' needs"):
        ModelConfig(rope_type="yarn", rope_scaling=(4.0, 1.0, 4.0, 16))
    with pytest.raises(ValueError, match="rope_type='llama3' needs"):
        ModelConfig(rope_type="llama3", rope_scaling=y)


@pytest.mark.parametrize("edit, message", [
    (dict(use_sliding_window=True), "unsupported option use_sliding_window=true"),
    (dict(rope_parameters={"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}),
     "unsupported rope_type 'longrope'; supported: default, llama3, yarn"),
    (dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}),   # 4.x spelling
     "unsupported rope_type 'dynamic'"),
    (dict(partial_rotary_factor=0.5), "unsupported option partial_rotary_factor=0.5"),
    (dict(architectures=["Qwen2MoeForCausalLM"]), "unknown architecture"),
])
def test_unsupported_options_are_one_line_errors(tmp_path, edit, message):
    model = _hf_model("qwen2_tied")
    model.save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda c: c.update(edit))
    with pytest.raises(CheckpointError) as e:
        from_hf(str(tmp_path))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith(str(tmp_path / "config.json"))


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_a_peft_adapter_round_trip_matches_peft(name, tmp_path):
    """Adapters written as a PEFT directory (swarmjax.models.peft_io) load with
    ``peft.PeftModel.from_pretrained`` on the base checkpoint and give swarmjax's logits;
    read back they are the same adapters; the merged model is the same model too."""
    peft = pytest.importorskip("peft")
    from swarmjax.models.config import LoraConfig
    from swarmjax.models.lora import init_lora, merge
    from swarmjax.models.peft_io import read_peft, write_peft

    model = _hf_model(name)
    model.save_pretrained(tmp_path / "base")
    cfg, params = from_hf(str(tmp_path / "base"))
    cfg = cfg.replace(lora=LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "o_proj", "down_proj")))
    lora = init_lora(cfg, jax.random.key(1))
    lora = jax.tree_util.tree_map_with_path(          # non-zero B: the adapter changes the logits
        lambda p, x: x if p[-1].key.endswith("_clip") else x + 0.1 * jax.random.normal(
            jax.random.fold_in(jax.random.key(2), x.size), x.shape), lora)
    ours = forward_jit({**params, "lora": lora}, cfg, jnp.asarray(TOKENS)).logits
    assert float(jnp.abs(ours - forward_jit(params, cfg.replace(lora=None), jnp.asarray(TOKENS)).logits).max()) > 1e-2
    write_peft(cfg, lora, str(tmp_path / "adapter"), base_model=str(tmp_path / "base"))
    theirs = peft.PeftModel.from_pretrained(model, str(tmp_path / "adapter")).eval()
    np.testing.assert_allclose(ours, _hf_logits(theirs, TOKENS), atol=1e-4, rtol=1e-4)
    lcfg, back = read_peft(str(tmp_path / "adapter"), cfg.replace(lora=None))
    assert lcfg == cfg.lora
    jax.tree.map(np.testing.assert_array_equal, back, lora)
    merged = merge({**params, "lora": lora}, cfg)
    np.testing.assert_allclose(forward_jit(merged, cfg.replace(lora=None), jnp.asarray(TOKENS)).logits, ours,
                               atol=1e-4, rtol=1e-4)
    # an adapter for another base: one line
    with pytest.raises(ValueError, match="another base model"):
        read_peft(str(tmp_path / "adapter"), cfg.replace(lora=None, hidden_size=32, head_dim=8))
