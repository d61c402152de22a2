"""Recall accuracy against distance and against memory size, for `python -m longctx report`.

- **By distance**: a run's scored answers (its `token_nll.npz` `correct`, written by `test
  --write_token_nll true`, at the offsets of the marks sidecar of the file it scored; see
  `long_range.marks_for_run`), binned by their distance to their binding, with the same bins for
  every run: `recall_by_distance.csv` / `.md` (answers and accuracy per bin, all answers and first
  queries) and `recall_vs_distance.png`, one line per run. A memory's reach is where its line
  falls to chance (1/K on first queries).
- **By segments back**, where token_nll.npz records the evaluation's segments (`segment_len`,
  `memory_start`): the same answers by the segments between binding and answer (0: the answer's own
  segment; 1 and more: only a memory reaches it) and whether the evaluation restarted the memory in
  between (the Recurrent Memory Transformer's samples of K): `recall_by_segment.csv`.
- **By memory size**: recall against the numbers per layer a model carries across segments
  (`{stage}/state_size`, `LMBase.state_size`: zoology's "state size", one axis for every memory):
  one point per run (test, else validation) and one line per model of every `python -m longctx
  context` run beside the runs (`context.csv`: a point per memory length). `recall_vs_state_size.png`.

Recall means first-query accuracy where the marks have query indices (`synth mqar`: the one
elimination cannot fake, `longctx.core.recall`), all answers otherwise (copy, byte-level recall).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from longctx.data.streams import evaluation_segment
from longctx.diagnostics.long_range import marks_for_run
from longctx.diagnostics.seeds import SEED_PART
from longctx.runtime.run_layout import TOKEN_NLL

N_BINS = 8  # distance bins of the table and figure (fewer when there are fewer distinct distances)


@dataclass
class RunAnswers:
    """The answers one run scored: correct (A,) bool, distance (A,) tokens, query (A,) index within
    the episode or None (marks without queries), pairs: K when every episode has the same, else None."""

    run: str
    correct: np.ndarray
    distance: np.ndarray
    query: np.ndarray | None
    pairs: int | None
    out_of_reach: int = 0  # answers left out: bound before the first token of their evaluation row
    # (A,) int: segments from the binding's to the answer's (0: the same segment), and (A,) bool: the
    # evaluation restarted the memory in between; None without token_nll.npz `segment_len`
    segments_back: np.ndarray | None = None
    memory_restarted: np.ndarray | None = None


def run_answers(run: str, run_dir: Path, config: dict[str, Any], subcommand: str | None) -> RunAnswers | None:
    """The run's scored answers, or None: no token_nll.npz, or one without `correct`, or no marks."""
    path = run_dir / TOKEN_NLL
    marks = marks_for_run(config, subcommand) if path.is_file() else None
    if marks is None:
        return None
    with np.load(path) as per_token:
        if "correct" not in per_token.files:
            return None
        offset, correct = per_token["offset"], per_token["correct"]
        row_start = per_token["row_start"] if "row_start" in per_token.files else None
        segment_len = int(per_token["segment_len"]) if "segment_len" in per_token.files else None
        memory_start = per_token["memory_start"] if "memory_start" in per_token.files else row_start
    scored = np.isin(marks["offset"], offset)  # the TRAMS protocol leaves some targets out
    at = np.minimum(np.searchsorted(offset, marks["offset"]), len(offset) - 1)  # its index there, if scored
    out_of_reach = 0
    if row_start is not None:  # as the logged accuracy: answers bound before their row's first token out
        bound_in_row = marks["offset"] - marks["distance"] >= row_start[at]
        out_of_reach = int((scored & ~bound_in_row).sum())
        scored &= bound_in_row
    where = at[scored]
    query = marks["query"][scored] if "query" in marks else None
    pairs = np.unique(marks["pairs"]) if "pairs" in marks else np.zeros(0)
    segments_back = memory_restarted = None
    if row_start is not None and segment_len is not None:
        answer, bound = marks["offset"][scored], (marks["offset"] - marks["distance"])[scored]
        start = row_start[where]
        # the answer is scored by segment (answer − 1 − start) // T, its binding read by (bound − start) // T
        segments_back = evaluation_segment(answer, start, segment_len) - (bound - start) // segment_len
        memory_restarted = bound < memory_start[where]
    return RunAnswers(
        run,
        correct[where],
        marks["distance"][scored],
        query,
        int(pairs[0]) if len(pairs) == 1 else None,
        out_of_reach,
        segments_back,
        memory_restarted,
    )


def distance_edges(answers: Sequence[RunAnswers], n_bins: int = N_BINS) -> np.ndarray:
    """Integer bin edges shared by every run: bin i holds distances edges[i] .. edges[i + 1] − 1."""
    distances = np.concatenate([a.distance for a in answers])
    low, high = int(distances.min()), int(distances.max()) + 1
    return np.unique(np.linspace(low, high, min(n_bins, high - low) + 1).round().astype(np.int64))


def _share(hits: np.ndarray) -> float | None:
    return float(hits.mean()) if hits.size else None


def _scores(a: RunAnswers, here: np.ndarray) -> dict[str, Any]:
    """The answers selected by `here` (A,) bool, their accuracy, their first queries and theirs."""
    first = here & (a.query == 0) if a.query is not None else np.zeros_like(here)
    return {
        "answers": int(here.sum()), "recall_acc": _share(a.correct[here]),
        "first_answers": int(first.sum()), "recall_acc_first": _share(a.correct[first]),
    }  # fmt: skip


