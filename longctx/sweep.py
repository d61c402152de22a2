"""Sweep files: one longctx run per line, as a SLURM array job or one after another on this machine.

A sweep file holds one longctx command line per run (`fit --config configs/x.yaml --model...`),
quoted as in a shell; blank lines and `#` comments are skipped, so run `i` is the `i`-th run line
(0-based, matching `#SBATCH --array=0-N`). Each line starts with a subcommand of `python -m longctx`:
fit, validate, test or evaluate_overlaps.

    python -m longctx.sweep FILE TASK_ID      # slurm/sweep.sbatch: print run TASK_ID's arguments,
                                              # NUL-separated for `mapfile -d ''`
    python -m longctx.sweep FILE 0 --count    # the number of runs (for --array=0-N)
    python -m longctx.sweep run FILE          # run every line here, one after another
    python -m longctx.sweep check FILE...     # parse every line with the CLI's parser, run nothing

Under SLURM the run directory and W&B run id come from `SLURM_ARRAY_JOB_ID`/`SLURM_ARRAY_TASK_ID`
unless the line names its run (see `longctx.cli.run_name_from_env`). `run` gives a line without
`--run_name` the stable name `<file stem>/<index>` and skips a line whose run directory
(`<trainer.default_root_dir>/<run_name>`, the root taken from the line, else `runs`) holds a
`summary.json` saying this subcommand finished, so an interrupted sweep restarts where it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from longctx.errors import OneLineArgumentParser, one_line, reported_as_one_line

SUBCOMMANDS = ("fit", "validate", "test", "evaluate_overlaps")  # LongCtxCLI.subcommands()
DEFAULT_ROOT = "runs"  # the CLI's run root when trainer.default_root_dir is not set
SUMMARY = "summary.json"  # written by longctx.callbacks.run_record at the end of every subcommand
LONGCTX = (sys.executable, "-m", "longctx")


def run_lines(path: Path) -> list[list[str]]:
    """The runs of a sweep file, each as an argument list."""
    runs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            args = shlex.split(line, comments=True)
        except ValueError as err:
            raise ValueError(f"{path}:{number}: cannot parse the line ({err})") from err
        if args:
            runs.append(args)
    return runs


def task_arguments(path: Path, task_id: int) -> list[str]:
    """Arguments of run `task_id`, with a clear error when the array is larger than the sweep."""
    runs = run_lines(path)
    if not 0 <= task_id < len(runs):
        raise ValueError(
            f"task {task_id} is out of range: {path} has {len(runs)} runs, so submit it with "
            f"--array=0-{len(runs) - 1}"
        )
    args = runs[task_id]
    if args[0] not in SUBCOMMANDS:
        raise ValueError(
            f"{path}: run {task_id} must start with one of {', '.join(SUBCOMMANDS)}, got {args[0]!r}"
        )
    return args


def option(args: list[str], name: str) -> str | None:
    """The value of `--name X` or `--name=X` in a command line (the last one wins, as in the CLI)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def local_run(path: Path, index: int, args: list[str]) -> tuple[list[str], Path]:
    """A line's arguments with a run name (`<file stem>/<index>` unless it has one) and its run
    directory."""
    if option(args, "--run_name") is None:
        args = [*args, "--run_name", f"{path.stem}/{index}"]
    root = option(args, "--trainer.default_root_dir") or DEFAULT_ROOT
    return args, Path(root) / option(args, "--run_name")


