"""`python -m longctx.data prepare`: download, verify and tokenize a corpus ahead of a job;
`python -m longctx.data synth`: write a synthetic long-range task (`longctx.data.synth`, `.mqar`).

    python -m longctx.data prepare --config configs/transformer_xl_tiny.yaml   # what a config reads
    python -m longctx.data prepare wikitext103 --root /data/longctx            # one corpus
    python -m longctx.data prepare text_files --files '{train: a.txt, valid: b.txt, test: b.txt}'
    python -m longctx.data synth copy --out data/copy --gap 160                # docs/long_range.md
    python -m longctx.data synth mqar --out data/mqar --min_distance 32 --max_distance 128

With `--config` (repeatable, composed as `python -m longctx fit` composes them) the corpus, root,
split sources and tokenizer are the config's own `data:` settings, resolved by the CLI's parser, so
the cache it writes is the one the run reads; the other flags override them. Downloads are on unless
`--no-download` (a config's `data.download: false` is for the jobs, not for this command). Run it
where there is internet (a login node); jobs on compute nodes then only memory-map the cache.
Prints each split's token count. The token cache goes to `--cache_dir` (else the config's
`data.cache_dir`, else `$LONGCTX_CACHE`, else the user's cache folder), never into the data root; a
failure (a missing file, no network, a data root that does not exist) is one line and leaves nothing
behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

from longctx.data import mqar, synth
from longctx.data.corpora import CORPORA
from longctx.data.datamodule import SPLITS, LMDataModule
from longctx.data.download import DataError
from longctx.runtime.errors import OneLineArgumentParser, reported_as_one_line

# The options that decide which files are read and which ids come out; the rest of a config's `data:`
# (batch sizes, lengths, modes) does not change the cache.
CACHE_OPTIONS = (
    "corpus",
    "root",
    "cache_dir",
    "split_sources",
    "tokenizer",
    "max_train_documents",
    "max_eval_document_tokens",
    "mirror",
    "vocab_file",
    "files",
)
# The batch shape a config reads: `text_files` checks that each file fills one batch of it (without a
# config, one token of one row: any non-empty file).
BATCH_OPTIONS = ("batch_size", "tgt_len", "eval_batch_size", "eval_tgt_len")


def config_data(configs: list[str]) -> dict[str, Any]:
    """The `data:` settings a run with these configs uses, resolved by longctx's own CLI parser
    (nested `config:` files and dotted keys included); nothing is instantiated."""
    from longctx.commands.cli import LongCtxCLI

    class ParseOnly(LongCtxCLI):
        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

        def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
            pass

    args = [arg for config in configs for arg in ("--config", config)]
    with warnings.catch_warnings():  # about args given while sys.argv holds `prepare ...`
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python")
        cli = ParseOnly(args=args, run=False, parser_kwargs={"parser_mode": "yaml"})
    return cli.config.data.as_dict()


def main(argv: list[str] | None = None) -> None:
    parser = OneLineArgumentParser(prog="python -m longctx.data", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="download, verify and tokenize one corpus")
    prepare.add_argument(
        "corpus", nargs="?", choices=sorted(CORPORA), help="the corpus (or take it from --config)"
    )
    prepare.add_argument("--config", action="append", default=[], help="a run config: prepare what it reads")
    prepare.add_argument(
        "--root", help="raw files (default: the config's, else $LONGCTX_DATA or ~/.cache/longctx)"
    )
    prepare.add_argument(
        "--cache_dir",
        help="token caches (default: the config's, else $LONGCTX_CACHE or ~/.cache/longctx/tokens)",
    )
    prepare.add_argument("--no-download", dest="download", action="store_false", help="never use the network")
    prepare.add_argument(
        "--tokenizer",
        help="raw-text corpora: gpt2 (default), a BPE folder or hub id, bytes; text_files also words",
    )
    prepare.add_argument("--max_train_documents", type=int, help="PG-19: first N train books")
    prepare.add_argument("--max_eval_document_tokens", type=int, help="PG-19: first K tokens per eval book")
    prepare.add_argument(
        "--files", type=yaml.safe_load, help="text_files: '{train: a.txt, valid: b.txt, test: b.txt}'"
    )
    add_synth_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "synth":
        run_synth(args)
        return
    if args.corpus is None and not args.config:
        prepare.error("name a corpus or give --config")

    # A config the parser refuses (ParseError), bad settings, missing or corrupt corpus files: one line.
    with reported_as_one_line(ValueError, DataError):
        settings = config_data(args.config) if args.config else {"batch_size": 1, "tgt_len": 1}
        options = CACHE_OPTIONS + BATCH_OPTIONS
        settings = {key: value for key, value in settings.items() if key in options and value is not None}
        flags = {key: getattr(args, key) for key in CACHE_OPTIONS if getattr(args, key, None) is not None}
        data = LMDataModule(**{**settings, **flags, "download": args.download})
        data.prepare_data()
        data.setup()
    print(f"{data.spec.name}: vocabulary {data.vocab_size}, cache {data.corpus.path}")
    for split in SPLITS:
        tokens = data.corpus.split(split).tokens
        print(f"  {split:5s} {len(tokens):>14,d} tokens ({tokens.dtype})")


def add_synth_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "synth", help="write a synthetic long-range task: train/valid/test text + marks of its answers"
    )
    tasks = parser.add_subparsers(dest="task", required=True)
    for task, what in (("copy", "a passage repeated"), ("recall", "key -> value bindings queried")):
        add_byte_task_flags(tasks.add_parser(task, help=f"{what}, in words read at byte level"))
    add_mqar_flags(
        tasks.add_parser("mqar", help="multi-query associative recall, one token per key and value (words)")
    )


def add_byte_task_flags(parser: argparse.ArgumentParser) -> None:
    defaults = synth.SynthSettings("copy")
    parser.add_argument("--out", required=True, type=Path, help="folder for the files (created)")
    parser.add_argument(
        "--gap", type=int, default=defaults.gap, help="G: marked bytes are >= G bytes from their source"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--train_bytes", type=int, default=defaults.train_bytes, help="size of train")
    parser.add_argument("--eval_bytes", type=int, default=defaults.eval_bytes, help="size of valid and test")
    parser.add_argument("--passage_words", type=int, default=defaults.passage_words, help="copy: words")
    parser.add_argument("--pairs", type=int, default=defaults.pairs, help="recall: keys per episode")
    parser.add_argument(
        "--passage_vocab",
        type=int,
        default=defaults.passage_vocab,
        help="copy: draw passages from N words with distinct first letters (default: all words)",
    )
    parser.add_argument(
        "--recalls", type=int, default=defaults.recalls, help="copy: recall the passage K times, G apart"
    )
    parser.add_argument(
        "--no_near_repeat",
        dest="near_repeat",
        action="store_false",
        help="no immediate repeat/query (the short-range copy a tiny model learns first)",
    )


def optional_int(text: str) -> int | None:
    """An integer, or none/null (no value: e.g. no distance range under the zoology law)."""
    return None if text.lower() in ("none", "null") else int(text)


def add_mqar_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag defaults to None: the preset's value, else `MQARSettings`'s (printed in --help)."""
    defaults = mqar.MQARSettings()
    parser.add_argument("--out", required=True, type=Path, help="folder for the files (created)")
    parser.add_argument(
        "--preset", choices=sorted(mqar.PRESETS), help="zoology: vocabulary 8192, 64-token episodes, K 4"
    )
    for name, kind, help_text in (
        ("pairs", int, "K: key/value bindings (and queries) per episode"),
        ("keys", int, "key words k0 .. k{N-1}"),
        ("values", int, "value words v0 .. v{N-1}"),
        ("filler_vocab", int, "filler words f0 .. f{N-1} (--filler separate)"),
        ("min_distance", optional_int, "least distance (tokens) from a binding's value to its answer"),
        ("max_distance", optional_int, "largest such distance"),
        ("episode_tokens", optional_int, "fixed episode length (zoology law; else: ends at its last query)"),
        ("power_a", float, "the zoology law's exponent"),
        (
            "train_tokens",
            int,
            "size of train in tokens: >= max_steps x batch_size x tgt_len (fresh episodes)",
        ),
        ("eval_tokens", int, "size of valid and test each, in tokens"),
        ("seed", int, "splits are seeded by (seed, split)"),
    ):
        parser.add_argument(f"--{name}", type=kind, help=f"{help_text} (default {getattr(defaults, name)})")
    parser.add_argument(
        "--filler",
        choices=["separate", "random"],
        help="separate filler words, or zoology's random keys and values",
    )
    parser.add_argument(
        "--gap_law",
        choices=["uniform", "zoology"],
        help="uniform distances in the range, or zoology's power law",
    )


