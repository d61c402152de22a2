"""The commands of longctx (this package: one module per command, and the CLI's parse errors) and
their one table, read by `python -m longctx` and the installed `longctx` script. No library folder of
longctx imports this package; the commands import the library.

    longctx fit|validate|test|evaluate_overlaps --config C ...   LightningCLI (`longctx.commands.cli`)
    longctx convert --from FORMAT SOURCE DEST --config C         `longctx.commands.convert`
    longctx report RUN_DIR...                                    `longctx.commands.report`
    longctx context --config C --ckpt_path P ...                 `longctx.commands.context`

Both entry points call `main`, so they accept the same commands. Targets are import paths, loaded only
when their command runs: `longctx report` does not import Lightning, and this table imports no method.
A method adds an evaluation subcommand to the CLI's trainer through its registry entry
(`longctx.methods.registry.Method.trainer_commands`, gathered in `TRAINER_COMMANDS`; its function runs
as `LongCtxTrainer.<name>`), so neither this table nor the generic CLI names a method.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from longctx.methods import registry
from longctx.runtime.process_exit import run_and_exit_cleanly

LIGHTNING_CLI = "longctx.commands.cli:main"


class Command(NamedTuple):
    """target: "module:function", called with the arguments after the command (LightningCLI's
    subcommands: with all of them, the command included); summary: its line in `longctx --help`."""

    target: str
    summary: str


# LightningCLI subcommands the methods add (their registry entries): name -> "module:function(trainer,
# model, datamodule, ckpt_path, ...)", run by the trainer method of that name (`cli.LongCtxTrainer`).
TRAINER_COMMANDS: dict[str, str] = {name: c.target for name, c in registry.trainer_commands().items()}

COMMANDS: dict[str, Command] = {
    "fit": Command(LIGHTNING_CLI, "train a model (--config C) in runs/<run_name>/"),
    "validate": Command(LIGHTNING_CLI, "evaluate a checkpoint on the validation split (--ckpt_path P)"),
    "test": Command(LIGHTNING_CLI, "evaluate a checkpoint on the test split (--ckpt_path P)"),
    **{name: Command(LIGHTNING_CLI, c.summary) for name, c in registry.trainer_commands().items()},
    "convert": Command("longctx.commands.convert:main", "the authors' released checkpoints as ours"),
    "report": Command("longctx.commands.report:main", "table and figures from finished run directories"),
    "context": Command(
        "longctx.commands.context:main", "checkpoints under a sweep of the context they may use"
    ),
}


def load(target: str) -> Callable[..., Any]:
    """The function a `module:function` target names (importing its module now)."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def usage() -> str:
    """`longctx --help`: every command of the table, one line each."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    return "\n".join(
        ["usage: longctx COMMAND ... (or python -m longctx COMMAND ...)", "", "commands:", *lines, "",
         "`longctx COMMAND --help` shows a command's options."]
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `python -m longctx` and of the `longctx` script: run the command `argv` names.

    It returns None, which the script passes to `sys.exit` (a command's return value there would be
    printed and make the status 1). A process that trained with others ends in `longctx.runtime.process_exit`,
    so that a finished DDP rank never aborts while the interpreter finalizes."""
    run_and_exit_cleanly(lambda: run(argv))


def run(argv: Sequence[str] | None = None) -> Any:
    """Run the command `argv` names (its function's return value, e.g. the LongCtxCLI).

    No command, or a word that is none, is one line naming the commands; a leading flag other than
    --help (LightningCLI's `-c CONFIG fit ...`) goes to LightningCLI."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(usage())
        sys.exit(0)
    if not args:
        sys.exit(f"error: name a command: {', '.join(COMMANDS)} (`longctx --help` says what each does)")
    name = args[0]
    if name not in COMMANDS and not name.startswith("-") and name != "predict":
        sys.exit(f"error: unknown command {name!r}; commands: {', '.join(COMMANDS)}")
    target = COMMANDS[name].target if name in COMMANDS else LIGHTNING_CLI
    if target == LIGHTNING_CLI:  # its subcommands, a leading flag (`-c CONFIG fit`), predict (cli.py says no)
        return load(target)(None if argv is None else args)
    return load(target)(args[1:])
