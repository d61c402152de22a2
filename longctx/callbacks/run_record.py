"""The run's own record in its run directory: `summary.json` and `metrics.jsonl` (no W&B needed).

`python -m longctx report` builds its table and figures from these files, and the sweep runner skips
a line whose run directory's `summary.json` says `"status": "finished"`.

- `metrics.jsonl`: one line per validation during `fit`: `step` (global step), `train_tokens`
  (training tokens seen so far, all ranks) and every `val/*` metric; the validation curve.
- `summary.json`, written (atomically) when a subcommand ends:
  `status` ("finished" | "failed" | "interrupted": SIGTERM or Ctrl-C | "diverged": the loss went
  NaN, infinite or past the divergence bound, see `longctx.callbacks.divergence`), `subcommand`,
  `method` (class path), `parameters`, `metrics` (every `val/*` and `test/*`: loss, bpc/ppl, word_ppl,
  bpb, flops_per_token, ...; none from `evaluate_overlaps`, whose per-overlap figures are under
  `overlaps`: see `longctx.methods.recurrence.overlap_record`), `train_tokens`, `train_tokens_per_s`
  (training time only, validation left out), `peak_memory_bytes` with `peak_memory_kind`
  (`cuda_max_allocated` on a GPU, else the process's `peak_rss`), `wall_time_s`, `global_step`,
  `error` (one line, or null), `time`, and for
  word corpora `out_of_vocabulary` (per split: `tokens`, `oov_tokens` mapped to `<unk>`, `oov_fraction`),
  and what a callback adds through a `summary_fields()` method (`recall_stop` of a fit with
  `--recall_stop.min_acc`: `longctx.callbacks.accuracy_stop`).
  A later subcommand in the same directory (e.g. `test` after `fit`) keeps the earlier metrics it
  does not recompute and the training figures when it did not train; `status` and `subcommand` are
  always the latest's, and `statuses` holds the last status of each subcommand run there
  (`{"fit": "finished", "test": "failed"}`) and `commands` the command line (`python -m longctx`
  arguments) of each (`{"fit": ["fit", "--config", ...]}`), and `config_digests` what each command
  resolved to (sha256 of its parsed settings, config files' contents included: see
  `longctx.runtime.config_digest`): the sweep runner skips a line only when the command recorded for its
  subcommand is the line and the digest recorded is what the line resolves to now. A `validate` or
  `test` replaces the `val/*` or `test/*` metrics of an earlier one, so none of them outlives the
  command that computed it. `artifacts` lists every file of the folder with the command that wrote
  it, and the files an earlier command of the same subcommand wrote that this one did not write again
  are removed (`longctx.runtime.run_folder.Ledger`).

A command that fails before its work starts (before `fit`'s first training step, before the first
evaluation batch: bad input found while it sets up) writes no record: its one error line is the
record, and the CLI removes what it created (`longctx.runtime.run_folder.undone_if_refused`), so it leaves
no `failed` folder behind and a folder that held a run keeps that run's record untouched.

Training tokens are the scored targets of this rank's batches times the world size (every rank
reads batches of one shape); they are kept in checkpoints, so a resumed run keeps counting.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from longctx.callbacks.divergence import DivergenceError
from longctx.callbacks.progress import scored_tokens
from longctx.runtime.atomic import write_text_atomic
from longctx.runtime.run_folder import Ledger, read_summary, record_command
from longctx.runtime.run_layout import METRICS, SUMMARY

EVAL_PREFIXES = ("val/", "test/")
# The metrics an evaluation subcommand computes in full: they replace an earlier one's.
REPLACED_METRICS = {"validate": "val/", "test": "test/"}


def eval_metrics(trainer: pl.Trainer) -> dict[str, float]:
    """Every scalar `val/*` and `test/*` metric the trainer holds."""
    return {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if name.startswith(EVAL_PREFIXES) and (not isinstance(value, torch.Tensor) or value.numel() == 1)
    }


def peak_memory(trainer: pl.Trainer) -> tuple[int, str]:
    """(bytes, kind): CUDA's max allocated on this rank's GPU, else this process's peak RSS."""
    device = trainer.strategy.root_device
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (rss if sys.platform == "darwin" else rss * 1024), "peak_rss"  # Linux reports KiB


