"""All of longctx's surface on Hugging Face `transformers`, in one place.

The recurrence runs inside a Hugging Face GPT-2; what longctx needs from `transformers` is here, so a
new transformers version is checked against one file:
- building the causal LM (`build_lm`: a hub id, a local directory, a `.ckpt` or `GPT2Config` fields),
  loading it from a Lightning checkpoint (`lm_from_checkpoint`), saving it (`save_lm`);
- registering the recurrence attention (`register_recurrence_attention`): explicit and idempotent,
  never at import time (importing a longctx module changes no registry of transformers);
- pickling (ddp_spawn): dropping transformers' unpicklable output-capturing hooks
  (`drop_output_capturing_hooks`) and repairing its private `_CAN_RECORD_REGISTRY` in the process that
  unpickles (`restore_after_unpickling`).

The attention functions themselves (`network.with_slot`) are plain torch; this module wraps the stock
ones with them. Dependencies point one way: `module.py` and `export.py` import this module, which
imports `network.py`; nothing here imports them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from torch import nn
from transformers import (
    AttentionInterface,
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask
from transformers.models.gpt2.modeling_gpt2 import eager_attention_forward
from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

from longctx.checkpoints.safe_unpickle import load_tensors_file
from longctx.methods.recurrence.network import (
    RECURRENCE_EAGER,
    RECURRENCE_IMPLEMENTATIONS,
    RECURRENCE_SDPA,
    with_slot,
)
from longctx.runtime.atomic import created_dirs, umask_mode

HF_CONFIG_KEY = "hf_config"  # where `RecurrentGPT2LM.on_save_checkpoint` stores the LM's config


# ---------------------------------------------------------------------------------------- attention
def register_recurrence_attention() -> None:
    """Register `recurrence_sdpa` / `recurrence_eager` (attention and mask functions) in transformers'
    global tables. Idempotent: a second call registers the same functions again under the same names.
    Called by everything here that hands out a model running them; call it yourself before
    `lm.set_attn_implementation(RECURRENCE_SDPA)` on a model you built."""
    AttentionInterface.register(RECURRENCE_SDPA, with_slot(sdpa_attention_forward))
    AttentionInterface.register(RECURRENCE_EAGER, with_slot(eager_attention_forward))
    ALL_MASK_ATTENTION_FUNCTIONS.register(RECURRENCE_SDPA, sdpa_mask)
    ALL_MASK_ATTENTION_FUNCTIONS.register(RECURRENCE_EAGER, eager_mask)


# ---------------------------------------------------------------------------------------- building
def build_lm(
    pretrained: str | None,
    gpt2_config: dict[str, Any] | None,
    vocab_size: int,
    attn_implementation: Literal["sdpa", "eager"] = "sdpa",
) -> PreTrainedModel:
    """The causal LM, running the recurrence attention implementation (which is the stock attention
    whenever no slot is passed, so the baseline runs it too)."""
    if (pretrained is None) == (gpt2_config is None):
        raise ValueError(
            "give exactly one of `pretrained` (hub id, directory or .ckpt) and `gpt2_config` (a dict)"
        )
    register_recurrence_attention()
    impl = RECURRENCE_IMPLEMENTATIONS[attn_implementation]
    if pretrained is not None:
        if pretrained.endswith(".ckpt"):
            # A RecurrentGPT2LM Lightning checkpoint (e.g. a windowed GPT-2 fit on the line before in a
            # sweep): its LM, with no export step.
            lm = lm_from_checkpoint(pretrained)
            lm.set_attn_implementation(impl)
        else:
            lm = AutoModelForCausalLM.from_pretrained(pretrained, attn_implementation=impl)
        lm.train()  # from_pretrained returns eval mode, which Lightning keeps at fit: dropout would be off
        if lm.config.vocab_size < vocab_size:
            raise ValueError(
                f"the pretrained model {pretrained!r} has {lm.config.vocab_size} tokens, fewer than the "
                f"data's vocabulary ({vocab_size}); use the model's tokenizer for the data"
            )
    else:
        fields = {"bos_token_id": None, "eos_token_id": None, **gpt2_config, "vocab_size": vocab_size}
        config = GPT2Config(**fields)
        check_gpt2_sizes(config)
        lm = GPT2LMHeadModel(config)
        lm.set_attn_implementation(impl)
    if attn_implementation == "eager" and getattr(lm.config, "reorder_and_upcast_attn", False):
        # GPT-2 runs its own upcast attention only when the implementation is literally "eager".
        raise ValueError("reorder_and_upcast_attn is not supported with the recurrence; use sdpa")
    return lm


def check_gpt2_sizes(config: GPT2Config) -> None:
    """One line for a size `GPT2Config` takes but its modules cannot build or run (a zero or negative
    size, a width its heads do not divide): transformers would fail later with a division by zero."""
    for name in ("n_embd", "n_head", "n_layer", "n_positions"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"gpt2_config.{name} must be at least 1, got {value}")
    if config.n_embd % config.n_head:
        raise ValueError(
            f"gpt2_config.n_embd ({config.n_embd}) must be divisible by gpt2_config.n_head ({config.n_head})"
        )


# ---------------------------------------------------------------------------------------- load / save
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
                register_recurrence_attention()
                lm.set_attn_implementation(RECURRENCE_IMPLEMENTATIONS["sdpa"])
            for file in sorted(staging.iterdir()):
                os.chmod(file, umask_mode())
                os.replace(file, out / file.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------- pickling
def drop_output_capturing_hooks(lm: nn.Module) -> None:
    """transformers 5 records `hidden_states` with forward hooks that are local closures, installed on
    the first forward: unpicklable. Drop them (the next forward installs them again)."""
    for module in lm.modules():
        for key, hook in list(module._forward_hooks.items()):
            if getattr(hook, "__name__", "") == "output_capturing_hook":
                del module._forward_hooks[key]
        if getattr(module, "_output_capturing_hooks_installed", False):
            module._output_capturing_hooks_installed = False


def restore_after_unpickling(lm: nn.Module) -> None:
    """Make an unpickled LM run in this process (a spawned process has built no model of its classes
    and imported nothing that registers): register the recurrence attention, and register what each
    model can record in transformers' private registry (filled by `PreTrainedModel.__init__`, which
    unpickling skips; keyed on the model since transformers 5.23)."""
    register_recurrence_attention()
    for module in lm.modules():
        if isinstance(module, PreTrainedModel):
            _CAN_RECORD_REGISTRY[module] = module._can_record_outputs
