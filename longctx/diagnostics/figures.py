"""The figures of `python -m longctx context` (matplotlib's object API: no global state, no display)."""

from __future__ import annotations

from collections import defaultdict

from matplotlib.figure import Figure


def _panels(n: int, width: float = 4.8) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * n, 3.6))
    return fig, [fig.add_subplot(1, n, i + 1) for i in range(n)]


def context_figure(rows: list[dict]) -> Figure:
    """Loss against context length: one panel per axis, one line per model."""
    axes = sorted({row["axis"] for row in rows})
    fig, panels = _panels(len(axes))
    for axis, ax in zip(axes, panels):
        lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for row in rows:
            if row["axis"] == axis:
                lines[row["model"]].append((row["context_length"], row["loss"]))
        for model, points in lines.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=model)
        ax.set_xlabel(f"context length ({axis})")
        ax.set_ylabel("loss (nats per token)")
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def by_key_figure(rows: list[dict], x_key: str, x_label: str, log_x: bool = False) -> Figure:
    """Loss against `x_key`: one panel per model, one line per context length."""
    models = list(dict.fromkeys(row["model"] for row in rows))
    fig, panels = _panels(len(models))
    for model, ax in zip(models, panels):
        lines: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for row in rows:
            if row["model"] == model:
                lines[row["context_length"]].append((row[x_key], row["loss"]))
        for length, points in sorted(lines.items()):
            points.sort()
            axis = next(row["axis"] for row in rows if row["model"] == model)
            ax.plot([p[0] for p in points], [p[1] for p in points], label=f"{axis} {length}")
        ax.set_title(model, fontsize="medium")
        ax.set_xlabel(x_label)
        ax.set_ylabel("loss (nats per token)")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
