"""tilerope.integrations.transformers on tiny randomly initialised models built from configs (no
download): logits, greedy generation and training gradients with and without it."""

from collections import Counter

import pytest
import torch
import transformers

import tilerope
from tilerope.integrations import transformers as integration

TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
VISION_TOKENS = dict(image_token_id=250, video_token_id=251, vision_start_token_id=252,
                     vision_end_token_id=253)


def text_model(name):
    config_class, model_class = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    }[name]
    extra = {"head_dim": 16} if name == "qwen3" else {}
    config = getattr(transformers, config_class)(**TEXT, **extra)
    return getattr(transformers, model_class)(config)


def vl_model(name):
    rope = {"rope_type": "default", "rope_theta": 1e6}
    if name == "qwen2_vl":
        config = transformers.Qwen2VLConfig(
            text_config={**TEXT, "rope_parameters": {**rope, "mrope_section": [2, 3, 3]}},
            vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, patch_size=4,
                               spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
            **VISION_TOKENS)
        return transformers.Qwen2VLForConditionalGeneration(config)
    if name == "qwen3_vl":  # interleaved MRoPE; Qwen3's q_norm/k_norm
        config = transformers.Qwen3VLConfig(
            text_config={**TEXT, "head_dim": 16, "rope_parameters": {
                **rope, "mrope_section": [2, 3, 3], "mrope_interleaved": True}},
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, patch_size=4, spatial_merge_size=2,
                               temporal_patch_size=2, in_channels=3, num_position_embeddings=64,
                               deepstack_visual_indexes=[0]),
            **VISION_TOKENS)
        return transformers.Qwen3VLForConditionalGeneration(config)
    config = transformers.Qwen2_5_VLConfig(
        text_config={**TEXT, "rope_parameters": {**rope, "mrope_section": [2, 3, 3]}},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, patch_size=4, spatial_merge_size=2,
                           temporal_patch_size=2, in_channels=3, window_size=16,
                           fullatt_block_indexes=[1]),
        **VISION_TOKENS)
    return transformers.Qwen2_5_VLForConditionalGeneration(config)


@pytest.fixture
def calls(monkeypatch):
    """Counts the tilerope functions the integration calls."""
    counter = Counter()
    for name in ("apply_rotary_pos_emb", "qk_norm_rope", "apply_rotary_pos_emb_vision"):
        original = getattr(integration, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counter[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(integration, name, counted)
    return counter


def run(model, inputs, generate=True):
    with torch.no_grad():
        logits = model(**inputs).logits
        tokens = model.generate(**inputs, max_new_tokens=6, do_sample=False) if generate else None
    return logits, tokens


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "qwen3"])
def test_text_models(name, calls):
    torch.manual_seed(0)
    model = text_model(name).eval()
    ids = torch.randint(0, 250, (2, 11))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    want_logits, want_tokens = run(model, inputs)
    report = integration.enable(model)
    try:
        text = str(report)
        assert "'rotary_pos_emb' hub kernel mapped on the CPU to tilerope" in text
        logits, tokens = run(model, inputs)
        keys = set(model.state_dict())
    finally:
        integration.disable(model)
    assert keys == set(model.state_dict()), "the state dict's keys changed"
    layers = model.config.num_hidden_layers
    if name == "qwen3":
        assert "q_norm/k_norm fused" in text
        assert calls["qk_norm_rope"] >= layers and calls["apply_rotary_pos_emb"] == 0
    else:
        assert calls["apply_rotary_pos_emb"] >= layers
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(run(model, inputs, generate=False)[0], want_logits), "disable"


def test_qwen3_training_gradients(calls):
    torch.manual_seed(0)
    model = text_model("qwen3").train()
    ids = torch.randint(0, 250, (2, 9))

    def grads():
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    want = grads()
    report = integration.enable(model)
    try:
        assert "Mode.TRAINING" in str(report)
        got = grads()
    finally:
        integration.disable(model)
    assert calls["qk_norm_rope"] >= 2
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-5, msg=n)


def image_inputs(model, batch=1):
    """input_ids with one 8x8-patch image (4x4 after merging) and its pixel values."""
    v = model.config.vision_config
    grid = torch.tensor([[1, 8, 8]] * batch)
    patches = int(grid[0].prod())
    pixels = torch.randn(batch * patches, v.in_channels * v.temporal_patch_size * v.patch_size**2)
    merged = patches // v.spatial_merge_size**2
    row = [5, 6, VISION_TOKENS["vision_start_token_id"]] + [VISION_TOKENS["image_token_id"]] * merged
    row += [VISION_TOKENS["vision_end_token_id"], 7, 8, 9]
    ids = torch.tensor([row] * batch)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels,
            "image_grid_thw": grid,
            "mm_token_type_ids": (ids == VISION_TOKENS["image_token_id"]).int()}


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vision_language_models(name, calls):
    torch.manual_seed(0)
    model = vl_model(name).eval()
    inputs = image_inputs(model)
    want_logits, want_tokens = run(model, inputs)
    report = integration.enable(model)
    try:
        assert "apply_rotary_pos_emb_vision patched" in str(report)
        logits, tokens = run(model, inputs)
    finally:
        integration.disable(model)
    assert calls["apply_rotary_pos_emb_vision"] >= model.config.vision_config.depth
    text = "qk_norm_rope" if name == "qwen3_vl" else "apply_rotary_pos_emb"
    assert calls[text] >= model.config.text_config.num_hidden_layers
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(tokens, want_tokens)
    modeling = __import__(f"transformers.models.{name}.modeling_{name}", fromlist=["x"])
    assert modeling.apply_rotary_pos_emb_vision is not integration.apply_rotary_pos_emb_vision


def test_unknown_models_are_refused():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not one tilerope knows"):
        integration.enable(model)
