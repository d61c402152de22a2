"""The runs whose numbers `tests/golden/` keeps (see tests/integration/test_golden.py)."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from longctx.core.base import LMBase
from longctx.data.cache import SAMPLE_FILE
from longctx.methods import registry
from tests.helpers.environment import REPO
from tests.helpers.lm_fixtures import SyntheticData, WindowData, cpu_trainer
from tests.helpers.methods import TINY, VOCAB, tiny


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` for the block: a fixed order of float32 sums (the
    numbers depend on it), and tiny models run faster on one thread than contending for several."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class TrainingLosses(pl.Callback):
    """Every training step's loss: the objective `training_step` returns (mean NLL plus any extra
    loss, e.g. adaptive span's l1 penalty), read on the host after each step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))


QUICKSTART_STEPS = 100


def quickstart_args(root: Path) -> list[str]:
    """`python -m longctx fit --config configs/quickstart.yaml` cut to its first steps, writing only
    into `root` (no W&B, no progress bar)."""
    return [
        "fit",
        "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--trainer.max_steps", str(QUICKSTART_STEPS),
        "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root / "runs"),
        "--data.cache_dir", str(root / "cache"),
        "--run_name", "golden",
    ]  # fmt: skip


def quickstart_losses(root: Path, threads: int) -> list[float]:
    """The quickstart's training losses for its first `QUICKSTART_STEPS` steps (its seed, 0), run
    through the CLI in-process on `threads` CPU threads."""
    from longctx.callbacks import CheckpointOnSigterm, RunRecord
    from longctx.commands.cli import PARSER_KWARGS, LongCtxCLI

    recorder = TrainingLosses()
    with torch_threads(threads):
        LongCtxCLI(
            args=quickstart_args(root),
            parser_kwargs=PARSER_KWARGS,
            trainer_defaults={"callbacks": [CheckpointOnSigterm(), RunRecord(), recorder]},
        )
    return recorder.losses


# ------------------------------------------------------------------ one evaluation per method
# Every method of the registry under the names its entry gives (`golden`: the variants with an
# evaluation path of their own, e.g. TRAMS, RPE, the windowed GPT-2; default: the method's name), at
# the sizes of tests/helpers/methods.py: name → (model factory taking extra knobs, data module class in its
# batch mode).
EVALUATED: dict[str, tuple[Callable[..., LMBase], type[SyntheticData]]] = {
    name: (partial(tiny, method, **knobs), TINY[method].data)
    for method, entry in registry.METHODS.items()
    for name, knobs in (entry.golden if entry.golden is not None else {method: {}}).items()
}
GOLDEN_TOKENS = 512  # the evaluation text: this many bytes of the bundled sample, modulo VOCAB
# The stored weights: the model's initialisation at WEIGHT_SEED, trained for WEIGHT_STEPS Adam steps
# on the golden tokens (loss ~1.9-2.8 nats against ~4.2 at initialisation), so that attention and
# memory carry real weight in the number (near-uniform attention hides changes of its inputs).
WEIGHT_SEED, WEIGHT_STEPS, WEIGHT_LR = 0, 100, 1e-2


def sample_tokens() -> list[int]:
    """The first `GOLDEN_TOKENS` bytes of the bundled sample text, modulo the tiny models' `VOCAB`
    (stored in the golden file: a change of the corpus or its reader never moves the numbers)."""
    with gzip.open(SAMPLE_FILE, "rb") as f:
        return [byte % VOCAB for byte in f.read(GOLDEN_TOKENS)]


class GoldenTokens(SyntheticData):
    """The synthetic data module's streams (segments of 16, evaluation batch 3) over given tokens."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__(n_tokens=1)
        self.tokens = np.asarray(tokens, dtype=np.uint8)


class GoldenWindows(WindowData, GoldenTokens):
    """The same in window mode (windows of 16, overlap 4)."""


def golden_data(data: type[SyntheticData], tokens: list[int]) -> SyntheticData:
    return GoldenWindows(tokens) if issubclass(data, WindowData) else GoldenTokens(tokens)


def trained_weights(name: str, tokens: list[int], root: Path) -> dict[str, torch.Tensor]:
    """New weights for the golden file (see WEIGHT_STEPS): made once, then stored, so that a change
    of the initialisation or of training moves no golden evaluation, only a change of the forward."""
    factory, data = EVALUATED[name]
    torch.manual_seed(WEIGHT_SEED)
    model = factory(optimizer=partial(torch.optim.Adam, lr=WEIGHT_LR))
    with torch_threads(1):
        cpu_trainer(root, max_steps=WEIGHT_STEPS, limit_val_batches=0).fit(
            model, datamodule=golden_data(data, tokens)
        )
    return model.state_dict()


def evaluation_loss(name: str, weights: dict[str, torch.Tensor], tokens: list[int], root: Path) -> float:
    """`val/loss` (mean NLL, nats) of the method's tiny model with `weights` on `tokens`, through
    `trainer.validate` (the method's own evaluation path: memory carried, its protocol)."""
    factory, data = EVALUATED[name]
    model = factory()
    model.load_state_dict(weights)  # strict: a renamed or reshaped weight fails here
    with torch_threads(1):
        metrics = cpu_trainer(root).validate(model, datamodule=golden_data(data, tokens), verbose=False)
    return float(metrics[0]["val/loss"])
