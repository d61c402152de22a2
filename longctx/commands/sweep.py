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
unless the line names its run (see `longctx.commands.cli.run_name_from_env`). `run` gives a line without
`--run_name` a name made from what it is, `<file stem>/<subcommand>-<hash>`, the hash of the line's
arguments and of what they resolve to (`longctx.runtime.config_digest`), so a line keeps its folder when lines
are inserted, removed or reordered, and gets a fresh one when it or a config file it reads is edited.

A line is what it resolves to, never its position: `summary.json` records, for each subcommand run in
a directory, its command line (`commands`) and the digest of the settings it resolved to
(`config_digests`, see `longctx.callbacks.run_record`). `run` skips a line only when its run directory
(`<trainer.default_root_dir>/<run_name>`, the root taken from the line, else `runs`) records this very
line as finished with the settings the line resolves to now, so an interrupted sweep restarts where it
stopped. A directory that holds the line's subcommand of another command (a named line that was
edited, two lines with one `--run_name`), or of this line resolved from config files that changed
since (or recorded before digests were kept), is refused, not reused, as is a SLURM task whose line or
config files changed since the task first ran (a requeue re-reads them): results of two
configurations never share a folder. The line is parsed with the CLI's own parser (one per sweep,
built at the first line that needs it) from the current directory, as when it runs.
A `fit` line whose folder holds its unfinished fit (failed, interrupted, diverged, or killed before
it wrote a record) is run again with `--ckpt_path last` appended: it continues that run from its last
checkpoint (or starts it afresh when there is none) instead of being refused as a second run in the
folder (`longctx.runtime.run_folder`); the recorded command is the line plus that flag.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.runtime import run_layout
from longctx.runtime.config_digest import config_digest
from longctx.runtime.errors import OneLineArgumentParser, one_line, read_utf8
from longctx.runtime.run_folder import held_run, read_summary

SUBCOMMANDS = ("fit", "validate", "test", "evaluate_overlaps")  # LongCtxCLI.subcommands()
LONGCTX = (sys.executable, "-m", "longctx")
# Flags that slurm/sweep.sbatch appends to a line (the job's resources): the same line on any cluster.
LAUNCH_FLAGS = ("--trainer.devices", "--trainer.num_nodes")
# What `run` appends to a fit line that continues its unfinished run: still the same line.
CONTINUE = ("--ckpt_path", "last")


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


def without_option(args: list[str], name: str) -> list[str]:
    """A command line without its `--name X` and `--name=X`."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            kept.append(arg)
    return kept


@functools.cache
def cli_parser() -> Any:
    """The CLI's own parser (`longctx.commands.cli.parser_only`: seconds to build), built once per process."""
    from longctx.commands.cli import parser_only  # imports torch and Lightning: only when a line is parsed

    return parser_only()


class LineError(ValueError):
    """A command line the CLI's parser refuses; the message is the line the command itself prints."""


def parse_line(args: list[str]) -> Any:
    """The CLI parser's config for a command line (configs read, classes and settings validated,
    nothing instantiated); `LineError` with the command's own error line when it refuses it."""
    parser = cli_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(args)
    except ValueError as err:  # ParseError: the line `python -m longctx` prints
        raise LineError(f"error: {one_line(err)}") from err
    except SystemExit as err:  # LONGCTX_DEBUG=1: jsonargparse's own exit
        raise LineError(one_line(stderr.getvalue().strip() or err)) from err


class LineResolver:
    """What command lines resolve to now (`longctx.runtime.config_digest`), each parsed once with the CLI's
    parser: one resolver per sweep pass, so a config file edited between passes is read again."""

    def __init__(self) -> None:
        self._digests: dict[tuple[str, ...], str] = {}

    def __call__(self, args: list[str]) -> str:
        key = tuple(without_option(args, "--run_name"))  # the digest leaves the run name out
        if key not in self._digests:
            self._digests[key] = config_digest(cli_parser(), parse_line(list(key)))
        return self._digests[key]


Resolve = Callable[[list[str]], str]


def line_name(path: Path, args: list[str], digest: str) -> str:
    """The run name of a line without `--run_name`: the file stem, the subcommand and a hash of the
    line's arguments and of what they resolve to (`digest`): quoting, spacing and comments do not
    change it; any argument does, and so does an edit of a config file the line reads."""
    name_hash = hashlib.sha256(f"{shlex.join(args)}\n{digest}".encode()).hexdigest()[:8]
    return f"{path.stem}/{args[0]}-{name_hash}"


def local_run(path: Path, args: list[str], resolve: Resolve) -> tuple[list[str], Path]:
    """A line's arguments with a run name (`line_name` unless it has one) and its run directory."""
    if option(args, "--run_name") is None:
        args = [*args, "--run_name", line_name(path, args, resolve(args))]
    return args, run_directory(args)


def run_directory(args: list[str], run_name: str | None = None) -> Path:
    """`<trainer.default_root_dir>/<run_name>` of a command line (the root `runs` unless it says)."""
    root = option(args, "--trainer.default_root_dir")
    return run_layout.run_directory(root, option(args, "--run_name") or run_name or "")


def same_command(recorded: list[str] | None, args: list[str]) -> bool:
    """Whether a recorded command line is `args`, up to the resource flags sweep.sbatch appends and
    the `--ckpt_path last` that `run` appends to continue an unfinished fit."""
    if recorded is None or recorded[: len(args)] != args:
        return False
    extra = recorded[len(args) :]
    pairs = list(zip(extra[::2], extra[1::2]))
    return len(extra) % 2 == 0 and all(pair[0] in LAUNCH_FLAGS or pair == CONTINUE for pair in pairs)


