"""Tokenization throughput (MB/s of raw text) of every path of `longctx.data.tokenize`.

    python benchmarks/tokenization.py [--shared ../shared/data] [--mb 100]

bytes/text8 run on synthetic data of `--mb` MB (the enwik8/text8 path is one numpy operation);
words and GPT-2 BPE on the real WikiText pieces of `../shared/data`. Ratios are against the
byte path measured in the same run.
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from longctx.data.tokenize import (
    WordVocab,
    encode_bpe,
    encode_bytes,
    encode_text8,
    gpt2_tokenizer_from_files,
)


def rate(fn: Callable[[], object], n_bytes: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n_bytes / best / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    text8 = rng.choice(np.frombuffer(b" abcdefghijklmnopqrstuvwxyz", np.uint8), args.mb * 10**6).tobytes()
    results = {
        "bytes (enwik8, with a copy)": rate(lambda: encode_bytes(text8).copy(), len(text8)),
        "text8 chars": rate(lambda: encode_text8(text8), len(text8)),
    }
    valid = args.shared / "wikitext-103" / "wiki.valid.tokens.gz"
    raw_valid = gzip.decompress(valid.read_bytes())
    with tempfile.TemporaryDirectory() as folder:  # the word path reads a plain file
        plain = Path(folder) / "wiki.valid.tokens"
        plain.write_bytes(raw_valid)
        vocab = WordVocab.build([plain])
        results["words (WikiText-103 valid, vocab build)"] = rate(
            lambda: WordVocab.build([plain]), len(raw_valid), 1
        )
        results["words (WikiText-103 valid, encode)"] = rate(lambda: vocab.encode_file(plain), len(raw_valid))
    gpt2 = gpt2_tokenizer_from_files(
        args.shared / "gpt2" / "encoder.json.gz", args.shared / "gpt2" / "vocab.bpe.gz"
    )
    raw = gzip.decompress((args.shared / "wikitext-raw" / "wiki.test.raw.gz").read_bytes())
    text = raw.decode()
    results["GPT-2 BPE (WikiText raw test)"] = rate(lambda: encode_bpe(gpt2, text), len(raw))
    base = results["bytes (enwik8, with a copy)"]
    print(f"{'path':45s} {'MB/s':>10s} {'vs bytes':>10s}")
    for name, value in results.items():
        print(f"{name:45s} {value:10.1f} {value / base:10.4f}")


if __name__ == "__main__":
    main()
