"""`longctx.commands`: one command table for `python -m longctx` and the installed `longctx` script.

The script is `[project.scripts] longctx` of pyproject.toml; it used to be `longctx.commands.cli:main`, which
knew only LightningCLI's subcommands (`longctx convert` failed with "invalid choice")."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest
import tomllib

from longctx import commands
from tests.helpers.environment import REPO

LIGHTNING_SUBCOMMANDS = {"fit", "validate", "test", "evaluate_overlaps"}


def script_target() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["longctx"]


def test_both_entry_points_are_the_command_table():
    assert script_target() == "longctx.commands:main"
    main_module = ast.parse((REPO / "longctx" / "__main__.py").read_text())
    imports = [ast.unparse(n) for n in main_module.body if isinstance(n, ast.ImportFrom)]
    assert imports == ["from longctx.commands import main"]


def test_the_table_holds_every_command_and_lightning_cli_s_subcommands():
    from longctx.commands.cli import LongCtxCLI

    assert set(commands.COMMANDS) == LIGHTNING_SUBCOMMANDS | {"convert", "report", "context"}
    assert set(LongCtxCLI.subcommands()) == LIGHTNING_SUBCOMMANDS
    assert all(callable(commands.load(command.target)) for command in commands.COMMANDS.values())


@pytest.mark.parametrize("name", sorted(commands.COMMANDS))
def test_each_command_reaches_its_function_with_its_arguments(name, monkeypatch):
    module, _, function = commands.COMMANDS[name].target.partition(":")
    calls = []
    monkeypatch.setattr(importlib.import_module(module), function, lambda argv: calls.append(argv))
    commands.main([name, "--flag", "value"])
    # LightningCLI parses the subcommand itself; the other commands get what follows their name.
    expected = [name, "--flag", "value"] if name in LIGHTNING_SUBCOMMANDS else ["--flag", "value"]
    assert calls == [expected]


def test_the_script_runs_convert(capsys):
    """What failed: `longctx convert` through the script's function answers as convert does."""
    script = commands.load(script_target())
    with pytest.raises(SystemExit) as info:
        script(["convert", "--from", "fairseq", "--config", "c.yaml", "SRC", "DEST"])
    assert (
        info.value.code
        == "error: unknown format 'fairseq'; formats: adaptive-span, transfo-xl-hf, transfo-xl"
    )


def test_a_method_command_is_run_by_the_trainer_through_the_table(monkeypatch):
    from longctx.commands.cli import LongCtxTrainer

    calls = []
    module, _, function = commands.TRAINER_COMMANDS["evaluate_overlaps"].partition(":")
    fake = lambda *args: calls.append(args) or ["rows"]  # noqa: E731
    monkeypatch.setattr(importlib.import_module(module), function, fake)
    trainer = LongCtxTrainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert trainer.evaluate_overlaps("model", "data", None, [0, 5], "valid") == ["rows"]
    assert calls == [(trainer, "model", "data", None, [0, 5], "valid")]


def test_help_lists_every_command_and_a_wrong_one_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        commands.main(["--help"])
    assert info.value.code == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert listed == list(commands.COMMANDS)
    names = ", ".join(commands.COMMANDS)
    for argv, message in (
        (["tset"], f"error: unknown command 'tset'; commands: {names}"),
        ([], f"error: name a command: {names} (`longctx --help` says what each does)"),
    ):
        with pytest.raises(SystemExit) as info:
            commands.main(argv)
        assert info.value.code == message


def test_predict_still_gets_the_cli_s_reason():
    with pytest.raises(SystemExit) as info:
        commands.main(["predict", "--config", "c.yaml"])
    assert str(info.value.code).startswith("error: predict is not offered: ")


HELP_OF_EVERY_COMMAND = """
import sys
from longctx.commands import COMMANDS, load
script = load(sys.argv[1])
for name in sorted(COMMANDS):
    sys.argv = ["longctx", name, "--help"]
    try:
        script()
    except SystemExit as end:
        assert end.code in (0, None), (name, end.code)
    else:
        raise AssertionError(f"{name} --help did not exit")
    print("ok", name, file=sys.stderr)
"""


@pytest.mark.slow  # one interpreter importing Lightning and running every command's --help: ~15 s
def test_every_command_answers_help_through_the_installed_script_function():
    """As the installed script runs: its function without arguments, the command line in sys.argv."""
    out = subprocess.run(
        [sys.executable, "-c", HELP_OF_EVERY_COMMAND, script_target()],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line for line in out.stderr.splitlines() if line.startswith("ok ")] == [
        f"ok {name}" for name in sorted(commands.COMMANDS)
    ]
