"""rope_parameters against transformers' ROPE_INIT_FUNCTIONS (and a model's default function),
on the configs of tests/configs and on synthetic ones for every rope type."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import tilerope

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def hf_config(d: dict):
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    return AutoConfig.for_model(**d)


def hf_parameters(config, seq_len=None):
    """inv_freq (float32) and attention_scaling as transformers computes them for `config`."""
    text = config.get_text_config()
    rope_type = text.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(text)
    return ROPE_INIT_FUNCTIONS[rope_type](text, None, seq_len)


def check(config_like, hf, seq_len=None):
    inv, scaling = tilerope.rope_parameters(config_like, seq_len)
    want_inv, want_scaling = hf
    assert inv.dtype == torch.float32 and inv.shape == want_inv.shape
    # transformers evaluates in fp32, tilerope in fp64 rounded once: a few fp32 ulps apart
    torch.testing.assert_close(inv, want_inv.float(), rtol=4e-7, atol=0)
    assert scaling == pytest.approx(float(want_scaling), rel=1e-6)


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_model_configs(name):
    path = CONFIGS / name
    d = json.loads(path.read_text())
    config = hf_config(d)
    hf = hf_parameters(config)
    check(path, hf)  # a config.json path
    check(d, hf)  # its dict
    check(config, hf)  # the transformers config object


BASE = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8,
        "max_position_embeddings": 4096}

SYNTHETIC = {
    "default": {"rope_theta": 1e6, "rope_type": "default"},
    "linear": {"rope_theta": 1e4, "rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_theta": 1e4, "rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
             "original_max_position_embeddings": 1024},
    "yarn-mscale": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 40.0, "mscale": 0.707,
                    "mscale_all_dim": 0.707, "original_max_position_embeddings": 1024,
                    "beta_fast": 32, "beta_slow": 1},
    "longrope": {"rope_theta": 1e4, "rope_type": "longrope", "factor": 4.0,
                 "original_max_position_embeddings": 1024,
                 "short_factor": [1.0 + i / 64 for i in range(64)],
                 "long_factor": [1.0 + i for i in range(64)]},
    "llama3": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    "proportional": {"rope_theta": 1e6, "rope_type": "proportional",
                     "partial_rotary_factor": 0.25},
}


@pytest.mark.parametrize("seq_len", [None, 1000, 16384])
@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_every_rope_type(name, seq_len):
    d = {**BASE, "rope_parameters": SYNTHETIC[name]}
    config = hf_config(d)
    check(d, hf_parameters(config, seq_len), seq_len)


def test_settings_and_tables():
    s = tilerope.rope_settings(CONFIGS / "qwen3-vl-8b-instruct.json")
    assert s["mrope_section"] == [24, 20, 20] and s["mrope_interleaved"] is True
    inv, scaling = tilerope.rope_parameters(CONFIGS / "qwen2.5-7b-instruct-yarn.json",
                                            dtype=torch.float64)
    cache = tilerope.cos_sin_cache(inv, 100, scaling)
    assert cache.shape == (100, 128) and cache.dtype == torch.float32
    p = torch.arange(100, dtype=torch.float64)[:, None] * inv
    torch.testing.assert_close(cache.double(), torch.cat((p.cos(), p.sin()), -1) * scaling,
                               atol=2**-24 * 1.2, rtol=0)
    cos, sin = tilerope.cos_sin(torch.tensor([[3, 99]]), inv, scaling, torch.bfloat16)
    assert cos.shape == (1, 2, 128) and cos.dtype == torch.bfloat16
    torch.testing.assert_close(cos[0, 1], torch.cat((cache[99, :64], cache[99, :64])).bfloat16())


def test_bad_configs_name_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"rope_scaling.factor \(-2\) must be > 0"):
        tilerope.rope_parameters({**BASE, "rope_scaling": {"rope_type": "linear", "factor": -2}})
    with pytest.raises(ValueError, match="rope_type 'ntk' is not one of"):
        tilerope.rope_parameters({**BASE, "rope_scaling": {"rope_type": "ntk"}})
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        tilerope.rope_parameters(bad)
    with pytest.raises(TypeError, match="config must be"):
        tilerope.rope_parameters(42)
    with pytest.raises(ValueError, match="no entry for layer_type 'full_attention'"):
        tilerope.rope_parameters(BASE, layer_type="full_attention")
