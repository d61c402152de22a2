"""The LM head's cross-entropy in chunks of tokens (`longctx/methods/recurrence/chunked_loss.py`):
the stock numbers (loss and gradients), float64 gradient check, ignored targets, autocast, and the
fact that the autograd graph keeps no (tokens, vocabulary) tensor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longctx.methods.recurrence.chunked_loss import IGNORE_INDEX, linear_cross_entropy

V, D = 97, 16


def inputs(n: int = 23, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = (0.3 * torch.randn(n, D, generator=g, dtype=dtype)).requires_grad_()  # losses of ~5: 1e-6 is ~10 ulp
    weight = torch.randn(V, D, generator=g, dtype=dtype, requires_grad=True)
    target = torch.randint(0, V, (n,), generator=g)
    return h, weight, target


def stock(h, weight, target):
    return F.cross_entropy(F.linear(h, weight).float(), target, reduction="none")


@pytest.mark.parametrize("chunk", [1, 5, 23, 64])
def test_equals_cross_entropy_of_the_whole_logits(chunk):
    h, weight, target = inputs()
    target[3] = IGNORE_INDEX
    upstream = torch.rand(23, generator=torch.Generator().manual_seed(1))
    ref = stock(h, weight, target)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), (h, weight))
    nll = linear_cross_entropy(h, weight, target, chunk)
    grads = torch.autograd.grad((nll * upstream).sum(), (h, weight))
    torch.testing.assert_close(nll, ref, rtol=0, atol=1e-6)
    assert nll[3] == 0 and grads[0][3].abs().max() == 0  # an ignored target: no loss, no gradient
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_float64_gradient_check():
    h, weight, target = inputs(n=7, dtype=torch.float64)
    # fast_mode: vᵀJu for random u, v against finite differences (any wrong Jacobian entry shows)
    assert torch.autograd.gradcheck(
        lambda h, w: linear_cross_entropy(h, w, target, 3), (h, weight), fast_mode=True
    )


def test_leading_dims_and_only_the_needed_gradients():
    h, weight, target = inputs(n=12)
    nll = linear_cross_entropy(h.detach().view(3, 4, D), weight, target.view(3, 4), 5)
    assert nll.shape == (3, 4)
    (grad,) = torch.autograd.grad(nll.sum(), weight)
    torch.testing.assert_close(grad, torch.autograd.grad(stock(h.detach(), weight, target).sum(), weight)[0])


def test_under_bfloat16_autocast_the_logits_are_made_as_autocast_makes_them():
    h, weight, target = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = stock(h, weight, target)
        nll = linear_cross_entropy(h, weight, target, 6)
    torch.testing.assert_close(nll, ref, rtol=0, atol=1e-6)  # same bfloat16 logits, same float32 softmax
    ref_grads = torch.autograd.grad(ref.sum(), (h, weight))
    grads = torch.autograd.grad(nll.sum(), (h, weight))
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # bfloat16 products, summed elsewhere


def test_the_graph_keeps_no_logits():
    h, weight, target = inputs(n=40)
    saved: list[tuple[int, ...]] = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        linear_cross_entropy(h, weight, target, 8)
    assert (40, V) not in saved and (8, V) not in saved
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stock(h, weight, target)
    assert (40, V) in saved  # the stock path saves the whole log-softmax


def test_bad_arguments_are_refused():
    h, weight, target = inputs()
    with pytest.raises(ValueError, match="chunk must be a positive"):
        linear_cross_entropy(h, weight, target, 0)
    with pytest.raises(ValueError, match="disagree"):
        linear_cross_entropy(h, weight, target[:-1], 4)
