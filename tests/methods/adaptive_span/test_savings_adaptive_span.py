"""Adaptive span trimmed per head (`span_trim="head"`): each group of heads attends its own trimmed
span, with the same outputs and gradients as the released code's per-layer trimming, the same caches,
and a FLOPs count per head."""

from __future__ import annotations

import pytest
import torch

from longctx.methods.adaptive_span import flops
from longctx.methods.adaptive_span.mask import attended_length
from longctx.methods.adaptive_span.network import SpanTransformer

S, R, D, H = 512, 32, 64, 4
SPANS = [[40.0, 10.0, 300.0, 40.0], [3.0, 3.0, 3.0, 100.0], [50.0, 50.0, 50.0, 50.0]]  # z per head


def network(span_trim: str) -> SpanTransformer:
    torch.manual_seed(0)
    net = SpanTransformer.Config(
        D, len(SPANS), H, 128, S, dropout=0.0, span_ramp=R, span_trim=span_trim
    ).build(50)
    with torch.no_grad():
        for layer, z in zip(net.layers, SPANS, strict=True):
            layer.attn.adaptive_mask.z_ratio.copy_(torch.tensor(z) / S)
    return net


def two_blocks(span_trim: str) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[str, torch.Tensor]]:
    """Logits of two consecutive blocks (the second reads the first's cache), caches, gradients."""
    net = network(span_trim)
    x = torch.randint(0, 50, (2, 2, 64), generator=torch.Generator().manual_seed(1))
    first = net(x[:, 0], net.init_cache(2))
    second = net(x[:, 1], first.cache)
    loss = first.logits.square().mean() + second.logits.square().mean() + second.penalty
    loss.backward()
    grads = {name: p.grad for name, p in net.named_parameters()}
    return [first.logits.detach(), second.logits.detach()], list(second.cache.h_cache), grads


def test_heads_are_grouped_by_their_own_trimmed_length():
    groups = [layer.attn.head_groups() for layer in network("head").layers]
    assert groups[0] == [(384, [2]), (128, [0, 3]), (64, [1])]
    assert groups[1] == [(192, [3]), (64, [0, 1, 2])]
    assert groups[2] == [(128, [0, 1, 2, 3])]  # equal spans: one group, the per-layer path
    assert [layer.attn.attended_length() for layer in network("head").layers] == [384, 192, 128]


def test_per_head_trimming_equals_per_layer_outputs_caches_and_gradients():
    logits_layer, cache_layer, grads_layer = two_blocks("layer")
    logits_head, cache_head, grads_head = two_blocks("head")
    for a, b in zip(logits_head, logits_layer, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(cache_head, cache_layer, strict=True):
        assert a.shape == b.shape  # the layer's cache is what the released code keeps
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for name, grad in grads_head.items():
        scale = grads_layer[name].abs().max().clamp_min(1e-12)
        torch.testing.assert_close(grad / scale, grads_layer[name] / scale, rtol=0, atol=1e-6, msg=name)
    assert grads_head["layers.0.attn.adaptive_mask.z_ratio"].abs().min() > 0  # every head's span learns


def test_flops_count_each_head_over_its_own_trimmed_length():
    d_inner, vocab, block = 128, 50, 64
    layer = flops.macs_per_token(D, len(SPANS), d_inner, vocab, SPANS, R, S, "trimmed", block, trim="layer")
    head = flops.macs_per_token(D, len(SPANS), d_inner, vocab, SPANS, R, S, "trimmed", block, trim="head")
    lengths = [[attended_length(z, S, R) for z in heads] for heads in SPANS]
    assert lengths == [[128, 64, 384, 128], [64, 64, 64, 192], [128] * 4]
    # (3·d + 2·d²/M) per attended position and head, averaged over heads: the per-head saving.
    per_position = 3 * D + 2 * D**2 / block
    saved = sum(max(ls) - sum(ls) / H for ls in lengths) * per_position
    assert layer - head == pytest.approx(saved)
    with pytest.raises(ValueError, match="trim='head' needs attn_span"):
        flops.macs_per_token(D, 1, d_inner, vocab, 10.0, R, None, trim="head")
