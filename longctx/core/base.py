"""`LMBase`: the LightningModule every method subclasses.

It owns what all three methods share, so a method module only says how its network turns a batch
and a memory into per-token losses:

- the loss: token-weighted NLL over the scored targets (never a mean of batch means), plus the
  method's extra term (e.g. the span penalty), logged as `train/extra_loss`;
- the contract with the data module: the method's `batch_mode` and the data facts it reads
  (`longctx.core.data_facts.LMDataFacts`) are checked at `setup`, one clear error before any step;
- the metrics: token-weighted sums synced across ranks, logged as `{stage}/loss`, `{stage}/bpc` or
  `{stage}/ppl`, `{stage}/word_ppl`, `{stage}/bpb` (bits per UTF-8 byte of the scored text, whatever
  the tokenizer, from the data module's `token_bytes`), and `throughput/*`; on a split with marks
  (`target_marks`), the recall accuracy `{stage}/recall_acc*` (`longctx.core.recall`);
- the memory lifecycle: one memory per stage, fresh at every epoch start, detached after every
  training step, so a validation in the middle of an epoch never disturbs the training memory; in
  segment mode the rows of a new document are made fresh through the memory's own `reset_rows`
  (`longctx.core.memory.RowMemory`), whatever the method;
- truncated backpropagation through time over k segments (`tbptt_segments`, a segment-mode method's
  knob; None: as many as each training batch holds, the data module's layout deciding): a training
  batch holds k consecutive segments per row (B, k, L), run in order with the memory carried *with*
  its gradient, detached only at the batch's end (Lightning's optimizer steps cannot share a graph);
  the loss is the mean over the k segments' scored tokens;
- the optimizer wiring: `optimizer` / `lr_scheduler` callables from the config;
- the RNG state in each checkpoint, so a resumed run draws the dropout masks the uninterrupted run
  would have drawn (the carried memory is not saved: it restarts empty).
"""

from __future__ import annotations

import inspect
import io
import math
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, Self, TypeAlias

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor
from torch.utils._pytree import tree_map
from torchmetrics import SumMetric

from longctx.core import rng_state
from longctx.core.data_facts import (
    VOCABULARY_KEY,
    BatchMode,
    DataMismatch,
    LMDataFacts,
    check_data_facts,
    check_vocabulary,
)
from longctx.core.knob_groups import (
    flatten_knobs,
    knob_path,
    moved_keywords,
    override_groups,
    plain,
    read_groups,
    rename_knobs,
    upgrade_flat,
)
from longctx.core.memory import RowMemory
from longctx.core.recall import RecallScorer
from longctx.core.spawn_exit import register_spawn_strategies
from longctx.core.token_nll import TokenNLLCollector

# `ddp_spawn` workers of every longctx model end without finalizing (`longctx.core.spawn_exit`).
register_spawn_strategies()

# A method's carried memory: a `RowMemory` (`longctx.core.memory`: a NamedTuple with named, documented
# fields and shapes, made by `empty` and cleared row by row by `reset_rows`), or None for a model
# without memory. It is a pytree: `detach_memory` maps over it, whatever its fields.
Memory: TypeAlias = RowMemory | None
STAGES = ("train", "val", "test")
EVAL_SPLITS = {"val": "valid", "test": "test"}  # the data split each evaluation stage reads
RNG_KEY = "rng_state"
# Constructor arguments that are callables: not checkpoint-safe (`torch.load(weights_only=True)`
# refuses them), and the CLI logs them with the resolved config anyway.
UNSAVED_HPARAMS = ("optimizer", "lr_scheduler")


@dataclass
class StepOutput:
    """What a method's `step` returns for one batch.

    nll: per-target negative log-likelihood in nats, the shape of `batch["target"]`.
    memory: the memory to carry into the next batch of the same stream (the base detaches it).
    extra_loss: a scalar added to the training loss (e.g. the l1 span penalty), or None.
    logs: scalars logged under the stage's prefix (e.g. {"span/avg": ...} are logged as is when the
        key already has a prefix containing "/").
    mask: overrides `batch["mask"]` (e.g. an evaluation protocol that skips some positions).
    correct: bool, the shape of `batch["target"]`: the target is the argmax of the model's full
        predicted distribution. Returned when `LMBase.wants_correct` is set (evaluation steps with
        marks or a per-token writer), else None (no cost).
    """

    nll: Tensor
    memory: Memory = None
    extra_loss: Tensor | None = None
    logs: dict[str, Tensor | float] = field(default_factory=dict)
    mask: Tensor | None = None
    correct: Tensor | None = None


