"""Write the GPT-2 of a `RecurrentGPT2LM` checkpoint as a Hugging Face directory.

    python -m longctx.methods.recurrence.export CKPT OUT_DIR [--tokenizer DIR]

The directory loads with `from_pretrained`, e.g. as `model.init_args.pretrained` of a recurrent model:
the recipe to make a small "pretrained" GPT-2 offline and add recurrence to it (docs/training.md, "The
methods on a CPU, on real text"). The recurrence's own weights (layer weights, FFN) are not part of
it. Loading and saving are `hf.py`'s (`lm_from_checkpoint`, `save_lm`); this is their command line.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from longctx.methods.recurrence.hf import lm_from_checkpoint, save_lm
from longctx.runtime.atomic import atomic_path
from longctx.runtime.errors import OneLineArgumentParser, reported_as_one_line

__all__ = ["copy_tokenizer", "lm_from_checkpoint", "main", "save_lm"]


def copy_tokenizer(src: str | Path, out_dir: str | Path) -> None:
    """Copy GPT-2 BPE files into an HF directory as vocab.json/merges.txt; the source may hold those or
    OpenAI's encoder.json/vocab.bpe, gzip'd or not (as in ../shared/data/gpt2)."""
    src, out = Path(src), Path(out_dir)
    for names, target in (
        (("vocab.json", "encoder.json"), "vocab.json"),
        (("merges.txt", "vocab.bpe"), "merges.txt"),
    ):
        candidates = [(src / n, open) for n in names] + [(src / f"{n}.gz", gzip.open) for n in names]
        found = [(path, opener) for path, opener in candidates if path.is_file()]
        if not found:
            raise FileNotFoundError(f"no {' or '.join(names)} (or .gz) in {src}")
        path, opener = found[0]
        with opener(path, "rb") as f_in, atomic_path(out / target) as tmp, open(tmp, "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineArgumentParser(
        prog="python -m longctx.methods.recurrence.export",
        description="Write a RecurrentGPT2LM checkpoint's GPT-2 as a Hugging Face directory.",
    )
    parser.add_argument("ckpt", help="a RecurrentGPT2LM Lightning checkpoint (e.g. a trained baseline)")
    parser.add_argument("out_dir", help="output directory (usable as model.init_args.pretrained)")
    parser.add_argument("--tokenizer", help="directory with the GPT-2 BPE files to copy alongside")
    args = parser.parse_args(argv)
    with reported_as_one_line(ValueError, OSError):  # not its checkpoint, unreadable, unwritable
        out = save_lm(lm_from_checkpoint(args.ckpt), args.out_dir)
        if args.tokenizer:
            copy_tokenizer(args.tokenizer, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
