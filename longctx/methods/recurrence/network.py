"""Recurrence for pretrained transformers (Yoshida, Ettinger, Gimpel 2020, arXiv 2008.07027, §3).

A pretrained causal LM (GPT-2 through Hugging Face `transformers`) reads a long text as windows of
`T` tokens. After window i, the hidden states of all layers are mean-pooled over positions and
mixed with softmax-normalised learned layer weights (eq. 1),

    z_i = Σ_l softmax(w)_l · (1/T) Σ_t h_{i,t}^{(l)},

and a small feed-forward net (3 hidden layers of width 200) maps z_i to `h_prev`, which window i+1
reads at layer ℓ_ins as **one extra key and value** (not a query): T queries, T+1 keys. The slot's
key/value come from that layer's own projections; positions of the window's tokens are unchanged.

The slot is added without copying Hugging Face's attention code: `hf.register_recurrence_attention()`
(called explicitly, never at import time) registers two attention implementations (`recurrence_sdpa`,
`recurrence_eager`) in transformers' `AttentionInterface` that wrap the stock SDPA / eager functions
(`with_slot`). At every layer but ℓ_ins they call the stock function unchanged (so without a slot the
model is bit for bit the stock model); at ℓ_ins they prepend the slot's key/value and one mask column
that every query of a row with a slot may see (rows without a slot get a zero slot with a masked
column). The matching mask functions are registered too, so padding masks keep working. A stock
attention implementation silently ignores the extra keyword argument, so `run_window` checks that
exactly one layer consumed the slot.

The slot is never passed through `past_key_values`: that shifts the window's positions, SDPA crops
it, and Hugging Face drops the cache under gradient checkpointing (field notes).

Choices the paper leaves open (knobs, with the default named here):
- which states are pooled: Hugging Face's `hidden_states` without the embedding output (`pool_embeddings:
  False`), i.e. the outputs of the L blocks, the last one after the final LayerNorm as HF returns it;
- positions pooled: the window's real input positions (padding at the end of a document's last window
  is excluded; the overlap prefix of a window is real text and is included);
- the slot enters layer ℓ_ins like any hidden state of a pre-LayerNorm block: through that block's
  `ln_1` before the key/value projection (`slot_norm: True`);
- ℓ_ins counts blocks from 0 (Hugging Face's `layer_idx`), default 2;
- FFN activation ReLU, PyTorch default initialisation, layer weights initialised uniform (zeros).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from longctx.core.recall import target_is_argmax
from longctx.methods.bptt import unroll
from longctx.methods.recurrence.chunked_loss import linear_cross_entropy
from longctx.methods.softmax_nll import full_softmax_nll

RECURRENCE_SDPA = "recurrence_sdpa"
RECURRENCE_EAGER = "recurrence_eager"
RECURRENCE_IMPLEMENTATIONS = {"sdpa": RECURRENCE_SDPA, "eager": RECURRENCE_EAGER}
SLOT_KWARG = "recurrence_slot"
AttentionFn = Callable[..., tuple[Tensor, Tensor | None]]


# ---------------------------------------------------------------------------------------- the slot
@dataclass
class RecurrenceSlot:
    """The extra key/value of one window, handed to the attention functions as a keyword argument.

    layer: ℓ_ins, the block (0-based `layer_idx`) whose attention gets the slot.
    state: (B, d) the hidden state fed to that layer's key/value projections (h_prev after `ln_1`).
    present: (B,) bool, rows that have a slot (False: the first window of a document).
    uses: how many attention calls consumed the slot (must be exactly 1 per forward).
    """

    layer: int
    state: Tensor
    present: Tensor
    uses: int = 0


def project_slot(module: nn.Module, state: Tensor) -> tuple[Tensor, Tensor]:
    """Key and value (B, H, 1, head_dim) of `state` (B, d) from a GPT-2 attention module's own c_attn."""
    if not hasattr(module, "c_attn") or getattr(module, "is_cross_attention", False):
        raise NotImplementedError(
            f"recurrence slot: no key/value projection known for {type(module).__name__} (GPT-2 family only)"
        )
    x = state[:, None, :]  # (B, 1, d)
    _, key, value = module.c_attn(x).split(module.split_size, dim=2)  # (B, 1, d) each
    key = key.view(x.shape[0], 1, -1, module.head_dim).transpose(1, 2)  # (B, H, 1, hd)
    value = value.view(x.shape[0], 1, -1, module.head_dim).transpose(1, 2)
    return key, value


