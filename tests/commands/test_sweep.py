"""Sweep files: every line of every `slurm/sweeps/*.txt` parses with the CLI's parser, and the local
runner (`python -m longctx.sweep run`) runs lines in turn, names unnamed runs stably and skips the
finished ones."""

from __future__ import annotations

import hashlib
import importlib
import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from longctx.commands.cli import LongCtxCLI
from longctx.commands.sweep import (
    SUBCOMMANDS,
    LineError,
    LineResolver,
    cli_parser,
    line_name,
    main,
    option,
    parse_sweeps,
    run_directory,
    run_lines,
    run_sweep,
    task_arguments,
    without_option,
)
from longctx.data.corpora import get_corpus
from tests.helpers.environment import REPO

SWEEPS = sorted((REPO / "slurm" / "sweeps").glob("*.txt"))


def test_the_sweep_subcommands_are_the_clis():
    assert set(SUBCOMMANDS) == set(LongCtxCLI.subcommands())


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_line_names_a_subcommand_and_existing_configs(sweep):
    runs = run_lines(sweep)
    assert runs
    for index, args in enumerate(runs):
        assert task_arguments(sweep, index) == args  # known subcommand
        configs = [args[i + 1] for i, arg in enumerate(args) if arg == "--config"]
        assert configs and all((REPO / c).is_file() for c in configs), args


def model_shapes(config) -> dict[str, tuple[int, ...]]:
    """State-dict shapes of the model a parsed run config builds (on the meta device: no memory)."""
    model = config.model
    module, _, name = model.class_path.rpartition(".")
    init = {k: v for k, v in model.init_args.as_dict().items() if k not in ("optimizer", "lr_scheduler")}
    init["vocab_size"] = get_corpus(config.data.corpus).vocab_size
    with torch.device("meta"):
        built = getattr(importlib.import_module(module), name)(**init)
    return {key: tuple(value.shape) for key, value in built.state_dict().items()}


@pytest.mark.slow
def test_every_sweep_line_parses_and_evaluations_fit_the_checkpoints_they_read(tmp_path, monkeypatch):
    """The whole command line of every run, through the CLI's own parser (configs read, classes and
    settings type-checked, nothing run): what a SLURM array task would start with. And an evaluation
    of a checkpoint that a sweep's `fit` writes (`--ckpt_path runs/<run_name>/...`) builds a model of
    the same shapes as that fit (the CLI would refuse the checkpoint otherwise); models loaded from
    `pretrained` (hub weights, none offline) are left out."""
    monkeypatch.chdir(REPO)  # the lines' paths are relative to the repository root
    bad = tmp_path / "bad.txt"
    bad.write_text(
        "test --config configs/quickstart.yaml --model.init_args.d_modle 8\n"
        "evaluate_overlaps --config configs/gpt2_window_tiny.yaml --overlaps '[0, 5]'\n"
    )
    parsed = parse_sweeps([*SWEEPS, bad])
    errors = {where: result for where, result in parsed.items() if isinstance(result, str)}
    assert list(errors) == [f"{bad}:run 0"], errors  # every real line parses; the typo is caught
    assert "d_modle" in errors[f"{bad}:run 0"]

    subcommands = {f"{sweep}:run {i}": args[0] for sweep in SWEEPS for i, args in enumerate(run_lines(sweep))}
    fits = {
        parsed[where].run_name: parsed[where] for where, command in subcommands.items() if command == "fit"
    }
    pairs = []  # (evaluation line, its config, the config of the fit that writes its checkpoint)
    for where, config in parsed.items():
        ckpt = Path(config.get("ckpt_path") or ".") if not isinstance(config, str) else Path()
        trained = fits.get(str(Path(*ckpt.parts[1:-2]))) if ckpt.parts[:1] == ("runs",) else None
        if trained and not (
            config.model.init_args.get("pretrained") or trained.model.init_args.get("pretrained")
        ):
            pairs.append((where, config, trained))
    assert len(pairs) >= 5, [where for where, *_ in pairs]
    for where, evaluation, trained in pairs:
        assert model_shapes(evaluation) == model_shapes(trained), where


