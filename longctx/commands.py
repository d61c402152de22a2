"""The one table of `longctx` commands, read by `python -m longctx` and the installed `longctx` script.

    longctx fit|validate|test|evaluate_overlaps --config C ...   LightningCLI (`longctx.cli`)
    longctx convert --from FORMAT SOURCE DEST --config C         `longctx.checkpoints.convert`
    longctx report RUN_DIR...                                    `longctx.report`
    longctx context --config C --ckpt_path P ...                 `longctx.context`

Both entry points call `main`, so they accept the same commands. Targets are import paths, loaded only
when their command runs: `longctx report` does not import Lightning, and this table imports no method.
A method adds an evaluation subcommand to the CLI's trainer through `TRAINER_COMMANDS` (its function
runs as `LongCtxTrainer.<name>`), so the generic CLI never imports a method either.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

LIGHTNING_CLI = "longctx.cli:main"

# command -> "module:function" called with the arguments after the command (LightningCLI's
# subcommands: with all of them, the command included).
COMMANDS: dict[str, str] = {
    "fit": LIGHTNING_CLI,
    "validate": LIGHTNING_CLI,
    "test": LIGHTNING_CLI,
    "evaluate_overlaps": LIGHTNING_CLI,
    "convert": "longctx.checkpoints.convert:main",
    "report": "longctx.report:main",
    "context": "longctx.context:main",
}

# LightningCLI subcommands a method adds: name -> "module:function(trainer, model, datamodule,
# ckpt_path, ...)", run by the trainer method of that name (`longctx.cli.LongCtxTrainer`).
TRAINER_COMMANDS: dict[str, str] = {
    "evaluate_overlaps": "longctx.methods.recurrence.overlaps:evaluate_overlaps",
}


def load(target: str) -> Callable[..., Any]:
    """The function a `module:function` target names (importing its module now)."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def main(argv: Sequence[str] | None = None) -> Any:
    """Entry point of `python -m longctx` and of the `longctx` script: run the command `argv` names.

    Anything that is not a table command other than LightningCLI's (a flag such as `--help`, an unknown
    word) goes to LightningCLI, which lists its subcommands or answers in one line."""
    args = list(sys.argv[1:] if argv is None else argv)
    target = COMMANDS.get(args[0] if args else "", LIGHTNING_CLI)
    if target == LIGHTNING_CLI:
        return load(target)(None if argv is None else args)
    return load(target)(args[1:])
