"""Compression functions f_c (Rae et al. 2020, §3.1; the choices §3.2): e = k·c evicted states -> k
compressed ones.

One f_c per layer. The paper's choices, all with rate c:
- `max_pool`, `mean_pool`: pooling with kernel = stride = c;
- `conv`: a 1-D convolution with kernel = stride = c (d -> d channels, with bias): the paper's best
  on enwik8 (Table 5) and WikiText-103 (§5.3), and the default;
- `dilated_conv`: the paper names dilated convolutions without their shape; here, within each group
  of c states, a causal stack of ceil(log2 c) kernel-2 convolutions with dilations 1, 2, 4, … (ReLU
  between them) whose last output, which sees the whole group, is the compressed state;
- `most_used`: the k states that received the most attention are kept, in their order (the paper
  sorts memories by their average attention; here the attention they received from the segment that
  evicts them, averaged over heads and queries: no usage is carried across segments).

Pooling and most-used have no parameters: nothing to train. The learned ones are trained by the
attention-reconstruction loss (`network.py`), or by the auto-encoding loss with `Decoder`.

The network gives every compressed slot one validity, the same for all layers: valid when all the
c states of its group are (`groups_valid`). Under most-used, whose kept states need not come from
their group, this never marks a zero state valid (the states of a cleared row are the oldest, and
receive no attention), but it may mask a real one near a document reset.
"""

from __future__ import annotations

import math
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

CompressionKind = Literal["conv", "max_pool", "mean_pool", "dilated_conv", "most_used"]
COMPRESSIONS = ("conv", "max_pool", "mean_pool", "dilated_conv", "most_used")


def groups_valid(valid: Tensor, rate: int) -> Tensor:
    """(B, k·c) -> (B, k): every state of the group of c is valid."""
    return valid.view(valid.shape[0], -1, rate).all(-1)


class Compression(nn.Module):
    """f_c at rate c: forward(states (B, k·c, d), usage (B, k·c) or None) -> compressed (B, k, d)."""

    needs_usage = False  # most-used reads the attention each state received

    def __init__(self, rate: int) -> None:
        super().__init__()
        if rate < 1:
            raise ValueError(f"the compression rate c must be >= 1, got {rate}")
        self.rate = rate

    def forward(self, states: Tensor, usage: Tensor | None = None) -> Tensor:
        return self.compress(states)

    def compress(self, states: Tensor) -> Tensor:
        raise NotImplementedError


class PoolCompression(Compression):
    """Max or mean pooling over each group of c states."""

    def __init__(self, rate: int, mode: Literal["max", "mean"]) -> None:
        super().__init__(rate)
        self.pool = F.max_pool1d if mode == "max" else F.avg_pool1d

    def compress(self, states: Tensor) -> Tensor:
        return self.pool(states.transpose(1, 2), self.rate, self.rate).transpose(1, 2)


class ConvCompression(Compression):
    """A 1-D convolution, kernel = stride = c, d_model -> d_model channels."""

    def __init__(self, d_model: int, rate: int) -> None:
        super().__init__(rate)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size=rate, stride=rate)

    def compress(self, states: Tensor) -> Tensor:
        return self.conv(states.transpose(1, 2)).transpose(1, 2)


class DilatedConvCompression(Compression):
    """Within each group of c states, causal kernel-2 convolutions with dilations 1, 2, 4, … (ReLU
    between them); the group's last output is its compressed state (see the module docstring)."""

    def __init__(self, d_model: int, rate: int) -> None:
        super().__init__(rate)
        self.convs = nn.ModuleList(
            nn.Conv1d(d_model, d_model, kernel_size=2, dilation=2**i)
            for i in range(math.ceil(math.log2(rate)))
        )

    def compress(self, states: Tensor) -> Tensor:
        B, e, d = states.shape
        x = states.reshape(B * (e // self.rate), self.rate, d).transpose(1, 2)  # one row per group
        for i, conv in enumerate(self.convs):
            x = conv(F.pad(x, (conv.dilation[0], 0)))  # causal: output t sees t and t − dilation
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x[..., -1].reshape(B, e // self.rate, d)


class MostUsedCompression(Compression):
    """Keep the e / c states with the most attention received, in their order."""

    needs_usage = True

    def forward(self, states: Tensor, usage: Tensor | None = None) -> Tensor:
        if usage is None:
            raise ValueError("most_used compression needs the attention each evicted state received")
        k = states.shape[1] // self.rate
        kept = usage.topk(k, dim=1).indices.sort(dim=1).values  # (B, k), in temporal order
        return states.gather(1, kept[..., None].expand(-1, -1, states.shape[2]))


class Decoder(nn.Module):
    """The auto-encoding loss's decoder (§3.2): k compressed states -> k·c reconstructed ones, a
    transposed 1-D convolution with kernel = stride = c."""

    def __init__(self, d_model: int, rate: int) -> None:
        super().__init__()
        self.deconv = nn.ConvTranspose1d(d_model, d_model, kernel_size=rate, stride=rate)

    def forward(self, compressed: Tensor) -> Tensor:
        return self.deconv(compressed.transpose(1, 2)).transpose(1, 2)


def build_compression(kind: CompressionKind, d_model: int, rate: int) -> Compression:
    """One layer's f_c."""
    if kind == "conv":
        return ConvCompression(d_model, rate)
    if kind in ("max_pool", "mean_pool"):
        return PoolCompression(rate, "max" if kind == "max_pool" else "mean")
    if kind == "dilated_conv":
        return DilatedConvCompression(d_model, rate)
    if kind == "most_used":
        return MostUsedCompression(rate)
    raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}; got {kind!r}")
