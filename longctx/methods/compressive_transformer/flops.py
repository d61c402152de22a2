"""Forward FLOPs per scored token of the Compressive Transformer at evaluation (FLOPs = 2 × MACs,
`longctx.core.flops`).

The attention is Transformer-XL's over P = n_m + n_cm memory slots (`transformer_xl/flops.py`). In
the steady state each segment evicts n states per layer, so f_c runs on n states per segment, per
token one state:

    conv (kernel = stride = c, d -> d)        d² per evicted state (d²·c per compressed slot)
    dilated_conv (ceil(log2 c) kernel-2 convs) 2·d² per conv per evicted state (every position of a group)
    max_pool, mean_pool, most_used            0 (no multiply-accumulate)

Without the key/value cache every segment projects the keys and values of all P memory slots again
(2·d·HD·P/n per token per layer). With it (`cache_kv`, `CompressiveTransformer.forward`) the memory's
slots carry the keys and values the layer computed when they were the segment, and each segment
projects only the n/c states it compresses, once (`CompressiveSegment.kept`): 2·d·HD/c per token per layer.

The attention-reconstruction loss (training's, and at evaluation its logged value) is not counted: the
language model's prediction does not need it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from longctx.core.flops import flops_from_macs
from longctx.methods.compressive_transformer.compression import CompressionKind
from longctx.methods.transformer_xl.flops import macs_per_token as xl_macs_per_token

if TYPE_CHECKING:
    from longctx.methods.compressive_transformer.memory import CompressiveLengths
    from longctx.methods.compressive_transformer.network import CompressiveTransformerConfig


def compression_macs_per_state(compression: CompressionKind, d_model: int, rate: int) -> float:
    """f_c's multiply-accumulates per evicted state (see the module docstring)."""
    if compression == "conv":
        return d_model * d_model
    if compression == "dilated_conv":
        return 2 * d_model * d_model * math.ceil(math.log2(rate))
    return 0.0


def macs_per_token(
    config: CompressiveTransformerConfig,
    vocab_size: int,
    lengths: CompressiveLengths,
    segment_length: int,
    cache_kv: bool = False,
    softmax_rows: Sequence[float] | None = None,
    embedding_rows: Sequence[float] | None = None,
) -> float:
    """Multiply-accumulates per scored token (forward pass, steady state: full memories).

    config: the network's sizes, f_c and c (`CompressiveTransformer.Config`); lengths: n_m
    (`mem_len`) and n_cm (`cmem_len`); segment_length: n_s; cache_kv: the memories' keys and values
    are carried; softmax_rows, embedding_rows: the adaptive softmax's and input's rows per token
    (`transformer_xl.flops.macs_per_token`).
    """
    attended = dataclasses.replace(lengths, mem_len=lengths.mem_len + lengths.cmem_len)  # P = n_m + n_cm
    xl = xl_macs_per_token(
        config, vocab_size, attended, segment_length, cache_kv=cache_kv, softmax_rows=softmax_rows,
        embedding_rows=embedding_rows,
    )  # fmt: skip
    if lengths.cmem_len == 0:
        return xl
    f_c = compression_macs_per_state(config.compression, config.d_model, config.compression_rate)
    compressed_kv = 2 * config.d_model * config.n_heads * config.head_dim / config.compression_rate
    return xl + config.n_layers * (f_c + (compressed_kv if cache_kv else 0.0))


def flops_per_token(*args, **kwargs) -> float:
    """`macs_per_token` in the project's convention: FLOPs = 2 × MACs (same arguments)."""
    return flops_from_macs(macs_per_token(*args, **kwargs))