def continued(run_dir: Path, args: list[str]) -> list[str]:
    """A `fit` line as `run` runs it: with `--ckpt_path last` when its folder holds its unfinished
    fit (the line's own: `conflict` found no other), so a retry continues that run."""
    held = held_run(run_dir)
    return [*args, *CONTINUE] if args[0] == "fit" and held is not None and held.has_fit else args


@dataclass(frozen=True)
class Recorded:
    """What a run directory records of the last run of one subcommand there; None for what it does
    not (its `statuses`, `commands` and `config_digests` keep each subcommand's, so a `fit` line and
    a `test` line may share a directory)."""

    status: str | None
    command: list[str] | None
    config_digest: str | None


def recorded_run(run_dir: Path, subcommand: str) -> Recorded:
    """What `run_dir`'s summary.json records of the last `subcommand` run there."""
    summary = read_summary(run_dir)
    latest = {summary.get("subcommand"): summary.get("status")}
    return Recorded(
        status={**latest, **summary.get("statuses", {})}.get(subcommand),
        command=summary.get("commands", {}).get(subcommand),
        config_digest=summary.get("config_digests", {}).get(subcommand),
    )


def refusal(run_dir: Path, args: list[str], what: str) -> str:
    """The line for a run directory that holds `args`'s subcommand of another configuration."""
    return (
        f"{run_dir} holds the {args[0]} {what}; give this line its own --run_name, or remove {run_dir} "
        "to run it there"
    )


def conflict(run_dir: Path, args: list[str], record: Recorded, resolve: Resolve) -> str | None:
    """Why `args` must not run in `run_dir` (`record`: what the folder holds of its subcommand), or
    None: the folder holds that subcommand's results of another command line, or of this one resolved
    to other settings (a config file, or a file it builds on, was edited since) or to settings it did
    not record (written before digests were kept: a change cannot be ruled out). The recorded command
    is resolved as it ran (with any resource flags sweep.sbatch appended), from today's files."""
    if record.status is None:
        return None
    if not same_command(record.command, args):
        held = "a command it did not record" if record.command is None else shlex.join(record.command)
        return refusal(run_dir, args, f"of another command ({held})")
    if record.config_digest is None:
        return refusal(
            run_dir,
            args,
            "of this line, recorded without the settings it resolved to (by an older longctx), so an "
            "edit of its config files since cannot be ruled out",
        )
    if record.config_digest != resolve(record.command):
        return refusal(
            run_dir,
            args,
            "of this line with other settings: a config file it reads (or one that file builds on) "
            "was edited since it ran",
        )
    return None


def run_longctx(args: list[str]) -> int:
    """Run one line as `python -m longctx ARGS` in a fresh process; its exit status."""
    return subprocess.run([*LONGCTX, *args]).returncode


def run_sweep(
    path: Path, launch: Callable[[list[str]], int] = run_longctx, resolve: Resolve | None = None
) -> int:
    """Run each line of a sweep file in turn (`launch`: a fresh `python -m longctx` per line),
    skipping the finished ones; a failed line does not stop the others. `resolve`: what a line
    resolves to (`LineResolver`). Returns the number of lines that failed or were not run (their
    folder holds another configuration's results)."""
    resolve = resolve or LineResolver()
    runs = [task_arguments(path, i) for i in range(len(run_lines(path)))]
    failed, refused = [], []
    for index, line in enumerate(runs):
        head = f"[{index + 1}/{len(runs)}] {path}:run {index}"  # until the line's folder is known
        try:  # a line is parsed at its turn: it may read what an earlier line wrote
            args, run_dir = local_run(path, line, resolve)
            head = f"[{index + 1}/{len(runs)}] {run_dir}"
            record = recorded_run(run_dir, args[0])
            problem = conflict(run_dir, args, record, resolve)
        except LineError as err:  # the error line the command itself would print
            print(f"{head}: FAILED: {err}", flush=True)
            failed.append(index)
            continue
        if problem is not None:
            print(f"{head}: not run: {problem}", flush=True)
            refused.append(index)
            continue
        if record.status == "finished":
            print(f"{head}: finished earlier, skipped", flush=True)
            continue
        args = continued(run_dir, args)
        print(f"{head}: python -m longctx {shlex.join(args)}", flush=True)
        start = time.perf_counter()
        code = launch(args)
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
    parsed: dict[str, Any] = {}
    for path in paths:
        for index in range(len(run_lines(path))):
            try:
                args = task_arguments(path, index)
                result = parse_line(args)[args[0]]
            except LineError as err:
                result = str(err)
            except ValueError as err:  # not a run line
                result = f"error: {one_line(err)}"
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
    from longctx.commands.cli import run_name_from_env  # imports torch: only for lines without a name

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
    run_dir = task_run_directory(run)
    try:
        problem = conflict(run_dir, run, recorded_run(run_dir, run[0]), LineResolver())
    except LineError as err:
        sys.exit(f"error: task {args.task_id}: {one_line(err).removeprefix('error: ')}")
    if problem is not None:
        sys.exit(f"error: task {args.task_id}: {problem}")
    sys.stdout.write("\0".join(run) + "\0")
