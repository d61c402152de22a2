"""`CompileNetwork` (torch.compile) against eager: training tokens/s per method, and graphs compiled
after the warm-up (must be 0: carried memories keep their shapes).

Each method trains through Lightning on the same synthetic tokens twice, eager and compiled, with the
same seed; a callback times every optimizer step. The first `--warmup` steps (compilation) are not
timed; the median of the rest is. Validation runs once inside the warm-up, so the eval graphs are
compiled there too.

    python benchmarks/compile.py                      # every registered method, ~6 min on 2 CPU cores
    python benchmarks/compile.py --methods transformer_xl --steps 40
    python benchmarks/compile.py --device cuda         # on a GPU (each step synchronised)
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention import synchronize  # this folder's
from gpu_report import device_name

from longctx.callbacks import CompileNetwork
from longctx.core.base import LMBase
from longctx.core.knob_groups import override_groups
from longctx.data.streams import SegmentStream
from longctx.methods import registry

VOCAB = 256
# The small network every method trains here (a GPT-2 spells the sizes n_layer, n_embd, n_head); each
# method's registry entry adds its own knobs at this scale (`bench_knobs`: memory lengths, span).
SIZES = {"network": {"n_layers": 4, "d_model": 256, "n_heads": 4, "d_inner": 1024}}
GPT2_SIZES = {"gpt2_config": {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 128}}


def build(method: str) -> LMBase:
    """The registered method's module at the benchmark's sizes (GPT-2's where it is built on one)."""
    entry = registry.METHODS[method]
    sizes = GPT2_SIZES if "gpt2_config" in entry.tiny_knobs else SIZES
    return entry.module_class()(vocab_size=VOCAB, **override_groups(sizes, entry.bench_knobs))


class Tokens(pl.LightningDataModule):
    """Random tokens as memory-carrying segments (or windows of 128 with overlap 32)."""

    def __init__(self, windowed: bool, batch_size: int, seq_len: int) -> None:
        super().__init__()
        self.tokens = np.random.default_rng(0).integers(0, VOCAB, size=2_000_000).astype(np.uint8)
        self.windowed, self.batch_size, self.seq_len = windowed, batch_size, seq_len
        # The facts LMBase reads (longctx.core.data_facts.LMDataFacts): random tokens, no text.
        self.mode = "windows" if windowed else "segments"
        self.metric, self.eval_overlap, self.token_bytes = "bpc", 32 if windowed else 0, None
        self.vocabulary_digest = None

    def word_count(self, split: str) -> None:
        return None

    def target_marks(self, split: str) -> None:
        return None

    def _stream(self, pad: bool) -> SegmentStream:
        window = {"overlap": 32, "windows_per_batch": 2} if self.windowed else {}
        return SegmentStream(self.tokens, self.batch_size, self.seq_len, pad=pad, **window)

    def train_dataloader(self) -> SegmentStream:
        return self._stream(pad=False)

    def val_dataloader(self) -> SegmentStream:
        return self._stream(pad=True)


class StepTimer(pl.Callback):
    """Each training step's time (the GPU's queued kernels waited for at both ends) and graph count."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.graphs: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        synchronize(pl_module.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        synchronize(pl_module.device)
        self.times.append(time.perf_counter() - self._start)
        self.graphs.append(int(counters["stats"]["unique_graphs"]))


def run(method: str, compiled: bool, args: argparse.Namespace) -> tuple[float, int]:
    """Tokens/s after the warm-up, and the graphs compiled after it."""
    torch._dynamo.reset()
    counters.clear()
    pl.seed_everything(0)
    model = build(method)
    windowed = model.batch_mode == "windows"
    data = Tokens(windowed, args.batch, 128 if windowed else args.block)
    timer = StepTimer()
    trainer = pl.Trainer(
        accelerator=args.device,
        devices=1,
        max_steps=args.warmup + args.steps,
        val_check_interval=args.warmup // 2,
        limit_val_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer, *([CompileNetwork()] if compiled else [])],
    )
    trainer.fit(model, datamodule=data)
    tokens_per_step = args.batch * (2 * 96 + 32 if windowed else args.block)  # scored + overlap read
    step = statistics.median(timer.times[args.warmup :])
    return tokens_per_step / step, timer.graphs[-1] - timer.graphs[args.warmup - 1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    methods = list(registry.METHODS)
    parser.add_argument("--methods", nargs="+", default=methods, choices=methods)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    print(
        f"device {device_name(args.device)}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"batch {args.batch}"
    )
    print(
        f"{'method':>16} {'eager tok/s':>12} {'compiled tok/s':>15} {'ratio':>7} {'graphs after warm-up':>21}"
    )
    for method in args.methods:
        eager, _ = run(method, False, args)
        compiled, new_graphs = run(method, True, args)
        print(f"{method:>16} {eager:12.0f} {compiled:15.0f} {compiled / eager:6.2f}× {new_graphs:21d}")


if __name__ == "__main__":
    main()
