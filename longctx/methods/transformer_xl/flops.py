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

The output layer counts what the NLL computes (`ProjectedAdaptiveLogSoftmax.forward`): a full
softmax d_embed·V; an adaptive softmax the head (d_embed·(cutoffs[0] + clusters)) for every target
and tail cluster i (d_i·|cluster i|) only for the targets in it, plus each cluster's projection. The
adaptive input's lookup is free, its projection to d_model (with div_val > 1: from the token's
cluster width d_i) is counted. Both counts need the share of tokens in each cluster (`softmax_rows`,
`embedding_rows`, which the module reads from the tokens its evaluation computed); without them,
every cluster for every token (the full log-probability `log_prob`: an upper bound). The argmax over
the full log-probability that recall accuracy asks for (a diagnostic) is not counted. The count per
*scored* token divides by the targets scored per segment (n − 1 under the TRAMS protocol).
FLOPs = 2 × MACs (`longctx.core.flops`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from longctx.core.flops import flops_from_macs

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
    softmax_rows: Sequence[float] | None = None,
    embedding_rows: Sequence[float] | None = None,
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
        softmax_rows, embedding_rows: the adaptive softmax's and input's rows computed per token,
            per cluster (`output_macs`, `input_macs`; None: every cluster for every token).
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
    cutoffs, d_embed, div_val = config.cutoffs, config.d_embed, config.div_val
    output = output_macs(d_model, vocab_size, cutoffs, d_embed, div_val, softmax_rows)
    embedding = input_macs(d_model, cutoffs, d_embed, div_val, embedding_rows)
    return (config.n_layers * per_layer + embedding + output) * n / scored


def _cluster_widths(d_model: int, n_clusters: int, d_embed: int | None, div_val: int) -> list[int]:
    """d_i, the width of each cluster's vectors (the head first)."""
    return [(d_embed or d_model) // div_val**i for i in range(n_clusters + 1)]


def _rows(rows: Sequence[float] | None, n_clusters: int) -> list[float]:
    """Rows computed per token per cluster; None: 1 for every cluster."""
    rows = [1.0] * (n_clusters + 1) if rows is None else list(rows)
    if len(rows) != n_clusters + 1:
        raise ValueError(f"rows per cluster: {n_clusters + 1} values (the head, each tail), got {len(rows)}")
    return rows


def input_macs(
    d_model: int,
    cutoffs: Sequence[int] = (),
    d_embed: int | None = None,
    div_val: int = 1,
    cluster_rows: Sequence[float] | None = None,
) -> float:
    """The (adaptive) input embedding's multiply-accumulates per token (`AdaptiveEmbedding`): the
    lookup is free; the projection to d_model costs d_embed·d_model for every token with div_val 1
    (when d_embed ≠ d_model), and d_i·d_model for a token of cluster i with div_val > 1, times
    `cluster_rows[i]`, the share of tokens in cluster i (`AdaptiveEmbedding.rows_per_token`; None:
    1 for every cluster, an upper bound)."""
    if div_val == 1:
        return d_model * d_embed if d_embed and d_embed != d_model else 0.0
    widths = _cluster_widths(d_model, len(cutoffs), d_embed, div_val)
    return sum(rows * d_model * d_i for rows, d_i in zip(_rows(cluster_rows, len(cutoffs)), widths))


def output_macs(
    d_model: int,
    vocab_size: int,
    cutoffs: Sequence[int] = (),
    d_embed: int | None = None,
    div_val: int = 1,
    cluster_rows: Sequence[float] | None = None,
) -> float:
    """The (adaptive) softmax's multiply-accumulates per token (`ProjectedAdaptiveLogSoftmax`): per
    cluster i (the head first), its projection d_model·d_i (with div_val > 1 or d_embed ≠ d_model)
    and its logits d_i·(words + one per tail cluster in the head), times `cluster_rows[i]`, the rows
    it computes per token: for the NLL 1 for the head and the share of targets in cluster i for a
    tail (`ProjectedAdaptiveLogSoftmax.rows_per_token`). None: 1 for every cluster, the full
    log-probability."""
    ends = [0, *cutoffs, vocab_size]
    n_clusters = len(cutoffs)
    projected = div_val > 1 or (d_embed or d_model) != d_model
    widths = _cluster_widths(d_model, n_clusters, d_embed, div_val)
    total = 0.0
    for i, (rows, d_i) in enumerate(zip(_rows(cluster_rows, n_clusters), widths)):
        logits = ends[i + 1] - ends[i] + (n_clusters if i == 0 else 0)
        total += rows * ((d_model * d_i if projected else 0) + d_i * logits)
    return total


def flops_per_token(*args, **kwargs) -> float:
    """`macs_per_token` in the project's convention: FLOPs = 2 × MACs (same arguments)."""
    return flops_from_macs(macs_per_token(*args, **kwargs))