def slot_mask(mask: Tensor | None, present: Tensor, q_len: int, kv_len: int, device: torch.device) -> Tensor:
    """The attention mask with one leading key column for the slot.

    mask: the stock mask for the window's own keys: None (plain causal, SDPA's `is_causal` path),
        (B|1, 1|H, q_len, kv_len) bool (True = attend, SDPA) or float additive (0 / min, eager).
    present: (B,) bool; the slot column is visible to every query of these rows, hidden elsewhere.
    Returns (B, 1|H, q_len, 1 + kv_len), same kind as `mask` (bool when `mask` is None).
    """
    batch = present.shape[0]
    if mask is None:
        # Bottom-right aligned causal mask (equal to SDPA's is_causal when q_len == kv_len).
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)
        mask = mask[None, None]
    mask = mask.expand(batch, -1, -1, -1)  # (B, h, q, kv)
    column = present.to(device).view(batch, 1, 1, 1).expand(batch, mask.shape[1], q_len, 1)
    if mask.dtype == torch.bool:
        return torch.cat([column, mask], dim=-1)
    hidden = torch.finfo(mask.dtype).min
    column = torch.where(column, torch.zeros((), dtype=mask.dtype, device=device), hidden)
    return torch.cat([column.to(mask.dtype), mask], dim=-1)


def with_slot(base: AttentionFn) -> AttentionFn:
    """Wrap a stock attention function so that layer ℓ_ins attends to one extra key/value."""

    def attention(
        module: nn.Module,
        query: Tensor,  # (B, H, T, hd)
        key: Tensor,  # (B, H, T, hd)
        value: Tensor,
        attention_mask: Tensor | None,
        **kwargs,
    ) -> tuple[Tensor, Tensor | None]:
        slot: RecurrenceSlot | None = kwargs.pop(SLOT_KWARG, None)
        if slot is None or getattr(module, "layer_idx", None) != slot.layer:
            return base(module, query, key, value, attention_mask, **kwargs)
        slot.uses += 1
        slot_key, slot_value = project_slot(module, slot.state)  # (B, H, 1, hd)
        key = torch.cat([slot_key.to(key.dtype), key], dim=2)  # (B, H, 1 + T, hd)
        value = torch.cat([slot_value.to(value.dtype), value], dim=2)
        mask = slot_mask(attention_mask, slot.present, query.shape[2], key.shape[2] - 1, query.device)
        return base(module, query, key, value, mask, **kwargs)

    attention.__name__ = f"recurrence_{getattr(base, '__name__', 'attention')}"
    return attention


def check_recurrence_attention(lm: nn.Module) -> None:
    """Raise unless `lm` runs with a registered recurrence attention implementation."""
    impl = getattr(lm.config, "_attn_implementation", None)
    if impl not in RECURRENCE_IMPLEMENTATIONS.values():
        raise RuntimeError(
            f"the model runs with attention implementation {impl!r}, which ignores the recurrence slot; "
            f"call hf.register_recurrence_attention(), then lm.set_attn_implementation({RECURRENCE_SDPA!r}) "
            f"(or {RECURRENCE_EAGER!r})"
        )


def pre_attention_norm(lm: nn.Module, layer: int) -> nn.Module:
    """The LayerNorm a hidden state goes through before layer `layer`'s key/value projection (GPT-2)."""
    base = getattr(lm, lm.base_model_prefix, lm)
    if not hasattr(base, "h"):
        raise NotImplementedError(f"no pre-attention norm known for {type(lm).__name__} (GPT-2 family only)")
    return base.h[layer].ln_1


def num_layers(lm: nn.Module) -> int:
    return int(lm.config.num_hidden_layers)