def _propagating_sum() -> SumMetric:
    """A sum that keeps NaN and inf: torchmetrics' default (`nan_strategy="warn"`) drops NaN values,
    so a diverged model would score loss 0, perplexity 1 (a wrong number, worse than none).
    "disable" also skips the per-update NaN check, a host sync."""
    return SumMetric(nan_strategy="disable")


def detach_memory(memory: Memory) -> Memory:
    """Cut the graph behind every tensor of a memory (truncated backprop through time)."""
    return tree_map(lambda x: x.detach() if isinstance(x, Tensor) else x, memory)


def check_tbptt_segments(k: int | None) -> None:
    """Refuse a `tbptt_segments` under 1 (None: as many as each training batch holds)."""
    if k is not None and k < 1:
        raise ValueError(f"tbptt_segments must be 1 or more (or null: as the batches hold), got {k}")


class LMBase(pl.LightningModule):
    """Shared base of the language-model modules (see docs/architecture.md for the contract)."""

    network_attribute = "net"  # the attribute holding the network (what `CompileNetwork` compiles)
    # The batch layout `step` reads (docs/architecture.md): "segments" (B, L) or "windows" (B, K, T);
    # each method declares it, and `setup` refuses a data module in the other mode.
    batch_mode: ClassVar[BatchMode] = "segments"
    # Flat names of the knob groups' fields (`longctx.core.knob_groups`): group argument → prefix, e.g.
    # {"evaluation": "eval_"}: `eval_mem_len=64` is `evaluation.mem_len`. Groups not named: no prefix.
    flat_prefixes: ClassVar[dict[str, str]] = {}
    # Group fields renamed after checkpoints and run configs saved them: old path → new path, e.g.
    # {"network.span": "network.span_kind"}; read under either name (`knob_groups.rename_knobs`), and
    # the CLI's line for the old name says what it is called now.
    renamed_knobs: ClassVar[dict[str, str]] = {}
    # The module's own evaluation knobs that set how much context it may use, as context axes
    # (`longctx.diagnostics.axes.Axis`, for `python -m longctx context`): the first that applies to a
    # model is its default axis; the data module's window and overlap apply to every model besides.
    context_axes: ClassVar[tuple[Any, ...]] = ()
    # Per-target NLL of the running evaluation: set by `TokenNLLWriter` (`--write_token_nll true`) only.
    token_nll_collector: TokenNLLCollector | None = None
    # Set by the base while `step` runs an evaluation batch that needs `StepOutput.correct` (the split
    # has marks, or a per-token writer is attached); a method computes the argmax only then.
    wants_correct: bool = False
    # Segment mode: the k segments of each row a training batch holds, through which the gradient
    # flows along the memory (truncated BPTT); 1: every step's memory is detached (the default); None:
    # as many as each training batch holds (`data.windows_per_batch`, or the layout the data module
    # chose from its text). A method that can carry its memory's graph takes it as its
    # `tbptt_segments` knob, and its `step` then returns the memory undetached in training.
    tbptt_segments: int | None = 1

    @property
    def carries_memory_graph(self) -> bool:
        """Training with truncated BPTT over several segments (`tbptt_segments` not 1; None: the
        batches decide): `step` returns the memory with its graph, the base detaches it per batch."""
        return self.training and self.tbptt_segments != 1

    def __init__(
        self,
        vocab_size: int = 0,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        if vocab_size <= 0:
            raise ValueError(
                f"vocab_size must be positive, got {vocab_size}: it is linked from the data module "
                "(data.vocab_size) when run through the CLI; pass it explicitly otherwise"
            )
        self.vocab_size = vocab_size
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self._memory: dict[str, Memory] = dict.fromkeys(STAGES)
        # Token-weighted sums, synced across ranks by torchmetrics on compute().
        self.nll_sum = torch.nn.ModuleDict({s: _propagating_sum() for s in ("val", "test")})
        self.token_sum = torch.nn.ModuleDict({s: _propagating_sum() for s in ("val", "test")})
        self.byte_sum = torch.nn.ModuleDict({s: _propagating_sum() for s in ("val", "test")})
        self._token_bytes: tuple[Tensor, Tensor] | None = None  # data module's (V,) table, on device
        self._batch_start_time: float | None = None
        self._eval_batches: dict[str, int] = {"val": 0, "test": 0}
        self._eval_length: dict[str, int] = {}  # segment length n (window T) of each stage's batches
        # Each evaluation's marked targets (`target_marks` of its split), None without marks.
        self._recall: dict[str, RecallScorer | None] = {"val": None, "test": None}

    def __new__(cls, *args: Any, **kwargs: Any) -> LMBase:
        cls.refuse_flat_keywords(kwargs)  # before `__init__`, whose own error would not name the group
        return super().__new__(cls)

    @classmethod
    def refuse_flat_keywords(cls, kwargs: Mapping[str, Any]) -> None:
        """A knob under its flat name (`eval_mem_len=64`) is a TypeError naming the group it moved to
        (`evaluation={'mem_len': ...}`): the module takes its knobs in groups only."""
        if moved := moved_keywords(cls.__init__, kwargs, cls.flat_prefixes):
            where = "; ".join(
                f"{key} is {path} ({path.split('.')[0]}={{{path.split('.')[1]!r}: ...}})"
                for key, path in moved.items()
            )
            raise TypeError(f"{cls.__name__}() takes its knobs in groups: {where}")

    @classmethod
    def read_groups(cls, given: dict[str, Any]) -> dict[str, Any]:
        """The module's knob groups (`given`: each as passed, a dataclass or a dict of its fields) as
        dataclasses (`knob_groups.read_groups`); call it first in `__init__`."""
        return read_groups(cls.__init__, given)

    @classmethod
    def upgrade_hyperparameters(cls, hparams: Mapping[str, Any]) -> dict[str, Any]:
        """A checkpoint's `hyper_parameters` in the module's groups: the flat keys of checkpoints
        saved before the groups moved into them (`knob_groups.upgrade_flat` with `flat_prefixes`), and
        knobs renamed since under their new names (`renamed_knobs`)."""
        renamed = rename_knobs(hparams, cls.renamed_knobs, cls.flat_prefixes)
        return upgrade_flat(cls.__init__, renamed, cls.flat_prefixes)

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | Path | IO[bytes],
        map_location: Any = None,
        hparams_file: str | Path | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Self:
        """Lightning's, reading a checkpoint of any version: its saved hyperparameters are upgraded
        first (`upgrade_hyperparameters`), and a group given as a dict in `kwargs` overrides only the
        fields it names (`evaluation={"mem_len": 64}` keeps the saved clamp_len)."""
        cls.refuse_flat_keywords(kwargs)
        lazy = isinstance(checkpoint_path, str | Path) and zipfile.is_zipfile(checkpoint_path)
        checkpoint = torch.load(
            checkpoint_path, map_location=map_location, weights_only=weights_only is not False, mmap=lazy
        )
        saved = checkpoint.get("hyper_parameters") or {}
        upgraded = cls.upgrade_hyperparameters(saved)
        merged = override_groups(upgraded, kwargs)
        kwargs = {name: merged[name] for name in kwargs}
        if upgraded != saved:  # Lightning reads the checkpoint with its hyperparameters upgraded
            checkpoint_path = io.BytesIO()
            torch.save({**checkpoint, "hyper_parameters": upgraded}, checkpoint_path)
        if isinstance(checkpoint_path, io.IOBase):
            checkpoint_path.seek(0)
        return super().load_from_checkpoint(
            checkpoint_path, map_location, hparams_file, strict, weights_only, **kwargs
        )

    @classmethod
    def flatten_knobs(cls, init_args: dict[str, Any]) -> dict[str, Any]:
        """A run config's init arguments with the groups' fields under their flat names (`report`)."""
        renamed = rename_knobs(init_args, cls.renamed_knobs, cls.flat_prefixes)
        return flatten_knobs(cls.__init__, renamed, cls.flat_prefixes)

    @classmethod
    def knob_path(cls, name: str) -> str:
        """The config path under `model.init_args` of the flat knob `name` (`network.d_model`); a renamed
        knob's old flat name gives its new path."""
        (name,) = rename_knobs({name: None}, cls.renamed_knobs, cls.flat_prefixes)
        return knob_path(cls.__init__, name, cls.flat_prefixes)

    def save_hyperparameters(
        self, *args: Any, ignore: Sequence[str] | str | None = None, frame: Any = None, logger: bool = True
    ) -> None:
        """Lightning's, called from a method's `__init__`, never saving `UNSAVED_HPARAMS`.

        Knob groups (dataclasses, `longctx.core.knob_groups`) are saved as dicts of plain values, so
        `torch.load(weights_only=True)` reads the checkpoint.
        """
        ignore = [ignore] if isinstance(ignore, str) else list(ignore or [])
        frame = frame or inspect.currentframe().f_back  # the subclass's __init__, not this method
        super().save_hyperparameters(*args, ignore=[*ignore, *UNSAVED_HPARAMS], frame=frame, logger=logger)
        for store in (self._hparams, self._hparams_initial):
            for key in list(store):
                store[key] = plain(store[key])

    # ------------------------------------------------------------------ method hooks
    def init_memory(self, batch_size: int) -> Memory:
        """Memory for `batch_size` fresh rows (the method's `RowMemory.empty` with its sizes); None for
        models without memory."""
        return None

    def step(self, batch: dict[str, Tensor], memory: Memory) -> StepOutput:
        """Run the network on one batch given the carried memory."""
        raise NotImplementedError

    def flops_per_token(self, segment_length: int) -> float | None:
        """Forward FLOPs per scored token at evaluation, in `longctx.core.flops`'s convention (2 × MACs),
        for batches of segment (window) length `segment_length`; logged as `{val,test}/flops_per_token`.
        None: not counted."""
        return None

    def state_size(self) -> int | None:
        """Numbers per layer that carry context from one segment (window) to the next at evaluation,
        zoology's "state size", so that different memories share one axis (Transformer-XL: its memory
        m·d); logged as `{val,test}/state_size`. None: not declared."""
        return None

    def evaluation_memory_start(
        self, row_start: np.ndarray, offset: np.ndarray, segment_len: int
    ) -> np.ndarray:
        """(M,) for each scored target `offset` of a contiguous split read in rows from `row_start`
        (`longctx.data.streams.evaluation_row_start`), `segment_len` targets per step: the first token of
        the segment from which this evaluation last restarted the memory. The row's first token, unless
        the method restarts its memory within a row (the Recurrent Memory Transformer's samples of K
        segments): an answer bound before it is one the evaluation made the memory forget, which
        `report`'s recall by segments back shows apart (token_nll.npz `memory_start`)."""
        return row_start

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """Elements (of the model's float dtype) of the tensors one evaluation step on `batch_size`
        rows of `length` tokens holds beyond the logits and grows with the context: the memory, the
        scores, a feed-forward activation (`longctx.diagnostics.footprint`, which `context` checks
        before it allocates a length). Each method counts its own."""
        raise NotImplementedError(f"{type(self).__name__} declares no evaluation footprint")

    @classmethod
    def describe_run(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> str | None:
        """What tells this method's runs apart (memory length, span kind, window and overlap), the
        `variant` column of `python -m longctx report`, from a run's resolved config: `model`, its model
        init arguments with the knob groups' fields under their flat names (runs from before the groups
        and after read alike), `data`, the data module's. None: nothing told (a dash)."""
        return None

    def context_variants(self) -> Sequence[Any]:
        """The settings every point of a `context` sweep is evaluated under, one line of its figure each
        (`longctx.diagnostics.axes.Variant`); none: the model as built."""
        return ()

    def longest_window(self) -> int | None:
        """The longest segment (window) the network's positions take at evaluation; None: no limit."""
        return None

    def optimizer_param_groups(self) -> list[dict[str, Any]] | Any:
        """Parameters (or parameter groups) handed to the optimizer factory."""
        return self.parameters()

    # ------------------------------------------------------------------ the data contract
    def setup(self, stage: str) -> None:
        """Check the data module against the model once, before any step (no check without one:
        loaders passed to `fit` directly)."""
        if (datamodule := getattr(self._trainer, "datamodule", None)) is not None:
            check_data_facts(datamodule, type(self).__name__, self.batch_mode)

    def data_facts(self) -> LMDataFacts | None:
        """The trainer's data module (checked at `setup`), or None without one."""
        return getattr(self._trainer, "datamodule", None)

    # ------------------------------------------------------------------ memory lifecycle
    def _memory_for(self, stage: str, batch: dict[str, Tensor]) -> Memory:
        """The stage's carried memory, with rows that start a new document cleared (`_rows_reset`)."""
        return self._rows_reset(stage, batch, self._memory[stage])

    def _rows_reset(self, stage: str, batch: dict[str, Tensor], memory: Memory) -> Memory:
        """`memory` (fresh when None) with the rows that start a new document in `batch` cleared.

        Segment mode (`reset` of shape (B,)) is handled here, through the memory's own `reset_rows`
        (`RowMemory`); in window mode (`reset` (B, K)) the reset can fall inside the batch, so the
        method's `step` applies it window by window.
        """
        reset = batch["reset"]
        if memory is not None and reset.dim() == 1 and stage == "train":
            return memory.reset_rows(reset)  # no host sync per training step
        if memory is None or (reset.dim() == 1 and bool(reset.all())):
            return self.init_memory(batch["input"].shape[0])
        if reset.dim() == 1 and bool(reset.any()):
            return memory.reset_rows(reset)
        return memory

    def _reset_memory(self, stage: str) -> None:
        self._memory[stage] = None

    def on_train_epoch_start(self) -> None:
        self._reset_memory("train")

    def on_validation_epoch_start(self) -> None:
        self._start_eval("val")

    def on_test_epoch_start(self) -> None:
        self._start_eval("test")

    def _start_eval(self, stage: str) -> None:
        self._reset_memory(stage)
        self._eval_batches[stage] = 0
        # Fresh metric states (also unshares tensors that a spawned process inherited).
        self.nll_sum[stage].reset()
        self.token_sum[stage].reset()
        self.byte_sum[stage].reset()
        data = self.data_facts()
        marks = None if data is None else data.target_marks(EVAL_SPLITS[stage])
        self._recall[stage] = None if marks is None else RecallScorer(marks, self.device)

    def on_validation_epoch_end(self) -> None:
        self._reset_memory("val")
        self._log_eval_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._reset_memory("test")
        self._log_eval_metrics("test")

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        if self.batch_mode == "segments":
            out = self._train_segments(batch)
        else:
            out = self.step(batch, self._memory_for("train", batch))
        self._memory["train"] = detach_memory(out.memory)
        mask = batch["mask"] if out.mask is None else out.mask
        nll_sum = (out.nll.float() * mask).sum()
        tokens = mask.sum()
        global_tokens = self._global_sum(tokens.float())
        # DDP averages gradients over ranks: scaling by world/global_tokens makes the update the
        # gradient of (sum of NLL over all ranks' tokens) / (all ranks' token count).
        loss = nll_sum * self.trainer.world_size / global_tokens.clamp_min(1.0)
        if out.extra_loss is not None:
            loss = loss + out.extra_loss
            self.log("train/extra_loss", out.extra_loss.detach())
        mean_nll = (nll_sum / tokens.clamp_min(1)).detach()
        self.log("train/loss", mean_nll, prog_bar=True)
        self._log_unit_metric("train", mean_nll)
        if (n_bytes := self._scored_bytes(batch["target"], mask)) is not None:
            self.log("train/bpb", nll_sum.detach() / math.log(2) / n_bytes.clamp_min(1))
        self._log_step_logs("train", out.logs)
        self._train_tokens = global_tokens.detach()  # a tensor: read on the host only when logged
        return loss

    def _train_segments(self, batch: dict[str, Tensor]) -> StepOutput:
        """A segment-mode training batch: one segment (B, L), or the `tbptt_segments` = k segments
        (B, k, L) of truncated BPTT, run in order with the memory carried undetached (rows reset per
        segment). Returns the k segments' NLL and mask (B, k, L), the last memory, and the mean over
        segments of the extra loss and of the logs."""
        k = 1 if batch["input"].dim() == 2 else batch["input"].shape[1]
        if self.tbptt_segments is not None and k != self.tbptt_segments:
            raise DataMismatch(self._tbptt_mismatch(k))
        memory = self._memory["train"]
        if batch["input"].dim() == 2:
            return self.step(batch, self._rows_reset("train", batch, memory))
        outs = []
        for i in range(k):
            segment = {key: value[:, i] for key, value in batch.items()}
            out = self.step(segment, self._rows_reset("train", segment, memory))
            memory = out.memory
            outs.append((out, segment["mask"] if out.mask is None else out.mask))
        extra = [out.extra_loss for out, _ in outs if out.extra_loss is not None]
        return StepOutput(
            nll=torch.stack([out.nll for out, _ in outs], 1),
            memory=memory,
            extra_loss=sum(extra) / k if extra else None,
            logs={name: sum(out.logs[name] for out, _ in outs) / k for name in outs[0][0].logs},
            mask=torch.stack([mask for _, mask in outs], 1),
        )

    def _tbptt_mismatch(self, k: int) -> str:
        """The one line for training batches of k segments per row that `tbptt_segments` does not
        expect."""
        name = type(self).__name__
        held = f"the training batches hold {k} segment{'s' * (k > 1)} per row (data.windows_per_batch)"
        if "tbptt_segments" not in inspect.signature(type(self).__init__).parameters:
            return (
                f"{name} trains on one segment per batch (it has no tbptt_segments), but {held}: set "
                "data.windows_per_batch: 1"
            )
        return (
            f"{name} trains with truncated BPTT over {self.tbptt_segments} segments "
            f"(model.init_args.tbptt_segments), but {held}: set data.windows_per_batch: {self.tbptt_segments}"
        )

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step("test", batch)

    def _eval_step(self, stage: str, batch: dict[str, Tensor]) -> None:
        memory = self._memory_for(stage, batch)
        recall = self._recall[stage]
        self.wants_correct = recall is not None or self.token_nll_collector is not None
        try:
            out = self.step(batch, memory)
        finally:
            self.wants_correct = False
        self._memory[stage] = detach_memory(out.memory)
        mask = batch["mask"] if out.mask is None else out.mask
        self.nll_sum[stage].update((out.nll.double() * mask).sum())
        self.token_sum[stage].update(mask.sum().double())
        if (n_bytes := self._scored_bytes(batch["target"], mask)) is not None:
            self.byte_sum[stage].update(n_bytes.double())
        if recall is not None:
            self._score_recall(recall, out, mask, batch)
        if self.token_nll_collector is not None:
            self.token_nll_collector.add(out.nll, mask, batch, out.correct)
        self._eval_batches[stage] += 1
        self._eval_length[stage] = batch["input"].shape[-1]
        self._log_step_logs(stage, out.logs)

    def _score_recall(
        self, recall: RecallScorer, out: StepOutput, mask: Tensor, batch: dict[str, Tensor]
    ) -> None:
        if out.correct is None:
            raise NotImplementedError(
                f"{type(self).__name__}.step returned no StepOutput.correct while wants_correct was set: "
                "the split has marks, so recall accuracy needs each target's argmax"
            )
        if "offset" not in batch:
            raise ValueError(
                "recall accuracy needs evaluation batches with an `offset` key (each target's index in "
                "the split), which LMDataModule's streams carry; this data module's batches do not"
            )
        recall.update(out.correct, mask, batch["offset"])

    # ------------------------------------------------------------------ metrics and logging
    def _global_sum(self, value: Tensor) -> Tensor:
        if self.trainer.world_size == 1:
            return value
        return self.all_gather(value).sum()

    def _scored_bytes(self, target: Tensor, mask: Tensor) -> Tensor | None:
        """UTF-8 bytes of the text of the scored targets, or None when the data module has no
        bytes-per-id table (`LMDataModule.token_bytes`)."""
        data = self.data_facts()
        table = None if data is None else data.token_bytes
        if table is None:
            return None
        if self._token_bytes is None or self._token_bytes[0] is not table:
            self._token_bytes = (table, table.to(target.device))  # a copy per data module and device
        return (self._token_bytes[1][target] * mask).sum()

    def _unit_metric(self) -> str:
        data = self.data_facts()
        return "ppl" if data is None else data.metric

    def _log_unit_metric(self, stage: str, mean_nll: Tensor, **kwargs: Any) -> None:
        if self._unit_metric() == "bpc":
            self.log(f"{stage}/bpc", mean_nll / math.log(2), prog_bar=stage != "train", **kwargs)
        else:
            self.log(f"{stage}/ppl", torch.exp(mean_nll), prog_bar=stage != "train", **kwargs)

    def _log_step_logs(self, stage: str, logs: dict[str, Tensor | float]) -> None:
        for name, value in logs.items():
            key = name if "/" in name else f"{stage}/{name}"
            self.log(key, value, on_step=stage == "train", on_epoch=stage != "train")

    def _log_eval_metrics(self, stage: str) -> None:
        nll = self.nll_sum[stage].compute()
        tokens = self.token_sum[stage].compute()
        n_bytes = self.byte_sum[stage].compute()
        self.nll_sum[stage].reset()
        self.token_sum[stage].reset()
        self.byte_sum[stage].reset()
        recall = self._recall[stage].results(stage) if self._recall[stage] is not None else {}
        for name, value in recall.items():
            self.log(name, value, sync_dist=False)
        if tokens <= 0:
            return
        mean_nll = (nll / tokens).float()
        self.log(f"{stage}/loss", mean_nll, prog_bar=True, sync_dist=False)
        self.log(f"{stage}/tokens", tokens.float(), sync_dist=False)
        self._log_unit_metric(stage, mean_nll, sync_dist=False)
        length = self._eval_length.get(stage)
        if length is not None and (flops := self.flops_per_token(length)) is not None:
            self.log(f"{stage}/flops_per_token", float(flops), sync_dist=False)
        if (state_size := self.state_size()) is not None:
            self.log(f"{stage}/state_size", float(state_size), sync_dist=False)
        if n_bytes > 0:
            self.log(f"{stage}/bpb", (nll / math.log(2) / n_bytes).float(), sync_dist=False)
        words = self._word_count(stage)
        if words:
            self.log(f"{stage}/word_ppl", torch.exp(nll / words).float(), sync_dist=False)

    def _word_count(self, stage: str) -> int | None:
        """Word count of the evaluated split, for perplexity per word of a BPE model; None unless the
        whole split was scored (with `limit_*_batches` the NLL covers only part of the words)."""
        data = self.data_facts()
        if data is None:
            return None
        loader = self.trainer.val_dataloaders if stage == "val" else self.trainer.test_dataloaders
        try:
            complete = self._eval_batches[stage] == len(loader)
        except TypeError:  # a loader without a length: cannot tell, do not guess
            complete = False
        if not complete:
            return None
        return data.word_count("valid" if stage == "val" else "test")

    # ------------------------------------------------------------------ throughput
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._batch_start_time = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._batch_start_time is None:
            return
        elapsed = time.perf_counter() - self._batch_start_time
        if elapsed > 0:
            self.log("throughput/train_tokens_per_s", self._train_tokens / elapsed)

    # ------------------------------------------------------------------ optimizer
    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.optimizer_param_groups())
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        if follow_trainer := getattr(scheduler, "follow_trainer", None):
            # A schedule configured without a length decays over the trainer's max_steps.
            follow_trainer(self.trainer.max_steps if self._trainer is not None else None)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[RNG_KEY] = rng_state.collect()
        data = self.data_facts()
        if data is not None and (digest := data.vocabulary_digest) is not None:
            checkpoint[VOCABULARY_KEY] = {"digest": digest, "size": int(getattr(data, "vocab_size", 0))}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if (data := self.data_facts()) is not None:
            check_vocabulary(checkpoint.get(VOCABULARY_KEY), data)
        # `load_from_checkpoint` (no trainer) leaves the RNG alone; a resumed fit restores it.
        if RNG_KEY in checkpoint and self._trainer is not None:
            rng_state.restore(checkpoint[RNG_KEY])
