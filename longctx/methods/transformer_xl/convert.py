"""Transformer-XL checkpoints into `TransformerXLLM` (`python -m longctx convert --from transfo-xl-hf`
or `--from transfo-xl`).

`transfo-xl-hf`: the Hugging Face layout of `transfo-xl-wt103` (also how TRAMS's models are stored):
a folder with `config.json`, `pytorch_model.bin` (a state dict, read with `weights_only=True`) and
`vocab.pkl` (`pickle.dump(tokenizer.__dict__)`, read with a restricted unpickler that only keeps
`idx2sym`). transformers 5 has no TransfoXL any more, so nothing of it is imported. Differences from
kimiyoung's code (and longctx) handled here:
- the head's cluster logits are in the opposite order (HF tail cluster i reads head column
  shortlist + i - 1, kimiyoung -i): `crit.cluster_weight` / `cluster_bias` rows are reversed;
- tied tensors are stored twice (output words = input embedding; tied projections), and with
  `untie_r: false` the shared u, v also once per layer: each copy is checked to be equal;
- `untie_r: true` (transfo-xl-wt103) stores u, v per layer only: the config needs `untie_r: true`;
- `pos_emb.inv_freq` is derived (checked against 1/10000^(2i/d)).

`transfo-xl`: kimiyoung's PyTorch `train.py` output, `torch.save(model)` of the whole
`MemTransformerLM`. It is read without their code: a restricted unpickler turns each of their
modules (and torch's) into an inert record, the tensors are collected by module path (their
state-dict names) and the sizes are read from the records' attributes. Their vocabulary comes from
the corpus cache their `get_lm_corpus` writes (`cache.pt`, a pickled `data_utils.Corpus`), read
the same way (`--vocab cache.pt`).

Both write the checkpoint's word vocabulary next to DEST (`<DEST stem>.vocab.txt`, one symbol per
line = id order) for `data.vocab_file`, so WikiText tokenizes to the checkpoint's ids. Evaluation
settings stored with the checkpoint (memory length, same_length, clamp_len) are printed next to the
config's, never applied silently: they are the config's choice (see configs/transfo_xl_wt103_hf.yaml).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from longctx.checkpoints.convert import Converted, ConvertError
from longctx.checkpoints.safe_unpickle import Record, load_pickle, load_tensors_file, load_torch_pickle
from longctx.data.datamodule import LMDataModule
from longctx.methods.transformer_xl.module import TransformerXLLM

MODEL_CLASS = TransformerXLLM
ARCH_KEYS = (
    "n_layers",
    "d_model",
    "n_heads",
    "d_head",
    "d_inner",
    "d_embed",
    "pre_lnorm",
    "cutoffs",
    "div_val",
    "tie_weight",
    "tie_projs",
    "untie_r",
)
# Classes a kimiyoung model.pt / cache.pt names: all rebuilt as inert records, never imported.
KIMIYOUNG_CLASSES = {
    "mem_transformer.MemTransformerLM",
    "mem_transformer.AdaptiveEmbedding",
    "mem_transformer.PositionalEmbedding",
    "mem_transformer.PositionwiseFF",
    "mem_transformer.RelPartialLearnableDecoderLayer",
    "mem_transformer.RelPartialLearnableMultiHeadAttn",
    "proj_adaptive_softmax.ProjectedAdaptiveLogSoftmax",
    "torch.nn.modules.activation.ReLU",
    "torch.nn.modules.container.ModuleList",
    "torch.nn.modules.container.ParameterList",
    "torch.nn.modules.container.Sequential",
    "torch.nn.modules.dropout.Dropout",
    "torch.nn.modules.linear.Linear",
    "torch.nn.modules.normalization.LayerNorm",
    "torch.nn.modules.sparse.Embedding",
}
CORPUS_CLASSES = {"data_utils.Corpus", "utils.vocabulary.Vocab"}
# vocab.pkl holds the whole tokenizer: its Moses and Trie helpers become inert records.
HF_VOCAB_CLASSES = {
    "transformers.tokenization_utils.Trie",
    "sacremoses.normalize.MosesPunctNormalizer",
    "sacremoses.tokenize.MosesTokenizer",
    "sacremoses.tokenize.MosesDetokenizer",
    "re._compile",
}

# Their names (kimiyoung's state dict = HF's without `transformer.`) -> ours.
_RENAMES = [
    (re.compile(r"word_emb\.(emb_layers\.\d+\.weight|emb_projs\.\d+)"), r"net.word_emb.\1"),
    (re.compile(r"layers\.(\d+)\.dec_attn\.(qkv_net|o_net|r_net)\.weight"), r"net.layers.\1.attn.\2.weight"),
    (re.compile(r"layers\.(\d+)\.dec_attn\.layer_norm\.(weight|bias)"), r"net.layers.\1.attn.layer_norm.\2"),
    (re.compile(r"layers\.(\d+)\.pos_ff\.CoreNet\.0\.(weight|bias)"), r"net.layers.\1.ff.fc1.\2"),
    (re.compile(r"layers\.(\d+)\.pos_ff\.CoreNet\.3\.(weight|bias)"), r"net.layers.\1.ff.fc2.\2"),
    (re.compile(r"layers\.(\d+)\.pos_ff\.layer_norm\.(weight|bias)"), r"net.layers.\1.ff.layer_norm.\2"),
    (re.compile(r"crit\.(out_layers\.\d+\.(weight|bias)|out_projs\.\d+)"), r"net.crit.\1"),
]
_LAYER_BIAS = re.compile(r"layers\.(\d+)\.dec_attn\.(r_w_bias|r_r_bias)")


# ---------------------------------------------------------------------------------- tensors
def to_longctx(
    theirs: dict[str, Tensor], model: TransformerXLLM, hf_cluster_order: bool, source: str
) -> dict:
    """Their state dict (kimiyoung names) -> ours; HF's cluster rows reversed; u, v per layer or shared.

    Copies of one tensor under several names (HF's tied weights) are checked equal and given once.
    """
    state: dict[str, Tensor] = {}
    layer_bias: dict[str, dict[int, Tensor]] = {"r_w_bias": {}, "r_r_bias": {}}
    for key, tensor in theirs.items():
        if key == "pos_emb.inv_freq":
            d = model.net.config.d_model
            expected = 1.0 / (10000 ** (torch.arange(0.0, d, 2.0) / d))
            if tensor.shape != expected.shape or not torch.allclose(tensor, expected):
                raise ConvertError(f"{source}: pos_emb.inv_freq is not the sinusoid of d_model = {d}")
        elif key in ("crit.cluster_weight", "crit.cluster_bias"):
            # HF: tail cluster i reads head column shortlist + i - 1; kimiyoung and longctx: -i.
            state[f"net.{key}"] = tensor.flip(0) if hf_cluster_order else tensor
        elif key in ("r_w_bias", "r_r_bias"):
            state[f"net.{key}"] = tensor
        elif match := _LAYER_BIAS.fullmatch(key):
            layer_bias[match.group(2)][int(match.group(1))] = tensor
        else:
            for pattern, target in _RENAMES:
                if pattern.fullmatch(key):
                    state[pattern.sub(target, key)] = tensor
                    break
            else:
                raise ConvertError(
                    f"{source}: tensor {key!r} is not part of the Transformer-XL longctx implements"
                )
    for name, per_layer in layer_bias.items():
        if not per_layer:
            continue
        stacked = torch.stack([per_layer[i] for i in sorted(per_layer)])  # (n_layers, H, Dh)
        if f"net.{name}" in state:  # untie_r false: HF also saves the shared pair in every layer
            if not all(torch.equal(t, state[f"net.{name}"]) for t in per_layer.values()):
                raise ConvertError(f"{source}: per-layer {name} differ from the shared one")
        elif model.net.config.untie_r:
            state[f"net.{name}"] = stacked
        else:
            raise ConvertError(
                f"{source}: {name} differs per layer (untie_r), the config shares one pair: set "
                "model.init_args.network.untie_r: true"
            )
    return state


def configured(init_args: dict[str, Any]) -> dict[str, Any]:
    """The architecture a config's `model.init_args` describe, with defaults resolved as the model
    resolves them (d_head = d_model / n_heads, d_embed = d_model), in the keys `architecture` uses."""
    d_model, n_heads = init_args["d_model"], init_args["n_heads"]
    return {
        "n_layers": init_args["n_layers"],
        "d_model": d_model,
        "n_heads": n_heads,
        "d_head": init_args["d_head"] or d_model // n_heads,
        "d_inner": init_args["d_inner"],
        "d_embed": init_args["d_embed"] or d_model,
        "cutoffs": list(init_args["cutoffs"] or []),
        "div_val": init_args["div_val"],
        "pre_lnorm": init_args["pre_lnorm"],
        "untie_r": init_args["untie_r"],
    }


def architecture(fmt: str, source: Path) -> dict[str, Any]:
    """The checkpoint's sizes under the config's names (model.init_args), read before any model is
    built, so every difference from the config is reported at once (`longctx.commands.convert`)."""
    if fmt == "transfo-xl-hf":
        return hf_architecture(read_hf_config(source))
    return kimiyoung_architecture(read_kimiyoung(source))


def hf_architecture(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "n_layers": config["n_layer"],
        "d_model": config["d_model"],
        "n_heads": config["n_head"],
        "d_head": config["d_head"],
        "d_inner": config["d_inner"],
        "d_embed": config["d_embed"],
        "cutoffs": config["cutoffs"],
        "div_val": config["div_val"],
        "pre_lnorm": config["pre_lnorm"],
        "untie_r": config["untie_r"],
    }


def kimiyoung_architecture(root: Record) -> dict[str, Any]:
    attrs, crit = root.state, root.state["_modules"]["crit"].state
    layer0 = attrs["_modules"]["layers"].state["_modules"]["0"].state
    attn0 = layer0["_modules"]["dec_attn"].state
    return {
        "n_layers": attrs["n_layer"],
        "d_model": attrs["d_model"],
        "n_heads": attrs["n_head"],
        "d_head": attrs["d_head"],
        "d_inner": layer0["_modules"]["pos_ff"].state["d_inner"],
        "d_embed": attrs["d_embed"],
        "cutoffs": list(crit["cutoffs"][:-1]),
        "div_val": crit["div_val"],
        "pre_lnorm": attn0["pre_lnorm"],
        "untie_r": False,
    }


def check_architecture(source: str, theirs: dict[str, Any], model: TransformerXLLM) -> None:
    """Refuse a model whose sizes differ from the checkpoint's, naming both (the vocabulary size is
    known only once the data module is built; the rest was compared with the config before)."""
    ours = {"vocab_size": model.vocab_size, **configured(model.flatten_knobs(dict(model.hparams)))}
    for key, value in theirs.items():
        if key in ours and ours[key] != value:
            where = (
                "data.vocab_size (from the corpus or data.vocab_file)"
                if key == "vocab_size"
                else f"model.init_args.{model.knob_path(key)}"
            )
            raise ConvertError(
                f"{source}: the checkpoint has {key} = {value}, the config's {where} = {ours[key]}"
            )


def evaluation_notes(theirs: dict[str, Any], model: TransformerXLLM) -> list[str]:
    """The checkpoint's stored evaluation settings next to the config's."""
    ours = dataclasses.asdict(model.eval_lengths)
    notes = []
    for key, value in theirs.items():
        if value != ours[key]:
            notes.append(
                f"note: the checkpoint was saved with {key} = {value}; the config evaluates with "
                f"model.init_args.evaluation.{key} = {ours[key]} (the config decides)"
            )
    return notes


# ---------------------------------------------------------------------------------- vocabulary
def checked_vocab(symbols: Any, source: str, size: int | None = None) -> list[str]:
    """idx2sym, checked to be writable one symbol per line (and of the checkpoint's size)."""
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        raise ConvertError(f"{source}: idx2sym is not a list of strings")
    if size is not None and len(symbols) != size:
        raise ConvertError(
            f"{source}: the vocabulary has {len(symbols):,} symbols, the checkpoint {size:,} rows"
        )
    bad = [s for s in symbols if not s or any(c.isspace() for c in s)]
    if bad or len(set(symbols)) != len(symbols):
        raise ConvertError(f"{source}: the vocabulary has empty, duplicate or whitespace symbols ({bad[:3]})")
    return symbols


def read_hf_vocab(path: Path, size: int) -> list[str]:
    if not path.is_file():
        raise ConvertError(f"{path} is missing: give the tokenizer's vocab.pkl with --vocab")
    state = load_pickle(path, HF_VOCAB_CLASSES)
    if isinstance(state, int):  # the magic number of a legacy torch.save (the hub's older vocab.pkl)
        state = load_torch_pickle(path, HF_VOCAB_CLASSES)
    if not isinstance(state, dict) or "idx2sym" not in state:
        raise ConvertError(f"{path}: not a TransfoXLTokenizer vocabulary (no idx2sym)")
    if state.get("lower_case"):
        raise ConvertError(f"{path}: a lower-cased vocabulary; longctx's word tokenizer keeps case")
    return checked_vocab(state["idx2sym"], str(path), size)


def read_corpus_vocab(path: Path | None) -> list[str]:
    if path is None:
        raise ConvertError(
            "--vocab is required for transfo-xl: the corpus cache their get_lm_corpus wrote (cache.pt), "
            "which holds the vocabulary the model was trained with"
        )
    corpus = load_torch_pickle(path, CORPUS_CLASSES)
    vocab = corpus.state.get("vocab") if isinstance(corpus, Record) else None
    if not isinstance(vocab, Record) or "idx2sym" not in vocab.state:
        raise ConvertError(f"{path}: not a Transformer-XL corpus cache (data_utils.Corpus with a Vocab)")
    if vocab.state.get("lower_case"):
        raise ConvertError(f"{path}: a lower-cased vocabulary; longctx's word tokenizer keeps case")
    return checked_vocab(vocab.state["idx2sym"], str(path))


# ---------------------------------------------------------------------------------- formats
def read_vocab(fmt: str, source: Path, vocab: Path | None) -> list[str]:
    """The checkpoint's word vocabulary in id order: HF's vocab.pkl, or kimiyoung's corpus cache."""
    if fmt == "transfo-xl":
        return read_corpus_vocab(vocab)
    config = read_hf_config(source)
    return read_hf_vocab(vocab or source / "vocab.pkl", config["vocab_size"])


def read_hf_config(source: Path) -> dict[str, Any]:
    for name in ("config.json", "pytorch_model.bin"):
        if not (source / name).is_file():
            raise ConvertError(f"{source}: no {name}; transfo-xl-hf reads a save_pretrained folder")
    config = json.loads((source / "config.json").read_text())
    if config.get("model_type") != "transfo-xl" or config.get("attn_type", 0) != 0:
        raise ConvertError(
            f"{source}: config.json is not a Transformer-XL with relative attention (attn_type 0)"
        )
    return config


def convert(
    fmt: str, source: Path, model: TransformerXLLM, datamodule: LMDataModule, vocab: Path | None
) -> Converted:
    if datamodule.info.unit != "word":
        raise ConvertError(
            f"Transformer-XL checkpoints here are word-level; the config's corpus is {datamodule.info.name}"
        )
    return convert_hf(source, model) if fmt == "transfo-xl-hf" else convert_kimiyoung(source, model)


def convert_hf(source: Path, model: TransformerXLLM) -> Converted:
    config = read_hf_config(source)
    check_architecture(str(source), {"vocab_size": config["vocab_size"], **hf_architecture(config)}, model)
    theirs = load_tensors_file(source / "pytorch_model.bin")
    theirs = {k.removeprefix("transformer."): v for k, v in theirs.items()}
    state = to_longctx(theirs, model, hf_cluster_order=True, source=str(source))
    clamp = config["clamp_len"]
    notes = evaluation_notes(
        {"mem_len": config["mem_len"], "same_length": config["same_length"], "clamp_len": max(clamp, 0)},
        model,
    )
    return Converted(state_dict=state, notes=notes)


def module_tensors(record: Record, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of a pickled module tree, named as its state_dict would name them."""
    for group in ("_parameters", "_buffers"):
        for name, tensor in (record.state.get(group) or {}).items():
            if tensor is not None:
                yield prefix + name, tensor
    for name, child in (record.state.get("_modules") or {}).items():
        if child is not None:
            yield from module_tensors(child, f"{prefix}{name}.")


def read_kimiyoung(source: Path) -> Record:
    """Their pickled MemTransformerLM as inert records, refused unless it is one this converts."""
    root = load_torch_pickle(source, KIMIYOUNG_CLASSES)
    if not isinstance(root, Record) or root.cls != "mem_transformer.MemTransformerLM":
        raise ConvertError(
            f"{source}: not a pickled MemTransformerLM (torch.save(model) of kimiyoung's train.py)"
        )
    attrs = root.state
    if attrs.get("attn_type", 0) != 0:
        raise ConvertError(
            f"{source}: attn_type {attrs['attn_type']}; only relative attention (0) is supported"
        )
    if attrs.get("sample_softmax", -1) > 0:
        raise ConvertError(f"{source}: a sampled-softmax model; only the adaptive softmax is supported")
    return root


def convert_kimiyoung(source: Path, model: TransformerXLLM) -> Converted:
    root = read_kimiyoung(source)
    attrs = root.state
    check_architecture(str(source), {"vocab_size": attrs["n_token"], **kimiyoung_architecture(root)}, model)
    theirs = dict(module_tensors(root))
    state = to_longctx(theirs, model, hf_cluster_order=False, source=str(source))
    notes = evaluation_notes(
        {
            "mem_len": attrs["mem_len"],
            "same_length": attrs["same_length"],
            "clamp_len": max(attrs["clamp_len"], 0),
        },
        model,
    )
    return Converted(state_dict=state, notes=notes)
