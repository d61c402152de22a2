"""`python -m longctx.data prepare`: download, verify and tokenize a corpus ahead of a job.

    python -m longctx.data prepare --config configs/transformer_xl_tiny.yaml   # what a config reads
    python -m longctx.data prepare wikitext103 --root /data/longctx            # one corpus

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

import warnings
from typing import Any

from longctx.data.corpora import CORPORA
from longctx.data.datamodule import SPLITS, LMDataModule
from longctx.data.download import DataError
from longctx.errors import OneLineArgumentParser, reported_as_one_line

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
)


def config_data(configs: list[str]) -> dict[str, Any]:
    """The `data:` settings a run with these configs uses, resolved by longctx's own CLI parser
    (nested `config:` files and dotted keys included); nothing is instantiated."""
    from longctx.cli import LongCtxCLI

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
        "--tokenizer", help="raw-text corpora: gpt2 (default), a BPE folder or hub id, bytes"
    )
    prepare.add_argument("--max_train_documents", type=int, help="PG-19: first N train books")
    prepare.add_argument("--max_eval_document_tokens", type=int, help="PG-19: first K tokens per eval book")
    args = parser.parse_args(argv)
    if args.corpus is None and not args.config:
        prepare.error("name a corpus or give --config")

    # A config the parser refuses (ParseError), bad settings, missing or corrupt corpus files: one line.
    with reported_as_one_line(ValueError, DataError):
        settings = config_data(args.config) if args.config else {}
        settings = {key: value for key, value in settings.items() if key in CACHE_OPTIONS}
        settings = {key: value for key, value in settings.items() if value is not None}
        flags = {key: getattr(args, key) for key in CACHE_OPTIONS if getattr(args, key, None) is not None}
        data = LMDataModule(**{**settings, **flags, "download": args.download})
        data.prepare_data()
        data.setup()
    print(f"{data.spec.name}: vocabulary {data.vocab_size}, cache {data.corpus.path}")
    for split in SPLITS:
        tokens = data.corpus.split(split).tokens
        print(f"  {split:5s} {len(tokens):>14,d} tokens ({tokens.dtype})")


if __name__ == "__main__":
    main()
