"""The overlap sweep of Yoshida et al. (2020, §4.2): one checkpoint evaluated at several overlaps.

Windows stay T tokens long; overlap o makes the stride T − o, so each scored token sees more context
at a higher cost. `evaluate_overlaps` runs Lightning's test (or validate) loop once per overlap,
prints and logs the table of every metric against o (`eval/overlaps`), and saves the figure of
perplexity against o and against FLOPs per token (the paper's trade-off) as
`<run dir>/overlaps_<split>.png` (also logged to W&B); with `--write_token_nll true` each overlap's
per-token NLL goes to `<run dir>/token_nll_overlap{o}.npz`. The CLI's `evaluate_overlaps` subcommand
(`python -m longctx evaluate_overlaps --config ... --ckpt_path ...`) calls it. Each finished overlap
is written to the run folder at once (`overlaps_<split>.csv`, `summary.json`'s `overlaps`) with one
progress line, and the same command again skips the finished ones (`overlap_record`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger
from matplotlib.figure import Figure

from longctx.callbacks.run_record import keep_artifact
from longctx.callbacks.token_nll import set_token_nll_name
from longctx.data.datamodule import LMDataModule
from longctx.methods.recurrence.overlap_record import evaluated, finished_overlaps, save_overlaps
from longctx.runtime.errors import BadInput


def evaluate_overlaps(
    trainer: pl.Trainer,
    model: pl.LightningModule,
    datamodule: LMDataModule,
    ckpt_path: str | None = None,
    overlaps: list[int] = [0, 5, 10, 30, 50],  # noqa: B006 (a CLI default, never mutated)
    split: Literal["valid", "test"] = "test",
) -> list[dict[str, float]]:
    """Evaluate one checkpoint at several window overlaps (Yoshida et al. 2020, §4.2).

    The `evaluate_overlaps` subcommand (this method's registry entry makes it the trainer's method of
    that name: the parameters after `datamodule` are its options). Returns one row of metrics per
    overlap."""
    check_overlaps(model, datamodule, overlaps)
    evaluate = trainer.test if split == "test" else trainer.validate
    stage = "test" if split == "test" else "val"
    run_dir = Path(trainer.default_root_dir)
    source = evaluated(trainer, model, datamodule, ckpt_path, split)
    done = finished_overlaps(run_dir, source)  # kept from an earlier run of this command
    if trainer.is_global_zero:
        save_overlaps(run_dir, split, source, [done[o] for o in overlaps if o in done])
    rows = []
    for i, overlap in enumerate(overlaps, start=1):
        start = time.perf_counter()
        if overlap in done:
            rows.append(done[overlap])
            keep_artifact(trainer, token_nll_name(overlap))  # its per-token file, if one was written
            say_overlap(trainer, i, len(overlaps), done[overlap], stage, "finished earlier, kept")
            continue
        datamodule.set_eval_overlap(overlap)
        set_token_nll_name(trainer, token_nll_name(overlap))  # with --write_token_nll true
        metrics = evaluate(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)[0]
        rows.append({"overlap": overlap, **{k: float(v) for k, v in metrics.items()}})
        ckpt_path = None  # weights are loaded once
        if trainer.is_global_zero:
            save_overlaps(run_dir, split, source, rows)
        say_overlap(trainer, i, len(overlaps), rows[-1], stage, f"{time.perf_counter() - start:.1f} s")
    columns = sorted({key for row in rows for key in row} - {"overlap"})
    figure_path = Path(trainer.default_root_dir) / f"overlaps_{split}.png"
    if trainer.is_global_zero:
        figure_path.parent.mkdir(parents=True, exist_ok=True)
        overlap_figure(rows, stage).savefig(figure_path, dpi=120)
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_table(
                "eval/overlaps",
                columns=["overlap", *columns],
                data=[[row["overlap"], *(row.get(c) for c in columns)] for row in rows],
            )
            logger.log_image(key="eval/overlaps_figure", images=[str(figure_path)])
    header = " ".join(f"{name:>18s}" for name in ["overlap", *columns])
    print(header)
    for row in rows:
        print(" ".join(f"{row.get(name, float('nan')):>18.6g}" for name in ["overlap", *columns]))
    return rows


def token_nll_name(overlap: int) -> str:
    """The per-token file of one overlap (`--write_token_nll true`)."""
    return f"token_nll_overlap{overlap}.npz"


def check_overlaps(model: pl.LightningModule, datamodule: LMDataModule, overlaps: Sequence[int]) -> None:
    """One line, before anything is evaluated, for a model that reads no windows or an overlap its
    windows cannot take (the stride, window − overlap, must be positive)."""
    if datamodule.mode != "windows":
        raise BadInput(
            f"evaluate_overlaps evaluates windowed models (data.mode: windows, the GPT-2 configs such as "
            f"configs/gpt2_window_tiny.yaml), and {type(model).__name__} reads segments: evaluate it with "
            "validate or test, or sweep its context with `python -m longctx context`"
        )
    window = datamodule.eval_tgt_len
    bad = [overlap for overlap in overlaps if not 0 <= overlap < window]
    if bad or not overlaps:
        what = f"{', '.join(map(str, bad))} out of range" if bad else "no overlap given"
        example = ",".join(str(window * i // 4) for i in range(4))
        raise BadInput(
            f"--overlaps {list(overlaps)}: {what}; each overlap o must satisfy 0 <= o < the window "
            f"(data.eval_tgt_len {window}), so that the stride window - o is positive; e.g. --overlaps "
            f"'[{example}]'"
        )


def say_overlap(trainer: pl.Trainer, i: int, n: int, row: dict[str, float], stage: str, note: str) -> None:
    """One progress line per overlap (rank 0): which one of how many, its loss and perplexity."""
    if trainer.is_global_zero:
        names = [f"{stage}/{metric}" for metric in ("loss", "ppl", "bpc")]
        figures = ", ".join(f"{name} {row[name]:.4g}" for name in names if name in row)
        print(f"longctx: overlap {row['overlap']} ({i}/{n}): {figures} ({note})", file=sys.stderr, flush=True)


def overlap_figure(rows: list[dict[str, float]], stage: str) -> Figure:
    """Perplexity (per token, and per word when known) against the overlap and against FLOPs/token."""
    metrics = [m for m in (f"{stage}/ppl", f"{stage}/word_ppl") if all(m in row for row in rows)]
    flops = f"{stage}/flops_per_token"
    panels = [("overlap", "overlap o (tokens)")]
    if all(flops in row for row in rows):
        panels.append((flops, "forward FLOPs per scored token"))
    fig = Figure(figsize=(4.5 * len(panels), 3.5))
    for i, (x_key, x_label) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, len(panels), i)
        for metric in metrics:
            ax.plot([row[x_key] for row in rows], [row[metric] for row in rows], marker="o", label=metric)
        ax.set_xlabel(x_label)
        ax.set_ylabel("perplexity")
        ax.legend()
    fig.tight_layout()
    return fig
