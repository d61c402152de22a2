"""facebookresearch/adaptive-span checkpoints into `AdaptiveSpanLM` (`python -m longctx convert
--from adaptive-span`).

Their `utils.save_checkpoint` writes `torch.save({"iter_no", "model", "logger", "optimizer",
"scheduler_iter"})`; `model` is the state dict of the (Distributed)DataParallel-wrapped
`TransformerSeq`, so its keys start with `module.`. Tensors map one to one, except:

- `key_pe` (1, head_dim, S) is our `net.key_pe` (head_dim, S), shared by all layers as theirs;
- `adaptive_span._mask.current_val` (H, 1, 1) is z/S, our `adaptive_mask.z_ratio` (H,);
- `adaptive_span._mask.mask_template` is linspace(1 - S, 0, S), derived (checked, not loaded);
- the embedding and output rows are in their vocabulary's order and are moved to ours.

Their vocabulary is not in the checkpoint: `data.Corpus` builds it from the prepared files
train.txt, valid.txt, test.txt, adding each symbol of `line.split() + ['<eos>']` at its first
appearance. enwik8 (awd-lstm's prep_enwik8.py): every byte as a decimal token, the newline byte as a
line break, hence `<eos>`; text8 (kimiyoung's prep_text8.py): every character, `_` for a space, one
line per split, hence one `<eos>` at the end of each split. We rebuild that order from the
prepared folder (`--vocab DIR`) or from the config's own corpus splits (the same bytes, the same
first appearances). Rows move to longctx's byte ids (enwik8: `<eos>` = byte 10) or text8 ids (`_` =
space). A longctx symbol they never saw gets a zero embedding, a zero output row and bias -1e9: its
probability is exactly 0 in float32 and no other score changes. Their text8 `<eos>` has no longctx
id (longctx's text8 has no line breaks) and is dropped: the softmax then renormalises over the 27
characters, which changes each score by -log(1 - p(<eos>)) (the released model almost never
predicts `<eos>`, seen 3 times in 100M characters). Spans of a checkpoint trained without
`--adapt-span-cache` were not trimmed; all released ones use it, as longctx always does.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from longctx.checkpoints.convert import Converted, ConvertError
from longctx.checkpoints.safe_unpickle import load_tensors_file
from longctx.data.datamodule import LMDataModule
from longctx.data.download import DataError
from longctx.data.tokenize import TEXT8_ALPHABET
from longctx.methods.adaptive_span.module import AdaptiveSpanLM

MODEL_CLASS = AdaptiveSpanLM
# What fixes the tensors' shapes and the cache sizes (the checkpoint does not store R), by flat name
# (fields of the network group, `SpanTransformer.Config`).
ARCH_KEYS = ("d_model", "n_layers", "n_heads", "d_inner", "attn_span", "span_kind", "span_ramp")
EOS = "<eos>"
NEWLINE = 10
SPACE_SYMBOL = "_"  # prep_text8.py writes a space as "_"
UNSEEN_BIAS = -1e9  # exp(-1e9 - max logit) is exactly 0 in float32
SPLIT_FILES = ("train.txt", "valid.txt", "test.txt")

_MASK = re.compile(r"layers\.(\d+)\.attn\.attn\.adaptive_span\._mask\.(current_val|mask_template)")
_LAYER = re.compile(
    r"layers\.\d+\.(attn\.proj_(query|key|val|out)\.weight|(norm1|norm2)\.(weight|bias)"
    r"|ff\.(fc1|fc2)\.(weight|bias))"
)
_DIRECT = {"in_emb.weight", "out_emb.weight", "out_emb.bias", "key_pe"}


# ---------------------------------------------------------------------------------- vocabulary
def vocabulary_from_files(folder: Path) -> list[str]:
    """Their `data.Corpus` dictionary: symbols of `line.split() + ['<eos>']` over train, valid,
    test, in order of first appearance."""
    order: dict[str, None] = {}
    for name in SPLIT_FILES:
        path = folder / name
        if not path.is_file():
            raise ConvertError(
                f"{path} is missing: --vocab must be the authors' prepared data folder with "
                f"{', '.join(SPLIT_FILES)} (their get_data.sh), or leave it out to rebuild the vocabulary "
                "from the config's corpus"
            )
        with open(path, encoding="utf8") as f:
            for line in f:
                order.update(dict.fromkeys(line.split()))
                order.setdefault(EOS)
    return list(order)


def vocabulary_from_ids(splits: list[np.ndarray], unit: str) -> list[str]:
    """The same dictionary from longctx's train/valid/test ids of enwik8 (bytes) or text8.

    enwik8: a newline byte is `<eos>`, and a split not ending in one gets a final `<eos>` (its last
    line); text8: each split is one line, so one `<eos>` after it.
    """
    order: dict[str, None] = {}
    for ids in splits:
        values, first = np.unique(np.asarray(ids), return_index=True)
        for value in values[np.argsort(first)]:
            order.setdefault(_symbol(int(value), unit))
        if unit == "char" or len(ids) == 0 or int(ids[-1]) != NEWLINE:
            order.setdefault(EOS)
    return list(order)


def _symbol(token: int, unit: str) -> str:
    if unit == "byte":
        return EOS if token == NEWLINE else str(token)
    char = chr(TEXT8_ALPHABET[token])
    return SPACE_SYMBOL if char == " " else char


def longctx_id(symbol: str, unit: str) -> int | None:
    """The longctx id of one of their symbols (None: no such symbol in longctx's vocabulary)."""
    if unit == "byte":
        if symbol == EOS:
            return NEWLINE
        if not symbol.isdigit() or int(symbol) > 255:
            raise ConvertError(
                f"symbol {symbol!r} is not a decimal byte: this is not an enwik8-style vocabulary"
            )
        return int(symbol)
    if symbol == EOS:
        return None
    char = " " if symbol == SPACE_SYMBOL else symbol
    index = TEXT8_ALPHABET.find(char.encode())
    if len(char) != 1 or index < 0:
        raise ConvertError(f"symbol {symbol!r} is not a text8 character (space as '_', a-z)")
    return index


def their_vocabulary(datamodule: LMDataModule, vocab: Path | None) -> list[str]:
    if vocab is not None:
        return vocabulary_from_files(vocab)
    try:
        datamodule.prepare_data()
        datamodule.setup("test")
    except DataError as err:
        raise ConvertError(
            f"the vocabulary of an adaptive-span checkpoint is not stored in it: it is rebuilt from the "
            f"corpus it was trained on, and the config's {datamodule.info.name} is not available here "
            f"({err}); give --vocab DIR, the authors' prepared data folder (train.txt, valid.txt, test.txt)"
        ) from err
    corpus = datamodule.corpus
    return vocabulary_from_ids(
        [corpus.split(s).tokens for s in ("train", "valid", "test")], corpus.corpus.unit
    )


# ---------------------------------------------------------------------------------- tensors
def permute_rows(rows: Tensor, targets: list[int | None], size: int, fill: float = 0.0) -> Tensor:
    """(V_theirs, ...) -> (size, ...): their row i at targets[i] (dropped when None), `fill` elsewhere."""
    out = rows.new_full((size, *rows.shape[1:]), fill)
    kept = [i for i, t in enumerate(targets) if t is not None]
    out[[targets[i] for i in kept]] = rows[kept]
    return out


def strip_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop the (Distributed)DataParallel `module.` prefix."""
    if state and all(k.startswith("module.") for k in state):
        return {k[len("module.") :]: v for k, v in state.items()}
    return state


def read_checkpoint(source: Path) -> dict[str, Tensor]:
    """Their model's state dict (without `module.`), refused unless the file is their checkpoint."""
    checkpoint = load_tensors_file(source, mmap=True)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
        raise ConvertError(
            f"{source}: not an adaptive-span checkpoint (theirs is a dict whose 'model' entry is the "
            "state dict, as their utils.save_checkpoint writes)"
        )
    return strip_prefix(checkpoint["model"])


def configured(init_args: dict) -> dict:
    """The config's settings that `architecture` reads from a checkpoint (`init_args` by flat name)."""
    keys = ("d_model", "n_layers", "n_heads", "d_inner", "attn_span", "span_kind")
    return {key: init_args[key] for key in keys}


def architecture(fmt: str, source: Path) -> dict:
    """The checkpoint's sizes under the config's flat names, from its tensors' shapes; span_ramp is
    not stored in their checkpoints (see the note `convert` prints)."""
    theirs = read_checkpoint(source)
    layers = {int(match.group(1)) for key in theirs if (match := _MASK.fullmatch(key))}
    z = theirs.get("layers.0.attn.attn.adaptive_span._mask.current_val")
    fc1 = theirs.get("layers.0.ff.fc1.weight")
    if z is None or fc1 is None or "in_emb.weight" not in theirs or "key_pe" not in theirs:
        raise ConvertError(
            f"{source}: no adaptive spans, key_pe or first feed-forward layer: not a checkpoint of "
            "adaptive-span's model with --adapt-span"
        )
    return {
        "d_model": theirs["in_emb.weight"].shape[1],
        "n_layers": len(layers),
        "n_heads": z.shape[0],
        "d_inner": fc1.shape[0],
        "attn_span": theirs["key_pe"].shape[-1],
        "span_kind": "adaptive",
    }


def read_vocab(fmt: str, source: Path, vocab: Path | None) -> None:
    """No word vocabulary: rows move onto longctx's fixed byte/char ids (see `convert`)."""
    return None


def convert(
    fmt: str, source: Path, model: AdaptiveSpanLM, datamodule: LMDataModule, vocab: Path | None
) -> Converted:
    theirs = read_checkpoint(source)
    unit = datamodule.info.unit
    if unit not in ("byte", "char"):
        raise ConvertError(
            f"adaptive-span checkpoints are byte (enwik8) or character (text8) models; the config's corpus "
            f"{datamodule.info.name} is {unit}-level"
        )
    network = model.net.config
    if network.span_kind != "adaptive":
        raise ConvertError(
            "the checkpoint has adaptive spans; the config has model.init_args.network.span_kind: "
            f"{network.span_kind}"
        )
    unknown = [k for k in theirs if k not in _DIRECT and not _MASK.fullmatch(k) and not _LAYER.fullmatch(k)]
    if unknown:
        raise ConvertError(
            f"{source}: tensors {unknown[:5]} are not part of the adaptive-span model longctx implements "
            "(adaptive input/output and persistent memory are not supported)"
        )
    symbols = their_vocabulary(datamodule, vocab)
    n_rows = theirs["in_emb.weight"].shape[0]
    if len(symbols) != n_rows:
        raise ConvertError(
            f"the rebuilt vocabulary has {len(symbols)} symbols, the checkpoint's embedding {n_rows} rows: "
            "the vocabulary source is not the data this model was trained on"
        )
    targets = [longctx_id(s, unit) for s in symbols]
    V = model.vocab_size
    S = network.attn_span
    state: dict[str, Tensor] = {
        "net.in_emb.weight": permute_rows(theirs["in_emb.weight"], targets, V),
        "net.out_emb.weight": permute_rows(theirs["out_emb.weight"], targets, V),
        "net.out_emb.bias": permute_rows(theirs["out_emb.bias"], targets, V, fill=UNSEEN_BIAS),
        "net.key_pe": theirs["key_pe"].squeeze(0),  # (1, Dh, S) -> (Dh, S)
    }
    for key, tensor in theirs.items():
        if match := _MASK.fullmatch(key):
            layer, name = match.groups()
            if name == "current_val":  # z/S (H, 1, 1)
                state[f"net.layers.{layer}.attn.adaptive_mask.z_ratio"] = tensor.reshape(-1)
            elif tensor.shape != (S,) or not torch.equal(tensor, torch.linspace(1 - S, 0, S)):
                raise ConvertError(
                    f"{source}: {key} is not linspace(1 - S, 0, S) for the config's attn_span S = {S} "
                    f"(its length is {tensor.shape[0]}): set model.init_args.network.attn_span to the "
                    "checkpoint's"
                )
        elif _LAYER.fullmatch(key):
            state[f"net.{key}"] = tensor
    notes = [
        f"vocabulary: {len(symbols)} symbols of theirs onto {V} longctx ids",
        "note: span_ramp is not stored in adaptive-span checkpoints: the config's "
        f"model.init_args.network.span_ramp = {network.span_ramp} must be the --adapt-span-ramp the model "
        "was trained with (theirs defaults to 32)",
    ]
    unseen = V - sum(t is not None for t in targets)
    if unseen:
        notes.append(
            f"{unseen} longctx symbols never seen by the model get probability 0 (as in their code): a "
            "text holding any of them scores about 1e9 nats for each; evaluate on its training corpus"
        )
    if None in targets:
        dropped = [s for s, t in zip(symbols, targets) if t is None]
        notes.append(
            f"dropped their symbols {dropped} (no longctx id): the softmax renormalises without them"
        )
    return Converted(state_dict=state, notes=notes)
