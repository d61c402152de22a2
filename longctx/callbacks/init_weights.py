"""`InitWeights`: a fresh `fit` starts from another checkpoint's weights only.

What a curriculum's next stage does (each stage starts from the previous stage's best checkpoint, as
the Recurrent Memory Transformer's BABILong scripts do with `--model_cpt`), and what a fine-tune on
another text does: the model's `state_dict` is loaded, while the optimizer, the schedule, the step
count and the data stream start fresh. Added by the CLI for `fit --init_weights PATH`.

A fit that resumes (`--ckpt_path`) takes its own checkpoint instead: a stopped stage continues where
it stopped. The checkpoint must fit the model (checked by the CLI before anything runs: class, names
and shapes) and its word vocabulary the data's (checked here, once the data is set up: the same ids
must stand for the same words).
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl

from longctx.checkpoints.safe_unpickle import load_tensors_file
from longctx.core.data_facts import VOCABULARY_KEY, check_vocabulary

log = logging.getLogger(__name__)


class InitWeights(pl.Callback):
    """Load `path`'s weights into the module when a fresh `fit` sets up (after the data module, so
    its vocabulary can be compared with the checkpoint's)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or trainer.ckpt_path:
            return  # a resumed fit: its own checkpoint is restored after setup
        checkpoint = load_tensors_file(self.path)
        if trainer.datamodule is not None:
            check_vocabulary(checkpoint.get(VOCABULARY_KEY), trainer.datamodule)
        pl_module.load_state_dict(checkpoint["state_dict"], strict=pl_module.strict_loading)
        step = checkpoint.get("global_step")
        log.warning("longctx: fit starts from the weights of %s (its step %s)", self.path, step)
