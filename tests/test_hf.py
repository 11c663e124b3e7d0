"""Parity with Hugging Face transformers (random tiny models, no download)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from swarmjax.models.hf import CheckpointError, from_hf, to_hf  # noqa: E402
from swarmjax.models.transformer import forward_jit  # noqa: E402
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
}


def _hf_model(name):
    config_cls, model_cls, extra = FAMILIES[name]
    torch.manual_seed(0)
    model = model_cls(config_cls(**COMMON, **extra)).eval()
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
