"""`python -m longctx context`: evaluate checkpoints under a sweep of available context.

    python -m longctx context --config configs/transformer_xl_tiny.yaml --ckpt_path runs/xl/last.ckpt \
        --config configs/window_transformer_tiny.yaml --ckpt_path runs/window/last.ckpt \
        [--name xl --name window] [--axis memory] [--lengths 0 16 32 64] [--split valid] \
        [--run_name NAME] [--root runs] [-- FLAGS FOR EVERY MODEL, e.g. --data.cache_dir X]

Each `--config`/`--ckpt_path` pair is one model (`--name` labels them in order; default: the config's
file name). Every model is built by the CLI exactly as `validate` builds it (the config, then the
flags after the pair's own: anything this command does not know is passed to every model), loaded
once, and evaluated at every context length of its axis (`longctx.diagnostics.axes`: the knob is
changed in place between evaluations, so a point equals a `validate` run with the flags the CSV
lists). Writes, in `<root>/<run_name>/`:

- `context.csv`: model, method, axis, context_length, loss, ppl, bpc, bpb, tokens, state_size (the
  numbers per layer the model carries at that point, `LMBase.state_size`), recall_acc and
  recall_acc_first (on a split with marks: `longctx.core.recall`), flags (the `validate` flags of
  the point); `context.png`: loss against context length, one line per model;
- `recl.csv` (and `recl_gains.csv`, every relative gain): the Relative Effective Context Length of
  Dai et al. 2019 over the models of each axis (`longctx.diagnostics.recl`; r = 0.1, 0.5, 1.0);
- `context_positions.csv`/`.png`: loss by position within the segment/window, per model and point;
- `context_document_distance.csv`/`.png`: loss by distance to the document start (bins that double);
- `<name>/token_nll_<axis><length>[_reset].npz`: each point's per-token NLL (`TokenNLLWriter`), and
  `<name>/config.yaml`, the model's resolved config;
- `summary.json`: the command (`commands.context`), how it ended, and every file of the folder with
  the command that wrote it (`artifacts`): the run directory may be a fit's, and a second `context`
  there replaces the first one's files (`longctx.runtime.run_folder`).
Logged to W&B (tables and figures) unless `WANDB_MODE=disabled`. Bad input is one line; bad input
found before the first evaluation leaves no folder and no file behind; so is a length whose
evaluation step would need more memory than the device has, found before anything is allocated
(`longctx.diagnostics.footprint`: the line names the longest length that fits). The run directory's
lock keeps a second command out while it runs (`longctx.runtime.run_lock`). `context.csv` is rewritten as
each point finishes (one progress line each): a Ctrl-C keeps the finished points there and exits
with 130; the same command again evaluates every point.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from longctx.callbacks.sigterm import ctrl_c_exit_code
from longctx.callbacks.token_nll import TokenNLLWriter
from longctx.checkpoints.saving import readable_size
from longctx.commands.cli import PARSER_KWARGS, USER_ERRORS, LongCtxCLI, ensure_wandb_mode, run_name_from_env
from longctx.core.base import LMBase
from longctx.data.datamodule import LMDataModule
from longctx.diagnostics import positions, recl
from longctx.diagnostics.axes import Axis, AxisError, Variant, all_axes, axis_named, default_axis, variants
from longctx.diagnostics.figures import by_key_figure, context_figure
from longctx.diagnostics.footprint import available_bytes, evaluation_bytes
from longctx.runtime.atomic import atomic_path, write_text_atomic
from longctx.runtime.errors import SIGINT_EXIT_CODE, debug_enabled, exit_with_error, one_line
from longctx.runtime.run_folder import command_in
from longctx.runtime.run_layout import DEFAULT_ROOT, run_directory

# How torch says an allocation failed, on a GPU and on the CPU.
OUT_OF_MEMORY = re.compile(r"out of memory|can't allocate memory", re.IGNORECASE)
CONTEXT_COLUMNS = [
    "model", "method", "axis", "context_length", "loss", "ppl", "bpc", "bpb", "tokens", "state_size",
    "recall_acc", "recall_acc_first", "flags",
]  # fmt: skip


class ContextError(ValueError):
    """Bad input to the command; printed as one line."""


@dataclass
class ModelRun:
    """One `--config`/`--ckpt_path` pair, built by the CLI, with its axis and lengths."""

    name: str
    ckpt_path: str
    cli: LongCtxCLI
    axis: Axis
    lengths: list[int]


class ValidateCLI(LongCtxCLI):
    """`python -m longctx validate ...` parsed and built (run directory, model, data module, trainer)
    but not run: the command evaluates the model itself, point by point."""

    def _run_subcommand(self, subcommand: str) -> None:
        """Nothing: `sweep` runs the evaluations."""


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m longctx context", description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a model's config (repeatable)")
    parser.add_argument(
        "--ckpt_path", action="append", required=True, help="its checkpoint (one per --config)"
    )
    parser.add_argument("--name", action="append", help="its label in tables and figures (in order)")
    *named, last = all_axes()
    parser.add_argument("--axis", help=f"{', '.join(named)} or {last} (default: per method)")
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="context lengths (default: five up to the configured)"
    )
    parser.add_argument("--split", choices=["valid", "test"], default="valid")
    parser.add_argument("--run_name", help="run directory name (default: as the CLI names runs)")
    parser.add_argument(
        "--root", default=DEFAULT_ROOT, help=f"where the run directory goes (default: {DEFAULT_ROOT})"
    )
    parser.add_argument(
        "--recl_r", type=float, nargs="+", default=list(recl.PAPER_R),
        help="RECL's r, the fraction of hardest positions compared (paper: 0.1 0.5 1.0)",
    )  # fmt: skip
    parser.add_argument(
        "--gain_threshold", type=float, default=recl.PAPER_GAIN_THRESHOLD,
        help="RECL's relative gain threshold (paper: 0.01)",
    )  # fmt: skip
    parser.add_argument("--wandb_project", default="longctx")
    args, extra = parser.parse_known_args(argv)
    if "--" in extra:  # the separator before the flags for every model (argparse keeps it)
        extra.remove("--")
    return args, extra


def model_names(args: argparse.Namespace) -> list[str]:
    """The models' labels: `--name` in order, else the config file's stem (numbered when repeated)."""
    if len(args.ckpt_path) != len(args.config):
        raise ContextError(
            f"{len(args.config)} --config but {len(args.ckpt_path)} --ckpt_path: "
            "give one checkpoint per config"
        )
    names = list(args.name or [])
    if len(names) > len(args.config):
        raise ContextError(
            f"{len(names)} --name for {len(args.config)} models: one name per --config at most"
        )
    names += [Path(config).stem for config in args.config[len(names) :]]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    if bad := [name for name in unique if not re.fullmatch(r"[A-Za-z0-9._+-]+", name)]:
        raise ContextError(f"--name {bad[0]!r}: use letters, digits and . _ + - (it names a directory)")
    return unique


def build(args: argparse.Namespace, extra: list[str], run_dir: Path) -> list[ModelRun]:
    """Every model built (as `validate` builds it) and checked before any evaluation runs."""
    runs = []
    for name, config, ckpt_path in zip(model_names(args), args.config, args.ckpt_path):
        if not Path(ckpt_path).is_file():
            raise ContextError(f"--ckpt_path {ckpt_path}: no such checkpoint file")
        cli_args = [
            "validate", "--config", config, *extra, "--ckpt_path", ckpt_path,
            "--trainer.default_root_dir", str(run_dir), "--run_name", name,
            "--trainer.enable_progress_bar", "false",
        ]  # fmt: skip
        with warnings.catch_warnings():  # it warns that sys.argv (this command's) is not what it parses
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            cli = ValidateCLI(args=cli_args, parser_kwargs=PARSER_KWARGS)
        if cli.trainer.world_size > 1:
            raise ContextError(
                f"{config}: the trainer runs {cli.trainer.world_size} processes; context evaluates in one "
                "(add --trainer.devices 1 --trainer.num_nodes 1 --trainer.strategy auto)"
            )
        model, data = cli.model, cli.datamodule
        axis = axis_named(args.axis) if args.axis else default_axis(model, data)
        lengths = axis.lengths_for(model, data, args.lengths)
        check_memory(model, data, axis, lengths, cli.trainer.strategy.root_device)
        cli.prepare_ckpt_path()  # the checkpoint's weights fit the model (as `validate` checks)
        runs.append(ModelRun(name, ckpt_path, cli, axis, lengths))
    return runs


def check_memory(
    model: LMBase, data: LMDataModule, axis: Axis, lengths: list[int], device: torch.device
) -> None:
    """One line, before anything is allocated, for lengths whose evaluation step needs more memory
    than `device` has available (`footprint.evaluation_bytes`), naming the largest length that fits.
    The axis is left at the last length checked (every evaluation sets its own)."""
    available = available_bytes(device)
    if available is None:
        return

    def need(length: int) -> int:
        axis.set(model, data, length)
        return evaluation_bytes(model, data)

    too_long = [length for length in lengths if need(length) > available]
    if not too_long:
        return
    longest, low = max(too_long), axis.limits(model, data)[0]
    needed = need(longest)
    fits = low - 1  # the longest length that fits: the estimate grows with the length
    high = longest
    while high - fits > 1:
        middle = (fits + high) // 2
        fits, high = (middle, high) if need(middle) <= available else (fits, middle)
    instead = f"give lengths up to about {fits:,}, or" if fits >= low else "even the shortest does not fit:"
    raise ContextError(
        f"--lengths {' '.join(map(str, too_long))}: {type(model).__name__} at {axis.name} length {longest:,} "
        f"needs about {readable_size(needed)} for one evaluation step (data.eval_batch_size "
        f"{data.eval_batch_size}, segments of {data.eval_tgt_len}), more than the "
        f"{readable_size(available)} available on {device}; {instead} lower data.eval_batch_size"
    )


def token_nll_name(axis: Axis, length: int, variant: Variant) -> str:
    return f"token_nll_{axis.name}{length}{variant.file_tag}.npz"


class FinishedPoints:
    """The points evaluated so far, in `context.csv` as each one finishes (the whole table, written
    atomically), so that a Ctrl-C or a crash keeps them; one progress line per point."""

    def __init__(self, path: Path, total: int) -> None:
        self.path, self.total = path, total
        self.rows: list[dict] = []

    def add(self, row: dict, seconds: float) -> None:
        self.rows.append(row)
        write_csv(self.path, self.rows, CONTEXT_COLUMNS)
        say(
            f"{row['model']} {row['axis']} {row['context_length']} ({len(self.rows)}/{self.total}): loss "
            f"{row['loss']:.4g} ({seconds:.1f} s)"
        )


def points(run: ModelRun) -> int:
    """How many evaluations `sweep` runs for this model."""
    return len(variants(run.cli.model)) * len(run.lengths)


def sweep(
    run: ModelRun, split: str, finished: FinishedPoints
) -> tuple[list[dict], dict[tuple[str, int], Path]]:
    """Evaluate one model at every length (and variant): CSV rows (each also handed to `finished` as
    it finishes) and each point's per-token file."""
    trainer, model, data = run.cli.trainer, run.cli.model, run.cli.datamodule
    trainer.loggers = []  # the points are logged together by this command, not one run each
    writer = TokenNLLWriter()
    trainer.callbacks.append(writer)
    evaluate = trainer.validate if split == "valid" else trainer.test
    stage = "val" if split == "valid" else "test"
    module = type(model).__module__
    method = module.split(".")[2] if module.startswith("longctx.methods.") else type(model).__name__
    ckpt_path: str | None = run.ckpt_path
    rows, files = [], {}
    for variant in variants(model):
        label = run.name + variant.suffix
        for length in run.lengths:
            start = time.perf_counter()
            variant.set(model)
            run.axis.set(model, data, length)
            writer.filename = token_nll_name(run.axis, length, variant)
            try:
                metrics = evaluate(model, datamodule=data, ckpt_path=ckpt_path, verbose=False)[0]
            except (torch.OutOfMemoryError, RuntimeError) as err:
                if not OUT_OF_MEMORY.search(str(err)):
                    raise
                raise ContextError(
                    f"{label} at {run.axis.name} length {length}: out of memory ({one_line(err)[:120]}); "
                    "give shorter lengths or lower data.eval_batch_size (the points finished before are in "
                    f"{finished.path})"
                ) from err
            ckpt_path = None  # the weights are loaded once
            files[(label, length)] = Path(trainer.default_root_dir) / writer.filename
            rows.append({
                "model": label, "method": method, "axis": run.axis.name, "context_length": length,
                "loss": metrics[f"{stage}/loss"], "ppl": metrics.get(f"{stage}/ppl"),
                "bpc": metrics.get(f"{stage}/bpc"), "bpb": metrics.get(f"{stage}/bpb"),
                "tokens": int(metrics[f"{stage}/tokens"]),
                "state_size": metrics.get(f"{stage}/state_size"),
                "recall_acc": metrics.get(f"{stage}/recall_acc"),
                "recall_acc_first": metrics.get(f"{stage}/recall_acc_first"),
                "flags": " ".join(run.axis.flags(model, data, length) + variant.flags),
            })  # fmt: skip
            finished.add(rows[-1], time.perf_counter() - start)
    if len({row["tokens"] for row in rows}) > 1:
        say(
            f"{run.name}: the points scored different numbers of targets (a limit_*_batches or a window "
            "length that changes the batches): their losses are over different text; RECL compares the "
            "targets all points scored"
        )
    return rows, files