def run_window(
    lm: nn.Module,
    input_ids: Tensor,
    *,
    slot: RecurrenceSlot | None = None,
    output_hidden_states: bool = False,
    **kwargs,
):
    """One forward of the causal LM over a window (B, T), with the slot at ℓ_ins if given.

    `lm` is a causal LM (its output has `logits` (B, T, V)) or its base model (`lm.base_model`: its
    output has `last_hidden_state` (B, T, d)); `hidden_states` too if asked. Without a slot this is
    the stock forward. With one, it checks that the slot was consumed by exactly one attention call.
    """
    if slot is None:
        return lm(input_ids=input_ids, output_hidden_states=output_hidden_states, use_cache=False, **kwargs)
    check_recurrence_attention(lm)
    slot.uses = 0
    out = lm(
        input_ids=input_ids,
        output_hidden_states=output_hidden_states,
        use_cache=False,
        **{SLOT_KWARG: slot},
        **kwargs,
    )
    if slot.uses != 1:
        raise RuntimeError(
            f"the recurrence slot was consumed by {slot.uses} attention calls instead of 1 (layer "
            f"{slot.layer} of {num_layers(lm)}): the model does not run the recurrence attention"
        )
    return out


# ---------------------------------------------------------------------------------------- pooling + FFN
def valid_positions(mask: Tensor) -> Tensor:
    """Real input positions of a window from its target mask (B, T): every position up to the last
    scored one (the overlap prefix is real text; padding only follows the last real target)."""
    return mask.flip(-1).cummax(-1).values.flip(-1)


class LayerPooling(nn.Module):
    """Eq. 1: z = Σ_l softmax(w)_l · mean_t h_t^{(l)}, the mean over the window's real positions."""

    def __init__(self, n_states: int) -> None:
        super().__init__()
        self.weight_logits = nn.Parameter(torch.zeros(n_states))  # uniform layer weights at start

    def forward(self, states: Sequence[Tensor], valid: Tensor | None = None) -> Tensor:
        """states: n_states tensors (B, T, d); valid: (B, T) bool or None (all). Returns z (B, d)."""
        if len(states) != self.weight_logits.numel():
            raise ValueError(f"expected {self.weight_logits.numel()} hidden states, got {len(states)}")
        if valid is None:
            means = torch.stack([h.float().mean(1) for h in states])  # (L, B, d)
        else:
            w_pos = valid.float()
            w_pos = w_pos / w_pos.sum(1, keepdim=True).clamp_min(1.0)  # (B, T)
            means = torch.stack([torch.einsum("btd,bt->bd", h.float(), w_pos) for h in states])
        weights = torch.softmax(self.weight_logits.float(), 0)  # (L,)
        return torch.einsum("l,lbd->bd", weights, means)


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


class RecurrenceFFN(nn.Module):
    """z (B, d) -> h_prev (B, d): `n_hidden` hidden layers of width `width` (paper: 3 × 200)."""

    def __init__(self, d_model: int, width: int = 200, n_hidden: int = 3, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        dims = [d_model] + [width] * n_hidden
        layers: list[nn.Module] = []
        for d_in, d_out in itertools.pairwise(dims):
            layers += [nn.Linear(d_in, d_out), ACTIVATIONS[activation]()]
        layers.append(nn.Linear(dims[-1], d_model))
        self.net = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z)


