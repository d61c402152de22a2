"""`python -m longctx report RUN_DIR... [--out DIR] [--wandb]`: one table and three figures for runs.

It reads what each run wrote into its own directory (`summary.json` and `metrics.jsonl`, see
`longctx.callbacks.run_record`, and the resolved `config.yaml`), so it needs no W&B account, and
writes into `--out` (default `report/`):

- `report.md` and `report.csv`: one row per run: run, method, corpus, status, parameters, training
  tokens seen, training tokens/s, peak memory, FLOPs per token, the method's native metric (bpc or
  ppl) on validation and test, test word perplexity, and bits per byte on validation and test;
- `bpb_vs_flops.png`, `bpb_vs_memory.png`: test bits per byte against FLOPs per token and against
  peak memory, one point per run;
- `val_curves.png`: validation bits per byte against training tokens, one line per run.

Bits per byte is the one metric comparable across tokenizers (bytes, characters, words, BPE). A value
a run did not record is a dash, in the table and in the CSV, and a run missing from a figure is named
under it in `report.md`: never a made-up value. With `--wandb` (or inside an active W&B run) the table
and figures are also logged to W&B (`report/table`, a `wandb.Table`).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure

from longctx.atomic import atomic_path, write_text_atomic
from longctx.callbacks.run_record import METRICS, SUMMARY
from longctx.errors import OneLineArgumentParser

MISSING = "-"
GIB = 2**30


@dataclass
class Run:
    """What one run directory holds."""

    path: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    curve: list[dict[str, float]]  # metrics.jsonl: one dict per validation

    @property
    def name(self) -> str:
        return self.path.name


def read_run(path: Path) -> Run:
    """A run directory's summary, resolved config (if saved) and validation curve."""
    summary_path = path / SUMMARY
    if not summary_path.is_file():
        raise FileNotFoundError(
            f"{path}: no {SUMMARY}; pass run directories (runs/<run_name>) of runs started with "
            "`python -m longctx fit|validate|test|evaluate_overlaps`"
        )
    config_path = path / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    curve_path = path / METRICS
    curve = (
        [json.loads(line) for line in curve_path.read_text().splitlines() if line.strip()]
        if curve_path.is_file()
        else []
    )
    return Run(path, json.loads(summary_path.read_text()), config or {}, curve)


def native_metric(metrics: dict[str, float]) -> str | None:
    """The run's own metric: bpc for byte/character corpora, else perplexity."""
    for name in ("bpc", "ppl"):
        if f"val/{name}" in metrics or f"test/{name}" in metrics:
            return name
    return None


# (column, how to read it from a run, how to show it in report.md)
Column = tuple[str, Callable[[Run], Any], Callable[[Any], str]]


def _metric(name: str) -> Callable[[Run], Any]:
    return lambda run: run.summary.get("metrics", {}).get(name)


def _native(stage: str) -> Callable[[Run], Any]:
    def read(run: Run) -> Any:
        metrics = run.summary.get("metrics", {})
        unit = native_metric(metrics)
        return None if unit is None else metrics.get(f"{stage}/{unit}")

    return read


def _flops(run: Run) -> Any:
    metrics = run.summary.get("metrics", {})
    return metrics.get("test/flops_per_token", metrics.get("val/flops_per_token"))


def _memory_gib(run: Run) -> Any:
    memory = run.summary.get("peak_memory_bytes")
    return None if memory is None else memory / GIB


def _method(run: Run) -> Any:
    path = run.summary.get("method") or run.config.get("model", {}).get("class_path")
    return None if path is None else path.rsplit(".", 1)[-1]


def _fmt(spec: str) -> Callable[[Any], str]:
    return lambda value: format(value, spec)


COLUMNS: list[Column] = [
    ("run", lambda run: run.name, str),
    ("method", _method, str),
    ("corpus", lambda run: run.config.get("data", {}).get("corpus"), str),
    ("status", lambda run: run.summary.get("status"), str),
    ("params", lambda run: run.summary.get("parameters"), _fmt(",d")),
    ("tokens_seen", lambda run: run.summary.get("train_tokens"), _fmt(",.0f")),
    ("tokens_per_s", lambda run: run.summary.get("train_tokens_per_s"), _fmt(",.0f")),
    ("peak_memory_gib", _memory_gib, _fmt(".3f")),
    ("flops_per_token", _flops, _fmt(".4g")),
    ("metric", lambda run: native_metric(run.summary.get("metrics", {})), str),
    ("val", _native("val"), _fmt(".4f")),
    ("test", _native("test"), _fmt(".4f")),
    ("test_word_ppl", _metric("test/word_ppl"), _fmt(".2f")),
    ("val_bpb", _metric("val/bpb"), _fmt(".4f")),
    ("test_bpb", _metric("test/bpb"), _fmt(".4f")),
]