def read_token_nll(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return dict(archive)


def position_rows(
    run: ModelRun, split: str, files: dict[tuple[str, int], Path]
) -> tuple[list[dict], list[dict]]:
    """Loss by position within the segment/window and by distance to the document start, for each of
    this model's points (`files`: its per-token files)."""
    data = run.cli.datamodule
    tokens = data.corpus.split(split)
    by_position, by_distance = [], []
    for (label, length), path in files.items():
        run.axis.set(run.cli.model, data, length)  # the layout this point was scored with
        where = positions.window_positions(data.stream(split, train=False), len(tokens.tokens))
        arrays = read_token_nll(path)
        head = {"model": label, "axis": run.axis.name, "context_length": length}
        for row in positions.loss_by_position(arrays["nll"], arrays["offset"], where):
            by_position.append({**head, **row})
        for row in positions.loss_by_document_distance(arrays["nll"], arrays["offset"], tokens.doc_offsets):
            by_distance.append({**head, **row})
    return by_position, by_distance


def recl_rows(
    runs: list[ModelRun], rows: list[dict], files: dict[tuple[str, int], Path], args: argparse.Namespace
) -> tuple[list[dict], list[dict]]:
    """RECL over the models of each axis, at the context lengths they share, on the targets all scored."""
    recls, gains = [], []
    for axis in sorted({row["axis"] for row in rows}):
        labels = list(dict.fromkeys(row["model"] for row in rows if row["axis"] == axis))
        group = [run for run in runs if run.axis.name == axis]
        splits = {run.cli.datamodule.corpus.split(args.split).tokens.tobytes() for run in group}
        if len(splits) > 1:
            say(f"RECL ({axis}): not computed, the models read different tokens (tokenizer or corpus)")
            continue
        per_label = ({c for (model, c) in files if model == label} for label in labels)
        lengths = sorted(set.intersection(*per_label))
        if len(lengths) < 2:
            say(f"RECL ({axis}): not computed, the models share fewer than two context lengths")
            continue
        arrays = {(label, c): read_token_nll(files[(label, c)]) for label in labels for c in lengths}
        common = set.intersection(*(set(a["offset"].tolist()) for a in arrays.values()))
        offsets = np.array(sorted(common), dtype=np.int64)
        losses = {label: {c: aligned(arrays[(label, c)], offsets) for c in lengths} for label in labels}
        found, steps = recl.relative_effective_context_length(losses, args.recl_r, args.gain_threshold)
        recls += [
            {"model": r.model, "axis": axis, "r": r.r, "recl": r.length, "reached_end": r.reached_end,
             "gain_threshold": args.gain_threshold, "targets": len(offsets)}
            for r in found
        ]  # fmt: skip
        gains += [
            {"model": g.model, "axis": axis, "r": g.r, "c": g.short, "c_prime": g.long, "gain": g.gain}
            for g in steps
        ]
    return recls, gains


def aligned(arrays: dict[str, np.ndarray], offsets: np.ndarray) -> np.ndarray:
    """The NLL of the targets at `offsets` (sorted, all present in the file's sorted `offset`)."""
    return arrays["nll"][np.searchsorted(arrays["offset"], offsets)]


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    columns = columns or (list(rows[0]) if rows else [])
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: ("" if row.get(key) is None else row.get(key)) for key in columns} for row in rows)
    write_text_atomic(path, buffer.getvalue())


