"""`python -m longctx report RUN_DIR... [--out DIR] [--wandb]`: one table and three figures for runs.

It reads what each run wrote into its own directory (`summary.json` and `metrics.jsonl`, see
`longctx.callbacks.run_record`, and the resolved `config.yaml`), so it needs no W&B account, and
writes into `--out` (default `report/`):

- `report.md` and `report.csv`: one row per run: run, method, variant (what the config ran, as the
  module class describes it, `LMBase.describe_run`: memory length, TRAMS m/M, no memory, recurrence
  on/off, window and overlap, span kind, protocol, the Compressive Transformer's n_m + n_cm, f_c and
  c), corpus,
  status, parameters, training tokens seen, training tokens/s, peak memory, FLOPs per token, the
  method's native metric (bpc or ppl) on validation and test, test word perplexity, and bits per
  byte on validation and test; on a synthetic long-range task (`python -m longctx.data synth`), the
  loss on the long-range positions and on the near answers (`long_range_loss`, `near_loss`, from
  token_nll.npz and the marks sidecar), and the RECL at r = 0.1 and 0.01 from a `context` run beside
  the run (`longctx.diagnostics.long_range`); with marks, the recall accuracy (`test_recall_acc`,
  `test_recall_acc_first`, `val_recall_acc_first`: `longctx.core.recall`), the steps the fit took to
  reach `--recall_stop.min_acc` (`steps_to_acc`; `>N`: not within its N steps) and the state size
  (numbers per layer carried across segments, `LMBase.state_size`);
- `seeds.csv` and report.md's "Over seeds": the median (min-max) of each result over runs that
  differ only in their seed (names `<run>_seed<N>`, configs equal beyond seed and naming;
  `longctx.diagnostics.seeds`);
- with recall: `recall_by_distance.csv`/`.md` and `recall_vs_distance.png` (accuracy per distance
  bin, from token_nll.npz `correct`), `recall_by_segment.csv` (accuracy by segments back, where
  token_nll.npz records the segments), `recall_vs_state_size.png` (runs and sibling `context` runs;
  `longctx.diagnostics.recall`);
- `bpb_vs_flops.png`, `bpb_vs_memory.png`: bits per byte against FLOPs per token and against peak
  memory, one point per run: test, or validation (hollow, "(val)") for a run that was not tested
  (a `fit` or `validate` alone); each point carries the number of its row in the table, placed
  apart from the other numbers and points (with a thin line to its point when moved away), and the
  legend beside the plot names each number's run, so nearby runs stay readable;
- `val_curves.png`: validation bits per byte against training tokens, one line per run.

Bits per byte is the one metric comparable across tokenizers (bytes, characters, words, BPE). A value
a run did not record is a dash, in the table and in the CSV, and a run missing from a figure is named
under it in `report.md` with the reason: never a made-up value. A run that diverged or failed shows
its status in place of every result and, like unfinished runs and NaN results, comes after the
finished runs (which keep the order given) and is never plotted as a point. A path that is not a run
directory (e.g. a sweep's folder in `runs/*`, or a `context` command's folder, whose `recl.csv`
feeds the RECL columns of the runs beside it) is skipped with a note in `report.md` and on stderr,
and so is a second path to a run directory already given (`runs/a/`, a symbolic link to `runs/a`):
each run is one row.
With `--wandb` (or inside an active W&B run) the table and figures are also logged to W&B
(`report/table`, a `wandb.Table`; a diverged or failed run's results are empty there).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from pydoc import locate
from typing import Any

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from longctx.diagnostics import recall, seeds
from longctx.diagnostics.long_range import marked_losses, recl
from longctx.methods import registry
from longctx.runtime.atomic import atomic_path, unwritable_ancestor, write_text_atomic
from longctx.runtime.errors import OneLineArgumentParser
from longctx.runtime.run_layout import CONFIG, METRICS, SUMMARY

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
    config_path = path / CONFIG
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    curve_path = path / METRICS
    curve = (
        [json.loads(line) for line in curve_path.read_text().splitlines() if line.strip()]
        if curve_path.is_file()
        else []
    )
    return Run(path, json.loads(summary_path.read_text()), config or {}, curve)


def read_runs(paths: Sequence[Path]) -> tuple[list[Run], list[str]]:
    """The run directories among `paths` (e.g. `runs/*`), each once, and one note per path that is not
    one or names one already given (the same folder through a trailing slash or a symbolic link)."""
    runs, skipped = [], []
    given: dict[Path, Path] = {}  # the resolved folder -> the path it was first given as
    for path in map(Path, paths):
        if (first := given.setdefault(path.resolve(), path)) is not path:
            skipped.append(f"{path}: skipped, the same run directory as {first} (each run is one row)")
            continue
        try:
            run = read_run(path)
            if set(run.summary.get("statuses", {})) == {"context"}:
                skipped.append(
                    f"{path}: skipped, a context diagnostics folder, not a run (its recl.csv gives the "
                    "RECL columns of the runs beside it)"
                )
                continue
            runs.append(run)
        except FileNotFoundError:
            if not path.exists():
                skipped.append(f"{path}: skipped, no such file or directory")
                continue
            inside = path.is_dir() and any(path.glob(f"*/{SUMMARY}"))
            hint = f" (run directories inside it: pass {path}/*)" if inside else ""
            skipped.append(f"{path}: skipped, not a run directory (no {SUMMARY}){hint}")
        except (OSError, ValueError, yaml.YAMLError) as err:  # unreadable JSON/YAML: not a run record
            reason = f"{type(err).__name__}: {err}".splitlines()[0]
            skipped.append(f"{path}: skipped, unreadable run record ({reason})")
    return runs, skipped


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


def run_status(run: Run) -> str | None:
    """The run's status; "diverged" when any of its subcommands diverged (e.g. a `test` of the
    diverged fit's last checkpoint finished, but the run did not)."""
    if "diverged" in run.summary.get("statuses", {}).values():
        return "diverged"
    return run.summary.get("status")


