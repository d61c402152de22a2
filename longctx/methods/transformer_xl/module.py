"""`TransformerXLLM`: Transformer-XL (Dai et al. 2019), the Transformer+RPE baseline (`mem_len: 0`) and
TRAMS memory selection at evaluation (Yu et al. 2023) on the `LMBase` spine.

The memory carried across batches is, per layer, the last `mem_len` inputs of the layer plus a
validity mask (`memory.py`). Every evaluation knob is an init argument, so it can be
changed without retraining: LightningCLI builds the model from the config and then loads the
checkpoint's weights (`python -m longctx test --config configs/trams_wt103.yaml --ckpt_path X`), and
`TransformerXLLM.load_from_checkpoint(X, trams={"attended": 200, "kept": 150})` overrides the stored
ones (a group's dict overrides the fields it names: `LMBase.load_from_checkpoint`).

Training uses `mem_len`, `clamp_len`, `same_length`. Validation and test use the `evaluation` group
(`EvaluationMemory`: mem_len, clamp_len, same_length, None = the training value; flat names
`eval_mem_len`, ...); Transformer-XL's published evaluation is wt103 eval_tgt_len 64 (a data knob),
evaluation mem_len 640, clamp_len 400, same_length; enwik8 eval_tgt_len 80, mem_len 2100, clamp_len
820, same_length.

TRAMS (evaluation only) is on when the `trams` group (`TramsSettings`) is set: the memory is a pool of
the last `pool` (M) states per layer, updated with every new state whatever was selected; each query
attends to the newest `kept` (m − k) pool slots plus k = m − kept slots selected from the older ones
(paper and code: M=400, m=200 = 150 kept + 50 selected, n = 64). `metric` "code" (the released
‖K′‖·|ΣK′|), "paper" (cos⟨K′, 1⟩·‖K′‖) or "oracle" (largest actual attention probability);
`positions` "compact" (the code: selected tokens placed right before the kept block) or "true"
(their real distances). Details in `longctx.methods.transformer_xl.trams`.

Evaluation protocols (`protocol`), a config choice to match the table compared with:
- "xl": Transformer-XL's evaluation: the first segment has an empty memory and every target is
  scored (compare with the Transformer-XL paper).
- "trams": the TRAMS code's evaluation: the first memory is mem_len zero states that are attended,
  and the first token of each segment is never scored (their Hugging Face loss shifts labels inside
  each segment); in our batches that is the last real target of each segment row, the token that
  opens the next segment (`drop_last_scored`; compare with the TRAMS paper's tables).

Logged at evaluation (when `log_attention_mass`): `trams/mem_mass`, the attention probability on the
attended memory keys averaged over layers, heads, queries and batch rows (the paper's attention-mass
analysis: XL at m vs TRAMS at m), and `trams/mem_mass_layer{i}`.

The papers' symbols and where each lives in this folder: the package docstring (`__init__.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from longctx.core.base import LMBase, StepOutput, check_tbptt_segments
from longctx.core.memory_warmup import MemoryWarmup
from longctx.core.run_settings import first_set
from longctx.diagnostics.footprint import feed_forward_elements, segment_memory_elements
from longctx.methods.transformer_xl import flops as xl_flops
from longctx.methods.transformer_xl.context_axes import ATTENDED, MEMORY
from longctx.methods.transformer_xl.memory import MemoryLengths, XLMemory
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.trams import TramsSettings

Protocol = Literal["xl", "trams"]


@dataclass(frozen=True)
class EvaluationMemory(MemoryLengths):
    """The memory at validation and test, changeable without retraining (the `evaluation` group of
    `TransformerXLLM`; flat names `eval_mem_len`, ...): mem_len, clamp_len, same_length as in
    training (None: the training value, `MemoryLengths.over`); cache_kv: carry the memory's keys and
    values instead of projecting the memory again every segment (exact; the released codes
    re-project)."""

    cache_kv: bool = True

    def __post_init__(self) -> None:
        if (self.mem_len or 0) < 0 or (self.clamp_len or 0) < 0:
            raise ValueError(
                f"evaluation mem_len ({self.mem_len}) and clamp_len ({self.clamp_len}) must be >= 0"
            )


class TransformerXLLM(MemoryWarmup, LMBase):
    """Transformer-XL language model with evaluation-time memory settings and TRAMS.

    Args:
        network: the network's knobs (`TransformerXL.Config`: sizes, dropouts, adaptive softmax,
            initialisation, untie_r, attention kernel); its defaults are the wt103 base
            (16 layers, d 410, 10 heads, inner 2100; enwik8 base: 12, 512, 8, 2048).
        mem_len, clamp_len, same_length: training memory length (0 = Transformer+RPE), cap of
            relative positions (0 = none), equal key count per query.
        evaluation: the memory at validation/test (`EvaluationMemory`: mem_len, clamp_len,
            same_length, None = training's; cache_kv).
        protocol: "xl" or "trams" evaluation protocol (see the module docstring).
        trams: TRAMS's m, m − k, metric, positions and pool M (`TramsSettings`); None = off.
        log_attention_mass: log `trams/mem_mass*` at evaluation. Off by default: the fused kernels
            return no probabilities, so this runs the evaluation attention op by op (the TRAMS
            configs turn it on for the paper's attention-mass analysis).
        tbptt_segments: k, the segments of each row a training batch holds (`data.windows_per_batch:
            k`), read in order with the memory carried with its gradient and detached at the batch's
            end (truncated BPTT over k segments, `LMBase`); 1: the paper's stop-gradient on the
            memory at every segment; None: as many as each training batch holds (the data module's
            layout, which its `far_text_layout` may choose from the text).
        mem_warmup_steps: train with memory 0 (as Transformer+RPE) for the first N optimizer steps,
            then with `mem_len`: a memory-length curriculum, not in the paper (0: off). Attention
            that starts spread over a long memory learns a sharp match later; without the memory the
            same heads first learn what lies within the segment, then read the memory with it
            (docs/long_range.md "Recall": the recipe's seeds).
        mem_warmup_min_within: the warm-up runs only on training text with at least this fraction of
            its answers bound within their own segment (the data module's
            `train_answers_within_segment`; 0: always). Without the memory such heads can learn only
            those; on text whose every binding lies beyond the segment memory 0 has nothing to teach,
            and after a warm-up of 250 or 1,000 steps none of 3 fits learned such text, where 3 of 3
            without one did (docs/long_range.md "Recall, tiny"). Text without answers
            (`data.train_targets: all`) keeps the warm-up.
        vocab_size, optimizer, lr_scheduler: see `LMBase` (paper: Adam 2.5e-4, cosine, no warm-up).
    """

    batch_mode = "segments"
    flat_prefixes: ClassVar[dict[str, str]] = {"evaluation": "eval_", "trams": "trams_"}

    context_axes = (MEMORY, ATTENDED)  # `context`: M, or TRAMS's m

    def __init__(
        self,
        vocab_size: int = 0,
        network: TransformerXL.Config = TransformerXL.Config(),  # noqa: B008 (frozen)
        mem_len: int = 150,
        clamp_len: int = 0,
        same_length: bool = False,
        evaluation: EvaluationMemory = EvaluationMemory(),
        protocol: Protocol = "xl",
        trams: TramsSettings | None = None,
        log_attention_mass: bool = False,
        tbptt_segments: int | None = 1,
        mem_warmup_steps: int = 0,
        mem_warmup_min_within: float = 0.0,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        groups = self.read_groups(dict(network=network, evaluation=evaluation, trams=trams))
        network, evaluation, trams = groups["network"], groups["evaluation"], groups["trams"]
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        if mem_len < 0 or clamp_len < 0:
            raise ValueError(f"mem_len ({mem_len}) and clamp_len ({clamp_len}) must be >= 0")
        if protocol not in ("xl", "trams"):
            raise ValueError(f"protocol must be 'xl' or 'trams', got {protocol!r}")
        check_tbptt_segments(tbptt_segments)
        self.init_memory_warmup(mem_warmup_steps, mem_warmup_min_within)
        self.net = network.build_within(vocab_size, say=rank_zero_info)
        self.train_lengths = MemoryLengths(mem_len, clamp_len, same_length)
        self.eval_lengths = evaluation.over(self.train_lengths)
        self.eval_cache_kv = evaluation.cache_kv
        self.protocol = protocol
        self.trams = trams
        if trams is not None:
            if trams.pool is not None:  # TRAMS's pool M is the evaluation memory
                self.eval_lengths = replace(self.eval_lengths, mem_len=trams.pool)
            if trams.attended > self.eval_lengths.mem_len:
                raise ValueError(
                    f"TRAMS attended ({trams.attended}) cannot exceed the pool ({self.eval_lengths.mem_len})"
                )
        self.log_attention_mass = log_attention_mass
        self.tbptt_segments = tbptt_segments

    # ------------------------------------------------------------------ memory
    def training_lengths(self) -> MemoryLengths:
        """The training memory at this optimizer step: none during `mem_warmup_steps`."""
        if self.warming_up:
            return replace(self.train_lengths, mem_len=0)
        return self.train_lengths

    def init_memory(self, batch_size: int) -> XLMemory:
        """Transformer-XL's empty memory; at evaluation under the TRAMS protocol, TRAMS's attended
        zeros. The memory keeps its convention, so its `reset_rows` clears a new document's rows
        the same way (masked, or attended zeros)."""
        if not self.training and self.protocol == "trams":
            return self.net.zero_memory(batch_size, self.eval_lengths.mem_len)
        return self.net.empty_memory(batch_size)

    # ------------------------------------------------------------------ cost
    @classmethod
    def describe_run(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> str:
        """Its evaluation: TRAMS m/M, plain XL memory, or no memory (RPE), and the protocol."""
        mem_len = model.get("mem_len")
        memory = first_set(model.get("eval_mem_len"), mem_len)
        if model.get("trams_attended") is not None:
            pool = first_set(model.get("trams_pool"), memory)
            kind = f"TRAMS m={model['trams_attended']} M={pool} kept={model.get('trams_kept')}"
            kind += f" metric={model.get('trams_metric')}"
        elif memory == 0:
            kind = "no memory (RPE)" if mem_len == 0 else f"no memory (trained with {mem_len})"
        else:
            kind = f"XL memory {memory}" + (f" (trained with {mem_len})" if mem_len != memory else "")
        return f"{kind}, protocol {model.get('protocol')}"

    def state_size(self) -> int:
        """The evaluation memory's m·d numbers per layer (TRAMS: the m slots attended of its pool;
        RPE, memory 0: 0). The keys and values are projections of these states."""
        slots = self.trams.attended if self.trams is not None else self.eval_lengths.mem_len
        return slots * self.net.d_model

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """The evaluation memory (TRAMS: its pool) before segments of `length` (`footprint`)."""
        net = self.net
        M, H, Dh, d = self.eval_lengths.mem_len, net.n_heads, net.config.head_dim, net.d_model
        return segment_memory_elements(batch_size, length, M, net.n_layers, d, H, Dh) + feed_forward_elements(
            batch_size, length, d, net.config.d_inner
        )

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token at evaluation with the full evaluation memory (TRAMS: the
        pool M, the attended window and the scoring; `flops.py`), the adaptive input and softmax counted
        for the tokens this evaluation computed (before any: every cluster for every token)."""
        return xl_flops.flops_per_token(
            self.net.config,
            self.vocab_size,
            self.eval_lengths,
            segment_length,
            cache_kv=self.eval_cache_kv,
            trams=self.trams,
            scored_per_segment=segment_length - 1 if self.protocol == "trams" else segment_length,
            softmax_rows=self.net.crit.rows_per_token(),
            embedding_rows=self.net.word_emb.rows_per_token(),
        )

    # ------------------------------------------------------------------ step
    def step(self, batch: dict[str, Tensor], memory: XLMemory) -> StepOutput:
        x = batch["input"]
        evaluating = not self.training
        need_mass = evaluating and self.log_attention_mass
        lengths = self.eval_lengths if evaluating else self.training_lengths()
        out = self.net(
            x,
            memory,
            mem_len=lengths.mem_len,
            clamp_len=lengths.clamp_len,
            same_length=lengths.same_length,
            trams=self.trams if evaluating else None,
            need_mass=need_mass,
            cache_kv=evaluating and self.eval_cache_kv,
            carry_gradient=self.carries_memory_graph,
        )
        nll = self.net.nll(out.hidden, batch["target"])  # (B, n)
        mask = drop_last_scored(batch["mask"]) if evaluating and self.protocol == "trams" else None
        logs: dict[str, Tensor | float] = {}
        if need_mass:
            masses = torch.stack([a.mem_mass for a in out.attn]).detach().float()
            logs["trams/mem_mass"] = masses.mean()
            for i, m in enumerate(masses):
                logs[f"trams/mem_mass_layer{i}"] = m
        # The argmax over the full vocabulary of the adaptive softmax: head and tail clusters.
        correct = self.net.crit.target_is_argmax(out.hidden, batch["target"]) if self.wants_correct else None
        return StepOutput(nll=nll, memory=out.memory, mask=mask, logs=logs, correct=correct)


def drop_last_scored(mask: Tensor) -> Tensor:
    """The TRAMS protocol's mask: `mask` (B, n) without each row's last scored target.

    TRAMS's evaluation never scores the first token of a segment; in our batches that token is the
    last *real* target of the segment (the one that opens the next segment). In a short final
    segment the real targets end before column n − 1 (padding follows, already unscored), so the
    dropped column is found per row rather than fixed at −1. Rows with no scored target are unchanged.
    """
    n = mask.shape[1]
    last = n - 1 - mask.flip(-1).to(torch.uint8).argmax(-1)  # (B,) last True column (n − 1 if none)
    dropped = mask.clone()
    dropped.scatter_(1, last[:, None], False)  # a row with no True only gets its False rewritten
    return dropped
