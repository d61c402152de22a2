"""Every network's forward and backward runs with parameters and inputs on the `meta` device.

Meta tensors have shapes but no values, so this fails on any host sync (`.item()`, `bool(t)`,
`.tolist()` raise on meta) other than those listed in `longctx/core/host_sync.py`, which skip themselves
there, and on any tensor created on the CPU inside a forward or backward (a missing `device=`): every
op's output is checked. A network that passes runs on a GPU without hidden transfers or stalls.
"""

from __future__ import annotations

import pytest
import torch
import transformers.masking_utils
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import GPT2Config, GPT2LMHeadModel

from longctx.methods.adaptive_span.network import SpanTransformer
from longctx.methods.recurrence.hf import register_recurrence_attention
from longctx.methods.recurrence.network import RECURRENCE_SDPA, WindowRecurrence
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.trams import TramsSettings
from tests.helpers.methods import TINY

META = torch.device("meta")


class NoHostTensors(TorchDispatchMode):
    """Fails on any op whose output is not on the meta device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device != META:
                raise AssertionError(f"{func} created a tensor on {t.device} (a missing device=?)")
        return out


def tokens(*shape: int) -> torch.Tensor:
    return torch.randint(0, 50, shape, device=META)


@pytest.mark.parametrize(
    "span, span_trim", [("fixed", "head"), ("adaptive", "head"), ("adaptive", "layer"), ("dynamic", "head")]
)
def test_adaptive_span_on_meta(span, span_trim):
    with META:
        config = SpanTransformer.Config(32, 2, 4, 64, 128, dropout=0.1, span_kind=span, span_trim=span_trim)
        net = config.build(50)
    x = tokens(2, 16)
    with NoHostTensors():
        out = net(x, net.init_cache(2, device=META))
        out = net(x, out.cache)
        loss = out.logits.float().mean() + (0 if out.penalty is None else out.penalty)
        loss.backward()
    assert out.logits.device == META and out.attended == [128, 128]  # no values: untrimmed (exact)
    assert all(p.grad is not None and p.grad.device == META for p in net.parameters())


@pytest.mark.parametrize(
    "trams",
    [None, TramsSettings(8, 4), TramsSettings(8, 4, "paper", "true"), TramsSettings(8, 4, "oracle")],
    ids=["xl", "trams", "trams-paper-true-positions", "trams-oracle"],
)
@pytest.mark.parametrize("cache_kv", [False, True])
def test_transformer_xl_and_trams_on_meta(trams, cache_kv):
    with META:
        net = TransformerXL.Config(2, 32, 4, 64, dropout=0.1).build(50)
    x = tokens(2, 8)
    memory = net.zero_memory(2, 16) if trams else net.empty_memory(2)
    with NoHostTensors():
        for _ in range(3):  # the memory fills, the caches (keys, values, scores) are carried
            out = net(x, memory, mem_len=16, trams=trams, cache_kv=cache_kv and trams is not None)
            memory = out.memory
        net.nll(out.hidden, x).sum().backward()
    assert all(p.grad is not None and p.grad.device == META for p in net.parameters())


@pytest.mark.parametrize("lean", [False, True], ids=["", "lean"])
@pytest.mark.parametrize("backward", ["plain", "checkpoint", "reverse"])
def test_recurrent_gpt2_on_meta(backward, lean, monkeypatch):
    """lean: every block checkpointed and the LM head's loss in chunks (`checkpoint_blocks`, `loss_chunk`)."""
    # host_sync.py, sync 4: transformers' packed-sequence check reads the position ids on the host.
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    config = GPT2Config(
        vocab_size=50, n_layer=3, n_embd=32, n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None
    )
    with META:
        lm = GPT2LMHeadModel(config)
        recurrence = WindowRecurrence.Config().build(32, 3)
    register_recurrence_attention()
    lm.set_attn_implementation(RECURRENCE_SDPA)
    if lean:
        lm.activation_checkpointing_enable({"use_reentrant": False})
    lm.train()
    x = tokens(2, 3, 8)
    mask = torch.ones(2, 3, 8, dtype=torch.bool, device=META)
    reset = torch.zeros(2, 3, dtype=torch.bool, device=META)
    h_prev = torch.zeros(2, 32, device=META)
    with NoHostTensors():
        nll, h_next, _ = recurrence(
            lm, x, x, mask, reset, h_prev,
            checkpoint_windows=backward != "plain", window_by_window=backward == "reverse",
            loss_chunk=5 if lean else 0,
        )  # fmt: skip
        (nll.mean() + h_next.mean()).backward()
    assert nll.shape == (2, 3, 8) and h_next.device == META
    assert all(p.grad is not None and p.grad.device == META for p in lm.parameters())


@pytest.mark.parametrize("method", sorted(TINY))
def test_every_module_trains_on_meta(method, monkeypatch):
    """Each registered method's module, built on meta, carries its memory over three training steps
    (its `init_memory` included) and backpropagates its loss and extra loss."""
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    with META:
        model = TINY[method].build().train()
    shape = (2, 2, 8) if model.batch_mode == "windows" else (2, 8)  # (B, K, T) or (B, L)
    x = tokens(*shape)
    batch = {
        "input": x,
        "target": x,
        "mask": torch.ones(shape, dtype=torch.bool, device=META),
        "reset": torch.zeros(shape[:-1], dtype=torch.bool, device=META),
    }
    with NoHostTensors():
        memory = model.init_memory(2)
        for _ in range(3):
            out = model.step(batch, memory)
            memory = out.memory
        (out.nll.float().mean() + (0 if out.extra_loss is None else out.extra_loss)).backward()
    assert out.nll.shape == shape
    assert all(p.grad is None or p.grad.device == META for p in model.parameters())
    assert any(p.grad is not None for p in model.parameters())