def record(run_dir: Path, status: str, command: list[str] | str | None, digest: str | None = None) -> None:
    """Add a subcommand's run to `run_dir/summary.json` as the CLI's RunRecord does (`command` None:
    a summary written before commands were recorded; `digest` None: before digests were)."""
    args = shlex.split(command) if isinstance(command, str) else command
    subcommand = args[0] if args else "fit"
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update(status=status, subcommand=subcommand)
    summary.setdefault("statuses", {})[subcommand] = status
    if args:
        summary.setdefault("commands", {})[subcommand] = args
    if digest:
        summary.setdefault("config_digests", {})[subcommand] = digest
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))


def text_digest(args: list[str]) -> str:
    """A stand-in for `LineResolver` (which parses with the CLI's parser, seconds per line) for the
    runner's own logic: the line without its run name, and its config files' text."""
    configs = [Path(args[i + 1]) for i, arg in enumerate(args) if arg == "--config"]
    if missing := [str(c) for c in configs if not c.is_file()]:
        raise LineError(f"error: config: no such file {missing[0]!r}")
    text = shlex.join(without_option(args, "--run_name")) + "".join(c.read_text() for c in configs)
    return hashlib.sha256(text.encode()).hexdigest()


class FakeLongctx:
    """A stand-in for `python -m longctx`, in-process: it records each call and writes the
    summary.json the CLI writes (status, command line, the digest `resolve` gives: the CLI's own
    digest is `LineResolver`'s, see test_the_digest_the_cli_records_is_the_one_the_runner_computes);
    a run named `broken` fails with exit status 3."""

    def __init__(self, resolve=text_digest) -> None:
        self.resolve = resolve
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str]) -> int:
        self.calls.append(args)
        if option(args, "--run_name") == "broken":
            return 3
        record(run_directory(args), "finished", args, self.resolve(args))
        return 0

    def take_calls(self) -> list[list[str]]:
        calls, self.calls = self.calls, []
        return calls

    def sweep(self, path: Path, resolve=None) -> int:
        """One `sweep run` pass (`resolve`: the pass's LineResolver, else `text_digest`)."""
        self.resolve = resolve or text_digest
        return run_sweep(path, self, self.resolve)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeLongctx:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("seed_everything: 1\n")
    return FakeLongctx()


def test_runner_skips_finished_runs_names_unnamed_ones_and_retries_failures(tmp_path, fake, capsys):
    sweep = tmp_path / "grid.txt"
    sweep.write_text(
        textwrap.dedent(
            """\
            # finished earlier: skipped
            fit --config a.yaml --run_name done
            # unnamed: runs under a name made from its content
            fit --config a.yaml --model.init_args.lr 0.1
            test --config a.yaml --run_name=broken
            # fit finished in this directory, but this line is a test: it runs
            test --config a.yaml --run_name done_fit
            # a test ran in this directory after the fit finished: the fit line is skipped
            fit --config a.yaml --run_name fit_then_test
            # failed earlier: runs again
            validate --config a.yaml --run_name retry --trainer.default_root_dir runs
            """
        )
    )
    for name, command in [
        ("done", "fit --config a.yaml --run_name done"),
        ("done_fit", "fit --config a.yaml --run_name done_fit"),
        ("fit_then_test", "fit --config a.yaml --run_name fit_then_test"),
        ("fit_then_test", "test --config a.yaml --run_name fit_then_test"),
    ]:
        record(tmp_path / "runs" / name, "finished", command, text_digest(shlex.split(command)))
    retry = "validate --config a.yaml --run_name retry --trainer.default_root_dir runs"
    record(tmp_path / "runs/retry", "failed", retry, text_digest(shlex.split(retry)))

    assert fake.sweep(sweep) == 1  # the broken line
    line = ["fit", "--config", "a.yaml", "--model.init_args.lr", "0.1"]
    unnamed = line_name(sweep, line, text_digest(line))
    assert unnamed.startswith("grid/fit-") and len(unnamed) == len("grid/fit-") + 8
    assert fake.take_calls() == [
        [*line, "--run_name", unnamed],
        ["test", "--config", "a.yaml", "--run_name=broken"],
        ["test", "--config", "a.yaml", "--run_name", "done_fit"],
        ["validate", "--config", "a.yaml", "--run_name", "retry", "--trainer.default_root_dir", "runs"],
    ]
    out = capsys.readouterr().out
    assert f"[1/6] {Path('runs/done')}: finished earlier, skipped" in out
    assert f"[3/6] {Path('runs/broken')}: FAILED (exit 3)" in out
    assert f"[5/6] {Path('runs/fit_then_test')}: finished earlier, skipped" in out
    assert "sweep" in out and "5 of 6 runs finished; failed: lines 2" in out

    assert fake.sweep(sweep) == 1  # restarted: only the failed line runs again
    assert fake.take_calls() == [["test", "--config", "a.yaml", "--run_name=broken"]]


