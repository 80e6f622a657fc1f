"""tilerope as a local kernel repository of the `kernels` package: the layer transformers' hub
kernel mechanism puts in place of ``apply_rotary_pos_emb`` (layer name "rotary_pos_emb").
tilerope.integrations.transformers maps it for the CPU; nothing is downloaded."""

from torch import nn

from tilerope.integrations.transformers import rotary_pos_emb_forward


class RotaryPosEmb(nn.Module):
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` by tilerope; on a Qwen3-style
    attention whose q_norm/k_norm were deferred to it, RMSNorm and RoPE fused."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return rotary_pos_emb_forward(self, q, k, cos, sin, unsqueeze_dim)


class layers:  # noqa: N801  (the name `kernels` looks up)
    RotaryPosEmb = RotaryPosEmb
