"""The device name, and the results of `bash benchmarks/gpu.sh` appended to benchmarks/RESULTS.md.

    python benchmarks/gpu_report.py device        # prints the CUDA device's name; exit 3 without one
    python benchmarks/gpu_report.py append --results benchmarks/RESULTS.md --device NAME LOG...

`append` adds one section per run, named by the device and the date (UTC), holding the commit and the
tail of every log (a log's first line is its command, its last the exit status), written whole or not
at all (`longctx.runtime.atomic`), so an interrupted run never leaves a half-written RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TAIL_LINES = 80  # of each log: pytest's failures and summary, a benchmark's whole table
NO_CUDA_EXIT = 3  # not 1: a Python that fails (no torch) exits 1


def device_name(device: torch.device | str) -> str:
    """The device's name: "cpu", or the CUDA product name, e.g. "cuda (NVIDIA H100 80GB HBM3)"."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    return f"cuda ({torch.cuda.get_device_name(device)})"


def cuda_summary() -> str | None:
    """The GPU, its memory and the software that drives it; None without a CUDA device."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return (
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} visible; "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )


def commit() -> str:
    """The checked-out commit (with "+ local changes" when the tree differs), or "unknown"."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + local changes" if dirty.stdout.strip() else "")


def section(device: str, logs: list[Path], when: dt.datetime) -> str:
    """The Markdown section of one run: a heading with device and date, then each log's tail."""
    lines = [
        f"## GPU run: {device}, {when:%Y-%m-%d %H:%M} UTC",
        "",
        f"`bash benchmarks/gpu.sh` at commit {commit()}; each block is the last {TAIL_LINES} lines of one "
        "part's output (first line: its command; last: its exit status and time).",
    ]
    for log in logs:
        text = log.read_text(encoding="utf-8", errors="replace").rstrip("\n").splitlines()
        command = text[0].removeprefix("$ ") if text else log.stem
        body = text[1:][-TAIL_LINES:]
        lines += ["", f"### `{command}`", "", "```", *body, "```"]
    return "\n".join(lines) + "\n"


def append(results: Path, device: str, logs: list[Path]) -> None:
    """Add the run's section at the end of `results`, whole or not at all."""
    from longctx.runtime.atomic import write_text_atomic

    old = results.read_text(encoding="utf-8") if results.exists() else "# Benchmark results\n"
    now = dt.datetime.now(dt.timezone.utc)
    write_text_atomic(results, old.rstrip("\n") + "\n\n" + section(device, logs, now))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("device", help=f"print the CUDA device; exit {NO_CUDA_EXIT} without one")
    add = commands.add_parser("append", help="append one run's logs to the results file")
    add.add_argument("--results", type=Path, required=True)
    add.add_argument("--device", required=True)
    add.add_argument("logs", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "device":
        summary = cuda_summary()
        if summary is None:
            return NO_CUDA_EXIT
        print(summary)
        return 0
    if missing := [str(log) for log in args.logs if not log.is_file()]:
        print(f"error: no such log: {', '.join(missing)}", file=sys.stderr)
        return 2
    append(args.results, args.device, args.logs)
    print(f"appended to {args.results}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