def test_a_retried_fit_line_continues_its_unfinished_run(tmp_path, fake, capsys):
    """A fit line that failed, was interrupted or killed before it wrote a record runs again with
    `--ckpt_path last` (a second fit in its folder would be refused); once it finishes, the line is
    found finished (its recorded command is the line plus that flag)."""
    sweep = tmp_path / "retry.txt"
    sweep.write_text("fit --config a.yaml --run_name failed\nfit --config a.yaml --run_name killed\n")
    failed = shlex.split("fit --config a.yaml --run_name failed")
    record(tmp_path / "runs/failed", "interrupted", failed, digest=text_digest(failed))
    (tmp_path / "runs/killed/checkpoints").mkdir(parents=True)  # `kill -9`: a checkpoint, no record
    (tmp_path / "runs/killed/checkpoints/last.ckpt").write_bytes(b"weights")
    assert fake.sweep(sweep) == 0
    assert fake.take_calls() == [
        ["fit", "--config", "a.yaml", "--run_name", "failed", "--ckpt_path", "last"],
        ["fit", "--config", "a.yaml", "--run_name", "killed", "--ckpt_path", "last"],
    ]
    out = capsys.readouterr().out
    assert (
        f"[1/2] {Path('runs/failed')}: python -m longctx fit --config a.yaml --run_name failed --ckpt_path"
        in out
    )
    assert fake.sweep(sweep) == 0 and fake.take_calls() == []
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2


def test_runner_finds_lines_by_content_not_position(tmp_path, fake, capsys):
    """Inserting, moving or editing lines never makes a line skip with another command's results."""
    sweep = tmp_path / "lr.txt"
    sweep.write_text("fit --config a.yaml --lr 0.07\nfit --config a.yaml --lr 0.03\n")
    assert fake.sweep(sweep) == 0 and len(fake.take_calls()) == 2

    # A line inserted first, the others moved down, one edited: the new and the edited lines run (in
    # folders of their own), the moved one is found and skipped.
    sweep.write_text(
        "fit --config a.yaml --lr 0.01\n"
        "fit --config a.yaml  --lr 0.07  # moved\n"
        "fit --config a.yaml --lr 0.3\n"
    )
    assert fake.sweep(sweep) == 0
    calls = fake.take_calls()
    assert [call[:4] for call in calls] == [["fit", "--config", "a.yaml", "--lr"]] * 2
    assert [call[4] for call in calls] == ["0.01", "0.3"]
    folders = sorted(p.parent.name for p in (tmp_path / "runs/lr").glob("*/summary.json"))
    assert len(folders) == 4  # 0.07, 0.03 (kept, whole), 0.01, 0.3
    for folder in folders:  # every folder holds the one command named after it
        summary = json.loads((tmp_path / "runs/lr" / folder / "summary.json").read_text())
        assert f"lr/{folder}" == summary["commands"]["fit"][-1]
    assert "[2/3] " in capsys.readouterr().out


def test_a_named_line_whose_folder_holds_another_command_is_refused(tmp_path, fake, capsys):
    sweep = tmp_path / "named.txt"
    sweep.write_text(
        "fit --config a.yaml --lr 0.01 --run_name edited\n"
        "fit --config a.yaml --run_name old\n"
        "test --config a.yaml --run_name edited\n"
        "fit --config a.yaml --run_name undigested\n"
    )
    record(tmp_path / "runs/edited", "finished", "fit --config a.yaml --lr 0.07 --run_name edited")
    record(tmp_path / "runs/old", "finished", None)  # written before commands were recorded
    record(tmp_path / "runs/undigested", "finished", "fit --config a.yaml --run_name undigested")
    assert fake.sweep(sweep) == 3
    assert fake.take_calls() == [["test", "--config", "a.yaml", "--run_name", "edited"]]
    out = capsys.readouterr().out
    edited = Path("runs/edited")
    assert (
        f"[1/4] {edited}: not run: {edited} holds the fit of another command (fit --config a.yaml --lr 0.07 "
        f"--run_name edited); give this line its own --run_name, or remove {edited} to run it there"
    ) in out
    assert f"{Path('runs/old')} holds the fit of another command (a command it did not record)" in out
    undigested = Path("runs/undigested")
    assert (
        f"[4/4] {undigested}: not run: {undigested} holds the fit of this line, recorded without the "
        "settings it resolved to (by an older longctx), so an edit of its config files since cannot be "
        f"ruled out; give this line its own --run_name, or remove {undigested} to run it there"
    ) in out
    assert "1 of 4 runs finished; not run: lines 0, 1, 3 (see above)" in out