def _model_class(run: Run) -> Any:
    """The module class of the run's config (`model.class_path`), or the registered one of its name
    (a run recorded under another import path); None if neither is known."""
    class_path = (run.config.get("model") or {}).get("class_path")
    found = locate(class_path) if isinstance(class_path, str) else None
    if isinstance(found, type) and hasattr(found, "describe_run"):
        return found
    name = _method(run)
    return None if name is None else registry.method_class_named(name)


def _settings(run: Run, section: str) -> dict[str, Any]:
    """The resolved init arguments of the config's `model` (class_path + init_args) or `data`; the
    model's knob groups under their flat names (`evaluation.mem_len` as `eval_mem_len`), so runs from
    before the groups and after read alike."""
    section_config = run.config.get(section) or {}
    settings = section_config.get("init_args") or section_config
    model_class = _model_class(run) if section == "model" else None
    return model_class.flatten_knobs(settings) if hasattr(model_class, "flatten_knobs") else settings


def _marked(column: str) -> Callable[[Run], Any]:
    return lambda run: marked_losses(run.path, run.config, run.summary.get("subcommand"))[column]


def _steps_to_acc(run: Run) -> Any:
    """The step the fit's recall reached `--recall_stop.min_acc` (summary.json `recall_stop`), or
    ">N" when it did not within its N steps; None without a stop rule."""
    record = run.summary.get("recall_stop")
    if not record:
        return None
    return record["reached_step"] if record["reached_step"] is not None else f">{record['global_step']}"


def _state_size(run: Run) -> Any:
    metrics = run.summary.get("metrics", {})
    return metrics.get("test/state_size", metrics.get("val/state_size"))


def _recall(run: Run) -> float | None:
    """The run's recall for the state-size figure: first queries where the marks have them, else all
    answers; test, else validation."""
    metrics = run.summary.get("metrics", {})
    names = ("test/recall_acc_first", "test/recall_acc", "val/recall_acc_first", "val/recall_acc")
    return next((metrics[name] for name in names if name in metrics), None)


def _recl(r: float) -> Callable[[Run], Any]:
    return lambda run: recl(run.path, r)


def _variant(run: Run) -> Any:
    """What tells the run apart from other runs of its method: its module class says
    (`LMBase.describe_run`, from the run's resolved config.yaml, model and data init_args)."""
    model_class = _model_class(run)
    if model_class is None or not run.config.get("model"):
        return None
    return model_class.describe_run(_settings(run, "model"), _settings(run, "data"))


def _fmt(spec: str) -> Callable[[Any], str]:
    return lambda value: format(value, spec)


