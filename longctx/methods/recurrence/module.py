"""`RecurrentGPT2LM`: recurrence for a pretrained GPT-2 (Yoshida, Ettinger, Gimpel 2020) on `LMBase`.

One module for both rows of the paper's comparison:
- `recurrence: true`: window i's hidden states are pooled (eq. 1) and mapped by a small FFN to h_prev,
  which window i+1 reads at layer ℓ_ins as one extra key/value (`network.py`); training
  backpropagates through the K windows of a batch, with gradient checkpointing per window (§3.2);
- `recurrence: false`: the windowed baseline, the same pretrained model on the same windows.

Batches are window mode (docs/architecture.md): input/target/mask (B, K, T), reset (B, K). The memory
carried from one batch to the next is `RecurrenceMemory(h_prev)`, h_prev (B, d) of each row's last
window (None at the start, and always for the baseline);
a row whose `reset` is set at window k starts a new document there and drops its h_prev.

The language model is a Hugging Face causal LM: `pretrained` (a hub id such as "gpt2" or a local
directory written by `save_pretrained`), or `gpt2_config`, a dict of `GPT2Config` fields for a small
randomly initialised GPT-2 (no weights can be downloaded on the test machines).

Make your own small "pretrained" GPT-2 and add recurrence to it (the full recipe offline):

    python -m longctx fit --config configs/gpt2_window_tiny.yaml            # baseline from scratch
    python -m longctx.methods.recurrence.export runs/<run>/checkpoints/last.ckpt runs/gpt2_tiny_hf \
        --tokenizer ../shared/data/gpt2
    python -m longctx fit --config configs/recurrent_gpt2_tiny.yaml \
        --model.init_args.pretrained runs/gpt2_tiny_hf --model.init_args.gpt2_config null

The paper's symbols and where each lives in this folder: the package docstring (`__init__.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from longctx.core.base import LMBase, StepOutput
from longctx.core.run_settings import eval_window, first_set
from longctx.data.streams import sample_start
from longctx.diagnostics.axes import Variant
from longctx.diagnostics.footprint import feed_forward_elements, window_elements
from longctx.methods.recurrence.flops import hf_model_flops_per_scored_token
from longctx.methods.recurrence.hf import (
    HF_CONFIG_KEY,
    build_lm,
    drop_output_capturing_hooks,
    restore_after_unpickling,
)
from longctx.methods.recurrence.memory import RecurrenceMemory
from longctx.methods.recurrence.network import WindowRecurrence, window_scores


class RecurrentGPT2LM(LMBase):
    """A pretrained GPT-2 on windows of T tokens, with (or, as the baseline, without) recurrence.

    Args:
        pretrained: hub id ("gpt2" = GPT-2 small, the paper's model), a local HF directory, or a
            RecurrentGPT2LM Lightning checkpoint (`.ckpt`: its GPT-2, the recurrence's weights left out).
        gpt2_config: instead of `pretrained`, `GPT2Config` fields (n_layer, n_embd, n_head,
            n_positions, dropouts...) of a randomly initialised GPT-2.
        recurrence: add the recurrence (False: the windowed baseline, which ignores `window_recurrence`).
        window_recurrence: the recurrence's knobs (`WindowRecurrence.Config`: insert_layer ℓ_ins, the
            0-based block that reads h_prev (paper: 2); ffn_width, ffn_hidden_layers, ffn_activation,
            the FFN z -> h_prev (paper: 3 hidden layers of 200); pool_embeddings; slot_norm); in
            configs `model.init_args.window_recurrence.insert_layer`.
        checkpoint_windows: gradient checkpointing per window in training (paper §3.2).
        window_by_window: with `checkpoint_windows`, run the backward one window at a time in reverse
            (`longctx/methods/bptt.py`: the memory of one window, gradients included); False:
            `torch.utils.checkpoint` per window in one backward (the reference; holds one more copy of
            the gradients).
        checkpoint_blocks: also checkpoint every GPT-2 block in training (Hugging Face's activation
            checkpointing): a window's backward then holds one block's activations, not all L blocks',
            at the cost of one more forward of the blocks.
        loss_chunk: tokens per chunk of the LM head's logits and cross-entropy (`chunked_loss.py`: the
            (tokens, vocabulary) logits never exist at once; the head's logits are computed twice);
            0: the stock head, all logits at once.
        attn_implementation: the stock attention the recurrence wraps ("sdpa" or "eager").
        eval_h_prev: at validation/test, "carried" (the paper: each window reads the previous
            window's h_prev) or "reset" (every window starts as a document start does, without h_prev:
            the same weights with the recurrence cut, what `python -m longctx context` compares).
        vocab_size, optimizer, lr_scheduler: see `LMBase` (paper: Adam, 100 warm-up steps).
    """

    batch_mode = "windows"
    # What `CompileNetwork` compiles: the GPT-2's body (embeddings, blocks, final norm), where the
    # recurrence runs inside the attention; the LM head and the loss run on its output (`token_nll`).
    network_attribute = "backbone"

    def __init__(
        self,
        vocab_size: int = 0,
        pretrained: str | None = None,
        gpt2_config: dict[str, Any] | None = None,
        recurrence: bool = True,
        window_recurrence: WindowRecurrence.Config = WindowRecurrence.Config(),  # noqa: B008 (frozen)
        checkpoint_windows: bool = True,
        window_by_window: bool = True,
        checkpoint_blocks: bool = False,
        loss_chunk: int = 0,
        attn_implementation: Literal["sdpa", "eager"] = "sdpa",
        eval_h_prev: Literal["carried", "reset"] = "carried",
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        groups = self.read_groups(dict(window_recurrence=window_recurrence))
        window_recurrence = groups["window_recurrence"]
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        self.lm = build_lm(pretrained, gpt2_config, vocab_size, attn_implementation)
        config = self.lm.config
        self.recurrence = (
            window_recurrence.build(config.hidden_size, config.num_hidden_layers) if recurrence else None
        )
        if eval_h_prev not in ("carried", "reset"):
            raise ValueError(f"eval_h_prev must be 'carried' or 'reset', got {eval_h_prev!r}")
        self.eval_h_prev = eval_h_prev
        if loss_chunk < 0:
            raise ValueError(f"loss_chunk must be 0 (the stock head) or a number of tokens, got {loss_chunk}")
        if checkpoint_blocks:
            self.lm.activation_checkpointing_enable({"use_reentrant": False})
        self.checkpoint_windows = checkpoint_windows
        self.window_by_window = window_by_window
        self.loss_chunk = loss_chunk

    @property
    def backbone(self) -> nn.Module:
        """The LM's base model (GPT-2: `lm.transformer`), which every window runs through."""
        return self.lm.base_model

    # ------------------------------------------------------------------ memory and step
    def init_memory(self, batch_size: int) -> RecurrenceMemory:
        return RecurrenceMemory.empty(batch_size)

    def step(self, batch: dict[str, Tensor], memory: RecurrenceMemory | None) -> StepOutput:
        x = batch["input"]
        use_checkpoint = self.checkpoint_windows and self.training and torch.is_grad_enabled()
        if self.recurrence is not None:
            memory = RecurrenceMemory.empty(x.shape[0]) if memory is None else memory
            h_prev, reset = memory.h_prev, memory.window_resets(batch["reset"])
            if not self.training and self.eval_h_prev == "reset":
                reset = torch.ones_like(reset)
            out = self.recurrence(
                self.lm,
                x,
                batch["target"],
                batch["mask"],
                reset,
                h_prev,
                checkpoint_windows=use_checkpoint,
                window_by_window=use_checkpoint and self.window_by_window,
                loss_chunk=self.loss_chunk,
                need_correct=self.wants_correct,
            )
            nll, correct, memory = out.nll, out.correct, RecurrenceMemory(out.h_prev)
        else:
            (nll, correct), memory = self._baseline_scores(x, batch["target"], use_checkpoint), None
        return StepOutput(nll=nll, memory=memory, correct=correct)

    @classmethod
    def describe_run(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> str:
        """Recurrence on (its layer; h_prev carried or reset) or off, and the evaluation's window and
        overlap."""
        overlap = first_set(data.get("eval_overlap"), data.get("overlap"))
        recurrence = model.get("recurrence")
        kind = f"recurrence on (layer {model.get('insert_layer')})" if recurrence else "recurrence off"
        if recurrence and model.get("eval_h_prev") == "reset":
            kind += ", h_prev reset every window"  # `--model.init_args.eval_h_prev reset`
        return f"{kind}, window {eval_window(data)} overlap {overlap}"

    def longest_window(self) -> int:
        """The GPT-2's learned positions: `n_positions`."""
        return self.lm.config.n_positions

    def context_variants(self) -> list[Variant]:
        """With recurrence, h_prev carried and reset: two lines of a `context` figure."""
        if self.recurrence is None:
            return []
        return [
            Variant("", "", lambda m: setattr(m, "eval_h_prev", "carried"),
                    ["--model.init_args.eval_h_prev", "carried"]),
            Variant(" (h_prev reset)", "_reset", lambda m: setattr(m, "eval_h_prev", "reset"),
                    ["--model.init_args.eval_h_prev", "reset"]),
        ]  # fmt: skip

    def state_size(self) -> int:
        """d: the one vector h_prev carried from window to window (read at layer ℓ_ins); 0 for the
        windowed baseline and with `eval_h_prev: reset`."""
        carried = self.recurrence is not None and self.eval_h_prev == "carried"
        return self.lm.config.hidden_size if carried else 0

    def evaluation_memory_start(
        self, row_start: np.ndarray, offset: np.ndarray, segment_len: int
    ) -> np.ndarray:
        """With `eval_h_prev: reset` h_prev restarts every window: the target's own window's start."""
        if self.recurrence is not None and self.eval_h_prev == "reset":
            return sample_start(offset, row_start, segment_len, every=1)
        return row_start

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """A GPT-2 window read alone (the carried h_prev is one vector; `footprint`)."""
        c = self.lm.config
        return window_elements(batch_size, length, c.n_layer, c.n_embd, c.n_head) + feed_forward_elements(
            batch_size, length, c.n_embd, c.n_inner
        )

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token for windows of T = `segment_length` at the evaluation
        overlap: the paper's count (`flops.py`: Kaplan's, without the recurrence's small FFN) plus the
        LM head, which the other methods' counts include too."""
        return hf_model_flops_per_scored_token(
            self.lm, segment_length, self._eval_overlap(), output_layer=True
        )

    def _baseline_scores(
        self, x: Tensor, target: Tensor, use_checkpoint: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Independent windows: one forward over (B·K, T), or one checkpointed forward per window (in
        training); the NLL (B, K, T) and, when `wants_correct`, the correctness (B, K, T)."""
        if not use_checkpoint:
            flat_x, flat_target = x.flatten(0, 1), target.flatten(0, 1)
            nll, correct = window_scores(self.lm, flat_x, flat_target, self.loss_chunk, self.wants_correct)
            return nll.view(x.shape), None if correct is None else correct.view(x.shape)
        nlls = [
            checkpoint(window_scores, self.lm, x[:, k], target[:, k], self.loss_chunk, use_reentrant=False)[0]
            for k in range(x.shape[1])
        ]
        return torch.stack(nlls, 1), None

    def _eval_overlap(self) -> int:
        data = self.data_facts()
        return 0 if data is None else data.eval_overlap

    # ------------------------------------------------------------------ pickling (ddp_spawn)
    def __getstate__(self) -> dict[str, Any]:
        """Without transformers' unpicklable output-capturing hooks (`hf.py`)."""
        drop_output_capturing_hooks(self.lm)
        return super().__getstate__()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A spawned process registers the recurrence attention and repairs transformers' registry."""
        super().__setstate__(state)
        restore_after_unpickling(self.lm)

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # The LM's full config, so `hf.lm_from_checkpoint` rebuilds it without the hub or the original
        # directory.
        checkpoint[HF_CONFIG_KEY] = self.lm.config.to_dict()
