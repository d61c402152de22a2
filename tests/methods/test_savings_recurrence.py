"""Backprop through K windows window by window in reverse (`longctx/methods/bptt.py`):
the same loss and gradients as one backward through all windows, one gradient per parameter per
step (what DDP's reducer needs), and the same gradients under 2-process DDP; the memory-lean options
(every block checkpointed, the LM head's loss in chunks) change none of it."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from longctx.methods.recurrence.module import RecurrentGPT2LM
from longctx.methods.recurrence.network import RECURRENCE_SDPA, WindowRecurrence
from tests.methods.recurrence.test_recurrence import L_INS, N_LAYER, TINY, VOCAB, D, gpt2, window_batch


def bptt(
    mode: str, autocast: bool = False, dropout: float = 0.1, lean: bool = False
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Loss, gradients (parameters and the carried h_prev) and the next random number after one
    backward through 4 windows with dropout, a document reset inside the batch and a carried h_prev.
    lean: every block checkpointed and the LM head's loss in chunks of 7 tokens."""
    lm = gpt2(RECURRENCE_SDPA, dropout=dropout).train()
    if lean:
        lm.activation_checkpointing_enable({"use_reentrant": False})
    torch.manual_seed(5)
    net = WindowRecurrence.Config(insert_layer=L_INS).build(D, N_LAYER)
    b = window_batch(n_windows=4)
    b["reset"][0, 2] = True
    h_prev = torch.randn(2, D, requires_grad=True)
    torch.manual_seed(7)  # dropout masks
    # No cast cache: a bf16 weight copy shared by all windows would sum their gradients in bf16.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast, cache_enabled=False):
        nll, h, _ = net(
            lm, b["input"], b["target"], b["mask"], b["reset"], h_prev,
            checkpoint_windows=mode != "plain", window_by_window=mode == "reverse",
            loss_chunk=7 if lean else 0,
        )  # fmt: skip
        loss = nll.mean() + h.float().square().mean()  # a gradient also arrives at the last h_prev
    loss.backward()
    params = {**dict(lm.named_parameters()), **{f"rec.{k}": v for k, v in net.named_parameters()}}
    grads = {k: p.grad for k, p in params.items()} | {"h_prev": h_prev.grad}
    return loss.detach(), grads, torch.rand(1)