COLUMNS: list[Column] = [
    ("run", lambda run: run.name, str),
    ("method", _method, str),
    ("variant", _variant, str),
    ("corpus", lambda run: run.config.get("data", {}).get("corpus"), str),
    ("status", run_status, str),
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
    ("long_range_loss", _marked("long_range_loss"), _fmt(".3f")),
    ("near_loss", _marked("near_loss"), _fmt(".3f")),
    ("test_recall_acc", _metric("test/recall_acc"), _fmt(".3f")),
    ("test_recall_acc_first", _metric("test/recall_acc_first"), _fmt(".3f")),
    ("val_recall_acc_first", _metric("val/recall_acc_first"), _fmt(".3f")),
    ("steps_to_acc", lambda run: _steps_to_acc(run), str),
    ("state_size", lambda run: _state_size(run), _fmt(",.0f")),
    ("recl_r0.1", _recl(0.1), str),
    ("recl_r0.01", _recl(0.01), str),
]


# Results: shown as the run's status, never as numbers, for a run that diverged or failed.
RESULT_COLUMNS = (
    "val", "test", "test_word_ppl", "val_bpb", "test_bpb", "long_range_loss", "near_loss",
    "test_recall_acc", "test_recall_acc_first", "val_recall_acc_first",
)  # fmt: skip
UNRANKED_STATUSES = ("diverged", "failed")