def save_figure(figure: Figure, path: Path) -> None:
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=120, format="png")


def log_to_wandb(
    run_dir: Path, run_name: str, project: str, tables: dict[str, list[dict]], figures: list[Path]
) -> None:
    """Tables and figures to W&B (offline without credentials), unless `WANDB_MODE=disabled`."""
    if os.environ.get("WANDB_MODE") == "disabled":
        return
    ensure_wandb_mode()
    import wandb

    run = wandb.init(
        project=project, name=run_name, id=re.sub(r"[^A-Za-z0-9_-]", "-", run_name), dir=str(run_dir),
        resume="allow", job_type="context",
    )  # fmt: skip
    for key, rows in tables.items():
        if rows:
            columns = list(rows[0])
            data = [[row[c] for c in columns] for row in rows]
            run.log({f"context/{key}": wandb.Table(columns=columns, data=data)})
    run.log({f"context/{path.stem}": wandb.Image(str(path)) for path in figures})
    run.finish()


def say(message: str) -> None:
    print(f"longctx: {message}", file=sys.stderr, flush=True)


def run(argv: list[str]) -> Path:
    """The command; returns the run directory."""
    args, extra = parse(argv)
    if args.axis:
        axis_named(args.axis)  # an unknown axis fails before any model is built
    if not all(0.0 < r <= 1.0 for r in args.recl_r):
        raise ContextError(f"--recl_r {args.recl_r}: r is a fraction of positions, in (0, 1]")
    run_name = args.run_name or run_name_from_env()
    run_dir = run_directory(args.root, run_name)
    with command_in(run_dir, ["context", *argv]) as command:
        runs = build(args, extra, run_dir)
        command.start()  # bad input found from here on is recorded as a failed command
        evaluate(runs, args, run_dir, run_name)
    say(f"context diagnostics in {run_dir}")
    return run_dir


