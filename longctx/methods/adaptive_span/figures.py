"""Adaptive Span's figure: the paper's Figure 4, the learned span of every head by layer.

`SpanFigure` draws it at the end of `fit` (rank 0), saves it as `<run dir>/span_by_layer.png` and
logs it to W&B as `span/by_layer`. `AdaptiveSpanLM.configure_callbacks` adds it to every adaptive
or dynamic run, so a config needs no entry for it.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger
from matplotlib.figure import Figure
from torch import Tensor

SPAN_FIGURE = "span_by_layer.png"


def span_figure(spans: list[Tensor], S: int, kind: str) -> Figure:
    """Raw spans z (per layer a (H,) tensor) against the layer, log scale.

    It shows z itself (what the paper's Figure 4 plots), not the released code's reported
    ceil(z) + R (`span/avg`, `span/max`), which counts the ramp as well.
    """
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    for i, z in enumerate(spans):
        ax.scatter([i + 1] * len(z), z.clamp_min(1.0).numpy(), s=14, color="tab:blue")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("learned span z (no ramp)")
    ax.set_xticks(range(1, len(spans) + 1))
    ax.set_title(f"{kind} span z per head (S = {S})")
    fig.tight_layout()
    return fig


class SpanFigure(pl.Callback):
    """Save and log the span figure of an `AdaptiveSpanLM` at the end of fit.

    Args:
        filename: the file name inside the run directory (`trainer.default_root_dir`).
    """

    def __init__(self, filename: str = SPAN_FIGURE) -> None:
        self.filename = filename

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        path = Path(trainer.default_root_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        config = pl_module.net.config
        span_figure(pl_module.head_spans(), config.attn_span, config.span_kind).savefig(path, dpi=120)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key="span/by_layer", images=[str(path)])
