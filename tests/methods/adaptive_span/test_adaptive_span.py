"""Adaptive Attention Span building blocks: the mask, the exact band attention, caches, trimming,
dynamic spans and the clipped Adagrad (Sukhbaatar et al. 2019; facebookresearch/adaptive-span)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from longctx.methods.adaptive_span.attention import SpanAttention, band_attention, key_windows
from longctx.methods.adaptive_span.flops import (
    flops_per_token,
    macs_per_token,
    network_flops_per_token,
    parameter_count,
)
from longctx.methods.adaptive_span.mask import AdaptiveMask, DynamicSpan, attended_length
from longctx.methods.adaptive_span.memory import SpanCache
from longctx.methods.adaptive_span.network import SpanTransformer
from longctx.optim.adagrad import ClippedAdagrad


def net(
    span: str, S: int = 96, R: int = 8, n_layers: int = 2, chunk_size: int = 8, **kwargs
) -> SpanTransformer:
    torch.manual_seed(0)
    model = SpanTransformer.Config(
        d_model=16,
        n_layers=n_layers,
        n_heads=2,
        d_inner=32,
        attn_span=S,
        dropout=0.0,
        span_kind=span,
        span_ramp=R,
        chunk_size=chunk_size,
        **kwargs,
    ).build(20)
    return model.double().eval()


def set_spans(model: SpanTransformer, z_ratio: list[float]) -> None:
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.adaptive_mask.z_ratio.copy_(torch.tensor(z_ratio))


# ---------------------------------------------------------------------------------- the mask
def test_mask_values_match_hand_computation():
    mask = AdaptiveMask(n_heads=3, attn_span=16, span_ramp=4, span_init=0.0)
    with torch.no_grad():
        mask.z_ratio.copy_(torch.tensor([0.0, 0.25, 0.5]))  # z = 0, 4, 8
    # m_z(x) = clamp((R + z - (x - 1)) / R, 0, 1), the code's shift: distance 1 always has mask 1.
    expected = torch.zeros(3, 16)
    expected[0, :5] = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    expected[1, :9] = torch.tensor([1.0, 1, 1, 1, 1, 0.75, 0.5, 0.25, 0.0])
    expected[2, :13] = torch.tensor([1.0, 1, 1, 1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25, 0.0])
    torch.testing.assert_close(mask.mask(16), expected.flip(-1))  # columns: distances 16..1


def test_gradient_reaches_z_and_matches_finite_differences():
    torch.manual_seed(0)
    attn = SpanAttention(
        SpanTransformer.Config(
            d_model=8, n_heads=2, attn_span=24, dropout=0.0, span_kind="adaptive", span_ramp=6, chunk_size=4
        )
    ).double()
    with torch.no_grad():
        attn.adaptive_mask.z_ratio.copy_(torch.tensor([0.2, 0.45]))  # inside the ramp
    h, h_cache = torch.randn(2, 10, 8, dtype=torch.double), torch.randn(2, 24, 8, dtype=torch.double)
    key_pe = torch.randn(4, 24, dtype=torch.double)

    def output(z_ratio: torch.Tensor) -> torch.Tensor:
        params = {"adaptive_mask.z_ratio": z_ratio}
        return torch.func.functional_call(attn, params, (h, h_cache, key_pe))[0]

    z_ratio = attn.adaptive_mask.z_ratio.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(output, (z_ratio,), fast_mode=True)  # vᵀJu for random u, v
    output(z_ratio).square().sum().backward()
    assert z_ratio.grad.abs().min() > 0


def test_clamp_keeps_z_ratio_in_unit_interval():
    mask = AdaptiveMask(n_heads=3, attn_span=16, span_ramp=4)
    with torch.no_grad():
        mask.z_ratio.copy_(torch.tensor([-0.3, 0.4, 1.7]))
    mask.clamp_()
    torch.testing.assert_close(mask.z_ratio.data, torch.tensor([0.0, 0.4, 1.0]))


def test_attended_length_follows_the_code_rounding():
    # S=512, R=32: need = ceil(max z) + R, trimmed part rounded down to a multiple of 64.
    assert attended_length(0.0, 512, 32) == 64
    assert attended_length(256.0, 512, 32) == 320  # need 288 -> trim 224 -> 192
    assert attended_length(512.0, 512, 32) == 512
    assert attended_length(0.0, 40, 0) == 40  # trim < 64 rounds to nothing


# ---------------------------------------------------------------------------------- band attention
def reference_attention(q, k, v, key_pe, mask):
    """Query i attends keys i .. i+L-1 (distances L .. 1) one query at a time."""
    M, Dh = q.shape[2:]
    L = k.shape[2] - M
    out = torch.zeros_like(q)
    for i in range(M):
        keys, values = k[:, :, i : i + L], v[:, :, i : i + L]  # (B, H, L, Dh)
        logits = (torch.einsum("bhd,bhld->bhl", q[:, :, i], keys) + q[:, :, i] @ key_pe) / math.sqrt(Dh)
        p = torch.softmax(logits, -1)
        if mask is not None:
            m = mask[:, :, i] if mask.shape[2] > 1 else mask[:, :, 0]
            p = p * m
            p = p / (p.sum(-1, keepdim=True) + 1e-8)
        out[:, :, i] = torch.einsum("bhl,bhld->bhd", p, values)
    return out


@pytest.mark.parametrize("L,c,n", [(5, 13, 1), (13, 5, 1), (5, 5, 3), (3, 7, 4), (0, 4, 2)])
def test_key_windows_equal_unfold_and_pass_gradients_back(L, c, n):
    x = torch.randn(2, 3, L + n * c, 4, dtype=torch.double, requires_grad=True)
    windows = key_windows(x, L, c)
    torch.testing.assert_close(windows, x.unfold(2, L + c, c).transpose(-1, -2))
    weights = torch.randn_like(windows)
    (grad,) = torch.autograd.grad((windows * weights).sum(), x)
    (expected,) = torch.autograd.grad((x.unfold(2, L + c, c).transpose(-1, -2) * weights).sum(), x)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
@pytest.mark.parametrize("mask_kind", ["none", "per_head", "per_query"])
def test_band_attention_equals_reference(chunk_size, mask_kind):
    torch.manual_seed(0)
    B, H, M, L, Dh = 2, 3, 13, 5, 4
    q = torch.randn(B, H, M, Dh, dtype=torch.double)
    k, v = torch.randn(2, B, H, L + M, Dh, dtype=torch.double)
    key_pe = torch.randn(Dh, L, dtype=torch.double)
    mask = {
        "none": None,
        "per_head": torch.rand(1, H, 1, L, dtype=torch.double),
        "per_query": torch.rand(B, H, M, L, dtype=torch.double),
    }[mask_kind]
    out = band_attention(q, k, v, key_pe, mask, nn.Dropout(0.0), chunk_size)
    torch.testing.assert_close(out, reference_attention(q, k, v, key_pe, mask))


# ---------------------------------------------------------------------------------- the network
@pytest.mark.parametrize("R", [1, 8])
def test_full_span_adaptive_equals_fixed_on_the_same_weights(R):
    fixed, adaptive = net("fixed", R=R), net("adaptive", R=R)
    missing, unexpected = adaptive.load_state_dict(fixed.state_dict(), strict=False)
    assert not unexpected and all("z_ratio" in name for name in missing)
    set_spans(adaptive, [1.0, 1.0])  # z = S: every mask value is 1, nothing is trimmed
    x = torch.randint(0, 20, (2, 24))
    a, f = adaptive(x, adaptive.init_cache(2)), fixed(x, fixed.init_cache(2))
    torch.testing.assert_close(a.logits, f.logits)
    for ca, cf in zip(a.cache.h_cache, f.cache.h_cache):
        torch.testing.assert_close(ca, cf)


@pytest.mark.parametrize("k", [0, 5, 37])
def test_hard_window_limit_equals_a_fixed_span_model(k):
    """R -> 0: with the smallest ramp R = 1 and z = k the mask is exactly 1 up to distance k + 1 and
    0 beyond, so the adaptive model equals the fixed-span model with S' = k + 1 on the same weights
    (its key position embedding being the last S' columns), trimming included."""
    S = 96
    adaptive = net("adaptive", S=S, R=1)
    set_spans(adaptive, [k / S, k / S])
    fixed = net("fixed", S=k + 1)
    state = {n: t for n, t in adaptive.state_dict().items() if "z_ratio" not in n}
    state["key_pe"] = state["key_pe"][:, S - (k + 1) :]
    fixed.load_state_dict(state)
    x = torch.randint(0, 20, (2, 40))
    a = adaptive(x, adaptive.init_cache(2))
    f = fixed(x, fixed.init_cache(2))
    assert a.attended == [32 if k < 32 else 96] * 2 and f.attended == [k + 1] * 2
    # Only the code's 1e-8 in the renormalisation p / (Σp + 1e-8) differs (relative 1e-8 / Σp).
    torch.testing.assert_close(a.logits, f.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("span", "S", "z_ratio"),
    [
        ("fixed", 40, None),
        ("adaptive", 40, [0.3, 0.8]),
        ("adaptive", 256, [0.05, 0.1]),
        ("dynamic", 40, None),
    ],
)
@pytest.mark.parametrize("n_chunks", [2, 4])
def test_cache_across_batches_equals_the_concatenated_sequence(span, S, z_ratio, n_chunks):
    """Cached attention over consecutive blocks equals attention over the whole sequence; with S=256
    and small spans the caches are trimmed (128 states) and still longer than one 8-token block."""
    model = net(span, S=S)
    if z_ratio is not None:
        set_spans(model, z_ratio)
    x = torch.randint(0, 20, (2, 32))
    whole = model(x, model.init_cache(2)).logits
    cache, logits = model.init_cache(2), []
    for block in x.chunk(n_chunks, dim=1):
        out = model(block, cache)
        cache = out.cache
        logits.append(out.logits)
    if S == 256:
        assert [c.shape[1] for c in cache.h_cache] == [128, 128]
    torch.testing.assert_close(torch.cat(logits, dim=1), whole)


def test_trimmed_cache_shrinks_with_z():
    model = net("adaptive", S=512, R=32, n_layers=3)
    set_spans(model, [0.0, 0.0])
    assert model.cache_sizes() == [128, 128, 128]  # attended 64 + the code's 64 margin
    with torch.no_grad():
        model.layers[1].attn.adaptive_mask.z_ratio.copy_(torch.tensor([0.1, 0.5]))
        model.layers[2].attn.adaptive_mask.z_ratio.copy_(torch.tensor([1.0, 0.0]))
    assert [layer.attn.attended_length() for layer in model.layers] == [64, 320, 512]
    assert model.cache_sizes() == [128, 384, 512]
    out = model(torch.randint(0, 20, (1, 16)), model.init_cache(1))
    assert out.attended == [64, 320, 512]
    assert [c.shape[1] for c in out.cache.h_cache] == [128, 384, 512]


def test_trimming_only_drops_positions_whose_mask_is_zero(monkeypatch):
    model = net("adaptive", S=256, R=8)
    set_spans(model, [0.05, 0.1])  # z = 12.8, 25.6: mask 0 beyond distance 35; trimmed to 64
    x = torch.randint(0, 20, (2, 16))
    cache = SpanCache(tuple(torch.randn(2, 256, 16, dtype=torch.double) for _ in model.layers))
    trimmed = model(x, cache)
    assert trimmed.attended == [64, 64]
    for layer in model.layers:
        monkeypatch.setattr(layer.attn, "attended_length", lambda: 256)
    untrimmed = model(x, cache)
    assert untrimmed.attended == [256, 256]
    torch.testing.assert_close(trimmed.logits, untrimmed.logits)


def test_dynamic_span_depends_on_input_and_penalty_is_mean_z():
    model = net("dynamic", S=64, n_layers=1)
    dynamic = model.layers[0].attn.dynamic_span
    assert isinstance(dynamic, DynamicSpan)
    torch.testing.assert_close(dynamic.proj.bias.data, torch.full((2,), -4.0, dtype=torch.double))
    x = torch.randint(0, 20, (2, 12))
    h = model.in_emb(x)  # layer 0 input (no embedding dropout)
    z = dynamic(h)  # (B, H, M)
    torch.testing.assert_close(
        z, 64 * torch.sigmoid(h @ dynamic.proj.weight.T + dynamic.proj.bias).transpose(1, 2)
    )
    assert z.std() > 0  # z_t varies with the input token
    out = model(x, model.init_cache(2))
    torch.testing.assert_close(out.penalty, z.mean())
    torch.testing.assert_close(out.spans[0], z.mean(dim=(0, 2)))
    x2 = (x + 1) % 20
    assert not torch.allclose(dynamic(model.in_emb(x2)), z)


def test_adaptive_penalty_is_sum_over_layers_of_mean_head_span():
    model = net("adaptive", S=100, n_layers=2)
    with torch.no_grad():
        model.layers[0].attn.adaptive_mask.z_ratio.copy_(torch.tensor([0.1, 0.3]))
        model.layers[1].attn.adaptive_mask.z_ratio.copy_(torch.tensor([0.5, 0.0]))
    out = model(torch.randint(0, 20, (1, 8)), model.init_cache(1))
    # (1/M)·Σ_heads z per layer, summed: (10 + 30)/2 + (50 + 0)/2 = 45
    torch.testing.assert_close(out.penalty, torch.tensor(45.0, dtype=torch.double))
    out.penalty.backward()
    torch.testing.assert_close(
        model.layers[0].attn.adaptive_mask.z_ratio.grad, torch.full((2,), 50.0).double()
    )


# ---------------------------------------------------------------------------------- optimizer
def test_clipped_adagrad_matches_the_code_update():
    torch.manual_seed(0)
    a, b = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(5))
    opt = ClippedAdagrad([a, b], lr=0.07, grad_clip=0.5)
    ref = {"a": a.detach().clone(), "b": b.detach().clone()}
    sums = {"a": torch.zeros(3, 4), "b": torch.zeros(5)}
    for step in range(3):
        grads = {"a": torch.randn(3, 4) * (step + 1), "b": torch.randn(5) * 0.01}  # a clipped, b not
        a.grad, b.grad = grads["a"].clone(), grads["b"].clone()
        opt.step()
        for name, g in grads.items():
            sums[name] += g * g  # the accumulator sees the unclipped gradient
            norm = g.norm().item()
            lr = 0.07 * (0.5 / (norm + 1e-10) if norm > 0.5 else 1.0)
            ref[name] -= lr * g / (sums[name].sqrt() + 1e-10)
        torch.testing.assert_close(a.data, ref["a"])
        torch.testing.assert_close(b.data, ref["b"])
    assert grads["a"].norm() > 0.5 > grads["b"].norm()


