"""`CompressiveTransformerLM`: the Compressive Transformer (Rae et al. 2020) on the `LMBase` spine.

The memory carried across batches is, per layer, the last `mem_len` (n_m) inputs of the layer and
`cmem_len` (n_cm) compressed states, with validity masks (`memory.py`); rows that start a new
document (PG-19 books) get both cleared; a resumed run restarts them empty, as for Transformer-XL.
Training uses `mem_len`, `cmem_len`, `clamp_len`, `same_length`; validation and test the
`evaluation` group's (`CompressiveEvaluationMemory`, in configs
`model.init_args.evaluation.cmem_len`, flat name `eval_cmem_len`; None = the training value), so a
checkpoint can be evaluated with longer memories. At evaluation both memories carry their keys and
values (`evaluation.cache_kv`, default on, as Transformer-XL's): each slot is projected once, when it
enters its memory.

Knobs: the network's, Transformer-XL's and f_c's, are one `CompressiveTransformer.Config`
(`model.init_args.network.*`); the memory lengths, the loss weight, f_c's learning rate and the logging
switch stay this module's own. Checkpoints saved with the flat names of before the groups
(`n_layers=`, `compression_rate=`, `eval_cmem_len=`) load through `LMBase.load_from_checkpoint`.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from longctx.core.base import LMBase, StepOutput, check_tbptt_segments
from longctx.core.memory_warmup import MemoryWarmup
from longctx.core.run_settings import first_set
from longctx.diagnostics.axes import Axis, knob_flag
from longctx.diagnostics.footprint import feed_forward_elements, segment_memory_elements
from longctx.methods.compressive_transformer import flops as ct_flops
from longctx.methods.compressive_transformer.memory import CompressiveLengths, CompressiveMemory
from longctx.methods.compressive_transformer.network import CompressiveTransformer
from longctx.methods.transformer_xl.context_axes import MEMORY


@dataclass(frozen=True)
class CompressiveEvaluationMemory(CompressiveLengths):
    """The memories at validation and test (the module's `evaluation` group): the four lengths (None:
    the training value) and cache_kv, carry the memories' keys and values instead of projecting both
    memories again every segment (exact; as Transformer-XL's `EvaluationMemory.cache_kv`)."""

    cache_kv: bool = True


def _set_compressed(model: CompressiveTransformerLM, data: Any, length: int) -> None:
    model.eval_lengths = dataclasses.replace(model.eval_lengths, cmem_len=length)


# The compressed memory n_cm as a context axis (`longctx.diagnostics.axes`): a length in attended
# slots, so the last layer reaches n_m + c·n_cm back.
COMPRESSED = Axis(
    "compressed",
    applies=lambda model, data: True,
    why_not="it is the compressed memory n_cm of the Compressive Transformer (evaluation.cmem_len)",
    limits=lambda model, data: (0, None),
    default_max=lambda model, data: model.eval_lengths.cmem_len,
    set=_set_compressed,
    flags=lambda model, data, length: knob_flag(model, "eval_cmem_len", length),
)


class CompressiveTransformerLM(MemoryWarmup, LMBase):
    """Compressive Transformer language model.

    Args:
        network: the network's knobs (`CompressiveTransformer.Config`): Transformer-XL's (n_layers,
            d_model, n_heads, d_inner, d_head, d_embed, dropout, dropatt, pre_lnorm, cutoffs, div_val,
            tie_weight, tie_projs, init_std, proj_init_std, layer_norm_eps, untie_r, attention) and f_c's
            (compression: "conv", "max_pool", "mean_pool", "dilated_conv", "most_used"; compression_rate
            c; reconstruction: "attention", the paper's attention-reconstruction loss, or
            "autoencoding"). `attention` is XL's kernel ("sdpa" fused, default, "eager" or "flex"); the
            layers fall back to the eager ops where the attention weights are needed (most-used
            compression, the compressed-memory attention logged at evaluation).
        mem_len, cmem_len: n_m and n_cm in training (cmem_len 0 = Transformer-XL).
        clamp_len, same_length: cap of relative positions (0 = none), equal key count per query.
        evaluation: the same four at validation/test (None = training's) and cache_kv
            (`CompressiveEvaluationMemory`).
        reconstruction_weight: the weight of that loss in the training loss (it reaches f_c only).
        compression_lr: f_c's learning rate in its own optimizer group (None: one group, the
            optimizer's learning rate).
        log_compressed_attention: log the attention on the compressed memory at evaluation. Off by
            default: the fused kernels return no probabilities, so this runs the evaluation
            attention op by op (the tiny and enwik8 configs turn it on).
        tbptt_segments: k, the segments of each row a training batch holds, read in order with the
            memory n_m carried with its gradient and detached at the batch's end (truncated BPTT,
            `LMBase`; not in the paper, as Transformer-XL's); the compressed memory stays a
            stop-gradient and f_c learns from its reconstruction loss alone. 1: the paper's
            stop-gradient on both memories; None: as many as each training batch holds.
        mem_warmup_steps, mem_warmup_min_within: train with both memories off (n_m = n_cm = 0) for
            the first N optimizer steps, on text with at least that share of its answers bound within
            their segment (Transformer-XL's curriculum, `longctx/core/memory_warmup.py`; not in
            the paper).
        vocab_size, optimizer, lr_scheduler: see `LMBase`.
    """

    batch_mode = "segments"
    flat_prefixes: ClassVar[dict[str, str]] = {"evaluation": "eval_"}

    # `context` sweeps n_cm by default (n_m stays evaluation.mem_len), or n_m with `--axis memory`.
    context_axes = (COMPRESSED, MEMORY)

    def __init__(
        self,
        vocab_size: int = 0,
        network: CompressiveTransformer.Config = CompressiveTransformer.Config(),  # noqa: B008 (frozen)
        mem_len: int = 512,
        cmem_len: int = 512,
        clamp_len: int = 0,
        same_length: bool = False,
        evaluation: CompressiveEvaluationMemory = CompressiveEvaluationMemory(),
        reconstruction_weight: float = 1.0,
        compression_lr: float | None = None,
        log_compressed_attention: bool = False,
        tbptt_segments: int | None = 1,
        mem_warmup_steps: int = 0,
        mem_warmup_min_within: float = 0.0,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        groups = self.read_groups(dict(network=network, evaluation=evaluation))
        network, evaluation = groups["network"], groups["evaluation"]
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        self.train_lengths = CompressiveLengths(mem_len, clamp_len, same_length, cmem_len)
        self.eval_lengths = evaluation.over(self.train_lengths)
        self.eval_cache_kv = evaluation.cache_kv
        lengths = dataclasses.asdict(self.train_lengths)
        lengths.update({f"eval_{k}": v for k, v in dataclasses.asdict(evaluation).items()})
        if negative := [k for k, v in lengths.items() if (v or 0) < 0]:
            raise ValueError(f"{', '.join(negative)} must be >= 0")
        check_tbptt_segments(tbptt_segments)
        self.init_memory_warmup(mem_warmup_steps, mem_warmup_min_within)
        self.net = network.build_within(vocab_size, say=rank_zero_info)
        self.tbptt_segments = tbptt_segments
        self.reconstruction_weight = reconstruction_weight
        self.compression_lr = compression_lr
        self.log_compressed_attention = log_compressed_attention

    # ------------------------------------------------------------------ memory
    def init_memory(self, batch_size: int) -> CompressiveMemory:
        return self.net.empty_memory(batch_size)

    def training_lengths(self) -> CompressiveLengths:
        """The training memories at this optimizer step: none during `mem_warmup_steps`."""
        if self.warming_up:
            return dataclasses.replace(self.train_lengths, mem_len=0, cmem_len=0)
        return self.train_lengths

    # ------------------------------------------------------------------ cost
    @classmethod
    def describe_run(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> str:
        """Its evaluation memories n_m + n_cm, f_c and c, and how far they reach."""
        trained = (model.get("mem_len"), model.get("cmem_len"))
        memory = first_set(model.get("eval_mem_len"), trained[0])
        compressed = first_set(model.get("eval_cmem_len"), trained[1])
        rate = model.get("compression_rate")
        kind = f"memory {memory} + compressed {compressed} ({model.get('compression')}, c={rate})"
        if isinstance(memory, int) and isinstance(compressed, int) and isinstance(rate, int):
            kind += f", reaches {memory + rate * compressed}"
        if (memory, compressed) != trained:
            kind += f" (trained with {trained[0]} + {trained[1]})"
        return kind

    def state_size(self) -> int:
        """(n_m + n_cm)·d numbers per layer at evaluation: the memory and the compressed memory."""
        return (self.eval_lengths.mem_len + self.eval_lengths.cmem_len) * self.net.d_model

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """The memory and the compressed memory (n_m + n_cm slots) as XL's memory (`footprint`)."""
        net = self.net
        M = self.eval_lengths.mem_len + self.eval_lengths.cmem_len
        H, Dh, d = net.n_heads, net.config.head_dim, net.d_model
        return segment_memory_elements(batch_size, length, M, net.n_layers, d, H, Dh) + feed_forward_elements(
            batch_size, length, d, net.config.d_inner
        )

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token at evaluation with full evaluation memories (`flops.py`),
        with the key/value cache when it is on, the adaptive input and softmax counted for the
        tokens this evaluation computed (before any: every cluster for every token)."""
        return ct_flops.flops_per_token(
            self.net.config,
            self.vocab_size,
            self.eval_lengths,
            segment_length,
            cache_kv=self.eval_cache_kv,
            softmax_rows=self.net.crit.rows_per_token(),
            embedding_rows=self.net.word_emb.rows_per_token(),
        )

    # ------------------------------------------------------------------ step
    def step(self, batch: dict[str, Tensor], memory: CompressiveMemory) -> StepOutput:
        x = batch["input"]
        evaluating = not self.training
        learns = self.net.learns_compression
        need_mass = evaluating and self.log_compressed_attention
        lengths = self.eval_lengths if evaluating else self.training_lengths()
        out = self.net(
            x,
            memory,
            **dataclasses.asdict(lengths),
            need_reconstruction=learns,
            need_compressed_mass=need_mass,
            cache_kv=evaluating and self.eval_cache_kv,
            carry_gradient=self.carries_memory_graph,
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
        correct = self.net.crit.target_is_argmax(out.hidden, batch["target"]) if self.wants_correct else None
        return StepOutput(nll=nll, memory=out.memory, extra_loss=extra_loss, logs=logs, correct=correct)

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
