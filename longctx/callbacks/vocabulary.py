"""`RunVocabulary`: a `fit` keeps the word vocabulary it trains with in its run directory.

A word vocabulary built from a train file (`data.tokenizer: words`) numbers the words by their counts
there, so the ids of a checkpoint mean those words only: another text read with its own vocabulary
gives the same ids to other words (`longctx.core.data_facts.check_vocabulary` refuses such a read).
To score a checkpoint on another text, or to start a fit from it (`--init_weights`), the data must be
read with the vocabulary it was trained with: `--data.vocab_file <run dir>/vocabulary.txt`, which this
callback writes (a copy of the token cache's `vocab.txt`, one symbol per line, id order) when `fit`
starts. Corpora with fixed ids (bytes, characters, GPT-2's BPE, a registered word corpus's own
vocabulary file) have nothing to keep. Registered by the CLI for every command; only `fit` writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning.pytorch as pl

from longctx.runtime.atomic import atomic_path
from longctx.runtime.run_layout import VOCABULARY


class RunVocabulary(pl.Callback):
    """At `fit` start (global rank 0): `<run dir>/vocabulary.txt` from the data module's `vocabulary_file`."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        source = getattr(trainer.datamodule, "vocabulary_file", None)
        if source is None or not trainer.is_global_zero:
            return
        with atomic_path(Path(trainer.default_root_dir) / VOCABULARY) as tmp:
            shutil.copyfile(source, tmp)
