"""Adaptive input embeddings and the projected adaptive softmax (Baevski & Auli 2019; Grave et al. 2017),
as in Transformer-XL (kimiyoung/transformer-xl `pytorch/mem_transformer.py` `AdaptiveEmbedding`,
`utils/proj_adaptive_softmax.py` `ProjectedAdaptiveLogSoftmax`).

The vocabulary is cut at `cutoffs` into a head (the most frequent words) and tail clusters. With
`div_val` > 1, cluster i has embedding size d_embed / div_val^i and a projection to d_proj. The head
softmax covers the head words plus one logit per tail cluster; log p(w) for a word of tail cluster i
is the head log-prob of cluster i plus its log-prob within the cluster. Layout follows the code, so
its checkpoints map one to one: with div_val = 1 there is one (n_token × d_embed) table and one output
layer, sliced per cluster; the cluster logits are appended to the head in the order of
`cluster_weight`, and tail cluster i reads head column −i (the code's `head_logprob[:, -i]`).
Embeddings are scaled by √d_proj.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.methods.softmax_nll import at_least_float32


def cutoffs_within(n_token: int, cutoffs: Sequence[int] | None) -> list[int]:
    """The cutoffs that split a vocabulary of `n_token` (those below it).

    A cutoff at or past the vocabulary size would make a cluster with no word in it: a word-level
    recipe (e.g. `cutoffs: [2000, 8000]`) read at byte level (256 symbols) keeps a full softmax, the
    only model such cutoffs can mean. `n_token` 0 (not linked yet) keeps them all.
    """
    cutoffs = list(cutoffs or [])
    return cutoffs if n_token <= 0 else [c for c in cutoffs if c < n_token]


def _check_cutoffs(n_token: int, cutoffs: Sequence[int]) -> list[int]:
    cutoffs = list(cutoffs)
    if cutoffs != sorted(cutoffs) or (cutoffs and (cutoffs[0] <= 0 or cutoffs[-1] >= n_token)):
        raise ValueError(f"cutoffs {cutoffs} must increase strictly inside (0, {n_token})")
    return [*cutoffs, n_token]


class ClusterRows(nn.Module):
    """What both adaptive layers share: the vocabulary of `n_token` ids cut at `cutoffs` (checked;
    cluster i holds ids [cutoff_ends[i], cutoff_ends[i + 1]), the head first), and the count, since the
    last `train()`/`eval()` (Lightning calls `eval()` as each validation or test loop starts, so an
    evaluation counts its own tokens), of the rows each cluster computed and of the tokens: what
    `longctx.methods.transformer_xl.flops` counts per token."""

    _counted_clusters: int  # tail clusters whose rows are counted (0: no count)

    def __init__(self, n_token: int, d_embed: int, d_proj: int, cutoffs: Sequence[int], div_val: int) -> None:
        super().__init__()
        self.n_token, self.d_embed, self.d_proj, self.div_val = n_token, d_embed, d_proj, div_val
        self.cutoffs = _check_cutoffs(n_token, cutoffs)
        self.cutoff_ends = [0, *self.cutoffs]

    def _count_from_zero(self) -> None:
        self._cluster_rows = [0] * (self._counted_clusters + 1)
        self._tokens = 0

    def train(self, mode: bool = True) -> Self:
        self._count_from_zero()
        return super().train(mode)

    def rows_per_token(self) -> list[float] | None:
        """Per cluster (the head first), the rows it computed per token counted; None without a
        cluster or before any token (the FLOPs count then takes every cluster for every token)."""
        if self._counted_clusters == 0 or self._tokens == 0:
            return None
        return [rows / self._tokens for rows in self._cluster_rows]


class AdaptiveEmbedding(ClusterRows):
    """Token ids (...,) -> embeddings (..., d_proj) scaled by √d_proj. With div_val > 1 each token is
    projected from its cluster's width (`rows_per_token`: the share of tokens in each cluster)."""

    def __init__(
        self, n_token: int, d_embed: int, d_proj: int, cutoffs: Sequence[int] = (), div_val: int = 1
    ) -> None:
        super().__init__(n_token, d_embed, d_proj, cutoffs, div_val)
        self.emb_scale = d_proj**0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(n_token, d_embed))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
        else:
            for i in range(len(self.cutoffs)):
                d_emb_i = d_embed // div_val**i
                self.emb_layers.append(nn.Embedding(self.cutoff_ends[i + 1] - self.cutoff_ends[i], d_emb_i))
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_emb_i)))
        # div_val 1: one table and one projection for all tokens, nothing to count
        self._counted_clusters = len(self.cutoffs) - 1 if div_val > 1 else 0
        self._count_from_zero()

    def forward(self, x: Tensor) -> Tensor:
        if self.div_val == 1:
            embed = self.emb_layers[0](x)
            if len(self.emb_projs):
                embed = F.linear(embed, self.emb_projs[0])
        else:
            flat = x.reshape(-1)
            self._tokens += flat.shape[0]
            param = self.emb_projs[0]
            embed = torch.zeros(flat.shape[0], self.d_proj, dtype=param.dtype, device=param.device)
            for i in range(len(self.cutoffs)):
                lo, hi = self.cutoff_ends[i], self.cutoff_ends[i + 1]
                idx = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
                if idx.numel() == 0:
                    continue
                self._cluster_rows[i] += idx.numel()
                emb_i = F.linear(self.emb_layers[i](flat[idx] - lo), self.emb_projs[i])
                embed.index_copy_(0, idx, emb_i.to(embed.dtype))
            embed = embed.view(*x.shape, self.d_proj)
        return embed * self.emb_scale


