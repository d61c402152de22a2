"""The Compressive Transformer network (Rae et al. 2020, §3 and Algorithm 1): Transformer-XL whose
layers also attend to a compressed memory.

Each layer attends over [compressed memory (n_cm), memory (n_m), segment (n_s)] with Transformer-XL's
relative positions, which run through both memories contiguously (Algorithm 1: mem ← concat(cmem,
mem)): the two memories are a memory type of XL's layer loop (`memory.py:CompressiveSegment`,
`TransformerXL.attend`). The parts are XL's own (`XLBlock`, `RelMultiHeadAttention`, the adaptive
embedding and softmax): the class is a `TransformerXL` plus one f_c per layer (`compressors`), so its
state dict is XL's plus `compressors.*` (and `decoders.*` with the auto-encoding loss).

After the segment the memory is updated first-in first-out (`memory.py`); the evicted states are
compressed by f_c and appended to the compressed memory. f_c is trained only by the
attention-reconstruction loss (§3.2, Algorithm 2):

    L^attn = Σ_layers ‖attn(h, old_mem) − attn(h, f_c(old_mem))‖²

where attn is the layer's content-based multi-head attention (softmax(q kᵀ/√d_head) v per head, no
positions, no output projection), h the segment's inputs to the layer and old_mem the evicted
states; ‖·‖² is the mean square over the attention vectors (rows without a valid key on either side
are left out). Stop-gradients: h, old_mem and the layer's weights enter detached, so the main network's
gradients are unchanged by the loss, and the memories are detached, so the language-model loss never
reaches f_c. The auto-encoding loss ‖old_mem − g(f_c(old_mem))‖² with a learned decoder g is the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.methods.attention_kernel import at_least_float32, split_heads
from longctx.methods.compressive_transformer.compression import (
    COMPRESSIONS,
    CompressionKind,
    Decoder,
    build_compression,
    groups_valid,
)
from longctx.methods.compressive_transformer.memory import CompressiveMemory, CompressiveSegment, Eviction
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.relative_attention import AttentionOutput, RelMultiHeadAttention

Reconstruction = Literal["attention", "autoencoding"]


@dataclass
class CompressiveOutput:
    """hidden: (B, n, d) last-layer output (after dropout); memory: the updated memories; attn: per
    layer XL's `AttentionOutput`; reconstruction_loss: the summed per-layer loss training f_c (only
    when asked; a zero tensor tied to f_c's parameters when nothing was compressed); compressed_mass:
    (L,) per layer the mean attention probability on the compressed memory (only when asked)."""

    hidden: Tensor
    memory: CompressiveMemory
    attn: list[AttentionOutput]
    reconstruction_loss: Tensor | None = None
    compressed_mass: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class CompressiveTransformerConfig(TransformerXL.Config):
    """The Compressive Transformer's network knobs, their one source (`CompressiveTransformer.Config`):
    Transformer-XL's (`TransformerXL.Config`, positional in its order) and, by keyword only:

    compression: f_c (`compression.py`): "conv" (the paper's best, default), "max_pool", "mean_pool",
        "dilated_conv", "most_used".
    compression_rate: c (>= 1).
    reconstruction: how f_c learns: "attention" (the paper's attention-reconstruction loss) or
        "autoencoding" (a decoder g reconstructs the evicted states).
    """

    compression: CompressionKind = "conv"
    compression_rate: int = 3
    reconstruction: Reconstruction = "attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression not in COMPRESSIONS:
            choices = ", ".join(COMPRESSIONS)
            raise ValueError(f"compression must be one of {choices}; got {self.compression!r}")
        if self.compression_rate < 1:
            raise ValueError(f"compression_rate (c) must be >= 1, got {self.compression_rate}")
        if self.reconstruction not in get_args(Reconstruction):
            raise ValueError(
                f"reconstruction must be 'attention' or 'autoencoding', got {self.reconstruction!r}"
            )

    def build(self, vocab_size: int) -> CompressiveTransformer:
        return CompressiveTransformer(vocab_size, self)


class CompressiveTransformer(TransformerXL):
    """Compressive Transformer language model (network only).

    `CompressiveTransformer(vocab_size, config)` with a `CompressiveTransformer.Config` (or
    `config.build(vocab_size)`).
    """

    Config = CompressiveTransformerConfig

    def __init__(self, vocab_size: int, config: CompressiveTransformerConfig) -> None:
        super().__init__(vocab_size, config)  # XL's network from the Config's XL fields; self.config = config
        c = config.compression_rate
        self.compression_rate, self.reconstruction = c, config.reconstruction
        self.compressors = nn.ModuleList(
            build_compression(config.compression, self.d_model, c) for _ in range(self.n_layers)
        )
        self.decoders = None
        if config.reconstruction == "autoencoding" and self.learns_compression:
            self.decoders = nn.ModuleList(Decoder(self.d_model, c) for _ in range(self.n_layers))

    @property
    def learns_compression(self) -> bool:
        """f_c has parameters (convolutions); pooling and most-used have none."""
        return any(True for _ in self.compressors.parameters())

    def compression_parameters(self) -> list[nn.Parameter]:
        """The parameters trained by the reconstruction loss only: f_c's (and the decoder's)."""
        decoders = [] if self.decoders is None else list(self.decoders.parameters())
        return [*self.compressors.parameters(), *decoders]

    def empty_memory(self, batch_size: int) -> CompressiveMemory:
        """The memories of fresh rows: nothing held (`CompressiveMemory.empty`)."""
        p = self.r_w_bias
        return CompressiveMemory.empty(
            batch_size, n_layers=self.n_layers, d_model=self.d_model, device=p.device, dtype=p.dtype
        )

    def forward(
        self,
        x: Tensor,
        memory: CompressiveMemory,
        mem_len: int,
        cmem_len: int,
        clamp_len: int = 0,
        same_length: bool = False,
        need_mass: bool = False,
        need_weights: bool = False,
        need_reconstruction: bool = False,
        need_compressed_mass: bool = False,
        cache_kv: bool = False,
        carry_gradient: bool = False,
    ) -> CompressiveOutput:
        """x: (B, n) token ids; memory: `CompressiveMemory`; mem_len, cmem_len: n_m and n_cm kept for the
        next segment (cmem_len 0: Transformer-XL); clamp_len: cap of relative positions (0 = none);
        same_length: every query sees min(n_m + n_cm, ·) memory keys; need_reconstruction: compute
        the loss that trains f_c; need_compressed_mass: the attention on the compressed memory;
        cache_kv (evaluation, no gradients): read the memories' keys and values from the memory's
        caches when it has them and return the new memory with them (`CompressiveMemory.kv`);
        carry_gradient: the memory (not the compressed memory) kept with its graph (truncated BPTT
        over several segments, in training)."""
        compressing = cmem_len > 0
        segment = CompressiveSegment(
            memory,
            x.shape[1],
            mem_len,
            cmem_len,
            same_length,
            cache_kv,
            self.compression_rate,
            need_usage=compressing and self.compressors[0].needs_usage,
            need_compressed_mass=need_compressed_mass,
        )
        hidden, attns = self.attend(x, segment, clamp_len, need_mass, need_weights)
        eviction = segment.eviction(carry_gradient)
        new = new_valid = new_kv = None
        if compressing and segment.fifo.evicted > 0:
            usage = segment.usage or [None] * self.n_layers
            new = [f_c(old, u) for f_c, old, u in zip(self.compressors, eviction.evicted, usage)]
            new_valid = groups_valid(eviction.evicted_valid, self.compression_rate)
            if cache_kv:  # each compressed slot projected once, when it enters its memory
                with torch.no_grad():
                    new_kv = [layer.attn.project_kv(cm) for layer, cm in zip(self.layers, new)]
        loss = self._reconstruction_loss(segment.inputs, eviction, new) if need_reconstruction else None
        new_memory = segment.kept(eviction, new, new_valid, new_kv)
        mass_per_layer = torch.stack(segment.compressed_mass) if need_compressed_mass else None
        return CompressiveOutput(hidden, new_memory, attns, loss, mass_per_layer)

    def _reconstruction_loss(
        self, inputs: list[Tensor], eviction: Eviction, new: list[Tensor] | None
    ) -> Tensor:
        """Σ over layers of the attention-reconstruction (or auto-encoding) loss; a zero tied to every
        f_c parameter when nothing was compressed, so that each parameter always gets a gradient
        (DDP without `find_unused_parameters`)."""
        params = self.compression_parameters()
        loss = sum((p.sum() * 0.0 for p in params), inputs[0].new_zeros((), dtype=torch.float32))
        if new is None or not params:
            return loss
        old_valid = eviction.evicted_valid
        new_valid = groups_valid(old_valid, self.compression_rate)
        for i, (layer, h, old, cm) in enumerate(zip(self.layers, inputs, eviction.evicted, new)):
            if self.decoders is None:
                loss = loss + attention_reconstruction(layer.attn, h.detach(), old, old_valid, cm, new_valid)
            else:
                loss = loss + masked_mse(self.decoders[i](cm), old, old_valid)
        return loss


def content_attention(attn: RelMultiHeadAttention, query: Tensor, memory: Tensor, valid: Tensor) -> Tensor:
    """attn(h, mem) of §3.2 (Algorithm 2) with the layer's weights detached: per head
    softmax(q kᵀ/√d_head) v over the valid memory slots, (B, H, n, Dh); LayerNorm first under pre-LN,
    as the layer does."""
    H = attn.n_heads
    w_q, w_k, w_v = (
        w.detach().flatten(0, 1) for w in (attn.query_weight(), attn.key_weight(), attn.value_weight())
    )
    if attn.pre_lnorm:
        ln = attn.layer_norm
        norm = lambda t: F.layer_norm(t, ln.normalized_shape, ln.weight.detach(), ln.bias.detach(), ln.eps)  # noqa: E731
        query, memory = norm(query), norm(memory)

    def heads(t: Tensor, w: Tensor) -> Tensor:
        return split_heads(F.linear(t, w), H)  # (B, H, T, Dh)

    scores = heads(query, w_q) @ heads(memory, w_k).transpose(-1, -2) * attn.scale  # (B, H, n, e)
    scores = at_least_float32(scores).masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row without a valid slot attends to nothing
    return probs.to(memory.dtype) @ heads(memory, w_v)


def attention_reconstruction(
    attn: RelMultiHeadAttention, h: Tensor, old: Tensor, old_valid: Tensor, new: Tensor, new_valid: Tensor
) -> Tensor:
    """‖attn(h, old_mem) − attn(h, new_cm)‖², the mean square over the rows that have a valid slot on
    both sides; only `new` (f_c's output) carries a gradient."""
    target = content_attention(attn, h, old.detach(), old_valid)
    rows = (old_valid.any(1) & new_valid.any(1)).to(target.dtype)  # (B,)
    squared = (content_attention(attn, h, new, new_valid) - target).pow(2).mean(dim=(1, 2, 3))
    return (squared * rows).sum() / rows.sum().clamp_min(1.0)


def masked_mse(reconstructed: Tensor, target: Tensor, valid: Tensor) -> Tensor:
    """Mean square of (reconstructed − target) over the valid states (B, e, d)."""
    weight = valid[..., None].to(target.dtype)
    squared = (reconstructed - target.detach()).pow(2) * weight
    return squared.sum() / (weight.sum() * target.shape[-1]).clamp_min(1.0)
