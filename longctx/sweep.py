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
`--run_name` a name made from its content, `<file stem>/<subcommand>-<hash of the line>`, so a line
keeps its folder when lines are inserted, removed or reordered, and an edited line gets a fresh one.

A line is identified by its command, never by its position: `summary.json` records the command line
of each subcommand run in a directory (`commands`, see `longctx.callbacks.run_record`). `run` skips a
line only when its run directory (`<trainer.default_root_dir>/<run_name>`, the root taken from the
line, else `runs`) records this very line as finished, so an interrupted sweep restarts where it
stopped; a directory that records another command for the line's subcommand (a named line that was
edited, or two lines with one `--run_name`) is refused, not reused, as is a SLURM task whose line
changed since the task first ran (a requeue re-reads the file): results of two commands never share
a folder.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from longctx import run_layout
from longctx.errors import OneLineArgumentParser, one_line, read_utf8, reported_as_one_line
from longctx.run_layout import SUMMARY

SUBCOMMANDS = ("fit", "validate", "test", "evaluate_overlaps")  # LongCtxCLI.subcommands()
LONGCTX = (sys.executable, "-m", "longctx")
# Flags that slurm/sweep.sbatch appends to a line (the job's resources): the same line on any cluster.
LAUNCH_FLAGS = ("--trainer.devices", "--trainer.num_nodes")


def run_lines(path: Path) -> list[list[str]]:
    """The runs of a sweep file, each as an argument list."""
    runs = []
    text = read_utf8(
        path, "a sweep file is text, one command per line (e.g. `fit --config C.yaml --run_name r`)"
    )
    for number, line in enumerate(text.splitlines(), start=1):
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


def line_name(path: Path, args: list[str]) -> str:
    """The run name of a line without `--run_name`: the file stem, the subcommand and a hash of the
    line's arguments (quoting, spacing and comments do not change it; any argument does)."""
    digest = hashlib.sha256(shlex.join(args).encode()).hexdigest()[:8]
    return f"{path.stem}/{args[0]}-{digest}"


def local_run(path: Path, args: list[str]) -> tuple[list[str], Path]:
    """A line's arguments with a run name (`line_name` unless it has one) and its run directory."""
    if option(args, "--run_name") is None:
        args = [*args, "--run_name", line_name(path, args)]
    return args, run_directory(args)


def run_directory(args: list[str], run_name: str | None = None) -> Path:
    """`<trainer.default_root_dir>/<run_name>` of a command line (the root `runs` unless it says)."""
    root = option(args, "--trainer.default_root_dir")
    return run_layout.run_directory(root, option(args, "--run_name") or run_name or "")


def read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / SUMMARY).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def same_command(recorded: list[str] | None, args: list[str]) -> bool:
    """Whether a recorded command line is `args`, up to the resource flags sweep.sbatch appends."""
    if recorded is None or recorded[: len(args)] != args:
        return False
    extra = recorded[len(args) :]
    return len(extra) % 2 == 0 and all(flag in LAUNCH_FLAGS for flag in extra[::2])


def recorded_run(run_dir: Path, subcommand: str) -> tuple[str | None, list[str] | None]:
    """(status, command line) of the last `subcommand` run in `run_dir`; None for what is not there
    (its `statuses` and `commands` keep each subcommand's, so a `fit` line and a `test` line may
    share a directory)."""
    summary = read_summary(run_dir)
    latest = {summary.get("subcommand"): summary.get("status")}
    status = {**latest, **summary.get("statuses", {})}.get(subcommand)
    return status, summary.get("commands", {}).get(subcommand)


def other_command(run_dir: Path, args: list[str]) -> str | None:
    """The command line of another command that ran `args`'s subcommand in `run_dir` (or a note that
    it was not recorded), or None when there is none."""
    status, recorded = recorded_run(run_dir, args[0])
    if status is None or same_command(recorded, args):
        return None
    return "a command it did not record" if recorded is None else shlex.join(recorded)


def refusal(run_dir: Path, args: list[str], recorded: str) -> str:
    """The line for a run directory that holds another command's results."""
    return (
        f"{run_dir} holds the {args[0]} of another command ({recorded}); give this line its own "
        f"--run_name, or remove {run_dir} to run it there"
    )


def finished(run_dir: Path, args: list[str]) -> bool:
    """Whether the run directory records this command line (`args`) as finished."""
    status, recorded = recorded_run(run_dir, args[0])
    return status == "finished" and same_command(recorded, args)


def run_sweep(path: Path, launcher: Sequence[str] = LONGCTX) -> int:
    """Run each line of a sweep file in turn (a fresh `python -m longctx` per line), skipping the
    finished ones; a failed line does not stop the others. Returns the number of lines that failed or
    were not run (their folder holds another command's results)."""
    runs = [task_arguments(path, i) for i in range(len(run_lines(path)))]
    failed, refused = [], []
    for index, line in enumerate(runs):
        args, run_dir = local_run(path, line)
        head = f"[{index + 1}/{len(runs)}] {run_dir}"
        if finished(run_dir, args):
            print(f"{head}: finished earlier, skipped", flush=True)
            continue
        if (recorded := other_command(run_dir, args)) is not None:
            print(f"{head}: not run: {refusal(run_dir, args, recorded)}", flush=True)
            refused.append(index)
            continue
        print(f"{head}: python -m longctx {shlex.join(args)}", flush=True)
        start = time.perf_counter()
        code = subprocess.run([*launcher, *args]).returncode
        status = "finished" if code == 0 else f"FAILED (exit {code})"
        print(f"{head}: {status} after {time.perf_counter() - start:.0f} s", flush=True)
        if code != 0:
            failed.append(index)
    print(
        f"sweep {path}: {len(runs) - len(failed) - len(refused)} of {len(runs)} runs finished"
        + (
            f"; failed: lines {', '.join(map(str, failed))} (rerun the same command to retry them)"
            if failed
            else ""
        )
        + (f"; not run: lines {', '.join(map(str, refused))} (see above)" if refused else ""),
        flush=True,
    )
    return len(failed) + len(refused)


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


def task_run_directory(args: list[str]) -> Path:
    """The run directory of a SLURM task's line: its `--run_name`, else the name the CLI derives
    from the SLURM ids (stable across requeues of the task)."""
    if option(args, "--run_name") is not None:
        return run_directory(args)
    from longctx.cli import run_name_from_env  # imports torch: only for lines without a name

    return run_directory(args, run_name_from_env())


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
    if (recorded := other_command(task_run_directory(run), run)) is not None:
        sys.exit(f"error: task {args.task_id}: {refusal(task_run_directory(run), run, recorded)}")
    sys.stdout.write("\0".join(run) + "\0")


if __name__ == "__main__":
    with reported_as_one_line(ValueError, OSError):  # a missing sweep file, a line that is no run
        main()
