"""A small memory-carrying LM and a synthetic-token data module for testing the spine.

`CarryLM` is the simplest model whose loss depends on carried memory: each row's memory is the
running sum of the embeddings it has read, added to every position's hidden state. That makes
"memory carried across batches", "memory reset", and "memory per rank" observable in the loss.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import NamedTuple

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.core.base import LMBase, StepOutput
from longctx.core.recall import TargetMarks
from longctx.data.streams import SegmentStream


class CarrySum(NamedTuple):
    """total: (B, d), each row's running sum of the embeddings it has read (a `RowMemory`)."""

    total: Tensor

    @classmethod
    def empty(cls, batch_size: int, *, d_model: int, device=None, dtype=None) -> CarrySum:
        return cls(torch.zeros(batch_size, d_model, device=device, dtype=dtype))

    def reset_rows(self, rows: Tensor) -> CarrySum:
        return CarrySum(self.total.masked_fill(rows[:, None], 0.0))


class CarryLM(LMBase):
    def __init__(
        self, vocab_size: int = 64, d_model: int = 16, record_dir: str | None = None, **kwargs
    ) -> None:
        super().__init__(vocab_size=vocab_size, **kwargs)
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.out = nn.Linear(d_model, vocab_size)
        self.record_dir = record_dir

    def init_memory(self, batch_size: int) -> CarrySum:
        return CarrySum.empty(batch_size, d_model=self.embed.embedding_dim, device=self.device)

    def step(self, batch: dict[str, Tensor], memory: CarrySum) -> StepOutput:
        x = self.embed(batch["input"])  # (B, L, d)
        h = x + memory.total[:, None, :] / 100.0
        logits = self.out(torch.tanh(h))  # (B, L, V)
        nll = F.cross_entropy(logits.transpose(1, 2), batch["target"], reduction="none")  # (B, L)
        new_memory = memory.total + (x * batch["mask"][..., None]).sum(1)
        return StepOutput(nll=nll, memory=CarrySum(new_memory))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        if self.record_dir is not None:
            path = Path(self.record_dir) / f"rank{self.global_rank}.jsonl"
            with path.open("a") as f:
                # A draw from the global generator stands for dropout: a resumed run must draw the same.
                record = {
                    "step": self.global_step,
                    "first": batch["input"][:, 0].tolist(),
                    "draw": torch.rand(()).item(),
                }
                f.write(json.dumps(record) + "\n")
        return super().training_step(batch, batch_idx)


class NoTextFacts:
    """The data facts `LMBase` reads (`LMDataFacts`) for synthetic tokens that stand for no text: no
    bytes per token, no words, no marks; segment batches unless a subclass says otherwise."""

    mode = "segments"
    metric = "ppl"
    eval_overlap = 0
    token_bytes = None
    vocabulary_digest = None

    def word_count(self, split: str) -> int | None:
        return None

    def target_marks(self, split: str) -> None:
        return None


class SyntheticData(NoTextFacts, pl.LightningDataModule):
    """Streams over fixed pseudo-random tokens (64 symbols); `marks`: the validation split's marked
    targets (recall accuracy is logged on them), None: no marks."""

    def __init__(
        self,
        n_tokens: int = 4001,
        batch_size: int = 4,
        seq_len: int = 16,
        eval_batch_size: int = 3,
        marks: TargetMarks | None = None,
    ):
        super().__init__()
        rng = np.random.default_rng(0)
        self.tokens = rng.integers(0, 64, size=n_tokens).astype(np.uint8)
        self.batch_size, self.seq_len, self.eval_batch_size = batch_size, seq_len, eval_batch_size
        self.vocab_size = 64
        self.metric = "bpc"
        self.marks = marks

    def target_marks(self, split: str) -> TargetMarks | None:
        return self.marks if split == "valid" else None

    def _stream(self, batch_size: int, pad: bool) -> SegmentStream:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return SegmentStream(self.tokens, batch_size, self.seq_len, pad=pad, rank=rank, world_size=world)

    def train_dataloader(self) -> SegmentStream:
        return self._stream(self.batch_size, pad=False)

    def val_dataloader(self) -> SegmentStream:
        return self._stream(self.eval_batch_size, pad=True)


class WindowData(SyntheticData):
    """The same synthetic tokens in window mode (T = 16, overlap 4, one window per batch)."""

    mode = "windows"
    eval_overlap = 4

    def _stream(self, batch_size: int, pad: bool) -> SegmentStream:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return SegmentStream(
            self.tokens,
            batch_size,
            self.seq_len,
            overlap=4,
            windows_per_batch=1,
            pad=pad,
            rank=rank,
            world_size=world,
        )


def reference_eval_loss(model: CarryLM, data: SyntheticData) -> float:
    """Total NLL over total scored tokens, computed batch by batch with one carried memory."""
    stream = SegmentStream(data.tokens, data.eval_batch_size, data.seq_len, pad=True)
    total, count, memory = 0.0, 0, None
    with torch.no_grad():
        for batch in stream:
            memory = model.init_memory(batch["input"].shape[0]) if memory is None else memory
            out = model.step(batch, memory)
            memory = out.memory
            total += float((out.nll * batch["mask"]).sum())
            count += int(batch["mask"].sum())
    return total / count


# What picks or names a run folder from the environment (`longctx.commands.cli.run_name_from_env`).
RUN_NAMING_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_NTASKS",
    "LONGCTX_RUN_NAME",
)


def run_cli_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in-process CLI commands from `folder` as a user at a terminal would: W&B off, and no SLURM
    job or `LONGCTX_RUN_NAME` of the machine running the tests choosing the run folder."""
    monkeypatch.chdir(folder)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for name in RUN_NAMING_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def carry_lm_cli(subcommand: str, run_name: str, *extra: str) -> list[str]:
    """The command line (`python -m longctx` arguments) of a tiny `CarryLM` run on the `sample` corpus:
    4 steps of 4 rows × 32 tokens, validated every 2 steps on 2 batches, tested on 2, run from a
    folder that keeps its token `cache`; `extra` flags last."""
    return [
        subcommand,
        "--model", "tests.helpers.lm_fixtures.CarryLM",
        "--data.corpus", "sample", "--data.batch_size", "4", "--data.tgt_len", "32",
        "--data.cache_dir", "cache",
        "--trainer.accelerator", "cpu", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
        "--trainer.check_val_every_n_epoch", "null",
        "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
        "--run_name", run_name,
        *extra,
    ]  # fmt: skip


def cpu_trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    """A quiet single-process CPU trainer (no logger, checkpoints, progress bar or summary); kwargs
    override any default."""
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    return pl.Trainer(**{**defaults, **kwargs})


class SignalAfterStep(pl.Callback):
    """Sends this process `signal_name` after optimizer step `step`, as a scheduler does before a
    time limit (SIGUSR1) or a kill (SIGTERM); `stop` then ends the fit, as a killed job would."""

    def __init__(self, step: int, signal_name: str = "SIGUSR1", stop: bool = False) -> None:
        self.step, self.signum, self.stop = step, signal.Signals[signal_name], stop

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)
            if self.stop:
                trainer.should_stop = True