def by_distance(answers: Sequence[RunAnswers], edges: np.ndarray) -> list[dict[str, Any]]:
    """One row per run and bin: the bin, its answers and accuracy, its first queries and theirs."""
    rows = []
    for a in answers:
        bins = np.searchsorted(edges, a.distance, side="right") - 1
        for i in range(len(edges) - 1):
            row = {"run": a.run, "distance_from": int(edges[i]), "distance_to": int(edges[i + 1] - 1)}
            rows.append(row | _scores(a, bins == i))
    return rows


DISTANCE_COLUMNS = [
    "run", "distance_from", "distance_to", "answers", "recall_acc", "first_answers", "recall_acc_first",
]  # fmt: skip


def by_segment(answers: Sequence[RunAnswers]) -> list[dict[str, Any]]:
    """One row per run, segments back (0: bound in the answer's own segment, where no memory is
    needed; s: s segments earlier, only a memory reaches it) and whether the evaluation restarted the
    memory in between (`memory_restarted`: yes only for methods that restart it within a row, e.g.
    the Recurrent Memory Transformer's samples of K segments): its answers and accuracy, its first
    queries and theirs. Runs without token_nll.npz `segment_len` have no rows."""
    rows = []
    for a in answers:
        if a.segments_back is None or a.memory_restarted is None:
            continue
        for back in np.unique(a.segments_back).tolist():
            for restarted in (False, True):
                here = (a.segments_back == back) & (a.memory_restarted == restarted)
                if here.any():
                    row = {
                        "run": a.run,
                        "segments_back": back,
                        "memory_restarted": "yes" if restarted else "no",
                    }
                    rows.append(row | _scores(a, here))
    return rows


SEGMENT_COLUMNS = [
    "run", "segments_back", "memory_restarted", "answers", "recall_acc", "first_answers", "recall_acc_first",
]  # fmt: skip


def _text(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def table_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] = DISTANCE_COLUMNS) -> str:
    lines = [",".join(columns)]
    lines += [",".join(_text(row[c]) for c in columns) for row in rows]
    return "\n".join(lines) + "\n"


def table_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str] = DISTANCE_COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_text(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def distance_figure(rows: Sequence[dict[str, Any]], answers: Sequence[RunAnswers]) -> Figure:
    """Accuracy against distance (bin middles), one line per run: all answers (solid) and first
    queries (dashed, where there are queries), with the first query's chance 1/K (dotted)."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for n, a in enumerate(answers):
        mine = [row for row in rows if row["run"] == a.run]
        middle = [(row["distance_from"] + row["distance_to"]) / 2 for row in mine]
        color = f"C{n % 10}"
        ax.plot(middle, [_nan(row["recall_acc"]) for row in mine], marker="o", color=color, label=a.run)
        if a.query is not None:
            first = [_nan(row["recall_acc_first"]) for row in mine]
            ax.plot(middle, first, marker="x", linestyle="--", color=color, label=f"{a.run} (first queries)")
    for k in sorted({a.pairs for a in answers if a.query is not None and a.pairs}):
        ax.axhline(1 / k, color="gray", linestyle=":", linewidth=1, label=f"chance of a first query (1/{k})")
    ax.set_xlabel("distance from binding to answer (tokens)")
    ax.set_ylabel("recall accuracy (argmax = answer)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def context_points(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Every point with a state size and a recall accuracy of the `context` runs beside the runs
    (`<parent>/*/context.csv`): model, axis, context_length, state_size, recall (first-query accuracy,
    else all answers)."""
    points = []
    tables = sorted({table for run_dir in run_dirs for table in Path(run_dir).parent.glob("*/context.csv")})
    for table in tables:
        with table.open() as f:
            for row in csv.DictReader(f):
                recall = row.get("recall_acc_first") or row.get("recall_acc")
                if row.get("state_size") and recall:
                    points.append({
                        "model": f"{table.parent.name}/{row['model']}", "axis": row["axis"],
                        "context_length": int(row["context_length"]),
                        "state_size": float(row["state_size"]), "recall": float(recall),
                    })  # fmt: skip
    return points


def state_size_figure(run_points: Sequence[dict[str, Any]], context: Sequence[dict[str, Any]]) -> Figure:
    """Recall against state size (numbers per layer): the runs as labelled points (the seeds of a
    run, `<run>_seed<N>`, one label at their first point), each context model as a line through its
    memory lengths."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    labelled = set()
    for point in run_points:
        ax.scatter(point["state_size"], point["recall"], color="C0")
        if (label := SEED_PART.sub("", point["run"])) not in labelled:
            labelled.add(label)
            ax.annotate(label, (point["state_size"], point["recall"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)  # fmt: skip
    for n, model in enumerate(dict.fromkeys(p["model"] for p in context)):
        line = sorted((p["state_size"], p["recall"]) for p in context if p["model"] == model)
        axis = next(p["axis"] for p in context if p["model"] == model)
        ax.plot(*zip(*line), marker="o", color=f"C{(n + 1) % 10}", label=f"{model} ({axis})")
    ax.set_xlabel("state size (numbers per layer carried across segments)")
    ax.set_ylabel("recall accuracy\n(first queries; all answers without queries)")
    ax.set_ylim(-0.02, 1.02)
    if context:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