def finished(run_dir: Path, subcommand: str) -> bool:
    """Whether the run directory's summary says `subcommand`'s last run there ran to its end (its
    `statuses` keeps each subcommand's, so a `fit` line and a `test` line may share a directory)."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    latest = {summary.get("subcommand"): summary.get("status")}
    return {**latest, **summary.get("statuses", {})}.get(subcommand) == "finished"


def run_sweep(path: Path, launcher: Sequence[str] = LONGCTX) -> int:
    """Run each line of a sweep file in turn (a fresh `python -m longctx` per line), skipping the
    finished ones; a failed line does not stop the others. Returns the number of failed lines."""
    runs = [task_arguments(path, i) for i in range(len(run_lines(path)))]
    failed = []
    for index, line in enumerate(runs):
        args, run_dir = local_run(path, index, line)
        head = f"[{index + 1}/{len(runs)}] {run_dir}"
        if finished(run_dir, args[0]):
            print(f"{head}: finished earlier, skipped", flush=True)
            continue
        print(f"{head}: python -m longctx {shlex.join(args)}", flush=True)
        start = time.perf_counter()
        code = subprocess.run([*launcher, *args]).returncode
        status = "finished" if code == 0 else f"FAILED (exit {code})"
        print(f"{head}: {status} after {time.perf_counter() - start:.0f} s", flush=True)
        if code != 0:
            failed.append(index)
    print(
        f"sweep {path}: {len(runs) - len(failed)} of {len(runs)} runs finished"
        + (
            f"; failed: lines {', '.join(map(str, failed))} (rerun the same command to retry them)"
            if failed
            else ""
        ),
        flush=True,
    )
    return len(failed)


def parse_sweeps(paths: list[Path]) -> dict[str, Any]:
    """Parse every run of the sweep files with the CLI's own parser (configs read, classes and
    settings validated, nothing instantiated or run): `{"file:run i": the run's subcommand config, or
    the error line the run itself would print}`. Relative paths in the lines are resolved from the
    current directory, as when they run."""
    from longctx.cli import parser_only

    parser = parser_only()
    parsed: dict[str, Any] = {}
    for path in paths:
        for index in range(len(run_lines(path))):
            stderr = io.StringIO()
            try:
                args = task_arguments(path, index)
                with contextlib.redirect_stderr(stderr):
                    result = parser.parse_args(args)[args[0]]
            except ValueError as err:  # ParseError: the line `python -m longctx` prints
                result = f"error: {one_line(err)}"
            except SystemExit as err:  # LONGCTX_DEBUG=1: jsonargparse's own exit
                result = one_line(stderr.getvalue().strip() or err)
            parsed[f"{path}:run {index}"] = result
    return parsed


def check_sweeps(paths: list[Path]) -> dict[str, str]:
    """`{"file:run i": error line}` for the runs of the sweep files that the CLI's parser refuses."""
    return {where: result for where, result in parse_sweeps(paths).items() if isinstance(result, str)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        parser = OneLineArgumentParser(prog="python -m longctx.sweep run", description=run_sweep.__doc__)
        parser.add_argument("sweep_file", type=Path)
        args = parser.parse_args(argv[1:])
        try:
            failed = run_sweep(args.sweep_file)
        except KeyboardInterrupt:
            sys.exit(f"sweep {args.sweep_file} interrupted: the same command continues it")
        sys.exit(1 if failed else 0)
    if argv[:1] == ["check"]:
        parser = OneLineArgumentParser(prog="python -m longctx.sweep check", description=check_sweeps.__doc__)
        parser.add_argument("sweep_files", type=Path, nargs="+")
        args = parser.parse_args(argv[1:])
        errors = check_sweeps(args.sweep_files)
        for where, error in errors.items():
            print(f"{where}: {error}", file=sys.stderr)
        sys.exit(1 if errors else 0)
    parser = OneLineArgumentParser(
        prog="python -m longctx.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_file", type=Path)
    parser.add_argument("task_id", type=int)
    parser.add_argument("--count", action="store_true", help="print the number of runs and exit")
    args = parser.parse_args(argv)
    if args.count:
        print(len(run_lines(args.sweep_file)))
        return
    try:
        run = task_arguments(args.sweep_file, args.task_id)
    except ValueError as err:
        sys.exit(f"error: {err}")
    sys.stdout.write("\0".join(run) + "\0")


if __name__ == "__main__":
    with reported_as_one_line(ValueError, OSError):  # a missing sweep file, a line that is no run
        main()