@pytest.mark.parametrize("reference", ["plain", pytest.param("checkpoint", marks=pytest.mark.slow)])
def test_window_by_window_backward_equals_one_backward_through_all_windows(reference):
    loss_ref, grads_ref, rng_ref = bptt(reference)
    loss, grads, rng = bptt("reverse")
    assert torch.equal(loss, loss_ref)
    assert torch.equal(rng, rng_ref)  # the recomputation leaves the RNG where the forward left it
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads.items():
        assert grad is not None and grads_ref[name] is not None, name
        torch.testing.assert_close(grad, grads_ref[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("mode", ["reverse", pytest.param("checkpoint", marks=pytest.mark.slow)])
def test_block_checkpointing_and_the_chunked_head_leave_loss_and_gradients_unchanged(mode):
    """The memory-lean options (`checkpoint_blocks`, `loss_chunk`) against the plain backward."""
    loss_ref, grads_ref, rng_ref = bptt("plain")
    loss, grads, rng = bptt(mode, lean=True)
    torch.testing.assert_close(loss, loss_ref, rtol=0, atol=1e-6)
    assert torch.equal(rng, rng_ref)
    for name, grad in grads.items():
        assert grad is not None, name
        torch.testing.assert_close(grad, grads_ref[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow  # ~10-30 s on 2 CPU cores: the fast tier stays within 3 minutes
def test_recomputation_runs_under_the_forwards_autocast():
    # Without dropout: SDPA's attention dropout on bfloat16 rounds differently when recomputed (the
    # gradients then differ at bfloat16 resolution, ~1e-3 relative; in float32 they are equal).
    loss_ref, grads_ref, _ = bptt("plain", autocast=True, dropout=0.0)
    loss, grads, _ = bptt("reverse", autocast=True, dropout=0.0)
    assert torch.equal(loss, loss_ref)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads_ref[name], rtol=0, atol=1e-6, msg=name)
    float32 = bptt("reverse", dropout=0.0)[1]["h_prev"]
    assert not torch.allclose(grads["h_prev"], float32, rtol=1e-3, atol=0)  # bfloat16 was used


@pytest.mark.slow  # ~10-30 s on 2 CPU cores: the fast tier stays within 3 minutes
@pytest.mark.parametrize("lean", [False, True])
def test_each_parameter_receives_exactly_one_gradient_per_backward(lean):
    """DDP's reducer marks a parameter ready when its gradient is accumulated and refuses a second
    time: the K per-window backwards accumulate elsewhere and `.grad` is written once (also when
    every block is checkpointed and recomputed inside a window's backward)."""
    lean_options = {"checkpoint_blocks": True, "loss_chunk": 16} if lean else {}
    m = RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config=TINY, **lean_options).train()
    calls = {name: 0 for name, _ in m.named_parameters()}
    for name, p in m.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _, name=name: calls.__setitem__(name, calls[name] + 1))
    m.step(window_batch(n_windows=5), None).nll.sum().backward()
    assert calls == dict.fromkeys(calls, 1)


class StepLoss(nn.Module):
    """The module's summed NLL as a forward, so DDP wraps the whole step."""

    def __init__(self, model: RecurrentGPT2LM) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.step(batch, None).nll.sum()


def tiny_model() -> RecurrentGPT2LM:
    torch.manual_seed(0)
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # ranks draw differently
    return RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config={**TINY, **no_dropout}).train()


def ddp_rank(rank: int, port: int, batch: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(StepLoss(tiny_model()))
    rows = {k: v[rank : rank + 1] for k, v in batch.items()}
    (model(rows) * 2).backward()  # DDP averages: ×2 makes it the sum over both ranks' rows
    if rank == 0:
        torch.save({k: p.grad for k, p in model.module.named_parameters()}, out)
    dist.barrier()  # both ranks done with every collective
    # Exit without tearing DDP down. Its Reducer, freed with the GIL held, dropped the last reference
    # to the gloo process group, whose destructor joins a worker thread that was itself waiting for
    # the GIL (to free a finished all-reduce's thread-local state): a deadlock that hung one CI run
    # (torch 2.13, stacks read with py-spy).
    os._exit(0)


@pytest.mark.slow
@pytest.mark.ddp
def test_two_process_ddp_gradients_equal_one_process(tmp_path):
    batch = window_batch(batch=2, n_windows=3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "grads.pt")
    mp.spawn(ddp_rank, args=(port, batch, out), nprocs=2, join=True)
    ddp_grads = torch.load(out, weights_only=True)
    single = StepLoss(tiny_model())
    single(batch).backward()
    for name, p in single.named_parameters():
        torch.testing.assert_close(ddp_grads[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("recurrence", [True, False])
def test_the_chunked_head_evaluates_as_the_stock_head(recurrence):
    """`loss_chunk` in evaluation (no graph), with recurrence and for the windowed baseline."""
    torch.manual_seed(0)
    stock = RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config=TINY, recurrence=recurrence).eval()
    chunked = RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config=TINY, recurrence=recurrence, loss_chunk=5).eval()
    chunked.load_state_dict(stock.state_dict())
    batch = window_batch(n_windows=3)
    with torch.no_grad():
        want, got = stock.step(batch, None), chunked.step(batch, None)
    torch.testing.assert_close(got.nll, want.nll, rtol=0, atol=1e-6)
    if recurrence:
        torch.testing.assert_close(got.memory.h_prev, want.memory.h_prev, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="loss_chunk must be 0"):
        RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config=TINY, loss_chunk=-1)
