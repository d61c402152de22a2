"""Sweep files for SLURM array jobs: one run per line, picked by `SLURM_ARRAY_TASK_ID`.

A sweep file holds one longctx command line per run (`fit --config configs/x.yaml --model...`),
quoted as in a shell; blank lines and `#` comments are skipped, so task `i` runs the `i`-th run line
(0-based, matching `#SBATCH --array=0-N`). `slurm/sweep.sbatch` calls

    python -m longctx.sweep FILE TASK_ID

which prints that run's arguments NUL-separated for `mapfile -d ''`. The run directory and W&B run
id come from `SLURM_ARRAY_JOB_ID`/`SLURM_ARRAY_TASK_ID` (see `longctx.cli.run_name_from_env`), so a
requeued task resumes its own run and the runs of one sweep share a W&B group.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


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
    if args[0] not in {"fit", "validate", "test"}:
        raise ValueError(f"{path}: run {task_id} must start with fit, validate or test, got {args[0]!r}")
    return args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    main()