def run_synth(args: argparse.Namespace) -> None:
    try:
        if args.task == "mqar":
            settings = mqar.settings_from_flags(vars(args), args.preset)
            counts = mqar.generate(settings, args.out)
        else:
            names = [field.name for field in dataclasses.fields(synth.SynthSettings)]  # each is a flag
            settings = synth.SynthSettings(**{name: getattr(args, name) for name in names})
            counts = synth.generate(settings, args.out)
    except (ValueError, OSError) as err:
        sys.exit(f"error: synth: {err}")
    for split, count in counts.items():
        path = args.out / f"{split}.txt"
        if args.task == "mqar":
            print(
                f"{path}: {count['tokens']:,} tokens, {count['episodes']:,} episodes, {count['answers']:,} "
                f"answers {count['min_distance']}-{count['max_distance']} tokens after their binding"
            )
        else:
            print(
                f"{path}: {count['bytes']:,} bytes, {count['marked']:,} marked (>= {settings.gap} back), "
                f"{count['near']:,} answer bytes nearer"
            )
    files = ", ".join(f"{split}: {args.out / f'{split}.txt'}" for split in SPLITS)
    tokenizer = "words" if args.task == "mqar" else "bytes"
    print(f"train on it: --data.corpus text_files --data.files '{{{files}}}' --data.tokenizer {tokenizer}")