# ---------------------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class WindowRecurrenceConfig:
    """The recurrence's knobs, their one source (`WindowRecurrence.Config`). The LM it runs
    around (its d_model and n_layers) is described apart, so `build` takes those.

    insert_layer: ℓ_ins, the 0-based block that reads h_prev (paper: 2; below the LM's n_layers).
    ffn_width, ffn_hidden_layers, ffn_activation: the FFN z -> h_prev (paper: 3 hidden layers of 200;
        0 hidden layers: one linear map).
    pool_embeddings: also pool the embedding output (L + 1 layer weights instead of L).
    slot_norm: feed h_prev through block ℓ_ins's `ln_1` before its key/value projection.
    """

    insert_layer: int = 2
    ffn_width: int = 200
    ffn_hidden_layers: int = 3
    ffn_activation: Literal["relu", "gelu", "tanh"] = "relu"
    pool_embeddings: bool = False
    slot_norm: bool = True

    def __post_init__(self) -> None:
        if self.insert_layer < 0:
            raise ValueError(f"insert_layer (ℓ_ins) counts blocks from 0, got {self.insert_layer}")
        if self.ffn_width < 1 or self.ffn_hidden_layers < 0:
            raise ValueError(
                f"the FFN needs ffn_width >= 1 and ffn_hidden_layers >= 0, got {self.ffn_width} and "
                f"{self.ffn_hidden_layers}"
            )
        if self.ffn_activation not in ACTIVATIONS:
            raise ValueError(
                f"ffn_activation must be one of {sorted(ACTIVATIONS)}, got {self.ffn_activation!r}"
            )

    def build(self, d_model: int, n_layers: int) -> WindowRecurrence:
        """The recurrence around an LM of hidden size `d_model` with `n_layers` blocks."""
        return WindowRecurrence(d_model, n_layers, self)


