"""The run directory's layout, in one place: what every command writes where (no Lightning, no torch).

    <root>/<run_name>/          the run directory (`run_directory`; root `runs` unless
                                `trainer.default_root_dir` names another); the trainer's `default_root_dir`
        .lock                   held by the one command that runs there (`longctx.runtime.run_lock`)
        config.yaml             the resolved configuration of the last subcommand (LightningCLI)
        summary.json            how each subcommand ended, its command line and metrics (`RunRecord`),
                                and every file in the folder with the command that wrote it
                                (`longctx.runtime.run_folder`)
        metrics.jsonl           one line per validation during `fit` (`RunRecord`)
        token_nll.npz           every scored target's NLL, with `--write_token_nll true` (`TokenNLLWriter`)
        vocabulary.txt          the word vocabulary a `fit` trained with, where the text numbers the
                                words (`data.tokenizer: words`; `RunVocabulary`): `--data.vocab_file`
        checkpoints/            the ModelCheckpoint callbacks' folder (`checkpoint_dir`)
            last.ckpt           what `--ckpt_path last` and SIGTERM/Ctrl-C resume from
        hpc_ckpt_<n>.ckpt       a SLURM requeue's checkpoint (Lightning's name)
        wandb/                  W&B's files of every command run there
    <root>/<run_name>.old-<time>/   a run moved aside by `fit --overwrite_run true` (`old_run_directory`)

The CLI, the sweep runner, the run record, the run lock, `report` and `context` all take these names
from here, so a file moves by changing one line. Method-specific files (e.g. recurrence's
`overlaps_<split>.csv`) are named by their method.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_ROOT = "runs"
LOCK = ".lock"
CONFIG = "config.yaml"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
TOKEN_NLL = "token_nll.npz"
VOCABULARY = "vocabulary.txt"
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"
HPC_CHECKPOINT_PREFIX = "hpc_ckpt_"
WANDB = "wandb"
OLD_RUN_MARK = ".old-"


def run_directory(root: str | Path | None, run_name: str) -> Path:
    """`<root>/<run_name>`, the root `runs` when none is given (`trainer.default_root_dir` unset)."""
    return Path(root or DEFAULT_ROOT) / run_name


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run's ModelCheckpoint callbacks write unless their config names a `dirpath`."""
    return Path(run_dir) / CHECKPOINTS


def old_run_directory(run_dir: str | Path, stamp: str) -> Path:
    """Where `fit --overwrite_run true` moves the run that was in `run_dir`: a sibling named with the
    time (`stamp`) the old run last wrote, e.g. `runs/quick.old-20260501-120000`."""
    run_dir = Path(run_dir)
    return run_dir.with_name(f"{run_dir.name}{OLD_RUN_MARK}{stamp}")