def table(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One dict per run, column name -> raw value (None when the run did not record it)."""
    return [{name: read(run) for name, read, _ in COLUMNS} for run in runs]


def _show(value: Any, formatter: Callable[[Any], str]) -> str:
    return MISSING if value is None else formatter(value)


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([name for name, _, _ in COLUMNS])
    writer.writerows(
        [[MISSING if row[name] is None else row[name] for name, _, _ in COLUMNS] for row in rows]
    )
    return out.getvalue()


def to_markdown(rows: Sequence[dict[str, Any]]) -> str:
    header = [name for name, _, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(_show(row[name], show) for name, _, show in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- figures
def scatter(rows: Sequence[dict[str, Any]], x: str, x_label: str) -> tuple[Figure, list[str]]:
    """Test bits per byte against column `x`, one labelled point per run; returns the runs left out."""
    fig = Figure(figsize=(5.5, 4))
    ax = fig.add_subplot()
    left_out = []
    for row in rows:
        if row[x] is None or row["test_bpb"] is None:
            left_out.append(row["run"])
            continue
        ax.scatter(row[x], row["test_bpb"])
        ax.annotate(
            row["run"], (row[x], row["test_bpb"]), textcoords="offset points", xytext=(4, 4), fontsize=8
        )
    ax.set_xlabel(x_label)
    ax.set_ylabel("test bits per byte")
    fig.tight_layout()
    return fig, left_out


def curves(runs: Sequence[Run]) -> tuple[Figure, list[str]]:
    """Validation bits per byte against training tokens, one line per run; returns the runs left out."""
    fig = Figure(figsize=(5.5, 4))
    ax = fig.add_subplot()
    left_out = []
    for run in runs:
        points = [(p["train_tokens"], p["val/bpb"]) for p in run.curve if "val/bpb" in p]
        if not points:
            left_out.append(run.name)
            continue
        ax.plot(*zip(*points), marker="o", label=run.name)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation bits per byte")
    if len(left_out) < len(runs):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, left_out


# ---------------------------------------------------------------------- output
FIGURES = {
    "bpb_vs_flops.png": "test bits per byte vs FLOPs per token",
    "bpb_vs_memory.png": "test bits per byte vs peak memory",
    "val_curves.png": "validation bits per byte vs training tokens",
}


def write_report(run_dirs: Sequence[Path], out: Path) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    """Write report.md, report.csv and the figures into `out`; return the rows and figure paths."""
    runs = [read_run(Path(d)) for d in run_dirs]
    rows = table(runs)
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "bpb_vs_flops.png": scatter(rows, "flops_per_token", "FLOPs per token"),
        "bpb_vs_memory.png": scatter(rows, "peak_memory_gib", "peak memory (GiB)"),
        "val_curves.png": curves(runs),
    }
    paths = {}
    notes = []
    for name, (figure, left_out) in figures.items():
        paths[name] = out / name
        with atomic_path(paths[name]) as tmp:
            figure.savefig(tmp, dpi=120, format="png")
        if left_out:
            notes.append(f"- {FIGURES[name]}: left out (no value recorded): {', '.join(left_out)}")
    memory_kinds = sorted(
        {run.summary["peak_memory_kind"] for run in runs if run.summary.get("peak_memory_kind")}
    )
    markdown = [
        "# longctx report\n",
        f"Runs: {', '.join(str(r.path) for r in runs)}\n",
        to_markdown(rows),
        f"`{MISSING}`: not recorded by the run. Peak memory: {', '.join(memory_kinds) or MISSING} "
        "(`cuda_max_allocated` on a GPU, else the process's peak RSS). `val`/`test`: the native "
        "`metric`; `*_bpb`: bits per UTF-8 byte, comparable across tokenizers.\n",
        *[f"![{title}]({name})\n" for name, title in FIGURES.items()],
        *(["\n".join(notes) + "\n"] if notes else []),
    ]
    write_text_atomic(out / "report.md", "\n".join(markdown))
    write_text_atomic(out / "report.csv", to_csv(rows))
    return rows, paths


def log_to_wandb(rows: Sequence[dict[str, Any]], figures: dict[str, Path], start: bool) -> None:
    """Log the table (`report/table`) and figures to the active W&B run, or to a new one if `start`."""
    import wandb

    run = wandb.run
    if run is None and not start:
        return
    if run is None:
        from longctx.cli import ensure_wandb_mode

        ensure_wandb_mode()
        run = wandb.init(project="longctx", job_type="report")
        started = True
    else:
        started = False
    columns = [name for name, _, _ in COLUMNS]
    data = [[row[name] for name in columns] for row in rows]
    run.log(
        {
            "report/table": wandb.Table(columns=columns, data=data),
            **{f"report/{Path(name).stem}": wandb.Image(str(path)) for name, path in figures.items()},
        }
    )
    if started:
        run.finish()


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineArgumentParser(  # bad arguments: one line, the usage only with --help
        prog="python -m longctx report", description="Table and figures from longctx run directories."
    )
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="runs/<run_name> directories"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("report"), help="output directory (default: report/)"
    )
    parser.add_argument("--wandb", action="store_true", help="also log the table and figures to W&B")
    args = parser.parse_args(argv)
    try:
        rows, figures = write_report(args.run_dirs, args.out)
    except FileNotFoundError as err:
        sys.exit(f"error: {err}")
    log_to_wandb(rows, figures, start=args.wandb)
    print(f"wrote {args.out}/report.md, report.csv and {len(figures)} figures for {len(rows)} runs")


if __name__ == "__main__":
    main()
