"""Write the GPT-2 of a `RecurrentGPT2LM` checkpoint as a Hugging Face directory.

    python -m longctx.methods.recurrence.export CKPT OUT_DIR [--tokenizer DIR]

The directory loads with `from_pretrained`, e.g. as `model.init_args.pretrained` of a recurrent model:
the recipe to make a small "pretrained" GPT-2 offline and add recurrence to it (README, "Recurrence on
your own small GPT-2"). The recurrence's own weights (layer weights, FFN) are not part of it.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from longctx.atomic import atomic_path, created_dirs, umask_mode
from longctx.errors import OneLineArgumentParser, reported_as_one_line
from longctx.methods.recurrence.module import HF_CONFIG_KEY
from longctx.methods.recurrence.network import RECURRENCE_IMPLEMENTATIONS
from longctx.safe_unpickle import load_tensors_file


def save_lm(lm: PreTrainedModel, out_dir: str | Path) -> Path:
    """`save_pretrained` with the stock attention named in the config (loaders choose their own).

    The files are written into a temporary folder, given the umask's mode (safetensors writes its
    weights 0600, which teammates cannot read) and moved into `out_dir`: a failed save leaves neither
    a partial model nor a new folder.
    """
    out = Path(out_dir)
    with created_dirs(out):
        staging = Path(tempfile.mkdtemp(dir=out, prefix=".export-"))
        try:
            lm.set_attn_implementation("sdpa")
            try:
                lm.save_pretrained(staging)
            finally:
                lm.set_attn_implementation(RECURRENCE_IMPLEMENTATIONS["sdpa"])
            for file in sorted(staging.iterdir()):
                os.chmod(file, umask_mode())
                os.replace(file, out / file.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


def lm_from_checkpoint(ckpt_path: str | Path) -> PreTrainedModel:
    """The causal LM of a `RecurrentGPT2LM` Lightning checkpoint (no hub access needed): its config is
    the one `RecurrentGPT2LM.on_save_checkpoint` stored under `HF_CONFIG_KEY`."""
    ckpt = load_tensors_file(ckpt_path)
    if not isinstance(ckpt, dict) or HF_CONFIG_KEY not in ckpt:
        saved = ckpt.get("hyper_parameters", {}).get("_class_path") if isinstance(ckpt, dict) else None
        holds = f" (it holds a {saved})" if saved else ""
        raise ValueError(
            f"{ckpt_path} is not a RecurrentGPT2LM checkpoint{holds}: export writes the GPT-2 of a "
            "RecurrentGPT2LM run (e.g. runs/<run>/checkpoints/last.ckpt of a gpt2_window or "
            "recurrent_gpt2 config)"
        )
    fields = dict(ckpt[HF_CONFIG_KEY])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    lm = AutoModelForCausalLM.from_config(config)
    state = {k.removeprefix("lm."): v for k, v in ckpt["state_dict"].items() if k.startswith("lm.")}
    missing, unexpected = lm.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", True) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint does not match the LM: missing {missing}, unexpected {unexpected}")
    lm.tie_weights()
    return lm


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