def test_a_line_the_parser_refuses_is_reported_with_its_error_and_not_run(tmp_path, fake, capsys):
    sweep = tmp_path / "typo.txt"
    sweep.write_text("fit --config nope.yaml\nfit --config a.yaml\n")
    assert fake.sweep(sweep) == 1
    assert len(fake.take_calls()) == 1
    out = capsys.readouterr().out
    assert f"[1/2] {sweep}:run 0: FAILED: error: config: no such file 'nope.yaml'" in out
    assert "1 of 2 runs finished; failed: lines 0" in out


QUICK_CONFIG = f"config: {REPO / 'configs/quickstart.yaml'}\ntrainer.max_steps: 3\n"


def test_a_line_whose_config_file_or_base_file_changed_runs_again_or_is_refused(tmp_path, fake, capsys):
    """What a line resolves to (the CLI's parser: its config file, the file that builds on, the
    flags) decides whether it finished: an edit of either file runs an unnamed line again in a fresh
    folder and stops a named one with its fix; reordering a file's keys changes nothing."""
    (tmp_path / "base.yaml").write_text(QUICK_CONFIG)
    config = tmp_path / "lr.yaml"
    settings = "config: base.yaml\nseed_everything: 5\nmodel.init_args.optimizer.init_args.lr: {lr}\n"
    config.write_text(settings.format(lr=0.07))
    sweep = tmp_path / "grid.txt"
    sweep.write_text("fit --config lr.yaml\nfit --config lr.yaml --run_name named\n")

    def ran() -> list[str]:
        return [option(call, "--run_name") for call in fake.take_calls()]

    assert fake.sweep(sweep, LineResolver()) == 0
    (first,) = (tmp_path / "runs/grid").iterdir()
    assert ran() == [f"grid/{first.name}", "named"]

    config.write_text(
        "# the same settings, reordered\nconfig: base.yaml\nmodel.init_args.optimizer.init_args.lr: 0.07\n"
        "seed_everything: 5\n"
    )
    assert fake.sweep(sweep, LineResolver()) == 0 and ran() == []
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2

    named = Path("runs/named")
    refused = (
        f"[2/2] {named}: not run: {named} holds the fit of this line with other settings: a config file "
        f"it reads (or one that file builds on) was edited since it ran; give this line its own "
        f"--run_name, or remove {named} to run it there"
    )
    config.write_text(settings.format(lr=0.1))
    assert fake.sweep(sweep, LineResolver()) == 1
    (second,) = {*(tmp_path / "runs/grid").iterdir()} - {first}  # a fresh folder; the first one kept
    assert ran() == [f"grid/{second.name}"]
    assert refused in capsys.readouterr().out
    assert json.loads((first / "summary.json").read_text())["commands"]["fit"][-1].endswith(first.name)

    (tmp_path / "base.yaml").write_text(QUICK_CONFIG.replace("max_steps: 3", "max_steps: 4"))
    assert fake.sweep(sweep, LineResolver()) == 1
    (third,) = {*(tmp_path / "runs/grid").iterdir()} - {first, second}
    assert ran() == [f"grid/{third.name}"]
    assert refused in capsys.readouterr().out


