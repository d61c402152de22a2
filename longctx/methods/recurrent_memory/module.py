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
or `gpt2_config`, a dict of `GPT2Config` fields for a small GPT-2 trained from scratch; or, with
`xl_config`, Transformer-XL's network without its memory, the 2022 paper's own backbone
(`xl_backbone.py`; `pretrained` may then name a `.ckpt` of such a run, its weights and memory, or of
a Transformer-XL run, its network).

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
from longctx.methods.recurrent_memory.flops import BackboneSizes, flops_per_token
from longctx.methods.recurrent_memory.memory import MemoryTokens
from longctx.methods.recurrent_memory.network import Backbone, HFBackbone, MemoryCell
from longctx.methods.recurrent_memory.xl_backbone import (
    XLBackbone,
    check_xl_backbone_sources,
    check_xl_memory_stays_bounded,
)
from longctx.methods.transformer_xl.network import TransformerXL

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
        xl_config: instead of a GPT-2, Transformer-XL's network (`TransformerXL.Config`; in configs
            `model.init_args.xl_config.d_model`), run without its memory as the 2022 paper's RMT
            (`xl_backbone.py`); with it, `pretrained` is None or a `.ckpt` of a run with the same
            backbone (the curriculum's next stage) or of a Transformer-XL run (its network).
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
        xl_config: TransformerXL.Config | None = None,
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
        groups = self.read_groups(dict(memory_cell=memory_cell, xl_config=xl_config))
        memory_cell, xl_config = groups["memory_cell"], groups["xl_config"]
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
        if xl_config is None:
            self.lm = build_lm(pretrained, gpt2_config, vocab_size, attn_implementation)
            self.memory_cell = memory_cell.build(self.lm.get_input_embeddings().weight)
        else:
            check_xl_backbone_sources(pretrained, gpt2_config, checkpoint_blocks)
            carried = train_memory == "carried" or (eval_memory == "carried" and eval_restart_every is None)
            check_xl_memory_stays_bounded(xl_config, carried)
            self.xl = XLBackbone(vocab_size, xl_config)
            self.memory_cell = memory_cell.build(self.xl.scaled_embedding())
        if pretrained is not None and pretrained.endswith(".ckpt"):
            saved = load_tensors_file(pretrained)["state_dict"]  # read once for the backbone and memory
            if self.uses_xl:
                self.load_backbone(saved, pretrained)
            self.load_memory(saved, pretrained)
        if checkpoint_blocks:
            self.lm.activation_checkpointing_enable({"use_reentrant": False})
        self.train_memory, self.eval_memory = train_memory, eval_memory
        self.eval_restart_every = eval_restart_every
        self._eval_segment = 0  # the evaluation's segments read so far (`eval_restart_every`)
        self.checkpoint_segments = checkpoint_segments

    @property
    def uses_xl(self) -> bool:
        """Whether the backbone is Transformer-XL's network (`xl_config`), not a GPT-2."""
        return "xl" in self._modules

    @property
    def backbone(self) -> nn.Module:
        """The module every segment runs through: the GPT-2's base model (`lm.transformer`), or the
        Transformer-XL backbone (its forward runs the blocks)."""
        return self.xl if self.uses_xl else self.lm.base_model

    @property
    def segment_backbone(self) -> Backbone:
        """The backbone as the memory cell calls it (`network.Backbone`)."""
        return self.xl if self.uses_xl else HFBackbone(self.lm)

    def load_backbone(self, state: Mapping[str, Tensor], ckpt_path: str) -> None:
        """The Transformer-XL backbone's weights from the state dict of a `.ckpt` (`ckpt_path`, named in
        the messages): of a RecurrentMemoryLM run on it (the curriculum's next stage), or of a
        Transformer-XL run (its network, e.g. the Transformer+RPE of the recall sweep: a backbone
        pretrained without memory tokens, as BABILong's start from a pretrained LM; its memory length
        does not matter, the weights are the same)."""
        weights = {k.removeprefix("xl."): v for k, v in state.items() if k.startswith("xl.net.")}
        weights = weights or {k: v for k, v in state.items() if k.startswith("net.")}
        if not weights:
            raise ValueError(
                f"{ckpt_path} holds no Transformer-XL network (xl.net.* or net.* weights): give the .ckpt "
                "of a RecurrentMemoryLM run with xl_config or of a Transformer-XL run"
            )
        try:
            self.xl.load_state_dict(weights)
        except RuntimeError as error:
            raise ValueError(
                f"{ckpt_path}'s Transformer-XL network does not fit xl_config (give the sizes it was "
                f"trained with): {str(error).splitlines()[1].strip()}"
            ) from None

    def load_memory(self, state: Mapping[str, Tensor], ckpt_path: str) -> None:
        """The initial memory from the state dict of a RecurrentMemoryLM checkpoint (`ckpt_path`, named
        in the messages; a RecurrentGPT2LM or Transformer-XL one has none: the memory keeps its fresh
        initialisation)."""
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
            self.segment_backbone,
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
        return self.memory_cell.num_mem_tokens * self.backbone_sizes().d_model if carried else 0

    def evaluation_memory_start(
        self, row_start: np.ndarray, offset: np.ndarray, segment_len: int
    ) -> np.ndarray:
        """The first token of the target's sample of K segments (`eval_restart_every`), of its own
        segment with `eval_memory: reset`, else of its row: where the memory was last the initial one."""
        every = 1 if self.eval_memory == "reset" else self.eval_restart_every
        return row_start if every is None else sample_start(offset, row_start, segment_len, every)

    def backbone_sizes(self) -> BackboneSizes:
        """The backbone's sizes: the GPT-2's config, or Transformer-XL's."""
        if self.uses_xl:
            c = self.xl.config
            return BackboneSizes(c.n_layers, c.d_model, c.n_heads, c.d_inner, self.xl.vocab_size, True)
        c = self.lm.config
        d_ff = getattr(c, "n_inner", None) or 4 * c.hidden_size
        return BackboneSizes(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, d_ff, c.vocab_size)

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """A window of the segment and its 2m memory tokens (T + 2m positions through every block)
        and the (B, m, d) memory carried to the next segment (`footprint`)."""
        sizes, m = self.backbone_sizes(), self.memory_cell.num_mem_tokens
        positions = length + 2 * m
        return (
            window_elements(batch_size, positions, sizes.n_layers, sizes.d_model, sizes.n_heads)
            + feed_forward_elements(batch_size, positions, sizes.d_model, sizes.d_inner)
            + batch_size * m * sizes.d_model
        )

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token for segments of T = `segment_length` at the evaluation
        overlap (`flops.py`: the backbone over T + 2m positions, the LM head over T)."""
        sizes, data = self.backbone_sizes(), self.data_facts()
        return flops_per_token(
            sizes.n_layers,
            sizes.d_model,
            sizes.d_inner,
            sizes.vocab_size,
            segment_length,
            self.memory_cell.num_mem_tokens,
            0 if data is None else data.eval_overlap,
            sizes.relative_positions,
        )

    # ------------------------------------------------------------------ pickling (ddp_spawn)
    def __getstate__(self) -> dict[str, Any]:
        """Without transformers' unpicklable output-capturing hooks (`recurrence/hf.py`)."""
        if not self.uses_xl:
            drop_output_capturing_hooks(self.lm)
        return super().__getstate__()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A spawned process repairs transformers' registry (`recurrence/hf.py`)."""
        super().__setstate__(state)
        if not self.uses_xl:
            restore_after_unpickling(self.lm)

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # The GPT-2's full config, so `pretrained: <this .ckpt>` rebuilds it without the hub (the
        # Transformer-XL backbone's sizes are the run's xl_config, in its hyperparameters).
        if not self.uses_xl:
            checkpoint[HF_CONFIG_KEY] = self.lm.config.to_dict()
