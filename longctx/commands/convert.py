"""`python -m longctx convert --from FORMAT --config CONFIG SOURCE DEST`: a released checkpoint as a
longctx Lightning checkpoint.

The config says which longctx model the weights go into (its class and sizes); the format's
converter (`longctx/methods/<method>/convert.py`) reads SOURCE without the authors' code, renames
and reshapes its tensors into the model's own names and maps the vocabulary rows onto the data
module's ids, so the same text gets the same scores as in the authors' code. DEST is then an
ordinary checkpoint for

    python -m longctx test --config CONFIG --ckpt_path DEST

Further `--key value` flags override the config, as in `test` (e.g. `--model.init_args.network.span_ramp 8`).

A word vocabulary travels as a text file next to DEST (`<DEST stem>.vocab.txt`, one symbol per
line, id = line number), read by the data option `data.vocab_file`.

Every tensor of the model must come from SOURCE (none is left at its initialisation), every tensor
of SOURCE must be used or be one the format knows to be derived, and a shape that differs from the
config's names both sides. DEST and the vocabulary file are written to temporary names and renamed.
The checkpoint's `hyper_parameters` hold only the architecture (what fixes the tensors' shapes), so
the config's evaluation settings (memory length, TRAMS, protocol) are never overridden by it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from longctx.checkpoints.convert import Converted, ConvertError, lightning_checkpoint, load_converted
from longctx.core.base import LMBase
from longctx.data.datamodule import LMDataModule
from longctx.data.download import DataError
from longctx.methods import registry
from longctx.runtime.atomic import atomic_path, write_text_atomic
from longctx.runtime.errors import OneLineArgumentParser, reported_as_one_line

# format -> module with `MODEL_CLASS`, `ARCH_KEYS`, `read_vocab(fmt, source, vocab)` (the word
# vocabulary in the checkpoint's id order, or None), `architecture(fmt, source)` (the checkpoint's
# sizes as model.init_args), `configured(init_args)` (the config's, in the same keys) and
# `convert(fmt, source, model, datamodule, vocab)`: each method's `checkpoint_formats` (its registry entry).
FORMATS = registry.checkpoint_formats()


def vocab_path_for(dest: Path) -> Path:
    """Where the word vocabulary of a converted checkpoint goes: `<dest stem>.vocab.txt`."""
    return dest.with_name(f"{dest.stem}.vocab.txt")


# ---------------------------------------------------------------------------------- config
def override_flags(settings: dict[str, Any], model_class: type[LMBase]) -> list[str]:
    """`--model.init_args.PATH VALUE` flags (values as JSON: lists, booleans) setting `settings`, given
    by flat knob names (`d_model` → `--model.init_args.network.d_model`)."""
    return [
        arg
        for key, value in settings.items()
        for arg in (
            f"--model.init_args.{model_class.knob_path(key)}",
            json.dumps(value, separators=(",", ":")).strip('"'),
        )
    ]


def check_sizes(
    config: Path, source: Path, theirs: dict[str, Any], ours: dict[str, Any], model_class: type[LMBase]
) -> None:
    """Every setting of the config that differs from the checkpoint's, in one error with the flags
    that fix them all (to give to `convert` and to the evaluation)."""
    wrong = {key: value for key, value in theirs.items() if ours.get(key) != value}
    if wrong:
        differences = ", ".join(f"{key} {ours.get(key)!r} (checkpoint: {wrong[key]!r})" for key in wrong)
        flags = shlex.join(override_flags(wrong, model_class))
        raise ConvertError(
            f"{config} does not describe {source}: model.init_args {differences}; add "
            f"{flags} to this command (convert prints them in its evaluate: line)"
        )


def load_config(
    config: Path,
    overrides: Sequence[str] = (),
    model_class: type[LMBase] | None = None,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[LMBase, LMDataModule]:
    """The model and data module a config describes, built by the project's own CLI parser (so
    defaults, links such as `data.vocab_size` and class paths resolve exactly as in `test`), without
    a trainer, logger or run directory. A config of another model class than `model_class` is
    refused before anything is built, and `check` sees the resolved `model.init_args` first."""
    from longctx.commands.cli import LongCtxCLI

    class ConfigReader(LongCtxCLI):
        def _set_seed(self) -> None:
            """Nothing random is drawn: every weight comes from the checkpoint."""

        def before_instantiate_classes(self) -> None:
            configured = self.config.model.class_path
            if model_class is not None and configured.rsplit(".", 1)[-1] != model_class.__name__:
                raise ConvertError(
                    f"this format converts into {model_class.__name__}, but {config} configures {configured}"
                )
            if check is not None:  # the knob groups' fields under their flat names
                check(model_class.flatten_knobs(self.config.model.init_args.as_dict()))
            self.config.trainer.logger = None
            self.config.trainer.callbacks = None

        def instantiate_classes(self) -> None:
            init = self.parser.instantiate_classes(self.config)
            self.model, self.datamodule = init.model, init.data

    with warnings.catch_warnings():  # about args given while sys.argv holds `convert ...`
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python")
        reader = ConfigReader(args=["--config", str(config), *overrides], run=False)
    return reader.model, reader.datamodule


# ---------------------------------------------------------------------------------- command
def convert(
    fmt: str,
    config: Path,
    source: Path,
    dest: Path,
    vocab: Path | None = None,
    overrides: Sequence[str] = (),
) -> tuple[Converted, Path | None]:
    """Convert `source` (a checkpoint in format `fmt`) into the model of `config`, saved as `dest`.

    Returns the converter's result and the word vocabulary file written next to `dest` (or None).
    The vocabulary is written first: the config is read with `data.vocab_file` pointing at it, so
    the model gets the checkpoint's vocabulary size.
    """
    if fmt not in FORMATS:
        raise ConvertError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    if not source.exists():
        raise ConvertError(f"{source} does not exist")
    converter = importlib.import_module(FORMATS[fmt])
    theirs = converter.architecture(fmt, source)
    symbols = converter.read_vocab(fmt, source, vocab)
    vocab_file = vocab_path_for(dest) if symbols is not None else None
    if vocab_file is not None:
        text = "".join(f"{symbol}\n" for symbol in symbols)
        write_text_atomic(vocab_file, text)
        overrides = [*overrides, "--data.vocab_file", str(vocab_file)]
    try:
        model, datamodule = load_config(
            config,
            overrides,
            converter.MODEL_CLASS,
            check=lambda init_args: check_sizes(
                config, source, theirs, converter.configured(init_args), converter.MODEL_CLASS
            ),
        )
        result = converter.convert(fmt, source, model, datamodule, vocab)
        load_converted(model, result.state_dict, str(source))
    except BaseException:
        if vocab_file is not None:
            vocab_file.unlink(missing_ok=True)
        raise
    origin = {"format": fmt, "source": str(source), "config": str(config)}
    checkpoint = lightning_checkpoint(model, converter.ARCH_KEYS, origin)
    with atomic_path(dest) as tmp:
        torch.save(checkpoint, tmp)
    return result, vocab_file


OWN_OPTIONS = ("--from", "--config", "--vocab")


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(convert's own arguments, the config overrides): every `--key value` or `--key=value` that is
    not one of convert's options is an override, so a value like `[100,400]` or a path is never
    taken for SOURCE or DEST."""
    own: list[str] = []
    overrides: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name = arg.split("=", 1)[0]
        if not arg.startswith("--") or name in OWN_OPTIONS or arg == "--help":
            own.append(arg)
            if arg in OWN_OPTIONS and args:
                own.append(args.pop(0))
        else:
            overrides.append(arg)
            if "=" not in arg and args:
                overrides.append(args.pop(0))
    return own, overrides


