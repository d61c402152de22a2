"""The Recurrent Memory Transformer, decoder-only (Bulatov, Kuratov, Burtsev, "Recurrent Memory
Transformer", NeurIPS 2022, arXiv 2207.06881, §3; on a pretrained decoder: Bulatov, Kuratov, Kapushev,
Burtsev, arXiv 2304.11062).

A long text is read as segments of T tokens. Segment τ goes through an unchanged causal transformer
with m memory tokens before it (read) and the same m after it (write):

    H̃_τ = [H_τ^mem ; H_τ ; H_τ^mem]                  (B, m + T + m, d)
    H̄_τ = Transformer(H̃_τ)
    [H_τ^read ; H_τ^out ; H_τ^write] = H̄_τ
    H_{τ+1}^mem = H_τ^write

The read tokens give the segment what the previous segments wrote; the write tokens, last in the
causal order, see the whole segment and become the next segment's memory. The model is trained by
backpropagation through time over the segments.

Where the paper leaves details open, this follows the authors' code (booydar/recurrent-memory-
transformer, `modeling_rmt/language_modeling.py`, `MemoryCell` and `RecurrentWrapper`):
- the read and the write tokens take the same input, the memory state (`process_input`:
  `cat([memory_state, inputs_embeds, memory_state])`);
- positions: the backbone numbers the whole sequence 0 … T + 2m − 1 (the code passes
  `inputs_embeds` and no position ids), so a GPT-2 with learned positions needs T + 2m ≤ n_positions;
- attention: the backbone's causal mask over the whole sequence (read tokens see the read tokens
  before them, segment tokens the read tokens and the segment up to themselves, write tokens all);
- the new memory is the write tokens' `hidden_states[-1]`, for a GPT-2 the output of its final
  LayerNorm (ln_f);
- the initial memory is one learned (m, d) parameter drawn as N(0, 1) · std(token embedding)
  (`create_memory`), used for every row's first segment;
- the logits are those of the T segment positions (`process_output` cuts the read and write ones),
  each predicting the next token of the stream;
- gradients: `manage_gradients` detaches the memory beyond the last k2 segments of a sample (k2 = −1,
  no detaching, in the released LM and BABILong scripts); here the unroll is the K windows of a
  batch (`MemoryCell.forward`), and the memory carried across batches is detached by the module.

The backbone is handed to every call as a `Backbone` (not a sub-module, so a module holding both
keeps the backbone's parameter names, `lm.*` for a GPT-2): `HFBackbone`, a Hugging Face causal LM as
above, or `xl_backbone.XLBackbone`, Transformer-XL's network without its memory, the 2022 paper's
own backbone (booydar/LM-RMT; its layout differences are in that file). Pure PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from longctx.core.data_facts import DataMismatch
from longctx.core.recall import target_is_argmax
from longctx.methods.bptt import unroll
from longctx.methods.recurrent_memory.memory import read_memory
from longctx.methods.softmax_nll import full_softmax_nll


@dataclass(frozen=True)
class MemoryCellConfig:
    """The memory's knobs, their one source (`MemoryCell.Config`). The backbone is described apart,
    so `build` takes its token embedding.

    num_mem_tokens: m, the memory tokens read before and written after every segment (0: the
        backbone over independent segments).
    """

    num_mem_tokens: int = 16

    def __post_init__(self) -> None:
        if self.num_mem_tokens < 0:
            raise ValueError(f"num_mem_tokens (m) must be 0 or more, got {self.num_mem_tokens}")

    def build(self, embedding: Tensor) -> MemoryCell:
        """The memory cell of a backbone whose token embedding is `embedding` (V, d)."""
        return MemoryCell(embedding, self)


class MemoryCell(nn.Module):
    """The learned initial memory and the recurrence over segments.

    `MemoryCell(embedding, config)` with a `MemoryCell.Config` (or `config.build(embedding)`);
    embedding: the backbone's token embedding (V, d), which gives the memory its width d and the
    scale of its initialisation.
    """

    Config = MemoryCellConfig

    def __init__(self, embedding: Tensor, config: MemoryCellConfig) -> None:
        super().__init__()
        self.config = config
        self.num_mem_tokens = m = config.num_mem_tokens
        scale = embedding.detach().std()
        # The initial memory H_0^mem (m, d) (`create_memory`).
        self.memory = nn.Parameter(
            torch.randn(m, embedding.shape[1], device=embedding.device, dtype=embedding.dtype) * scale
        )

    def segment(self, backbone: Backbone, input_ids: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        """One segment through the backbone: input_ids (B, T) and H_τ^mem (B, m, d) -> the segment's
        last hidden states H_τ^out (B, T, d) and H_{τ+1}^mem = H_τ^write (B, m, d)."""
        m, length = self.num_mem_tokens, input_ids.shape[1]
        backbone.check_positions(length, m)
        tokens = backbone.embed(input_ids)  # (B, T, d)
        memory = memory.to(tokens.dtype)
        sequence = torch.cat([memory, tokens, memory], dim=1)  # [read; segment; write] (B, T + 2m, d)
        hidden = backbone.transform(sequence, m)  # (B, T + 2m, d)
        return hidden[:, m : m + length], hidden[:, m + length :]

    def forward(
        self,
        backbone: Backbone,
        input_ids: Tensor,
        target: Tensor,
        reset: Tensor,
        state: Tensor | None = None,
        checkpoint_segments: bool = False,
        need_correct: bool = False,
    ) -> SegmentsOutput:
        """Backprop through the K segments of a batch.

        backbone: the transformer the segments run through (`HFBackbone`, `xl_backbone.XLBackbone`);
        input_ids, target: (B, K, T); reset: (B, K) bool (the row starts a document at that segment:
        it reads the initial memory); state: (B, m, d) written by the previous batch's last segment,
        or None (every row starts from the initial memory).
        With `checkpoint_segments`, the backward recomputes one segment at a time in reverse
        (`longctx/methods/bptt.py`): the activations of one segment, not K, are alive at once.
        need_correct: also say whether each target is the LM's argmax (evaluation of recall).
        Returns nll (B, K, T), the memory written by the last segment (B, m, d) and the correctness
        (`SegmentsOutput`).
        """

        def one_segment(k: int, state: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
            """Segment k from the memory entering it: NLL (B, T), the memory it writes (B, m, d) and
            the correctness (B, T) or None."""
            memory = read_memory(state, self.memory, reset[:, k])
            hidden, written = self.segment(backbone, input_ids[:, k], memory)
            nll, correct = backbone.scores(hidden, target[:, k], need_correct)
            return nll, written, correct

        reverse = {"backbone": backbone.module, "memory_cell": self} if checkpoint_segments else None
        nll, state, correct = unroll(one_segment, input_ids.shape[1], state, input_ids.device, reverse)
        return SegmentsOutput(nll, state, correct)


class SegmentsOutput(NamedTuple):
    """What `MemoryCell` returns for K segments: nll (B, K, T); state (B, m, d), the memory the last
    segment wrote; correct (B, K, T) bool (the target is the LM's argmax), None unless asked."""

    nll: Tensor
    state: Tensor
    correct: Tensor | None = None


class BackboneScores(NamedTuple):
    """A segment's per-target NLL (B, T) and whether each target is the argmax (B, T) bool, or None."""

    nll: Tensor
    correct: Tensor | None = None


class Backbone(Protocol):
    """What the memory cell asks of the transformer it runs every segment through."""

    @property
    def module(self) -> nn.Module:
        """The module holding every parameter the segment uses (the segment-by-segment backward)."""
        ...

    def embed(self, input_ids: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, d) the token inputs of the blocks."""
        ...

    def transform(self, sequence: Tensor, num_mem_tokens: int) -> Tensor:
        """[read (m); segment; write (m)] (B, T + 2m, d) -> the last hidden states (B, T + 2m, d)."""
        ...

    def scores(self, hidden: Tensor, target: Tensor, need_correct: bool = False) -> BackboneScores:
        """The segment's last hidden states (B, T, d) scored against its targets (B, T)."""
        ...

    def check_positions(self, segment_length: int, num_mem_tokens: int) -> None:
        """Refuse, in one line, a segment and memory the backbone has no positions for."""
        ...


class HFBackbone:
    """A Hugging Face causal LM (a GPT-2) as the backbone, as the authors' `MemoryCell` runs it:
    `inputs_embeds` and no position ids (positions 0 … T + 2m − 1), the causal mask, the last hidden
    states after the final norm, the LM head on the segment's positions alone."""

    def __init__(self, lm: nn.Module) -> None:
        self.lm = lm

    @property
    def module(self) -> nn.Module:
        return self.lm

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.lm.get_input_embeddings()(input_ids)

    def transform(self, sequence: Tensor, num_mem_tokens: int) -> Tensor:
        return self.lm.base_model(inputs_embeds=sequence, use_cache=False).last_hidden_state  # after ln_f

    def scores(self, hidden: Tensor, target: Tensor, need_correct: bool = False) -> BackboneScores:
        """Logits (B, T, V) for the segment's positions only."""
        logits = self.lm.get_output_embeddings()(hidden)
        nll = full_softmax_nll(logits, target)
        return BackboneScores(nll, target_is_argmax(logits, target) if need_correct else None)

    def check_positions(self, segment_length: int, num_mem_tokens: int) -> None:
        """The GPT-2's learned positions hold T + 2m."""
        available = getattr(self.lm.config, "max_position_embeddings", None)
        needed = segment_length + 2 * num_mem_tokens
        if available is not None and needed > available:
            raise DataMismatch(
                f"segments of {segment_length} tokens with {num_mem_tokens} memory tokens read and "
                f"{num_mem_tokens} written need T + 2m = {needed} positions, the GPT-2 has {available}: "
                "lower data.tgt_len and data.eval_tgt_len or model.init_args.memory_cell.num_mem_tokens "
                "(a GPT-2 from scratch: raise model.init_args.gpt2_config.n_positions)"
            )