class ProjectedAdaptiveLogSoftmax(ClusterRows):
    """Hidden states (N, d_proj) -> log-probabilities or per-token NLL over n_token words.

    With no cutoffs it is a plain (optionally projected) softmax layer with bias. `rows_per_token`
    counts what the NLL computes per target: the head for every target, tail cluster i for the
    targets in it (`log_prob`, for a diagnostic such as recall accuracy's argmax, is not counted).
    """

    def __init__(
        self, n_token: int, d_embed: int, d_proj: int, cutoffs: Sequence[int] = (), div_val: int = 1
    ) -> None:
        super().__init__(n_token, d_embed, d_proj, cutoffs, div_val)
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        if self.n_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        self.out_layers = nn.ModuleList()
        self.out_projs = nn.ParameterList()  # one per cluster, or none (div_val 1 and d_proj == d_embed)
        if div_val == 1:
            if d_proj != d_embed:
                for _ in self.cutoffs:
                    self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
            self.out_layers.append(nn.Linear(d_embed, n_token))
        else:
            for i in range(len(self.cutoffs)):
                d_emb_i = d_embed // div_val**i
                self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_emb_i)))
                self.out_layers.append(nn.Linear(d_emb_i, self.cutoff_ends[i + 1] - self.cutoff_ends[i]))
        self._counted_clusters = self.n_clusters
        self._count_from_zero()

    def tie_to(self, embedding: AdaptiveEmbedding, tie_weight: bool, tie_projs: Sequence[bool]) -> None:
        """Share the output word vectors (tie_weight) and, per cluster, the projections (tie_projs)
        with the adaptive input, as the code's `MemTransformerLM.__init__`."""
        if tie_weight:
            for layer, emb in zip(self.out_layers, embedding.emb_layers):
                layer.weight = emb.weight
        for i, tie in enumerate(tie_projs):
            if not tie or i >= len(self.out_projs):
                continue
            if self.div_val == 1 and len(embedding.emb_projs):
                self.out_projs[i] = embedding.emb_projs[0]
            elif self.div_val != 1:
                self.out_projs[i] = embedding.emb_projs[i]

    def _cluster_params(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Weight, bias and projection of cluster i (for i = 0 the head, with the cluster logits)."""
        if self.div_val == 1:
            lo, hi = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            weight, bias = self.out_layers[0].weight[lo:hi], self.out_layers[0].bias[lo:hi]
        else:
            weight, bias = self.out_layers[i].weight, self.out_layers[i].bias
        if i == 0 and self.n_clusters > 0:
            weight = torch.cat([weight, self.cluster_weight], dim=0)
            bias = torch.cat([bias, self.cluster_bias], dim=0)
        proj = self.out_projs[i] if len(self.out_projs) else None
        return weight, bias, proj

    @staticmethod
    def _logits(hidden: Tensor, weight: Tensor, bias: Tensor, proj: Tensor | None) -> Tensor:
        if proj is not None:
            hidden = F.linear(hidden, proj.t())
        return F.linear(hidden, weight, bias)

    def _head_logprob(self, hidden: Tensor) -> Tensor:
        logits = self._logits(hidden, *self._cluster_params(0))
        return F.log_softmax(at_least_float32(logits), dim=-1)  # (N, shortlist + n_clusters)

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Full log-distribution (N, n_token) (for tests and small vocabularies)."""
        head = self._head_logprob(hidden)
        out = [head[:, : self.shortlist_size]]
        for i in range(1, self.n_clusters + 1):
            tail = F.log_softmax(at_least_float32(self._logits(hidden, *self._cluster_params(i))), dim=-1)
            out.append(head[:, -i, None] + tail)
        return torch.cat(out, dim=-1)

    def predict(self, hidden: Tensor, max_logits: int = 1 << 24) -> Tensor:
        """(N,) the most probable word of each hidden state (N, d_proj): the argmax of the full
        `log_prob`, head and tail clusters alike, made for at most `max_logits` log-probabilities at
        once (rows in chunks; a wt103 vocabulary of 267,735 words takes 62 rows per chunk)."""
        rows = max(1, max_logits // self.n_token)
        return torch.cat([self.log_prob(part).argmax(-1) for part in hidden.split(rows)])

    def target_is_argmax(self, hidden: Tensor, target: Tensor) -> Tensor:
        """(...) bool: `target` (...) is the most probable word (`predict`) given `hidden` (..., d_proj)."""
        return self.predict(hidden.reshape(-1, hidden.shape[-1])).view(target.shape) == target

    def forward(self, hidden: Tensor, target: Tensor) -> Tensor:
        """NLL (nats) of target (N,) given hidden (N, d_proj), in the order of the input: (N,)."""
        if self.n_clusters == 0:
            logits = self._logits(hidden, *self._cluster_params(0))
            return F.cross_entropy(at_least_float32(logits), target, reduction="none")
        head = self._head_logprob(hidden)
        nll = torch.zeros(target.shape[0], dtype=head.dtype, device=head.device)
        self._tokens += target.shape[0]
        self._cluster_rows[0] += target.shape[0]
        for i in range(self.n_clusters + 1):
            lo, hi = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            idx = ((target >= lo) & (target < hi)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            if i > 0:
                self._cluster_rows[i] += idx.numel()
            t = (target[idx] - lo)[:, None]
            if i == 0:
                logp = head[idx].gather(1, t).squeeze(1)
            else:
                tail = self._logits(hidden[idx], *self._cluster_params(i))
                logp = head[idx, -i] + F.log_softmax(at_least_float32(tail), dim=-1).gather(1, t).squeeze(1)
            nll.index_copy_(0, idx, -logp)
        return nll
