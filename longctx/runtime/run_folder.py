"""One run per run folder, and a record of which command wrote each file in it (no Lightning, no torch).

A run folder (`runs/<run_name>/`, see `longctx.runtime.run_layout`) holds one run: one `fit`, continued as
often as it is resumed (`--ckpt_path last`, a SLURM requeue), and the evaluations of its checkpoints
(`validate`, `test`, `evaluate_overlaps`, `context`). What the CLI, the sweep runner and `context`
know about a folder is here:

- `held_run`: whether a folder already holds a run, described in a few words (what ran, how it
  ended, the step, when it last wrote) for `fit`'s refusal;
- `move_aside`: `fit --overwrite_run true` moves the old run's files into a sibling folder named
  with the time the old run last wrote (`runs/quick.old-20260501-120000`): never deleted, never
  mixed with the new run's;
- `Ledger`: `summary.json`'s `artifacts`, every file of the folder with the command that wrote it
  (`subcommand`, `command`, the file's `time`; all null for a file no recorded command wrote). The
  files a command writes replace what an earlier command of the same subcommand wrote: what that
  one wrote and this one did not write again is removed when this one ends (a `test` without
  `--write_token_nll` removes the `token_nll.npz` of an earlier `test`), so no file passes for the
  output of a command that did not write it. A `fit` continues its own run and keeps its earlier
  checkpoints; W&B's entries (`wandb/<entry>`: the W&B run of each command) are never removed;
- `undone_if_refused`: a command that stops before its work starts (bad input found while it sets
  up: a checkpoint that does not load, a corpus file that does not decode, a folder that holds
  another run) leaves the folder as it found it: the files and folders it created there are removed
  (the run folder and its parents too, when it created them), nothing that was there before is.

The CLI's commands use these through `longctx.callbacks.run_record` (whose `summary.json` adds the
metrics); a command outside Lightning's loops (`context`) takes all of them at once: `command_in`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.runtime.atomic import write_json_atomic
from longctx.runtime.errors import SIGINT_EXIT_CODE, one_line
from longctx.runtime.run_layout import LOCK, METRICS, SUMMARY, WANDB, old_run_directory
from longctx.runtime.run_lock import lock_if_launching

ARTIFACTS = "artifacts"  # summary.json's ledger: relative path -> {subcommand, command, time}
CHECKPOINT_SUFFIX = ".ckpt"
FIT = "fit"


def read_summary(run_dir: Path | str) -> dict[str, Any]:
    """The folder's `summary.json`, or {} when there is none (or it does not parse)."""
    try:
        return json.loads((Path(run_dir) / SUMMARY).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _mtime(path: Path) -> int | None:
    """`path`'s modification time (ns; a link's own), or None when it is gone (W&B's files come and
    go while W&B runs)."""
    try:
        return path.lstat().st_mtime_ns
    except FileNotFoundError:
        return None


def _newest(path: Path) -> int | None:
    """The newest modification time (ns) of `path` and, for a folder, of everything under it."""
    times = [_mtime(path)]
    if path.is_dir() and not path.is_symlink():
        times += [_mtime(Path(folder) / name) for folder, _, files in os.walk(path) for name in files]
    return max((mtime for mtime in times if mtime is not None), default=None)


def _is_temporary(name: str) -> bool:
    """A file being written beside its final name (`longctx.runtime.atomic`)."""
    return name.startswith(".") and name.endswith(".tmp")


def artifact_files(run_dir: Path | str) -> dict[str, int]:
    """Every artifact of the folder, relative path -> modification time (ns): each file (the lock,
    `summary.json` and files still being written left out) and each entry of W&B's folder as one
    (`wandb/offline-run-...`: W&B's own files, which change while W&B runs)."""
    run_dir = Path(run_dir)
    found: dict[str, int] = {}
    if not run_dir.is_dir():
        return found
    for folder, dirs, files in os.walk(run_dir):
        here = Path(folder)
        relative = here.relative_to(run_dir)
        if relative == Path(WANDB):
            entries = {f"{WANDB}/{name}": _newest(here / name) for name in [*dirs, *files]}
            dirs.clear()
        else:
            entries = {
                (relative / name).as_posix(): _mtime(here / name)
                for name in files
                if not ((relative == Path() and name in (LOCK, SUMMARY)) or _is_temporary(name))
            }
        found.update((name, mtime) for name, mtime in entries.items() if mtime is not None)
    return found


def _stamp(mtime_ns: int, spec: str = "%Y-%m-%dT%H:%M:%S%z") -> str:
    return time.strftime(spec, time.localtime(mtime_ns / 1e9))


def last_written(run_dir: Path | str) -> int | None:
    """When the folder's run last wrote a file (ns), `summary.json` included; None for no file."""
    run_dir = Path(run_dir)
    times = list(artifact_files(run_dir).values())
    if (run_dir / SUMMARY).is_file():
        times.append((run_dir / SUMMARY).stat().st_mtime_ns)
    return max(times, default=None)


@dataclass(frozen=True)
class HeldRun:
    """A run found in a folder: `description` in a few words, `has_fit` whether it trained there."""

    description: str
    has_fit: bool


def held_run(run_dir: Path | str) -> HeldRun | None:
    """The run `run_dir` holds: a recorded command (`summary.json`), a checkpoint or a validation
    curve; None for a folder with none of them (new, empty, or left by a command refused before it
    started)."""
    run_dir = Path(run_dir)
    files = artifact_files(run_dir)
    checkpoints = sorted(name for name in files if name.endswith(CHECKPOINT_SUFFIX))
    has_summary = (run_dir / SUMMARY).is_file()
    if not (has_summary or checkpoints or METRICS in files):
        return None
    summary = read_summary(run_dir)
    statuses = summary.get("statuses") or (
        {summary["subcommand"]: summary.get("status")} if summary.get("subcommand") else {}
    )
    parts = [", ".join(f"{subcommand} {status}" for subcommand, status in statuses.items())]
    if has_summary and not summary:
        parts = [f"an unreadable {SUMMARY}"]
    if summary.get("global_step") is not None:
        parts.append(f"step {summary['global_step']}")
    if checkpoints:
        parts.append(f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) > 1 else ''}")
    if (newest := last_written(run_dir)) is not None:
        parts.append(f"last written {_stamp(newest, '%Y-%m-%d %H:%M:%S')}")
    has_fit = FIT in statuses or bool(checkpoints) or METRICS in files
    return HeldRun(", ".join(part for part in parts if part), has_fit)