def table(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One dict per run, column name -> raw value (None when the run did not record it, and for the
    results of a diverged or failed run), in the given order except that runs which cannot be compared
    (not finished, or a NaN/infinite result) come after all the others."""
    rows = []
    for run in runs:
        row = {name: read(run) for name, read, _ in COLUMNS}
        if row["status"] in UNRANKED_STATUSES:
            row.update(dict.fromkeys(RESULT_COLUMNS))
        rows.append(row)
    return sorted(rows, key=lambda row: not comparable(row))


def comparable(row: dict[str, Any]) -> bool:
    """A finished run whose every recorded result is a finite number."""
    results = [row[name] for name in RESULT_COLUMNS if row[name] is not None]
    return row["status"] == "finished" and all(math.isfinite(value) for value in results)


def _cell(row: dict[str, Any], name: str) -> Any:
    """What a table shows: the status instead of a diverged or failed run's results, a dash for None."""
    if row[name] is None:
        return row["status"] if name in RESULT_COLUMNS and row["status"] in UNRANKED_STATUSES else MISSING
    return row[name]


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([name for name, _, _ in COLUMNS])
    writer.writerows([[_cell(row, name) for name, _, _ in COLUMNS] for row in rows])
    return out.getvalue()


def to_markdown(rows: Sequence[dict[str, Any]]) -> str:
    header = [name for name, _, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [_cell(row, name) if row[name] is None else show(row[name]) for name, _, show in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- figures
# A run left out of a figure: (run name, why).
LeftOut = list[tuple[str, str]]
NOT_RECORDED = "no value recorded"


def scatter(rows: Sequence[dict[str, Any]], x: str, x_label: str) -> tuple[Figure, LeftOut]:
    """Bits per byte against column `x`, one numbered point per run (the number of its row): the test
    value (filled), or the validation value (hollow) for a run that was not tested; the legend names
    each number's run. Returns the runs left out."""
    fig = Figure(figsize=(7.5, 4))
    FigureCanvasAgg(fig)  # a renderer, to measure the numbers while placing them
    ax = fig.add_subplot()
    left_out: LeftOut = []
    splits = set()
    points, entries = [], []  # (number, x, y); legend (handle, label)
    for number, row in enumerate(rows, start=1):
        split, y = ("test", row["test_bpb"]) if row["test_bpb"] is not None else ("val", row["val_bpb"])
        if row["status"] in UNRANKED_STATUSES:
            left_out.append((row["run"], row["status"]))
        elif row[x] is None or y is None:
            left_out.append((row["run"], NOT_RECORDED))
        elif not math.isfinite(y):
            left_out.append((row["run"], f"bits per byte {y}"))
        else:
            splits.add(split)
            ax.scatter(row[x], y, color="C0", facecolors="none" if split == "val" else "C0")
            points.append((number, row[x], y))
            label = row["run"] if split == "test" else f"{row['run']} (val)"
            entries.append((Line2D([], [], linestyle="none", marker=f"${number}$", color="black"), label))
    ax.set_xlabel(x_label)
    ax.set_ylabel(Y_LABELS.get(frozenset(splits), Y_LABELS[frozenset({"test"})]))
    if entries:
        handles, labels = zip(*entries)
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, borderaxespad=0)
    fig.tight_layout()
    place_numbers(ax, points)
    return fig, left_out


# Where a point's number may go, in points from the point: rings of growing radius, 8 directions each
# (the diagonals first); beyond the first ring a thin line joins the number to its point.
NUMBER_RINGS = (10, 16, 24, 34, 46, 60, 76)
NUMBER_OFFSETS = [
    (radius, radius * math.cos(angle * math.pi / 4), radius * math.sin(angle * math.pi / 4))
    for radius in NUMBER_RINGS
    for angle in (1, 3, 5, 7, 0, 2, 4, 6)
]
LEADER_LINE = {"arrowstyle": "-", "lw": 0.5, "color": "0.5", "shrinkA": 1, "shrinkB": 3}
MARKER_HALF_WIDTH = 4.0  # points: a scatter marker's half width, kept clear of numbers


def place_numbers(ax: Any, points: Sequence[tuple[int, float, float]]) -> None:
    """Write each point's number at the first offset (`NUMBER_OFFSETS`) where it overlaps no other
    number and no point and stays inside the axes, with a thin line to its point when it is not
    next to it."""
    renderer = ax.figure.canvas.get_renderer()
    half = MARKER_HALF_WIDTH * ax.figure.dpi / 72
    taken = [
        Bbox.from_extents(px - half, py - half, px + half, py + half)
        for px, py in (ax.transData.transform((x, y)) for _, x, y in points)
    ]
    inside = ax.get_window_extent(renderer)
    for number, x, y in points:
        for radius, dx, dy in NUMBER_OFFSETS:
            text = ax.annotate(
                str(number), (x, y), xytext=(dx, dy), textcoords="offset points", ha="center",
                va="center", fontsize=8, arrowprops=LEADER_LINE if radius > NUMBER_RINGS[0] else None,
            )  # fmt: skip
            box = number_box(text, renderer)
            fits = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            if fits and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                break
            text.remove()
        else:  # no free place within reach: next to the point, as a plain label would be
            ax.annotate(str(number), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)


def number_box(text: Any, renderer: Any, pad: float = 1.0) -> Bbox:
    """The drawn extent of a point's number (an annotation: its text only, not its line), `pad`
    pixels wider."""
    text.update_positions(renderer)  # where the annotation puts its text
    box = Text.get_window_extent(text, renderer)
    return Bbox.from_extents(box.x0 - pad, box.y0 - pad, box.x1 + pad, box.y1 + pad)


Y_LABELS = {
    frozenset({"test"}): "test bits per byte",
    frozenset({"val"}): "validation bits per byte",
    frozenset({"test", "val"}): "bits per byte (filled: test, hollow: validation)",
}


def curves(runs: Sequence[Run]) -> tuple[Figure, LeftOut]:
    """Validation bits per byte against training tokens, one line per run, up to where it diverged;
    returns the runs left out."""
    fig = Figure(figsize=(5.5, 4))
    ax = fig.add_subplot()
    left_out: LeftOut = []
    for run in runs:
        points = [
            (p["train_tokens"], p["val/bpb"]) for p in run.curve if math.isfinite(p.get("val/bpb", math.nan))
        ]
        if not points:
            left_out.append((run.name, NOT_RECORDED))
            continue
        status = run_status(run)
        label = run.name if status == "finished" else f"{run.name} ({status})"
        ax.plot(*zip(*points), marker="o", label=label)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation bits per byte")
    if len(left_out) < len(runs):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, left_out


def _left_out_note(title: str, left_out: LeftOut) -> str:
    """`- TITLE: left out (WHY): run, run; left out (WHY): ...`, one group per reason."""
    reasons = dict.fromkeys(reason for _, reason in left_out)
    groups = [f"left out ({why}): {', '.join(run for run, r in left_out if r == why)}" for why in reasons]
    return f"- {title}: {'; '.join(groups)}"


# ---------------------------------------------------------------------- output
FIGURES = {
    "bpb_vs_flops.png": "bits per byte vs FLOPs per token",
    "bpb_vs_memory.png": "bits per byte vs peak memory",
    "val_curves.png": "validation bits per byte vs training tokens",
}


def write_report(run_dirs: Sequence[Path], out: Path) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    """Write report.md, report.csv and the figures into `out`; return the rows and figure paths.
    A path that is not a run directory is skipped with a note (in report.md and on stderr)."""
    runs, skipped = read_runs(run_dirs)
    for note in skipped:
        print(f"longctx report: {note}", file=sys.stderr)
    if not runs:
        raise FileNotFoundError(
            f"no run directory among {', '.join(map(str, run_dirs))}: pass run directories "
            f"(runs/<run_name>, with a {SUMMARY}) of runs started with "
            "`python -m longctx fit|validate|test|evaluate_overlaps`"
        )
    rows = table(runs)
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "bpb_vs_flops.png": scatter(rows, "flops_per_token", "FLOPs per token"),
        "bpb_vs_memory.png": scatter(rows, "peak_memory_gib", "peak memory (GiB)"),
        "val_curves.png": curves(runs),
    }
    paths = {}
    notes = [f"- {note}" for note in skipped]
    for name, (figure, left_out) in figures.items():
        paths[name] = out / name
        with atomic_path(paths[name]) as tmp:
            figure.savefig(tmp, dpi=120, format="png")
        if left_out:
            notes.append(_left_out_note(FIGURES[name], left_out))
    recall_markdown = write_recall_outputs(runs, out, paths, notes)
    seeds_markdown = write_seed_outputs(runs, rows, out, notes)
    memory_kinds = sorted(
        {run.summary["peak_memory_kind"] for run in runs if run.summary.get("peak_memory_kind")}
    )
    markdown = [
        "# longctx report\n",
        f"Runs: {', '.join(str(r.path) for r in runs)}\n",
        to_markdown(rows),
        f"`{MISSING}`: not recorded by the run. Peak memory: {', '.join(memory_kinds) or MISSING} "
        "(`cuda_max_allocated` on a GPU, else the process's peak RSS). `val`/`test`: the native "
        "`metric`; `*_bpb`: bits per UTF-8 byte, comparable across tokenizers. Runs that diverged or "
        "failed show their status instead of results and come last, with unfinished runs and "
        "non-finite results. Figures: test bits per byte, or validation (hollow, `(val)`) for a run "
        "that was not tested; each point is numbered by its row in this table.\n",
        *[f"![{title}]({name})\n" for name, title in FIGURES.items()],
        *seeds_markdown,
        *recall_markdown,
        *(["\n".join(notes) + "\n"] if notes else []),
    ]
    write_text_atomic(out / "report.md", "\n".join(markdown))
    write_text_atomic(out / "report.csv", to_csv(rows))
    return rows, paths


def write_seed_outputs(
    runs: Sequence[Run], rows: Sequence[dict[str, Any]], out: Path, notes: list[str]
) -> list[str]:
    """`seeds.csv` and report.md's "Over seeds" table: the median and range of every result over the
    runs that differ only in their seed (`longctx.diagnostics.seeds`); nothing when no runs do."""
    groups, group_notes = seeds.seed_groups([(run.name, run.config) for run in runs])
    notes += group_notes
    if not groups:
        return []
    by_run = {row["run"]: row for row in rows}
    columns = [c for c in RESULT_COLUMNS if any(by_run[n][c] is not None for g in groups.values() for n in g)]
    listed = [
        c for c in ("steps_to_acc",) if any(by_run[n].get(c) is not None for g in groups.values() for n in g)
    ]
    table_ = seeds.seed_rows(groups, by_run, columns, listed)
    write_text_atomic(out / "seeds.csv", seeds.to_csv(table_, columns, listed))
    return [
        "## Over seeds\n",
        "Runs whose names differ only in `_seed<N>` and whose configs agree beyond the seed and the "
        "run's naming: the median (min-max) of each result over the finished ones (the steps to "
        "`recall_stop`'s accuracy: each seed's, `>N` where it was not reached in N):\n",
        seeds.markdown(table_, columns, lambda value: f"{value:.4g}", listed),
    ]


def write_recall_outputs(
    runs: Sequence[Run], out: Path, paths: dict[str, Path], notes: list[str]
) -> list[str]:
    """Recall by distance (`recall_by_distance.csv`/`.md`, `recall_vs_distance.png`) and against state
    size (`recall_vs_state_size.png`), when some run has what they need (`longctx.diagnostics.recall`);
    adds the figures to `paths`, notes on runs left out to `notes`; returns report.md's lines."""
    answers = [
        a
        for run in runs
        if (a := recall.run_answers(run.name, run.path, run.config, run.summary.get("subcommand")))
    ]
    markdown = []
    if answers:
        table = recall.by_distance(answers, recall.distance_edges(answers))
        write_text_atomic(out / "recall_by_distance.csv", recall.table_csv(table))
        write_text_atomic(out / "recall_by_distance.md", recall.table_markdown(table))
        _save(recall.distance_figure(table, answers), out / "recall_vs_distance.png", paths)
        markdown += [
            "## Recall by distance\n",
            "Answers and accuracy (argmax = answer) per distance bin, from each run's token_nll.npz "
            "`correct` and the marks of the file it scored; an answer bound before the first token of "
            "its evaluation row (which starts with an empty memory) is out of every model's reach and "
            "left out, as the logged accuracy leaves it out:\n",
            recall.table_markdown(table),
            "![recall accuracy vs distance](recall_vs_distance.png)\n",
        ]
        if segments := recall.by_segment(answers):
            write_text_atomic(
                out / "recall_by_segment.csv", recall.table_csv(segments, recall.SEGMENT_COLUMNS)
            )
            markdown += [
                "## Recall by segments back\n",
                "The same answers by the segments between the binding's and the answer's (0: the "
                "answer's own segment, no memory needed; 1 and more: only a memory reaches it), and "
                "whether the evaluation restarted the memory in between:\n",
                recall.table_markdown(segments, recall.SEGMENT_COLUMNS),
            ]
        if out_of_reach := [f"{a.run} {a.out_of_reach:,}" for a in answers if a.out_of_reach]:
            notes.append(f"- recall by distance: answers out of reach, left out: {', '.join(out_of_reach)}")
        if left := [run.name for run in runs if run.name not in {a.run for a in answers}]:
            why = "no token_nll.npz with `correct` on marked text"
            notes.append(f"- recall by distance: left out ({why}): {', '.join(left)}")
    points, left_out = [], []
    for run in runs:
        found, state_size = _recall(run), _state_size(run)
        if run_status(run) in UNRANKED_STATUSES or found is None or state_size is None:
            left_out.append(run.name)
        else:
            points.append({"run": run.name, "state_size": state_size, "recall": found})
    context = recall.context_points([run.path for run in runs])
    if points or context:
        _save(recall.state_size_figure(points, context), out / "recall_vs_state_size.png", paths)
        markdown.append("![recall accuracy vs state size](recall_vs_state_size.png)\n")
        if left_out:
            notes.append(
                f"- recall vs state size: left out (no recall or state size recorded): {', '.join(left_out)}"
            )
    return markdown


def _save(figure: Figure, path: Path, paths: dict[str, Path]) -> None:
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=120, format="png")
    paths[path.name] = path


