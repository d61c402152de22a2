"""`RecurrentMemoryLM`: the Recurrent Memory Transformer (Bulatov et al. 2022) on a GPT-2, on `LMBase`.

Batches are window mode (docs/architecture.md): input/target/mask (B, K, T), reset (B, K). The K
windows of a row are K consecutive segments, read one after another with the memory tokens carried
from each to the next (`network.py`), and training backpropagates through all K (the unroll). The
memory the last segment writes is carried to the row's next batch as `MemoryTokens(state)` (the base
detaches it: no gradient reaches beyond the K segments of a batch); a row whose `reset` is set at
window k starts a new document there and reads the learned initial memory.

The backbone is a Hugging Face GPT-2, built as the recurrent GPT-2 builds it (`recurrence/hf.py`):
`pretrained` (a hub id such as "gpt2", a local directory written by `save_pretrained`, or a `.ckpt`
of a RecurrentMemoryLM or RecurrentGPT2LM run: its GPT-2, and its initial memory when it has one),
or `gpt2_config`, a dict of `GPT2Config` fields for a small GPT-2 trained from scratch.

The curriculum of the authors' recipe (1, 2, 4, … segments, each stage from the previous stage's
best checkpoint) is one fit per stage: `data.windows_per_batch` is the stage's K and
`model.init_args.pretrained` the previous stage's best checkpoint (docs/recurrent_memory.md).

The paper's symbols and where each lives in this folder: the package docstring (`__init__.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from longctx.checkpoints.safe_unpickle import load_tensors_file
from longctx.core.base import LMBase, StepOutput
from longctx.core.run_settings import eval_window
from longctx.data.streams import sample_start
from longctx.diagnostics.footprint import feed_forward_elements, window_elements
from longctx.methods.recurrence.hf import (
    HF_CONFIG_KEY,
    build_lm,
    drop_output_capturing_hooks,
    restore_after_unpickling,
)
from longctx.methods.recurrent_memory.flops import flops_per_token
from longctx.methods.recurrent_memory.memory import MemoryTokens
from longctx.methods.recurrent_memory.network import MemoryCell

MEMORY_KEY = "memory_cell.memory"  # the initial memory's name in the state dict


class RecurrentMemoryLM(LMBase):
    """A GPT-2 reading segments with m memory tokens carried from each segment to the next.

    Args:
        pretrained: hub id ("gpt2"), a local Hugging Face directory, or a `.ckpt` of a
            RecurrentMemoryLM (its GPT-2 and its initial memory: the curriculum's next stage) or a
            RecurrentGPT2LM (its GPT-2).
        gpt2_config: instead of `pretrained`, `GPT2Config` fields (n_layer, n_embd, n_head,
            n_positions, dropouts...) of a randomly initialised GPT-2. n_positions must hold a
            segment and its 2m memory tokens (T + 2m).
        memory_cell: the memory's knobs (`MemoryCell.Config`: num_mem_tokens, m); in configs
            `model.init_args.memory_cell.num_mem_tokens`.
        train_memory: what a training batch's first segment reads: "carried" (the memory written
            by the row's previous batch, detached: truncated backpropagation through time over the
            stream) or "fresh" (the initial memory: every batch is an independent sample of K
            segments, as the authors' training samples are).
        eval_memory: at validation/test, "carried" (the memory flows over the whole split) or
            "reset" (every segment reads the initial memory: the same weights with the memory cut).
        eval_restart_every: with the memory carried, restart it from the initial memory every this
            many segments of the evaluation (segments 0, n, 2n, ... read the initial memory): the
            authors' evaluation of samples of K segments, what a `train_memory: fresh` model trained
            on (set it to the training's `data.windows_per_batch`); None: never (carried over the
            whole split, as every method's memory).
        checkpoint_segments: in training, recompute each segment in the backward, one segment at a
            time in reverse (`longctx/methods/bptt.py`): the activations of one segment, not K, at once.
        checkpoint_blocks: also checkpoint every GPT-2 block (Hugging Face's activation
            checkpointing; the authors' scripts set `gradient_checkpointing`).
        attn_implementation: the GPT-2's attention ("sdpa" or "eager").
        vocab_size, optimizer, lr_scheduler: see `LMBase` (the authors' scripts: AdamW with weight
            decay 0.01, configs/base/recurrent_memory.yaml; the default is Adam, as the recurrent
            GPT-2's, so that a config naming Adam inherits no weight decay from AdamW's defaults).
    """

    batch_mode = "windows"
    # What `CompileNetwork` compiles: the GPT-2's body (embeddings, blocks, final norm), which every
    # segment runs through with its memory tokens; the LM head and the loss run on its output.
    network_attribute = "backbone"

    def __init__(
        self,
        vocab_size: int = 0,
        pretrained: str | None = None,
        gpt2_config: dict[str, Any] | None = None,
        memory_cell: MemoryCell.Config = MemoryCell.Config(),  # noqa: B008 (frozen)
        train_memory: Literal["carried", "fresh"] = "carried",
        eval_memory: Literal["carried", "reset"] = "carried",
        eval_restart_every: int | None = None,
        checkpoint_segments: bool = False,
        checkpoint_blocks: bool = False,
        attn_implementation: Literal["sdpa", "eager"] = "sdpa",
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        memory_cell = self.read_groups(dict(memory_cell=memory_cell))["memory_cell"]
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        if train_memory not in ("carried", "fresh"):
            raise ValueError(f"train_memory must be 'carried' or 'fresh', got {train_memory!r}")
        if eval_memory not in ("carried", "reset"):
            raise ValueError(f"eval_memory must be 'carried' or 'reset', got {eval_memory!r}")
        if eval_restart_every is not None and eval_restart_every < 1:
            raise ValueError(
                f"eval_restart_every must be at least 1 (or null: never), got {eval_restart_every}"
            )
        self.lm = build_lm(pretrained, gpt2_config, vocab_size, attn_implementation)
        self.memory_cell = memory_cell.build(self.lm.get_input_embeddings().weight)
        if pretrained is not None and pretrained.endswith(".ckpt"):
            self.load_memory(pretrained)
        if checkpoint_blocks:
            self.lm.activation_checkpointing_enable({"use_reentrant": False})
        self.train_memory, self.eval_memory = train_memory, eval_memory
        self.eval_restart_every = eval_restart_every
        self._eval_segment = 0  # the evaluation's segments read so far (`eval_restart_every`)
        self.checkpoint_segments = checkpoint_segments

    @property
    def backbone(self) -> nn.Module:
        """The GPT-2's base model (`lm.transformer`), which every segment runs through."""
        return self.lm.base_model

    def load_memory(self, ckpt_path: str) -> None:
        """The initial memory of a RecurrentMemoryLM checkpoint (a RecurrentGPT2LM one has none: the
        memory keeps its fresh initialisation)."""
        state = load_tensors_file(ckpt_path)["state_dict"]
        if MEMORY_KEY not in state:
            return
        saved, own = state[MEMORY_KEY], self.memory_cell.memory
        if saved.shape != own.shape:
            raise ValueError(
                f"{ckpt_path} has {saved.shape[0]} memory tokens of width {saved.shape[1]}, this model "
                f"{own.shape[0]} of width {own.shape[1]}: set model.init_args.memory_cell.num_mem_tokens "
                f"to {saved.shape[0]}"
            )
        with torch.no_grad():
            own.copy_(saved)

    # ------------------------------------------------------------------ memory and step
    def init_memory(self, batch_size: int) -> MemoryTokens:
        return MemoryTokens.empty(batch_size)

    def step(self, batch: dict[str, Tensor], memory: MemoryTokens | None) -> StepOutput:
        memory = MemoryTokens.empty(batch["input"].shape[0]) if memory is None else memory
        state, reset = memory.state, memory.window_resets(batch["reset"])
        if self.training and self.train_memory == "fresh":
            state = None  # every batch a sample of K segments from the initial memory
        if not self.training and self.eval_memory == "reset":
            state, reset = None, torch.ones_like(reset)
        elif not self.training and self.eval_restart_every is not None:
            reset = reset | self._restarts(reset.shape[1], first=state is None, device=reset.device)
        out = self.memory_cell(
            self.lm,
            batch["input"],
            batch["target"],
            reset,
            state,
            checkpoint_segments=self.checkpoint_segments and self.training and torch.is_grad_enabled(),
            need_correct=self.wants_correct,
        )
        return StepOutput(nll=out.nll, memory=MemoryTokens(out.state), correct=out.correct)

    def _restarts(self, n_segments: int, first: bool, device: torch.device) -> Tensor:
        """(1, K) bool on `device` (built there: no host-to-device copy per batch): which of the next
        K evaluation segments restart from the initial memory (`eval_restart_every`); `first`: no
        memory yet, the evaluation's first segment."""
        if first:
            self._eval_segment = 0
        index = torch.arange(self._eval_segment, self._eval_segment + n_segments, device=device)
        self._eval_segment += n_segments
        return (index % self.eval_restart_every == 0)[None, :]

    @classmethod
    def describe_run(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> str:
        """m memory tokens, carried over the stream or reset every window at evaluation, and the
        evaluation's window."""
        kind = f"m={model.get('num_mem_tokens')} memory tokens"
        if model.get("eval_memory") == "reset":
            kind += ", reset every window"
        elif model.get("eval_restart_every"):
            kind += f", restarted every {model['eval_restart_every']} windows"
        return f"{kind}, window {eval_window(data)}"

    def state_size(self) -> int:
        """m·d: the m memory tokens of width d carried from segment to segment, read at the input as
        the recurrent GPT-2's h_prev (d) is read at its layer; 0 with `eval_memory: reset`."""
        carried = self.eval_memory == "carried"
        return self.memory_cell.num_mem_tokens * self.lm.config.hidden_size if carried else 0

    def evaluation_memory_start(
        self, row_start: np.ndarray, offset: np.ndarray, segment_len: int
    ) -> np.ndarray:
        """The first token of the target's sample of K segments (`eval_restart_every`), of its own
        segment with `eval_memory: reset`, else of its row: where the memory was last the initial one."""
        every = 1 if self.eval_memory == "reset" else self.eval_restart_every
        return row_start if every is None else sample_start(offset, row_start, segment_len, every)

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """A GPT-2 window of the segment and its 2m memory tokens (T + 2m positions through every
        block) and the (B, m, d) memory carried to the next segment (`footprint`)."""
        c, m = self.lm.config, self.memory_cell.num_mem_tokens
        positions = length + 2 * m
        return (
            window_elements(batch_size, positions, c.n_layer, c.n_embd, c.n_head)
            + feed_forward_elements(batch_size, positions, c.n_embd, c.n_inner)
            + batch_size * m * c.n_embd
        )

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token for segments of T = `segment_length` at the evaluation
        overlap (`flops.py`: the backbone over T + 2m positions, the LM head over T)."""
        config = self.lm.config
        d_model = int(config.hidden_size)
        d_ff = getattr(config, "n_inner", None) or 4 * d_model
        data = self.data_facts()
        return flops_per_token(
            int(config.num_hidden_layers),
            d_model,
            int(d_ff),
            int(config.vocab_size),
            segment_length,
            self.memory_cell.num_mem_tokens,
            0 if data is None else data.eval_overlap,
        )

    # ------------------------------------------------------------------ pickling (ddp_spawn)
    def __getstate__(self) -> dict[str, Any]:
        """Without transformers' unpicklable output-capturing hooks (`recurrence/hf.py`)."""
        drop_output_capturing_hooks(self.lm)
        return super().__getstate__()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A spawned process repairs transformers' registry (`recurrence/hf.py`)."""
        super().__setstate__(state)
        restore_after_unpickling(self.lm)

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # The GPT-2's full config, so `pretrained: <this .ckpt>` rebuilds it without the hub.
        checkpoint[HF_CONFIG_KEY] = self.lm.config.to_dict()