def move_aside(run_dir: Path | str) -> Path:
    """Move every file and folder of `run_dir` but its lock (held by the command that moves them)
    into a new sibling folder named with the time the old run last wrote; returns that folder."""
    run_dir = Path(run_dir)
    stamp = _stamp(last_written(run_dir) or time.time_ns(), "%Y%m%d-%H%M%S")
    target, copy = old_run_directory(run_dir, stamp), 1
    while target.exists():
        copy += 1
        target = old_run_directory(run_dir, f"{stamp}-{copy}")
    target.mkdir()
    for entry in sorted(run_dir.iterdir()):
        if entry.name != LOCK:
            entry.rename(target / entry.name)
    return target


def _remove(run_dir: Path, name: str) -> None:
    """Remove the file `name` of the folder, and the folders it leaves empty (not `run_dir`)."""
    path = run_dir / name
    path.unlink(missing_ok=True)
    for parent in path.parents:
        if parent == run_dir or not parent.is_relative_to(run_dir):
            break
        try:
            parent.rmdir()
        except OSError:  # not empty
            break


class Ledger:
    """`summary.json`'s `artifacts` for one command: the folder as the command found it, compared with
    the folder when it ends (a file written, or written again, since it started is the command's)."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.before = artifact_files(self.run_dir)
        self.kept: set[str] = set()

    def keep(self, name: str) -> None:
        """`name`, an earlier command's file of this subcommand, is still valid for this one and stays,
        listed as the earlier command's (e.g. an overlap that `evaluate_overlaps` did not redo)."""
        self.kept.add(name)

    def settle(self, previous: dict[str, Any], subcommand: str, command: list[str] | None) -> dict[str, Any]:
        """The ledger after this command, from the folder's previous `summary.json` (`previous`);
        removes the files an earlier command of this subcommand wrote that this one did not write again
        (except for `fit`, which continues its run, W&B's entries and `kept` files)."""
        earlier: dict[str, Any] = previous.get(ARTIFACTS, {})
        now = artifact_files(self.run_dir)
        written = {name for name, mtime in now.items() if self.before.get(name) != mtime}
        if subcommand != FIT:
            for name in sorted(now):
                stale = name not in written and name not in self.kept and not name.startswith(f"{WANDB}/")
                if stale and earlier.get(name, {}).get("subcommand") == subcommand:
                    _remove(self.run_dir, name)
                    del now[name]
        ledger = {}
        for name, mtime in sorted(now.items()):
            unknown = {"subcommand": None, "command": None, "time": _stamp(mtime)}
            mine = {"subcommand": subcommand, "command": command, "time": _stamp(mtime)}
            ledger[name] = mine if name in written else earlier.get(name, unknown)
        return ledger