def log_to_wandb(
    rows: Sequence[dict[str, Any]], figures: dict[str, Path], start: bool, out: Path = Path("report")
) -> None:
    """Log the table (`report/table`) and figures to the active W&B run, or to a new one if `start`
    (whose files, logs and caches go to `<out>/wandb/`, nowhere else)."""
    import wandb

    run = wandb.run
    if run is None and not start:
        return
    if run is None:
        from longctx.commands.cli import ensure_wandb_mode, keep_wandb_in

        ensure_wandb_mode()
        keep_wandb_in(out)
        run = wandb.init(project="longctx", job_type="report", dir=out)
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


OUT_FIX = "give --out a folder you can write (it is made if missing)"


def check_out(out: Path) -> None:
    """`--out` is a folder this process can write in, or can make: one line before anything else."""
    if (blocked := unwritable_ancestor(out)) is not None:
        what = "a file, not a folder" if not blocked.is_dir() else "a folder you cannot write in"
        where = "" if blocked == out else f": {blocked} is {what}"
        sys.exit(f"error: --out {out}{where or f' is {what}'}; {OUT_FIX}")


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
    check_out(args.out)
    try:
        rows, figures = write_report(args.run_dirs, args.out)
    except FileNotFoundError as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # a read-only mount, a full disk: found only when writing
        sys.exit(f"error: cannot write the report into {args.out} ({err.strerror}): {OUT_FIX}")
    log_to_wandb(rows, figures, start=args.wandb, out=args.out)
    print(f"wrote {args.out}/report.md, report.csv and {len(figures)} figures for {len(rows)} runs")
