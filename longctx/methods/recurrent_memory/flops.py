"""Forward FLOPs per scored token of the Recurrent Memory Transformer on a GPT-2, in the count the
recurrent GPT-2 of the same backbone uses (Kaplan et al. 2020, Table 1; `longctx.core.flops`: 2 × MACs).

A segment of T tokens runs the backbone over T + 2m positions (m read, T segment, m write tokens).
Per position Kaplan's forward count is 2N + 2·n_layer·n_ctx·d, with N = 2·d·n_layer·(2·d + d_ff)
the non-embedding weights and n_ctx = T + 2m the positions attended; the LM head (d·V
multiply-accumulates) runs on the T segment positions only. With overlap o, T − o targets are new:

    FLOPs per scored token = [(T + 2m)·(2N + 2·n_layer·(T + 2m)·d) + T·2·d·V] / (T − o).

At m = 0 this is the windowed GPT-2's count with its output layer
(`recurrence/flops.py:hf_model_flops_per_scored_token`, `output_layer=True`), so the two methods'
numbers compare like with like. Biases, LayerNorms, softmax and the embedding look-ups are left out.

On Transformer-XL's network (`xl_backbone.py`, `relative_positions=True`) every layer also projects
the T + 2m relative positions (W_R: d·d per position) and scores them ((q + v)·r: n_ctx·d per
position), in the same count: + (T + 2m)·n_layer·(d·d + (T + 2m)·d) multiply-accumulates a segment
(W_R's projection is computed once for all rows of a batch; counted per row, as Transformer-XL's
own count, `transformer_xl/flops.py`, counts it).
"""

from __future__ import annotations

from typing import NamedTuple

from longctx.core.flops import flops_from_macs


def flops_per_token(
    n_layers: int,
    d_model: int,
    d_ff: int,
    vocab_size: int,
    segment: int,
    num_mem_tokens: int,
    overlap: int = 0,
    relative_positions: bool = False,
) -> float:
    """Forward FLOPs per scored token of segments of `segment` tokens with `num_mem_tokens` memory
    tokens read and written, at overlap `overlap`; `relative_positions`: Transformer-XL's blocks."""
    if not 0 <= overlap < segment:
        raise ValueError(f"overlap must satisfy 0 <= o < T, got o={overlap}, T={segment}")
    positions = segment + 2 * num_mem_tokens
    weights = 2 * d_model * n_layers * (2 * d_model + d_ff)  # Kaplan's N
    backbone = positions * (weights + n_layers * positions * d_model)
    if relative_positions:
        backbone += positions * n_layers * (d_model * d_model + positions * d_model)
    head = segment * d_model * vocab_size
    return flops_from_macs(backbone + head) / (segment - overlap)


class BackboneSizes(NamedTuple):
    """What the FLOPs and the evaluation footprint read of a backbone, GPT-2 or Transformer-XL."""

    n_layers: int
    d_model: int
    n_heads: int
    d_inner: int
    vocab_size: int
    relative_positions: bool = False