class RunRecord(pl.Callback):
    """Counts training tokens and time, appends `metrics.jsonl`, and writes `summary.json`
    (`finish`, called by the CLI when the subcommand ends: see `recorded`). `started` turns true when
    the command's work starts (training, or an evaluation that is not the sanity check), after its
    setup and checkpoint loading."""

    def __init__(self) -> None:
        self.train_tokens = 0.0  # all ranks, this run and the runs it resumed from
        self.train_seconds = 0.0
        self._pending: torch.Tensor | None = None  # this rank's tokens since the last sync (on device)
        self._mark: float | None = None
        self.exception: BaseException | None = None
        self.started = False
        self.ledger: Ledger | None = None  # the run folder as the command found it (`recorded`)

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, float]:
        return {"train_tokens": self.tokens_seen(), "train_seconds": self.train_seconds}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        self.train_tokens = float(state_dict["train_tokens"])
        self.train_seconds = float(state_dict["train_seconds"])
        self._pending = None

    def tokens_seen(self) -> float:
        if self._pending is not None:
            self.train_tokens += float(self._pending) * self._world_size
            self._pending = None
        return self.train_tokens

    # ------------------------------------------------------------------ training
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._world_size = trainer.world_size
        self.exception = None

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.started = self.started or not trainer.sanity_checking

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.started = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.started = True
        self._mark = time.perf_counter()
        if trainer.is_global_zero:  # a resumed run drops the curve past its checkpoint
            self._keep_metric_lines(Path(trainer.default_root_dir) / METRICS, trainer.global_step)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (tokens := scored_tokens(batch)) is not None:
            self._pending = tokens.detach() if self._pending is None else self._pending + tokens.detach()
        now = time.perf_counter()
        self.train_seconds += now - self._mark
        self._mark = now

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        self._mark = time.perf_counter()  # validation time is not training time
        line = {"step": trainer.global_step, "train_tokens": self.tokens_seen()}
        line.update({k: v for k, v in eval_metrics(trainer).items() if k.startswith("val/")})
        if trainer.is_global_zero:
            path = Path(trainer.default_root_dir) / METRICS
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps(line) + "\n")

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.exception = exception  # Lightning re-raises Ctrl-C as SystemExit(1): keep the original

    @staticmethod
    def _keep_metric_lines(path: Path, last_step: int) -> None:
        if not path.exists():
            return
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        kept = [line for line in lines if json.loads(line)["step"] <= last_step]
        if kept != lines:
            write_text_atomic(path, "".join(line + "\n" for line in kept))

    # ------------------------------------------------------------------ summary
    def finish(
        self,
        trainer: pl.Trainer,
        subcommand: str,
        error: BaseException | None,
        wall_time_s: float,
        command: list[str] | None = None,
        config_digest: str | None = None,
    ) -> None:
        """Write `summary.json` for a subcommand that ended (with `error` None when it finished);
        `command` is its command line (`python -m longctx` arguments), `config_digest` what that
        resolved to (`longctx.runtime.config_digest`). Nothing for a command that failed before its work
        started."""
        tokens = self.tokens_seen()  # every rank: no collective inside, but keep ranks alike
        if not trainer.is_global_zero or (error is not None and not self.started):
            return
        cause = self.exception or error
        if error is None:
            status = "finished"
        elif isinstance(cause, (SIGTERMException, KeyboardInterrupt)):
            status = "interrupted"
        elif isinstance(cause, DivergenceError):
            status = "diverged"
        else:
            status = "failed"
        model = trainer.lightning_module
        memory, memory_kind = peak_memory(trainer)
        current: dict[str, Any] = {
            "error": None if cause is None else f"{type(cause).__name__}: {cause}".splitlines()[0],
            "method": None if model is None else f"{type(model).__module__}.{type(model).__qualname__}",
            "parameters": None if model is None else sum(p.numel() for p in model.parameters()),
            "global_step": trainer.global_step,
            "peak_memory_bytes": memory,
            "peak_memory_kind": memory_kind,
            "wall_time_s": wall_time_s,
        }
        if oov := getattr(trainer.datamodule, "out_of_vocabulary", dict)():
            current["out_of_vocabulary"] = oov  # per split: tokens, oov_tokens, oov_fraction
        for callback in trainer.callbacks:  # e.g. `StopAtAccuracy`: the step recall reached its threshold
            if hasattr(callback, "summary_fields"):
                current.update(callback.summary_fields())
        if tokens > 0:
            current["train_tokens"] = tokens
            current["train_tokens_per_s"] = tokens / self.train_seconds if self.train_seconds > 0 else None
        run_dir = Path(trainer.default_root_dir)
        previous = read_summary(run_dir)
        metrics = previous.get("metrics", {})
        if replaced := REPLACED_METRICS.get(subcommand):
            metrics = {name: value for name, value in metrics.items() if not name.startswith(replaced)}
        # evaluate_overlaps keeps each overlap's figures under `overlaps`, not as the run's metrics
        if subcommand != "evaluate_overlaps":
            metrics.update(eval_metrics(trainer))
        ledger = self.ledger or Ledger(run_dir)
        digests = {**previous.get("config_digests", {}), subcommand: config_digest}
        record_command(
            run_dir, subcommand, command, status, ledger, **current, metrics=metrics, config_digests=digests
        )


def run_record(trainer: pl.Trainer) -> RunRecord | None:
    """The trainer's `RunRecord` callback (the CLI adds one to every trainer)."""
    return next((cb for cb in trainer.callbacks if isinstance(cb, RunRecord)), None)


def keep_artifact(trainer: pl.Trainer, name: str) -> None:
    """The run folder's file `name`, written by an earlier command of this subcommand, is still this
    command's result (e.g. an overlap it did not evaluate again): it stays, as the earlier command's."""
    record = run_record(trainer)
    if record is not None and record.ledger is not None:
        record.ledger.keep(name)


@contextmanager
def recorded(
    trainer: pl.Trainer, subcommand: str, command: list[str] | None = None, config_digest: str | None = None
) -> Iterator[None]:
    """Run a subcommand and write its `summary.json` however it ends once its work started (the
    trainer's `RunRecord`); `command`: its command line, and `config_digest` what it resolved to,
    recorded."""
    record = run_record(trainer)
    if record is not None and trainer.is_global_zero:
        record.ledger = Ledger(trainer.default_root_dir)
    start = time.perf_counter()
    try:
        yield
    except BaseException as error:
        if record is not None:
            try:
                record.finish(trainer, subcommand, error, time.perf_counter() - start, command, config_digest)
            except Exception as write_error:  # never hide the run's own error behind this one
                print(f"longctx: could not write {SUMMARY}: {write_error}", file=sys.stderr)
        raise
    if record is not None:
        record.finish(trainer, subcommand, None, time.perf_counter() - start, command, config_digest)
