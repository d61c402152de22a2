"""Forward FLOPs per scored token of Transformer-XL at evaluation, with memory, and of TRAMS.

Counted as the network computes them (`relative_attention.py`), per token of a segment of n tokens
with P memory slots (the steady state: P = the evaluation memory length, or the TRAMS pool M), in
multiply-accumulates per layer:

    q, k, v of the segment        3·d·HD                  (HD = n_heads·d_head)
    k, v of the memory again      2·d·HD·P/n              (not with the key/value cache, `cache_kv`)
    relative positions r = W_R·R  d·HD·W_r/n              (W_r position rows projected per segment)
    scores and weighted sum       3·HD·W                  ((q+u)·k, (q+v)·r and probs·v over W keys)
    output projection             HD·d
    feed-forward                  2·d·d_inner

with W = P + n keys per query (the whole n × W score matrix is computed; the causal and same_length
masks only hide entries). Under TRAMS (Yu et al. 2023) the window has W = min(m, P) + n keys, and
every segment scores n_s slots: the n keys entering the pool with the key/value cache (a slot is
scored once and its score carried), else the P − (m − k) older pool slots: with the released metric ‖K′‖·|ΣK′|
computed as ‖Rk‖ and s·k (`trams.trams_scores`), H·(Dh² + 2·Dh) per slot, per row; with the paper's
metric H·Dh. `positions="true"` projects and computes the position term for all P + n keys before
gathering the window's; the "oracle" metric computes XL's full scores over the pool on top. The
QR factor R of the query weights (once per evaluation with the cache) and top-k are left out.

The output layer counts the full log-probability (`log_prob`): d_embed·(V + clusters) plus the
projections (with an adaptive softmax, the per-token NLL computes a tail cluster only for the targets
in it, so this is an upper bound there). The count per *scored* token divides by the targets scored
per segment (n − 1 under the TRAMS protocol). FLOPs = 2 × MACs (`longctx.flops`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from longctx.flops import flops_from_macs

if TYPE_CHECKING:
    from longctx.methods.transformer_xl.memory import MemoryLengths
    from longctx.methods.transformer_xl.network import TransformerXLConfig
    from longctx.methods.transformer_xl.trams import TramsSettings


def macs_per_token(
    config: TransformerXLConfig,
    vocab_size: int,
    lengths: MemoryLengths,
    segment_length: int,
    cache_kv: bool = False,
    trams: TramsSettings | None = None,
    scored_per_segment: int | None = None,
) -> float:
    """Multiply-accumulates per scored token (forward pass); see the module docstring.

    Args:
        config: the network's sizes and adaptive softmax (`TransformerXL.Config`; no cutoffs: a full
            softmax over d_model); vocab_size: V.
        lengths: the memory's (`lengths.mem_len`: P, memory slots; TRAMS: the pool M).
        segment_length: n, tokens per segment.
        cache_kv: the memory's keys and values are carried, not projected again each segment.
        trams: TRAMS's m, m − k, metric and positions, or None (Transformer-XL).
        scored_per_segment: targets scored per segment row (default n; n − 1 under the TRAMS protocol).
    """
    d_model, n_heads, d_head = config.d_model, config.n_heads, config.head_dim
    n, P, HD = segment_length, lengths.mem_len, n_heads * d_head
    scored = n if scored_per_segment is None else scored_per_segment
    if not 0 < scored <= n:
        raise ValueError(f"scored_per_segment must be in (0, {n}], got {scored}")
    full = P + n
    if trams is None or P == 0:
        W, position_rows, score_macs = full, full, 3 * HD * full
    else:
        W = min(trams.attended, P) + n
        full_positions = trams.positions == "true" or trams.metric == "oracle"
        position_rows = (full if full_positions else 0) + (W if trams.positions == "compact" else 0)
        bd = HD * full if trams.positions == "true" else HD * W
        score_macs = 2 * HD * W + bd  # (q+u)·k and probs·v over the window, and the position term
        if trams.positions == "compact" and full_positions:
            score_macs += HD * full  # the oracle's full position term
        # With the K/V cache each slot is scored once, when it enters the pool (`trams.py`).
        n_scored_slots = n if cache_kv else max(P - trams.kept, 0)
        if trams.metric == "code":
            score_macs += n_heads * (d_head**2 + 2 * d_head) * n_scored_slots / n
        elif trams.metric == "paper":
            score_macs += n_heads * d_head * n_scored_slots / n
        else:  # oracle: XL's content scores over the whole pool as well
            score_macs += HD * full
    per_layer = (
        3 * d_model * HD
        + (0 if cache_kv else 2 * d_model * HD * P / n)
        + d_model * HD * position_rows / n
        + score_macs
        + HD * d_model
        + 2 * d_model * config.d_inner
    )
    output = output_macs(d_model, vocab_size, config.cutoffs, config.d_embed, config.div_val)
    return (config.n_layers * per_layer + output) * n / scored


def output_macs(
    d_model: int, vocab_size: int, cutoffs: Sequence[int] = (), d_embed: int | None = None, div_val: int = 1
) -> float:
    """The (adaptive) softmax's full log-probability for one token (`ProjectedAdaptiveLogSoftmax`)."""
    d_embed = d_embed or d_model
    ends = [0, *cutoffs, vocab_size]
    n_clusters = len(cutoffs)
    if div_val == 1:
        projection = d_model * d_embed * (n_clusters + 1) if d_embed != d_model else 0  # one per cluster
        return projection + d_embed * (vocab_size + n_clusters)
    total = 0.0
    for i in range(len(ends) - 1):
        d_i = d_embed // div_val**i
        total += d_model * d_i + d_i * (ends[i + 1] - ends[i] + (n_clusters if i == 0 else 0))
    return total


def flops_per_token(*args, **kwargs) -> float:
    """`macs_per_token` in the project's convention: FLOPs = 2 × MACs (same arguments)."""
    return flops_from_macs(macs_per_token(*args, **kwargs))
