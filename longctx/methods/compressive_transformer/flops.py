"""Forward FLOPs per scored token of the Compressive Transformer at evaluation (FLOPs = 2 × MACs,
`longctx.flops`).

The attention is Transformer-XL's over P = n_m + n_cm memory slots (`transformer_xl/flops.py`). In
the steady state each segment evicts n states per layer, so f_c runs on n states per segment, per
token one state:

    conv (kernel = stride = c, d -> d)        d² per evicted state (d²·c per compressed slot)
    dilated_conv (ceil(log2 c) kernel-2 convs) 2·d² per conv per evicted state (every position of a group)
    max_pool, mean_pool, most_used            0 (no multiply-accumulate)

Without the key/value cache every segment projects the keys and values of all P memory slots again
(2·d·HD·P/n per token per layer). With it (`cache_kv`, `CompressiveTransformer.forward`) the memory's
slots carry the keys and values the layer computed when they were the segment, and each segment
projects only the n/c states it compresses, once (`_updated_caches`): 2·d·HD/c per token per layer.

The attention-reconstruction loss (training's, and at evaluation its logged value) is not counted: the
language model's prediction does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from longctx.flops import flops_from_macs
from longctx.methods.compressive_transformer.compression import CompressionKind
from longctx.methods.transformer_xl.flops import macs_per_token as xl_macs_per_token


def compression_macs_per_state(compression: CompressionKind, d_model: int, rate: int) -> float:
    """f_c's multiply-accumulates per evicted state (see the module docstring)."""
    if compression == "conv":
        return d_model * d_model
    if compression == "dilated_conv":
        return 2 * d_model * d_model * math.ceil(math.log2(rate))
    return 0.0


def macs_per_token(
    n_layers: int,
    d_model: int,
    n_heads: int,
    d_head: int,
    d_inner: int,
    vocab_size: int,
    segment_length: int,
    mem_len: int,
    cmem_len: int,
    compression: CompressionKind = "conv",
    compression_rate: int = 3,
    cutoffs: Sequence[int] = (),
    d_embed: int | None = None,
    div_val: int = 1,
    cache_kv: bool = False,
    softmax_rows: Sequence[float] | None = None,
    embedding_rows: Sequence[float] | None = None,
) -> float:
    """Multiply-accumulates per scored token (forward pass, steady state: full memories); cache_kv:
    the memories' keys and values are carried; softmax_rows, embedding_rows: the adaptive softmax's
    and input's rows per token (`transformer_xl.flops.macs_per_token`)."""
    P = mem_len + cmem_len  # the attended memory slots
    xl = xl_macs_per_token(
        n_layers, d_model, n_heads, d_head, d_inner, vocab_size, segment_length, P, cutoffs, d_embed, div_val,
        cache_kv=cache_kv, softmax_rows=softmax_rows, embedding_rows=embedding_rows,
    )  # fmt: skip
    if cmem_len == 0:
        return xl
    f_c = compression_macs_per_state(compression, d_model, compression_rate)
    compressed_kv = 2 * d_model * n_heads * d_head / compression_rate if cache_kv else 0.0
    return xl + n_layers * (f_c + compressed_kv)


def flops_per_token(*args, **kwargs) -> float:
    """`macs_per_token` in the project's convention: FLOPs = 2 × MACs (same arguments)."""
    return flops_from_macs(macs_per_token(*args, **kwargs))
