"""The run folder's record of an overlap sweep, written as it goes, so that stopped work is kept.

After every overlap `evaluate_overlaps` rewrites (atomically) `<run dir>/overlaps_<split>.csv`, one
row per finished overlap, and the `overlaps` list of `summary.json` (`[{"overlap": o, "test/ppl":
..., ...}]`: kept apart from the run's `metrics`, so `report` never takes an overlap's figures for
the test result), with `overlaps_of` naming what was evaluated: the split, the checkpoint (path, size,
modification time) and a hash of the settings (model and data hyperparameters, batch limit,
precision, world size). A Ctrl-C, a kill or a crash keeps the finished overlaps; the same command
again (same run name) skips the overlaps recorded for the same checkpoint and settings and evaluates
the rest. A record of another checkpoint or other settings is replaced, never mixed in.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from longctx.core.base import LMBase
from longctx.runtime.atomic import write_json_atomic, write_text_atomic
from longctx.runtime.run_layout import SUMMARY

ROWS_KEY = "overlaps"
SOURCE_KEY = "overlaps_of"


def evaluated(
    trainer: pl.Trainer,
    model: LMBase,
    datamodule: pl.LightningDataModule,
    ckpt_path: str | None,
    split: str,
) -> dict[str, Any]:
    """What an overlap sweep evaluates: equal for two commands whose finished overlaps are
    interchangeable."""
    checkpoint = None
    if ckpt_path and os.path.isfile(ckpt_path):
        stat = os.stat(ckpt_path)
        checkpoint = {
            "path": str(Path(ckpt_path).resolve()),
            "bytes": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
        }
    stage = "test" if split == "test" else "val"
    settings = {
        # Knob groups under their flat names, as versions before the groups recorded them: a record
        # they wrote is still recognised.
        "model": model.flatten_knobs(dict(model.hparams)),
        "data": {k: v for k, v in datamodule.hparams.items() if k != "eval_overlap"},
        "limit_batches": getattr(trainer, f"limit_{stage}_batches"),
        "precision": str(trainer.precision),
        "world_size": trainer.world_size,
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
    return {"split": split, "checkpoint": checkpoint, "settings": digest[:16]}


def finished_overlaps(run_dir: Path, source: dict[str, Any]) -> dict[int, dict[str, float]]:
    """The rows recorded in `run_dir` for this very evaluation (`source`), by overlap."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    if summary.get(SOURCE_KEY) != source:
        return {}
    return {int(row["overlap"]): row for row in summary.get(ROWS_KEY, [])}


def save_overlaps(run_dir: Path, split: str, source: dict[str, Any], rows: list[dict[str, float]]) -> None:
    """Write the finished rows to `overlaps_<split>.csv` and to `summary.json` (rank 0 only)."""
    columns = ["overlap", *sorted({key for row in rows for key in row} - {"overlap"})]
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(run_dir / f"overlaps_{split}.csv", table.getvalue())
    path = run_dir / SUMMARY
    summary = json.loads(path.read_text()) if path.exists() else {}
    write_json_atomic(path, {**summary, SOURCE_KEY: source, ROWS_KEY: rows})
