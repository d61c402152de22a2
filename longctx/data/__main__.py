"""`python -m longctx.data prepare CORPUS`: download, verify and tokenize a corpus ahead of a job.

Run it where there is internet (a login node) with the same `--root`/`--cache_dir` the jobs use;
jobs on compute nodes then only memory-map the cache. Prints each split's token count.
"""

from __future__ import annotations

import argparse

from longctx.data.corpora import CORPORA
from longctx.data.datamodule import SPLITS, LMDataModule


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m longctx.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="download, verify and tokenize one corpus")
    prepare.add_argument("corpus", choices=sorted(CORPORA))
    prepare.add_argument("--root", help="raw files (default: $LONGCTX_DATA or ~/.cache/longctx)")
    prepare.add_argument("--cache_dir", help="token cache (default: <root>/cache)")
    prepare.add_argument("--no-download", dest="download", action="store_false", help="never use the network")
    prepare.add_argument("--tokenizer", default="gpt2", help="GPT-2 BPE for BPE corpora: local dir or hub id")
    prepare.add_argument("--max_train_documents", type=int, help="PG-19: first N train books")
    prepare.add_argument("--max_eval_document_tokens", type=int, help="PG-19: first K tokens per eval book")
    args = parser.parse_args(argv)

    data = LMDataModule(
        corpus=args.corpus,
        root=args.root,
        cache_dir=args.cache_dir,
        download=args.download,
        tokenizer=args.tokenizer,
        max_train_documents=args.max_train_documents,
        max_eval_document_tokens=args.max_eval_document_tokens,
    )
    data.prepare_data()
    data.setup()
    print(f"{args.corpus}: vocabulary {data.vocab_size}, cache {data.spec.cache_dir}")
    for split in SPLITS:
        tokens = data.corpus.split(split).tokens
        print(f"  {split:5s} {len(tokens):>14,d} tokens ({tokens.dtype})")


if __name__ == "__main__":
    main()