def record_command(
    run_dir: Path | str,
    subcommand: str,
    command: list[str] | None,
    status: str,
    ledger: Ledger,
    **fields: Any,
) -> None:
    """Write `summary.json` for a command that ended: `status`, `subcommand` and `time` (the latest's),
    the status and command line of each subcommand run there (`statuses`, `commands`), `fields`, and
    the `artifacts` ledger; what earlier commands recorded and this one does not set stays."""
    run_dir = Path(run_dir)
    previous = read_summary(run_dir)
    summary = {
        **previous,
        **fields,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": status,
        "subcommand": subcommand,
        "statuses": {**previous.get("statuses", {}), subcommand: status},
        "commands": {**previous.get("commands", {}), subcommand: command},
        ARTIFACTS: ledger.settle(previous, subcommand, command),
    }
    write_json_atomic(run_dir / SUMMARY, summary)


def _paths_under(folder: Path) -> set[Path]:
    paths = {folder}
    for parent, dirs, files in os.walk(folder):
        paths.update(Path(parent) / name for name in [*dirs, *files])
    return paths


@contextmanager
def undone_if_refused(run_dir: Path | str, started: Callable[[], bool]) -> Iterator[None]:
    """Run a command's block; if it fails while `started()` is still false (its work has not begun),
    remove the files and folders it created in `run_dir` (and `run_dir` and its parents, if it
    created them and they are left empty). What existed before the block is never touched."""
    run_dir = Path(run_dir)
    missing = [path for path in (run_dir, *run_dir.parents) if not path.exists()]  # deepest first
    existed = _paths_under(run_dir) if run_dir.is_dir() else set()
    try:
        yield
    except BaseException:
        if not started():
            _remove_created(run_dir, existed, missing)
        raise


def _remove_created(run_dir: Path, existed: set[Path], missing: list[Path]) -> None:
    if run_dir.is_dir():
        for parent, dirs, files in os.walk(run_dir, topdown=False):
            for name in files:
                if (path := Path(parent) / name) not in existed:
                    path.unlink(missing_ok=True)
            for name in dirs:
                path = Path(parent) / name
                if path in existed:
                    continue
                if path.is_symlink():
                    path.unlink()
                else:
                    with contextlib.suppress(OSError):  # something that was there before is inside
                        path.rmdir()
    for path in missing:
        try:
            path.rmdir()
        except OSError:  # not empty (another command wrote there too) or already gone
            break


class Command:
    """A command running in a run folder (`command_in`); `start()` marks the start of its work."""

    def __init__(self) -> None:
        self.started = False

    def start(self) -> None:
        self.started = True


def _is_ctrl_c(error: BaseException) -> bool:
    """Ctrl-C, as Python raises it or as a command turned it into its exit code 130."""
    return isinstance(error, KeyboardInterrupt) or (
        isinstance(error, SystemExit) and error.code == SIGINT_EXIT_CODE
    )


@contextmanager
def command_in(run_dir: Path | str, command: list[str]) -> Iterator[Command]:
    """Run a command (`command[0]` its name) in `run_dir`, holding the folder's lock: left as found if
    it fails before `start()`, else recorded in `summary.json` however it ends (`finished`,
    `interrupted` by Ctrl-C, `failed` with its error's line) with the files it wrote."""
    run_dir = Path(run_dir)
    running = Command()
    with undone_if_refused(run_dir, lambda: running.started), lock_if_launching(run_dir):
        ledger = Ledger(run_dir)
        try:
            yield running
        except BaseException as error:
            if running.started:
                status = "interrupted" if _is_ctrl_c(error) else "failed"
                error_line = one_line(f"{type(error).__name__}: {error}")
                record_command(run_dir, command[0], command, status, ledger, error=error_line)
            raise
        record_command(run_dir, command[0], command, "finished", ledger, error=None)
