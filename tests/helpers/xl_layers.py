"""One Transformer-XL attention layer over a memory, through the seam the network uses: the layer's
memory type (`XLSegment`, or TRAMS's pool `TramsSegment`) answers the `KeyWindow`, the attention
attends it."""

from __future__ import annotations

import torch

from longctx.methods.transformer_xl.memory import XLMemory, XLSegment
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.relative_attention import AttentionOutput, RelMultiHeadAttention
from longctx.methods.transformer_xl.trams import TramsSettings
from longctx.methods.transformer_xl.trams_pool import TramsSegment


def attention_layer(**config) -> RelMultiHeadAttention:
    """`RelMultiHeadAttention` of a `TransformerXL.Config` with these fields (dropout 0 unless given)."""
    return RelMultiHeadAttention(TransformerXL.Config(**{"dropout": 0.0, **config}))


def attend(
    attn: RelMultiHeadAttention,
    x: torch.Tensor,
    mem: torch.Tensor,
    valid: torch.Tensor,
    pos_emb: torch.Tensor,
    u: torch.Tensor,
    v: torch.Tensor,
    same_length: int | None = None,
    trams: TramsSettings | None = None,
    need_mass: bool = False,
    need_weights: bool = False,
) -> AttentionOutput:
    """The layer's output for its input x (B, n, d) over its memory mem (B, P, d) with validity valid
    (B, P): Transformer-XL's [memory, segment] (at most `same_length` keys per query), or with `trams`
    the window TRAMS selects from the pool of those P slots (m = `trams.attended` keys per query with
    `same_length`)."""
    memory, n, P = XLMemory([mem], valid), x.shape[1], mem.shape[1]
    if trams is None:
        segment = XLSegment(memory, n, P if same_length is None else same_length, same_length is not None)
    else:
        segment = TramsSegment(memory, n, P, same_length is not None, False, trams)
    return attn(x, segment.window(0, attn, x), pos_emb, u, v, need_mass, need_weights)


def selected_slots(out: AttentionOutput, settings: TramsSettings) -> torch.Tensor:
    """The pool slots a TRAMS window selected (B, H, k), in time order: its first k slots."""
    return out.window.slots[..., : settings.selected]