# ---------------------------------------------------------------------------------- FLOPs
def test_macs_per_token_matches_the_paper_small_model():
    # Paper Table 1 (text8, small: 12 layers, d=512, inner 2048, 38M parameters): 42M FLOPS at an
    # average span of 314, counted in multiply-accumulates. Our count (3 multiply-adds per head
    # dimension and attended position: content, position, values) gives 43.6M, within 5%.
    flops = macs_per_token(d_model=512, n_layers=12, d_inner=2048, vocab_size=27, spans=314)
    assert abs(flops / 42e6 - 1) < 0.05
    assert abs(parameter_count(512, 12, 2048, 27, 8192, 8) / 38e6 - 1) < 0.02
    assert abs(parameter_count(768, 24, 4096, 206, 8192, 8) / 209e6 - 1) < 0.01  # large: 209M
    # A fixed span of 8192 costs 4.3x the adaptive model: the attention term dominates.
    assert macs_per_token(512, 12, 2048, 27, 8192) / flops > 4
    # The project's convention (longctx.core.flops): 2 FLOPs per multiply-accumulate.
    assert flops_per_token(512, 12, 2048, 27, 314) == 2 * flops


def test_macs_count_matches_the_model_parameters_and_trimming():
    model = net("adaptive", S=512, R=32, n_layers=2)
    weights = (
        sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers") and p.dim() == 2)
        + model.out_emb.weight.numel()
    )
    # with span 0 and no ramp only the weight matrices count: one multiply-add per weight
    assert macs_per_token(16, 2, 32, 20, 0.0) == weights
    # per layer: 3·d·span, mean over heads (mask) or the trimmed attended length of the layer
    base = macs_per_token(16, 2, 32, 20, 0.0)
    spans = [[10.0, 100.0], [0.0, 0.0]]
    assert macs_per_token(16, 2, 32, 20, spans, span_ramp=32, attn_span=512) == base + 3 * 16 * (
        (42 + 132) / 2 + 32
    )
    set_spans(model, [10 / 512, 100 / 512])
    with torch.no_grad():
        model.layers[1].attn.adaptive_mask.z_ratio.zero_()
    out = model(torch.randint(0, 20, (1, 8)), model.init_cache(1))
    trimmed = macs_per_token(16, 2, 32, 20, spans, span_ramp=32, attn_span=512, attended="trimmed")
    assert trimmed == base + 3 * 16 * sum(out.attended)
    assert out.attended == [192, 64]