def evaluate_command(config: Path, overrides: Sequence[str], dest: Path, vocab_file: Path | None) -> str:
    """The `python -m longctx test` line for the converted checkpoint: the same config and overrides
    (which fixed its sizes) and the vocabulary written next to it."""
    args = ["test", "--config", str(config), *overrides, "--ckpt_path", str(dest)]
    if vocab_file is not None:
        args += ["--data.vocab_file", str(vocab_file)]
    return f"python -m longctx {shlex.join(args)}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineArgumentParser(
        prog="python -m longctx convert",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--from", dest="fmt", required=True, help=f"source format: {', '.join(FORMATS)}")
    parser.add_argument("--config", required=True, type=Path, help="the longctx config of the model")
    parser.add_argument(
        "--vocab",
        type=Path,
        default=None,
        help="vocabulary source: adaptive-span: the authors' prepared data folder (train/valid/test.txt; "
        "default: rebuilt from the config's corpus); transfo-xl: their corpus cache cache.pt (required); "
        "transfo-xl-hf: vocab.pkl (default: SOURCE/vocab.pkl)",
    )
    parser.add_argument("source", type=Path, help="the released checkpoint (file or folder)")
    parser.add_argument("dest", type=Path, help="the longctx checkpoint to write (.ckpt)")
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    with reported_as_one_line(ValueError, OSError, DataError):
        result, vocab_file = convert(args.fmt, args.config, args.source, args.dest, args.vocab, overrides)
    print(f"wrote {args.dest}")
    if vocab_file is not None:
        print(f"wrote {vocab_file} (the checkpoint's word vocabulary)")
    for note in result.notes:
        print(note)
    print(f"evaluate: {evaluate_command(args.config, overrides, args.dest, vocab_file)}")
