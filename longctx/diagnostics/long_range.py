"""What a run's per-token output says about long-range context, for `python -m longctx report`.

- `marked_losses`: the mean NLL on the long-range positions of a synthetic task (`python -m longctx.data
  synth`, docs/long_range.md) and on the near answers (the control), from the run's `token_nll.npz`
  and the `<split>.marks.npz` sidecar next to the text file its config's `data.files` names for the
  split that `token_nll.npz` scored (`test` after a `test`, else `valid`).
- `recl`: the run's Relative Effective Context Length from a `python -m longctx context` run beside it
  (`recl.csv` in a sibling directory, the row whose `model` is the run's directory name).

Either is None (a dash in the report) when the run has no such output: no token_nll.npz, a corpus that
is not `text_files`, a tokenizer other than the marks' unit (`bytes` for copy and recall, `words` for
mqar), text without a sidecar, no context run. Never a guessed value.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from longctx.data.synth import load_marks, marks_path
from longctx.runtime.run_layout import TOKEN_NLL

# The split `token_nll.npz` holds, by the subcommand that wrote it last (summary.json `subcommand`).
SCORED_SPLIT = {"test": "test", "validate": "valid", "fit": "valid"}


def marks_for_run(config: dict[str, Any], subcommand: str | None) -> dict[str, np.ndarray] | None:
    """The marks of the text file the run's token_nll.npz scored, or None (see the module doc)."""
    data = config.get("data") or {}
    data = data.get("init_args") or data
    files = data.get("files") or {}
    split = SCORED_SPLIT.get(subcommand or "")
    if data.get("corpus") != "text_files" or split not in files:
        return None
    text = Path(files[split])
    if not marks_path(text).is_file():
        return None
    marks = load_marks(text.parent, text.stem)
    # Offsets in the unit of the run's tokens only (sidecars that do not say it are byte offsets).
    return marks if str(marks.get("tokenizer", "bytes")) == data.get("tokenizer") else None


def marked_losses(run_dir: Path, config: dict[str, Any], subcommand: str | None) -> dict[str, float | None]:
    """`long_range_loss` (mean NLL, nats, of the marked targets: answers >= G back) and `near_loss`
    (the answers nearer than G), each None when not measurable."""
    empty: dict[str, float | None] = {"long_range_loss": None, "near_loss": None}
    token_nll = run_dir / TOKEN_NLL
    marks = marks_for_run(config, subcommand) if token_nll.is_file() else None
    if marks is None:
        return empty
    with np.load(token_nll) as per_token:
        nll, offset = per_token["nll"].astype(np.float64), per_token["offset"]
    losses = {}
    for column, key in (("long_range_loss", "offset"), ("near_loss", "near_offset")):
        scored = np.isin(offset, marks[key]) if key in marks else np.zeros(0, bool)  # mqar: no near answers
        losses[column] = float(nll[scored].mean()) if scored.any() else None
    return losses


def recl(run_dir: Path, r: float) -> str | None:
    """The run's RECL at threshold r from a sibling context run's recl.csv, e.g. "32 (memory)", with
    "+" when the gain never fell below the threshold (the RECL is at least that); None if absent."""
    for table in sorted(run_dir.parent.glob("*/recl.csv")):
        with table.open() as f:
            for row in csv.DictReader(f):
                if row["model"] == run_dir.name and float(row["r"]) == r:
                    more = "+" if row.get("reached_end") == "True" else ""
                    return f"{row['recl']}{more} ({row['axis']})"
    return None