@pytest.mark.parametrize(
    ("span_kind", "span_trim"), [("adaptive", "head"), ("adaptive", "layer"), ("fixed", "head")]
)
def test_the_networks_flops_read_ramp_cap_and_trimming_from_its_config(span_kind, span_trim):
    """A fixed span has no ramp and trims per layer; an adaptive span adds R and trims as span_trim."""
    config = SpanTransformer.Config(
        d_model=16, n_layers=2, n_heads=2, d_inner=32, attn_span=512, span_kind=span_kind, span_ramp=32,
        span_trim=span_trim,
    )  # fmt: skip
    spans = [[10.0, 100.0], [0.0, 0.0]] if span_kind == "adaptive" else [[512.0] * 2] * 2
    ramp, trim = (32, span_trim) if span_kind == "adaptive" else (0, "layer")
    expected = flops_per_token(
        16, 2, 32, 20, spans, span_ramp=ramp, attn_span=512, attended="trimmed", block=8, trim=trim
    )
    assert network_flops_per_token(config, 20, spans, block=8, attended="trimmed") == expected
    if span_kind == "fixed":  # S for every head: 3·d·S per layer, the re-projection of S states per block
        weights = 2 * (4 * 16**2 + 2 * 16 * 32) + 16 * 20
        assert expected == 2 * (weights + 2 * (3 * 16 * 512 + 2 * 16**2 * 512 / 8))


def test_flops_per_token_per_head_with_the_cache_reprojection_by_hand():
    # d=16, 2 layers, inner 32, V=20, S=512, R=32, blocks of 8 tokens. Per layer 4·16² + 2·16·32 = 2048
    # weight MACs. Layer 0, spans 10 and 100: heads attend 42 and 132 positions (3·16·87 = 4176); its
    # trimmed length is 192 (132 rounded up to 64s of 512) re-projected every block: 2·16²·192/8 = 12288.
    # Layer 1, spans 0: 32 positions each (3·16·32 = 1536), trimmed length 64: 2·16²·64/8 = 4096.
    # Output 16·20 = 320.
    macs = (2048 + 4176 + 12288) + (2048 + 1536 + 4096) + 320
    spans = [[10.0, 100.0], [0.0, 0.0]]
    args = (16, 2, 32, 20, spans)
    assert macs_per_token(*args, span_ramp=32, attn_span=512, block=8) == macs
    assert flops_per_token(*args, span_ramp=32, attn_span=512, block=8) == 2 * macs