def test_a_slurm_task_whose_line_or_config_changed_since_it_ran_is_refused(tmp_path, monkeypatch, capsys):
    """A requeued array task re-reads its line and its config files: an edited line, or an edited
    config file, must not resume another configuration's checkpoint in that task's folder; the same
    line (plus sweep.sbatch's resource flags) goes on."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "500")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.delenv("LONGCTX_RUN_NAME", raising=False)
    config = tmp_path / "a.yaml"
    config.write_text(QUICK_CONFIG)
    sweep = tmp_path / "s.txt"
    line = "fit --config a.yaml --seed_everything 1"
    sweep.write_text(line + "\n")
    ran = [*shlex.split(line), "--trainer.devices", "1", "--trainer.num_nodes", "1"]
    record(tmp_path / "runs/slurm-500_0", "interrupted", ran, LineResolver()(ran))
    main([str(sweep), "0"])
    assert capsys.readouterr().out.split("\0") == [*shlex.split(line), ""]

    task = Path("runs/slurm-500_0")
    sweep.write_text("fit --config a.yaml --seed_everything 2\n")
    with pytest.raises(SystemExit) as exit_info:
        main([str(sweep), "0"])
    assert str(exit_info.value.code).startswith(
        f"error: task 0: {task} holds the fit of another command (fit --config a.yaml --seed_everything 1 "
    )

    sweep.write_text(line + "\n")
    config.write_text(QUICK_CONFIG.replace("max_steps: 3", "max_steps: 4"))
    with pytest.raises(SystemExit) as exit_info:
        main([str(sweep), "0"])
    assert exit_info.value.code == (
        f"error: task 0: {task} holds the fit of this line with other settings: a config file it reads "
        f"(or one that file builds on) was edited since it ran; give this line its own --run_name, or "
        f"remove {task} to run it there"
    )


def test_the_digest_the_cli_records_is_the_one_the_runner_computes(tmp_path, monkeypatch):
    """The CLI digests what it parsed (`LongCtxCLI.parse_arguments`), before it fills in
    run-specific values (its run directory, a drawn seed): the runner's `LineResolver` gets the same
    digest for the line, named or not. (Both use the CLI's parser; test_runner_runs_a_real_sweep_...
    checks the digest a real run records, end to end.)"""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text(QUICK_CONFIG)
    line = ["fit", "--config", "a.yaml", "--trainer.max_steps", "2"]
    cli = LongCtxCLI.__new__(LongCtxCLI)  # only its parse step, on the parser the runner uses
    LongCtxCLI.parse_arguments(cli, cli_parser(), [*line, "--run_name", "x"])
    assert cli.config.fit.run_name == "x"
    assert cli.config_digest == LineResolver()(line)


@pytest.mark.slow
def test_runner_runs_a_real_sweep_and_skips_it_when_restarted(tmp_path, monkeypatch):
    """`python -m longctx.sweep run FILE` end to end: a real tiny fit writes its summary.json, so the
    same command again runs nothing; after an edit of the config file the lines name, the unnamed line
    runs again in a fresh folder and the named one is refused."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "quick.yaml"
    config.write_text(f"config: {REPO / 'configs/quickstart.yaml'}\n")
    sweep = tmp_path / "tiny.txt"
    quick = (
        f"--config quick.yaml --data.cache_dir {tmp_path / 'cache'} "
        "--trainer.max_steps 2 --trainer.limit_val_batches 1 --trainer.val_check_interval 2 "
        "--trainer.logger false --trainer.enable_progress_bar false"
    )
    sweep.write_text(f"fit {quick} --run_name earlier\nfit {quick}\n")
    earlier = shlex.split(f"fit {quick} --run_name earlier")
    record(tmp_path / "runs/earlier", "finished", earlier, LineResolver()(earlier))
    env = {"WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "longctx.sweep", "run", str(sweep)]

    def sweep_run() -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)

    first = sweep_run()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    line = shlex.split(f"fit {quick}")
    summary = json.loads(
        (tmp_path / "runs" / line_name(sweep, line, LineResolver()(line)) / "summary.json").read_text()
    )
    assert summary["status"] == "finished" and summary["global_step"] == 2
    assert summary["config_digests"]["fit"] == LineResolver()(line)
    again = sweep_run()
    assert again.returncode == 0 and again.stdout.count("finished earlier, skipped") == 2, again.stdout

    config.write_text(config.read_text() + "model.init_args.optimizer.init_args.lr: 0.1\n")
    edited = sweep_run()
    assert edited.returncode == 1, edited.stdout[-2000:] + edited.stderr[-3000:]
    assert f"{Path('runs/earlier')} holds the fit of this line with other settings" in edited.stdout
    assert "1 of 2 runs finished; not run: lines 0" in edited.stdout
    assert len(list((tmp_path / "runs/tiny").glob("*/summary.json"))) == 2
