"""`CompressiveTransformerLM`: the Compressive Transformer (Rae et al. 2020) on the `LMBase` spine.

The memory carried across batches is, per layer, the last `mem_len` (n_m) inputs of the layer and
`cmem_len` (n_cm) compressed states, with validity masks (`memory.py`); rows that start a new document
(PG-19 books) get both cleared; a resumed run restarts them empty, as for Transformer-XL. Training
uses `mem_len`, `cmem_len`, `clamp_len`, `same_length`; validation and test the `eval_*` values
(None = the training value), so a checkpoint can be evaluated with longer memories.

f_c learns only from the reconstruction loss (`network.py`), added to the training loss as
`reconstruction_weight` × loss (`StepOutput.extra_loss`). Its gradients never mix with the main
network's: gradient-norm clipping (`trainer.gradient_clip_val`) clips the two parameter sets
separately (as the paper's separate optimisation of f_c), and `compression_lr` gives f_c its own
optimizer group and learning rate.

Shapes: when c divides n_s and n_m, both memories keep one shape once full; otherwise the memory
holds up to c − 1 extra states (`memory.py`) and its length cycles, so a compiled network
(`CompileNetwork`) recompiles for each length.

Logged (per stage, when f_c learns): `reconstruction_loss`; at evaluation (when
`log_compressed_attention`): `compressed_mass`, the attention probability on the compressed memory
averaged over layers, heads, queries and rows, and `compressed_mass_layer{i}`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from longctx.core.base import LMBase, StepOutput
from longctx.methods.attention_kernel import AttentionKernel
from longctx.methods.compressive_transformer import flops as ct_flops
from longctx.methods.compressive_transformer import memory as ct_memory
from longctx.methods.compressive_transformer.compression import CompressionKind
from longctx.methods.compressive_transformer.memory import CompressiveMemory
from longctx.methods.compressive_transformer.network import CompressiveTransformer, Reconstruction
from longctx.methods.transformer_xl.adaptive_softmax import cutoffs_within
from longctx.methods.transformer_xl.network import TransformerXL

# The arguments of `TransformerXL` that this module takes under the same names.
XL_NETWORK_KNOBS = tuple(
    f.name for f in dataclasses.fields(TransformerXL.Config) if f.name != "layer_norm_eps"
)


class CompressiveTransformerLM(LMBase):
    """Compressive Transformer language model.

    Args:
        n_layers, d_model, n_heads, d_head, d_inner, d_embed, dropout, dropatt, pre_lnorm, cutoffs,
            div_val, tie_weight, tie_projs, init_std, proj_init_std, untie_r: Transformer-XL's network
            (`TransformerXLLM`).
        mem_len, cmem_len: n_m and n_cm (cmem_len 0 = Transformer-XL).
        compression, compression_rate: f_c ("conv", "max_pool", "mean_pool", "dilated_conv",
            "most_used") and c.
        reconstruction: "attention" (the paper's attention-reconstruction loss) or "autoencoding".
        reconstruction_weight: the weight of that loss in the training loss (it reaches f_c only).
        compression_lr: f_c's learning rate in its own optimizer group (None: one group, the
            optimizer's learning rate).
        clamp_len, same_length: cap of relative positions (0 = none), equal key count per query.
        eval_mem_len, eval_cmem_len, eval_clamp_len, eval_same_length: the same at validation/test
            (None = training's).
        log_compressed_attention: log the attention on the compressed memory at evaluation. Off by
            default: the fused kernels return no probabilities, so this runs the evaluation
            attention op by op (the tiny and WikiText-103 configs turn it on).
        attention: Transformer-XL's attention kernel ("sdpa" fused, default, "eager" or "flex"); the layers
            fall back to the eager ops where the attention weights are needed (most-used compression,
            the compressed-memory attention logged at evaluation).
        vocab_size, optimizer, lr_scheduler: see `LMBase`.
    """

    batch_mode = "segments"

    def __init__(
        self,
        vocab_size: int = 0,
        n_layers: int = 16,
        d_model: int = 410,
        n_heads: int = 10,
        d_head: int | None = None,
        d_inner: int = 2100,
        d_embed: int | None = None,
        dropout: float = 0.1,
        dropatt: float = 0.0,
        pre_lnorm: bool = False,
        cutoffs: list[int] | None = None,
        div_val: int = 1,
        tie_weight: bool = True,
        tie_projs: list[bool] | None = None,
        init_std: float = 0.02,
        proj_init_std: float = 0.01,
        untie_r: bool = False,
        attention: AttentionKernel = "sdpa",
        mem_len: int = 512,
        cmem_len: int = 512,
        compression: CompressionKind = "conv",
        compression_rate: int = 3,
        reconstruction: Reconstruction = "attention",
        reconstruction_weight: float = 1.0,
        compression_lr: float | None = None,
        clamp_len: int = 0,
        same_length: bool = False,
        eval_mem_len: int | None = None,
        eval_cmem_len: int | None = None,
        eval_clamp_len: int | None = None,
        eval_same_length: bool | None = None,
        log_compressed_attention: bool = False,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        lengths = dict(mem_len=mem_len, cmem_len=cmem_len, clamp_len=clamp_len, eval_mem_len=eval_mem_len)
        lengths.update(eval_cmem_len=eval_cmem_len, eval_clamp_len=eval_clamp_len)
        if negative := [k for k, v in lengths.items() if (v or 0) < 0]:
            raise ValueError(f"{', '.join(negative)} must be >= 0")
        if compression_rate < 1:
            raise ValueError(f"compression_rate (c) must be >= 1, got {compression_rate}")
        # Transformer-XL's network knobs are this module's arguments of the same names (one list of
        # them per network is issue 21's `TransformerXL.Config`, not there yet).
        xl_knobs = {k: self.hparams[k] for k in XL_NETWORK_KNOBS}
        # A word-level recipe's cutoffs on a byte-level corpus: a full softmax, said once.
        self.cutoffs = cutoffs_within(vocab_size, cutoffs)
        if len(self.cutoffs) < len(cutoffs or []):
            rank_zero_info(
                f"longctx: cutoffs {list(cutoffs or [])} reach past the vocabulary ({vocab_size}): "
                f"adaptive softmax cutoffs {self.cutoffs or 'none (a full softmax)'}"
            )
        self.net = CompressiveTransformer(
            vocab_size,
            compression=compression,
            compression_rate=compression_rate,
            reconstruction=reconstruction,
            **{**xl_knobs, "cutoffs": self.cutoffs},
        )
        self.mem_len, self.cmem_len = mem_len, cmem_len
        self.clamp_len, self.same_length = clamp_len, same_length
        self.eval_mem_len = mem_len if eval_mem_len is None else eval_mem_len
        self.eval_cmem_len = cmem_len if eval_cmem_len is None else eval_cmem_len
        self.eval_clamp_len = clamp_len if eval_clamp_len is None else eval_clamp_len
        self.eval_same_length = same_length if eval_same_length is None else eval_same_length
        self.reconstruction_weight = reconstruction_weight
        self.compression_lr = compression_lr
        self.log_compressed_attention = log_compressed_attention

    # ------------------------------------------------------------------ memory
    def init_memory(self, batch_size: int) -> CompressiveMemory:
        return self.net.empty_memory(batch_size)

    def reset_memory_rows(self, memory: CompressiveMemory, reset: Tensor) -> CompressiveMemory:
        return ct_memory.reset_compressive_memory_rows(memory, reset)

    # ------------------------------------------------------------------ cost
    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token at evaluation with full evaluation memories (`flops.py`)."""
        h, net = self.hparams, self.net
        return ct_flops.flops_per_token(
            n_layers=net.n_layers,
            d_model=net.d_model,
            n_heads=net.n_heads,
            d_head=net.d_head,
            d_inner=h.d_inner,
            vocab_size=self.vocab_size,
            segment_length=segment_length,
            mem_len=self.eval_mem_len,
            cmem_len=self.eval_cmem_len,
            compression=h.compression,
            compression_rate=h.compression_rate,
            cutoffs=self.cutoffs,
            d_embed=h.d_embed,
            div_val=h.div_val,
        )

    # ------------------------------------------------------------------ step
    def step(self, batch: dict[str, Tensor], memory: CompressiveMemory) -> StepOutput:
        x = batch["input"]
        evaluating = not self.training
        learns = self.net.learns_compression
        need_mass = evaluating and self.log_compressed_attention
        out = self.net(
            x,
            memory,
            mem_len=self.eval_mem_len if evaluating else self.mem_len,
            cmem_len=self.eval_cmem_len if evaluating else self.cmem_len,
            clamp_len=self.eval_clamp_len if evaluating else self.clamp_len,
            same_length=self.eval_same_length if evaluating else self.same_length,
            need_reconstruction=learns,
            need_compressed_mass=need_mass,
        )
        nll = self.net.nll(out.hidden, batch["target"])  # (B, n)
        logs: dict[str, Tensor | float] = {}
        extra_loss = None
        if learns:
            logs["reconstruction_loss"] = out.reconstruction_loss.detach()
            if not evaluating:
                extra_loss = self.reconstruction_weight * out.reconstruction_loss
        if need_mass:
            logs["compressed_mass"] = out.compressed_mass.mean()
            for i, mass in enumerate(out.compressed_mass):
                logs[f"compressed_mass_layer{i}"] = mass
        return StepOutput(nll=nll, memory=out.memory, extra_loss=extra_loss, logs=logs)

    # ------------------------------------------------------------------ optimisation
    def _split_parameters(self) -> tuple[list[Tensor], list[Tensor]]:
        """(the main network's parameters, f_c's and the decoder's)."""
        compression = self.net.compression_parameters()
        ids = {id(p) for p in compression}
        return [p for p in self.parameters() if id(p) not in ids], compression

    def optimizer_param_groups(self) -> list[dict[str, Any]] | Any:
        if self.compression_lr is None:
            return self.parameters()
        main, compression = self._split_parameters()
        return [{"params": main}, {"params": compression, "lr": self.compression_lr}]

    def configure_gradient_clipping(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Norm clipping of the main network and of f_c apart, so that the reconstruction loss never
        changes the main network's update (value clipping is per element: Lightning's)."""
        if not gradient_clip_val or gradient_clip_algorithm == "value" or not self.net.learns_compression:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        for params in self._split_parameters():
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