def evaluate(runs: list[ModelRun], args: argparse.Namespace, run_dir: Path, run_name: str) -> None:
    """Every model at every point; the tables, figures and W&B log of them all."""
    rows, files, by_position, by_distance = [], {}, [], []
    finished = FinishedPoints(run_dir / "context.csv", sum(map(points, runs)))
    try:
        with ctrl_c_exit_code():  # Lightning ends an evaluation stopped by Ctrl-C with exit code 1
            for model_run in runs:
                model_rows, model_files = sweep(model_run, args.split, finished)
                rows += model_rows
                files.update(model_files)
                position, distance = position_rows(model_run, args.split, model_files)
                by_position += position
                by_distance += distance
    except (KeyboardInterrupt, SystemExit) as stop:
        if isinstance(stop, SystemExit) and stop.code != SIGINT_EXIT_CODE:
            raise
        kept = f"the finished ones are in {finished.path}" if finished.rows else "none is kept"
        say(
            f"Ctrl-C: stopped after {len(finished.rows)} of {finished.total} points; {kept} (RECL and the "
            f"figures need every point: run the command again); exit code {SIGINT_EXIT_CODE}"
        )
        raise SystemExit(SIGINT_EXIT_CODE) from None
    recls, gains = recl_rows(runs, rows, files, args)
    write_csv(run_dir / "recl.csv", recls)
    write_csv(run_dir / "recl_gains.csv", gains)
    write_csv(run_dir / "context_positions.csv", by_position)
    write_csv(run_dir / "context_document_distance.csv", by_distance)
    figures = {
        run_dir / "context.png": context_figure(rows),
        run_dir / "context_positions.png": by_key_figure(
            by_position, "position", "position in the segment/window"
        ),
        run_dir / "context_document_distance.png": by_key_figure(
            by_distance, "distance_from", "distance to the document start (tokens)", log_x=True
        ),
    }
    for path, figure in figures.items():
        save_figure(figure, path)
    tables = {"losses": rows, "recl": recls, "positions": by_position, "document_distance": by_distance}
    log_to_wandb(run_dir, run_name, args.wandb_project, tables, list(figures))
    print_summary(rows, recls)


def print_summary(rows: list[dict], recls: list[dict]) -> None:
    print(f"{'model':>36s} {'axis':>9s} {'context':>8s} {'loss':>9s} {'tokens':>9s}")
    for row in rows:
        length, loss, tokens = row["context_length"], row["loss"], row["tokens"]
        print(f"{row['model']:>36s} {row['axis']:>9s} {length:>8d} {loss:>9.4f} {tokens:>9d}")
    for row in recls:
        more = "+" if row["reached_end"] else ""
        print(f"RECL {row['model']} ({row['axis']}, r = {row['r']}): {row['recl']}{more}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m longctx context`; bad input exits with one line, Ctrl-C with 130."""
    try:
        run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # before any point (building the models): nothing to keep
        say(f"Ctrl-C: stopped before any point was evaluated; exit code {SIGINT_EXIT_CODE}")
        raise SystemExit(SIGINT_EXIT_CODE) from None
    except (ContextError, AxisError, *USER_ERRORS) as err:
        if debug_enabled():
            raise
        exit_with_error(err)
