"""The soft span mask of Adaptive Attention Span (Sukhbaatar et al. 2019, §2.2) and its dynamic variant.

A head with span `z` weighs the key at distance `x` (1 = the previous token) by the ramp

    m_z(x) = clamp((R + z - x) / R, 0, 1)                                     (paper eq. 2)

The released code (facebookresearch/adaptive-span, `AdaptiveMask`) evaluates the ramp at `x - 1`, so
distance 1 always has mask 1 and a head never loses all its keys; we follow the code:

    m_z(x) = clamp((R + z - (x - 1)) / R, 0, 1).

The mask multiplies the softmax probabilities, which are then renormalised (the code's
`attn / (attn.sum(-1) + 1e-8)`). `z = S·z'` with `z'` a parameter kept in [0, 1].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from longctx.core.host_sync import host_values

# The code trims and sizes caches in steps of 64 positions ("too fine granularity might be bad for
# the memory management"), and keeps 64 more cached positions than the current span needs.
TRIM_GRANULARITY = 64
CACHE_MARGIN = 64


def ramp_mask(z: Tensor, distances: Tensor, R: float) -> Tensor:
    """m_z(x) with the code's one-position shift: clamp((R + z - (x - 1)) / R, 0, 1).

    z: spans, any shape `(...,)`; distances: `(L,)` distances x >= 1. Returns `(..., L)`.
    """
    return ((R + z[..., None] - (distances - 1)) / R).clamp(0.0, 1.0)


def renormalise(probs: Tensor, mask: Tensor) -> Tensor:
    """Multiply softmax probabilities by the mask and renormalise over keys (the code's eq. 2')."""
    masked = probs * mask
    return masked / (masked.sum(-1, keepdim=True) + 1e-8)


def attended_length(max_span: float, S: int, R: int) -> int:
    """How many previous positions a layer must attend to when its largest span is `max_span`.

    The code's `get_trim_len`: the mask is 0 beyond ceil(max z) + R, and the trimmed part is rounded
    down to a multiple of 64, so the attended length is rounded up: S - floor((S - need) / 64)·64,
    at least 1 (distance 1 always has mask 1).
    """
    need = max(0, min(S, math.ceil(max_span) + R))
    trim = min(S - 1, S - need)
    trim = (trim // TRIM_GRANULARITY) * TRIM_GRANULARITY
    return S - trim


def reported_span(z_ratio: Tensor, S: int, R: int) -> Tensor:
    """The span the released code reports for z' (any shape): ceil(z'·S) + R, clipped to [0, S].

    The code's `AdaptiveMask.get_current_avg_size` / `get_current_max_size` apply this to a layer's
    mean / largest z' over heads; its logger averages the former and takes the max of the latter over
    layers (`span_avg`, `span_max`). Computed in float64 like the code's Python float product.
    """
    return (torch.ceil(z_ratio.double() * S) + R).clamp(0, S)


class AdaptiveMask(nn.Module):
    """One learned span per head, z = S·z' (paper §2.2, code `AdaptiveMask` / `AdaptiveSpan`).

    Args:
        n_heads: heads of the layer.
        attn_span: S, the maximum span.
        span_ramp: R, the ramp length (paper: 32).
        span_init: initial z' (the code's `adapt_span_init`, 0 by default: heads start at span R).
    """

    def __init__(self, n_heads: int, attn_span: int, span_ramp: int, span_init: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= span_init <= 1.0:
            raise ValueError(f"span init z' must be in [0, 1], got {span_init}")
        self.S, self.R = attn_span, span_ramp
        self.z_ratio = nn.Parameter(torch.full((n_heads,), float(span_init)))  # z' (H,)

    @property
    def z(self) -> Tensor:
        """Current spans z = S·z', shape (H,)."""
        return self.z_ratio * self.S

    def attended_length(self) -> int:
        """Previous positions this layer attends to now (the code's S - trim_len); a host sync
        (`longctx/core/host_sync.py`), S on the meta device."""
        z_max = host_values(self.z.max())
        return self.S if z_max is None else attended_length(z_max, self.S, self.R)

    def head_attended_lengths(self) -> list[int]:
        """Per head, the previous positions its own span needs (the code's rounding to 64, per head);
        a host sync (`longctx/core/host_sync.py`), S for every head on the meta device.

        Beyond them the head's mask is exactly 0, so attending only these is exact (`span_trim="head"`).
        """
        z = host_values(self.z)
        return [self.S] * self.z.shape[0] if z is None else [attended_length(h, self.S, self.R) for h in z]

    def cache_size(self) -> int:
        """Previous hidden states to keep for the next block: attended length + 64, at most S."""
        return min(self.S, self.attended_length() + CACHE_MARGIN)

    def mask(self, L: int) -> Tensor:
        """m_z(x) (H, L) over the L most recent keys (distances L..1)."""
        z = self.z
        distances = torch.arange(L, 0, -1, device=z.device, dtype=z.dtype)  # (L,) = L..1
        return ramp_mask(z, distances, self.R)

    def penalty(self) -> Tensor:
        """Mean span of the layer's heads, (1/M)·Σ_i z_i; the model multiplies by λ and sums layers."""
        return self.z.mean()

    @torch.no_grad()
    def clamp_(self) -> None:
        """Keep z' in [0, 1]; called after every optimizer step (the code's `clamp_param`)."""
        self.z_ratio.clamp_(0.0, 1.0)


class DynamicSpan(nn.Module):
    """Dynamic attention span (paper §2.2): z_t = S·σ(vᵀx_t + b), one (v, b) per head.

    Not in the released code (its issue #15): written from the paper. x_t is the layer's input at
    the query position; b starts at -4 (paper), so spans start near S·σ(-4) ≈ 0.018·S.
    """

    def __init__(
        self, d_model: int, n_heads: int, attn_span: int, span_ramp: int, dynamic_bias_init: float = -4.0
    ) -> None:
        super().__init__()
        self.S, self.R = attn_span, span_ramp
        self.proj = nn.Linear(d_model, n_heads)  # v (H, d) and b (H,)
        nn.init.constant_(self.proj.bias, dynamic_bias_init)

    def forward(self, x: Tensor) -> Tensor:
        """Spans z_t (B, H, M) of the queries x (B, M, d)."""
        logits = self.proj(x)  # (B, M, H)
        return self.S * torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32))).transpose(
            1, 2
        )

    def attended_length(self, z: Tensor) -> int:
        """Previous positions needed for the largest span in this block (rounded as in the code); a
        host sync (`longctx/core/host_sync.py`), S on the meta device."""
        z_max = host_values(z.max())
        return self.S if z_max is None else attended_length(z_max, self.S, self.R)

    def mask(self, z: Tensor, L: int) -> Tensor:
        """m_{z_t}(x) (B, H, M, L) over the L most recent keys (distances L..1) for spans z (B, H, M)."""
        distances = torch.arange(L, 0, -1, device=z.device, dtype=z.dtype)  # (L,) = L..1
        return ramp_mask(z, distances, self.R)
