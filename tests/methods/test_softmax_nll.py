"""`full_softmax_nll`: every method's full-softmax loss, upcast to float32 at least."""

from __future__ import annotations

import pytest
import torch

from longctx.methods.softmax_nll import full_softmax_nll


def reference_nll(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    log_p = logits - logits.exp().sum(-1, keepdim=True).log()  # log-softmax written out
    return -log_p.gather(-1, target[..., None])[..., 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_logits_are_scored_in_float32(dtype):
    torch.manual_seed(0)
    logits, target = (torch.randn(2, 5, 50) * 4).to(dtype), torch.randint(50, (2, 5))
    nll = full_softmax_nll(logits, target)
    assert nll.dtype == torch.float32 and nll.shape == (2, 5)
    torch.testing.assert_close(nll, reference_nll(logits.double(), target).float())


def test_float64_stays_float64_and_its_gradient_checks():
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 7, dtype=torch.float64, requires_grad=True)
    target = torch.randint(7, (1, 3))
    assert full_softmax_nll(logits, target).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda x: full_softmax_nll(x, target), (logits,))