class WindowRecurrence(nn.Module):
    """The recurrence around a causal LM: layer weights, FFN, and the loop over K windows carrying h_prev.

    The LM is an argument of every call, not a sub-module, so a module holding both keeps the LM's
    parameter names (`lm.*`) whether or not it has the recurrence (the windowed baseline).

    `WindowRecurrence(d_model, n_layers, config)` with a `WindowRecurrence.Config` (or
    `config.build(d_model, n_layers)`); d_model, n_layers: the LM's hidden size and number of blocks.
    """

    Config = WindowRecurrenceConfig

    def __init__(self, d_model: int, n_layers: int, config: WindowRecurrenceConfig) -> None:
        super().__init__()
        self.config = config
        if config.insert_layer >= n_layers:
            raise ValueError(f"insert_layer (ℓ_ins) must be in [0, {n_layers}), got {config.insert_layer}")
        self.insert_layer = config.insert_layer
        self.pool_embeddings = config.pool_embeddings
        self.slot_norm = config.slot_norm
        self.pooling = LayerPooling(n_layers + int(config.pool_embeddings))
        self.ffn = RecurrenceFFN(d_model, config.ffn_width, config.ffn_hidden_layers, config.ffn_activation)

    def slot_for(self, lm: nn.Module, h_prev: Tensor | None, present: Tensor | None) -> RecurrenceSlot | None:
        """The slot from h_prev (B, d) for the rows in `present` (B,), or None without h_prev. Rows not
        in `present` get a zero slot whose column is masked (no host sync to test whether any row is)."""
        if h_prev is None or present is None:
            return None
        state = h_prev * present[:, None].to(h_prev.dtype)  # zero (and mask) rows without h_prev
        if self.slot_norm:
            state = pre_attention_norm(lm, self.insert_layer)(state)
        return RecurrenceSlot(self.insert_layer, state, present)

    def window(
        self,
        lm: nn.Module,
        input_ids: Tensor,
        target: Tensor,
        valid: Tensor,
        h_prev: Tensor | None,
        present: Tensor | None,
        loss_chunk: int = 0,
        need_correct: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """One window (B, T): per-target NLL (B, T), the pooled z (B, d) and, if `need_correct`, whether
        each target is the LM's argmax (B, T) (else None). The unit of checkpointing."""
        slot = self.slot_for(lm, h_prev, present)
        out = run_window(lm.base_model, input_ids, slot=slot, output_hidden_states=True)
        nll, correct = token_scores(lm, out.last_hidden_state, target, loss_chunk, need_correct)
        states = out.hidden_states if self.pool_embeddings else out.hidden_states[1:]
        return nll, self.pooling(states, valid), correct

    def forward(
        self,
        lm: nn.Module,
        input_ids: Tensor,
        target: Tensor,
        mask: Tensor,
        reset: Tensor,
        h_prev: Tensor | None = None,
        checkpoint_windows: bool = False,
        window_by_window: bool = False,
        loss_chunk: int = 0,
        need_correct: bool = False,
    ) -> WindowsOutput:
        """Backprop through K windows.

        input_ids, target, mask: (B, K, T); reset: (B, K) bool (the row starts a document at that
        window: its h_prev is dropped); h_prev: (B, d) carried from the previous batch, or None.
        With `checkpoint_windows`, each window's forward is recomputed in the backward pass, so
        only the window inputs, z_i and h_prev,i stay in memory (paper §3.2).
        With `window_by_window` (also recomputing each window), the backward runs one window at a
        time in reverse and only h_prev,i stays in memory: no gradient buffer beyond `.grad`
        (`longctx/methods/bptt.py`).
        loss_chunk: tokens per chunk of the LM head's logits (`token_nll`; 0: all at once).
        need_correct: also say whether each target is the LM's argmax (evaluation of recall).
        Returns nll (B, K, T), h_prev for the next batch (B, d) and the correctness (`WindowsOutput`).
        """
        check_recurrence_attention(lm)

        def window(k: int, h_prev: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
            """Window k from the state entering it: NLL (B, T), the state leaving it (B, d) and the
            correctness (B, T) or None."""
            present = None if h_prev is None else ~reset[:, k].to(h_prev.device)
            valid = valid_positions(mask[:, k])
            args = (lm, input_ids[:, k], target[:, k], valid, h_prev, present, loss_chunk, need_correct)
            if checkpoint_windows and not window_by_window and torch.is_grad_enabled():
                nll, z, correct = checkpoint(self.window, *args, use_reentrant=False)
            else:
                nll, z, correct = self.window(*args)
            return nll, self.ffn(z), correct

        reverse = {"lm": lm, "recurrence": self} if window_by_window else None
        nll, h_prev, correct = unroll(window, input_ids.shape[1], h_prev, input_ids.device, reverse)
        return WindowsOutput(nll, h_prev, correct)


class WindowsOutput(NamedTuple):
    """What `WindowRecurrence` returns for K windows: nll (B, K, T); h_prev (B, d) for the next batch;
    correct (B, K, T) bool (the target is the LM's argmax), None unless asked."""

    nll: Tensor
    h_prev: Tensor
    correct: Tensor | None = None


def token_nll(lm: nn.Module, hidden: Tensor, target: Tensor, loss_chunk: int = 0) -> Tensor:
    """Per-target NLL (B, T) from the LM's last hidden states (B, T, d) through its output embedding:
    the stock logits (B, T, V) when `loss_chunk` is 0, else `loss_chunk` tokens' logits at a time
    (`chunked_loss.py`: the same numbers without the logits of the whole window in memory)."""
    head = lm.get_output_embeddings()
    if not loss_chunk:
        return full_softmax_nll(head(hidden), target)
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise NotImplementedError(
            f"loss_chunk needs a bias-free linear LM head (GPT-2's), got {type(head).__name__}; "
            "set loss_chunk: 0"
        )
    return linear_cross_entropy(hidden, head.weight, target, loss_chunk)


def token_scores(
    lm: nn.Module, hidden: Tensor, target: Tensor, loss_chunk: int = 0, need_correct: bool = False
) -> tuple[Tensor, Tensor | None]:
    """`token_nll` and, if `need_correct`, whether each target (B, T) is the argmax of the LM head's
    log-probabilities (`loss_chunk` tokens' logits at a time, or all at once), else None."""
    nll = token_nll(lm, hidden, target, loss_chunk)
    if not need_correct:
        return nll, None
    head = lm.get_output_embeddings()
    flat_hidden, flat_target = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    rows = loss_chunk or flat_hidden.shape[0]
    correct = torch.cat(
        [
            target_is_argmax(head(part), part_target)
            for part, part_target in zip(flat_hidden.split(rows), flat_target.split(rows), strict=True)
        ]
    )
    return nll, correct.view(target.shape)


def window_scores(
    lm: nn.Module, input_ids: Tensor, target: Tensor, loss_chunk: int = 0, need_correct: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Per-target NLL (B, T) of independent windows (the baseline: no recurrence) and, if
    `need_correct`, whether each target is the LM's argmax (`token_scores`)."""
    hidden = run_window(lm.base_model, input_ids).last_hidden_state
    return token_scores(lm, hidden, target, loss_chunk, need_correct)
