"""The fused attention path (`attention="sdpa"`, one `scaled_dot_product_attention` kernel) equals the
eager, op-by-op path (the authors' computation) to 1e-5 in float32: outputs, per-token NLL and every
gradient, for each method and option; so does the compiled `attention="flex"` at evaluation
(Transformer-XL, TRAMS, the Compressive Transformer, adaptive span; slow tier: each shape compiles
for seconds), which trains with "sdpa"."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch._dynamo.utils import counters

from longctx.methods import attention_kernel
from longctx.methods.adaptive_span.attention import band_attention
from longctx.methods.adaptive_span.module import AdaptiveSpanLM
from longctx.methods.adaptive_span.network import SpanTransformer
from longctx.methods.compressive_transformer.network import CompressiveTransformer
from longctx.methods.transformer_xl.module import TransformerXLLM
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.relative_attention import sinusoid_positions
from longctx.methods.transformer_xl.trams import TramsSettings
from tests.helpers.xl_layers import attend, attention_layer

TOL = {"rtol": 1e-5, "atol": 1e-5}
VOCAB = 40
XL_SIZES = {"n_layers": 2, "d_model": 12, "n_heads": 3, "d_inner": 20, "dropout": 0.0}


def xl_network(**kwargs) -> TransformerXL:
    """Weights N(0, 0.3) (not the code's 0.02): scores of order 1, so that every term shows."""
    torch.manual_seed(0)
    return TransformerXL.Config(**XL_SIZES, init_std=0.3, proj_init_std=0.3, **kwargs).build(VOCAB)


def use_kernel(model: torch.nn.Module, attention: str) -> None:
    for module in model.modules():
        if hasattr(module, "attention"):
            module.attention = attention


def xl_stream(model: TransformerXL, tokens: torch.Tensor, lengths: list[int], memory, **kwargs):
    """Run the segments of the given lengths (the last may be short) with the memory carried; row 0
    starts a new document at the third segment. Returns per segment (hidden, per-token NLL)."""
    outputs, start = [], 0
    for s, n in enumerate(lengths):
        if s == 2:
            memory = memory.reset_rows(torch.tensor([True, False]))
        x, y = tokens[:, start : start + n], tokens[:, start + 1 : start + n + 1]
        out = model(x, memory, **kwargs)
        outputs.append((out.hidden, model.nll(out.hidden, y)))
        memory, start = out.memory, start + n
    return outputs


def xl_eager_and_fused(model: TransformerXL, run, fused: str = "sdpa") -> tuple[list, list, dict, dict]:
    """run(model) -> [(hidden, nll)] on "eager" and the `fused` kernel; the NLL's sum is
    backpropagated when it can be."""
    results = []
    for kernel in ("eager", fused):
        use_kernel(model, kernel)
        model.zero_grad()
        outputs = run(model)
        loss = sum(nll.sum() for _, nll in outputs)
        if loss.requires_grad:
            loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((outputs, grads))
    (eager, eager_grads), (fused, fused_grads) = results
    return eager, fused, eager_grads, fused_grads


def assert_equal_runs(eager, fused, eager_grads, fused_grads) -> None:
    for (h_e, nll_e), (h_f, nll_f) in zip(eager, fused, strict=True):
        torch.testing.assert_close(h_f, h_e, **TOL)
        torch.testing.assert_close(nll_f, nll_e, **TOL)
    assert eager_grads.keys() == fused_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_split_heads_gives_each_head_its_block_of_columns_and_merge_heads_undoes_it():
    """Head h of a projection (..., T, H·Dh) is its columns h·Dh … (h+1)·Dh − 1, for a batch of
    sequences and for position rows alike; merging the heads gives the projection back."""
    H, Dh = 3, 4
    for x in (torch.randn(2, 5, H * Dh), torch.randn(5, H * Dh)):
        heads = attention_kernel.split_heads(x, H)  # (..., H, T, Dh)
        assert heads.shape == (*x.shape[:-2], H, x.shape[-2], Dh)
        for h in range(H):
            assert torch.equal(heads[..., h, :, :], x[..., h * Dh : (h + 1) * Dh])
        assert torch.equal(attention_kernel.merge_heads(heads), x)


@pytest.mark.parametrize(
    ("mem_len", "same_length", "clamp_len"),
    [(0, False, 0), (3, False, 0), (6, True, 0), (6, False, 2), (5, True, 3)],
)
def test_xl_training_fused_equals_eager(mem_len, same_length, clamp_len):
    """Outputs, per-token NLL and every gradient through three segments (empty, partial then full
    memory; a reset row; a short last segment), with gradients flowing through the same segment."""
    model = xl_network().train()
    tokens = torch.randint(0, VOCAB, (2, 15), generator=torch.Generator().manual_seed(1))

    def run(m):
        return xl_stream(
            m,
            tokens,
            [4, 4, 4, 2],
            m.empty_memory(2),
            mem_len=mem_len,
            same_length=same_length,
            clamp_len=clamp_len,
        )

    eager, fused, eager_grads, fused_grads = xl_eager_and_fused(model, run)
    assert len(eager_grads) == len(list(model.parameters()))  # every parameter got a gradient
    assert_equal_runs(eager, fused, eager_grads, fused_grads)


@pytest.mark.parametrize("untie_r", [False, True])
def test_xl_pre_lnorm_and_untied_biases_fused_equals_eager(untie_r):
    model = xl_network(pre_lnorm=True, untie_r=untie_r).train()
    tokens = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(2))

    def run(m):
        return xl_stream(m, tokens, [4, 4, 4], m.empty_memory(2), mem_len=5)

    assert_equal_runs(*xl_eager_and_fused(model, run))


@pytest.mark.parametrize("cache_kv", [False, True])
@pytest.mark.parametrize("same_length", [False, True])
def test_xl_evaluation_with_the_key_value_cache_fused_equals_eager(cache_kv, same_length):
    run = xl_evaluation(mem_len=6, same_length=same_length, clamp_len=3, cache_kv=cache_kv)
    assert_equal_runs(*xl_eager_and_fused(xl_network().eval(), run))


def xl_evaluation(**options):
    """A run for `xl_eager_and_fused`: five segments at evaluation (memory empty, partial, full; a
    reset row; a short last segment) with the given memory options."""
    tokens = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(3))

    def run(m):
        with torch.no_grad():
            return xl_stream(m, tokens, [4, 4, 4, 4, 2], m.empty_memory(2), **options)

    return run


@pytest.mark.parametrize("positions", ["compact", "true"])
@pytest.mark.parametrize(("metric", "cache_kv"), [("code", True), ("code", False), ("oracle", False)])
@pytest.mark.parametrize("first", ["zero", "empty"])
def test_trams_fused_equals_eager(positions, metric, cache_kv, first):
    """TRAMS's per-head windows (m = 4 of a pool M = 8, 2 kept): compact and true positions, the
    score and key/value caches, a zero-filled (TRAMS) or empty (XL) first memory."""
    model = xl_network().eval()
    tokens = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(4))
    memory = model.zero_memory(2, 8) if first == "zero" else model.empty_memory(2)

    def run(m):
        with torch.no_grad():
            return xl_stream(
                m,
                tokens,
                [4, 4, 4, 4, 4, 2],
                memory,
                mem_len=8,
                same_length=True,
                cache_kv=cache_kv,
                trams=TramsSettings(4, 2, metric, positions),
            )

    assert_equal_runs(*xl_eager_and_fused(model, run))


def test_xl_is_fused_by_default_and_eager_when_the_probabilities_are_asked(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    model = xl_network().eval()
    x = torch.randint(0, VOCAB, (2, 4))
    model(x, model.empty_memory(2), mem_len=4)
    assert len(calls) == 2  # one kernel per layer
    out = model(x, model.empty_memory(2), mem_len=4, need_mass=True, need_weights=True)
    assert len(calls) == 2 and all(a.probs is not None and a.mem_mass is not None for a in out.attn)


def test_xl_query_without_keys_is_nan_as_in_eager():
    """same_length with mem_len 0 leaves every query without a key: eager's softmax gives NaN, and the
    fused path must not silently turn it into zeros."""
    model = xl_network().eval()
    x = torch.randint(0, VOCAB, (2, 4))
    with torch.no_grad():
        outs = []
        for kernel in ("eager", "sdpa"):
            use_kernel(model, kernel)
            outs.append(model(x, model.empty_memory(2), mem_len=0, same_length=True).hidden)
    assert outs[0].isnan().all() and outs[1].isnan().all()


def test_xl_fused_applies_attention_dropout_in_training_only():
    torch.manual_seed(0)
    attn = attention_layer(d_model=8, n_heads=2, d_head=4, dropatt=0.5)
    x, mem = torch.randn(2, 4, 8), torch.randn(2, 3, 8)
    valid, biases = torch.ones(2, 3, dtype=torch.bool), (torch.zeros(2, 4), torch.zeros(2, 4))
    args = (attn, x, mem, valid, sinusoid_positions(7, 8), *biases)
    first, second = attend(*args).out, attend(*args).out
    assert not torch.allclose(first, second)  # probabilities dropped, a fresh draw each call
    attn.eval()
    torch.testing.assert_close(attend(*args).out, attend(*args).out, rtol=0, atol=0)


def test_bad_attention_kernel_is_one_line():
    expected = (
        r"^attention must be 'eager', 'sdpa' \(fused, the default\) or 'flex' \(compiled, evaluation\), "
        r"got 'flash'$"
    )
    with pytest.raises(ValueError, match=expected):
        xl_network(attention="flash")


def test_flex_refuses_a_head_dimension_cuda_cannot_run_in_one_line():
    """Inductor's CUDA flex kernel needs a head dimension of 16: a narrower model is told so before
    compiling (checked with a stand-in for a CUDA query: the test tier has no GPU)."""

    class CudaQuery:  # what `compile_flex` reads of its first argument
        is_cuda = True
        shape = (2, 4, 16, 8)  # (B, H, M, Dh)

    @attention_kernel.compile_flex
    def never_called(q):  # pragma: no cover - refused before compiling
        raise AssertionError

    expected = (
        r"^attention 'flex' needs a head dimension of at least 16 on CUDA \(this model's is 8\): "
        r"use attention 'sdpa', or fewer, wider heads$"
    )
    with pytest.raises(ValueError, match=expected):
        never_called(CudaQuery())


# ------------------------------------------------------------------ Transformer-XL by flex_attention


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mem_len", "same_length", "clamp_len", "cache_kv"),
    [
        (0, False, 0, False),
        (3, False, 0, False),
        (6, True, 3, True),
        (5, True, 0, False),
        (6, False, 2, True),
    ],
)
def test_xl_evaluation_flex_equals_eager(mem_len, same_length, clamp_len, cache_kv):
    """Compiled flex_attention (the position term read per distance, masks in its score_mod) equals
    eager through five segments: empty, partial then full memory, a reset row, a short last one."""
    run = xl_evaluation(mem_len=mem_len, same_length=same_length, clamp_len=clamp_len, cache_kv=cache_kv)
    assert_equal_runs(*xl_eager_and_fused(xl_network().eval(), run, fused="flex"))


@pytest.mark.slow
@pytest.mark.parametrize(("positions", "cache_kv"), [("compact", True), ("true", False)])
def test_trams_flex_equals_eager(positions, cache_kv):
    """TRAMS's per-head windows (m = 4 of M = 8, 2 kept, zero-filled first memory) by flex."""
    model = xl_network().eval()
    tokens = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(4))

    def run(m):
        with torch.no_grad():
            return xl_stream(
                m,
                tokens,
                [4, 4, 4, 4, 4, 2],
                model.zero_memory(2, 8),
                mem_len=8,
                same_length=True,
                cache_kv=cache_kv,
                trams=TramsSettings(4, 2, "code", positions),
            )

    assert_equal_runs(*xl_eager_and_fused(model, run, fused="flex"))


@pytest.mark.slow
def test_xl_flex_compiles_once_per_shape():
    """One graph per (queries, keys) shape while the memory fills, shared by the layers; none once it
    is full (as `CompileNetwork` is checked in tests/callbacks/test_compile.py)."""
    torch._dynamo.reset()
    counters.clear()
    model = xl_network().eval()
    use_kernel(model, "flex")
    tokens = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(5))
    memory, graphs = model.empty_memory(2), []
    with torch.no_grad():
        for s in range(8):
            out = model(tokens[:, 4 * s : 4 * s + 4], memory, mem_len=6, same_length=True, cache_kv=True)
            memory = out.memory
            graphs.append(int(counters["stats"]["unique_graphs"]))
    # Segments 0, 1, 2 meet 0, 4 and 6 memory slots (4, 8, 10 keys); from segment 2 on it is full.
    assert graphs == [1, 2, 3, 3, 3, 3, 3, 3], graphs


@pytest.mark.slow
def test_compressive_transformer_evaluation_flex_equals_eager():
    """The Compressive Transformer's layers ([compressed; memory; segment] keys, same_length) by flex."""
    torch.manual_seed(0)
    model = (
        CompressiveTransformer.Config(**XL_SIZES, compression="conv", compression_rate=2).build(VOCAB).eval()
    )
    tokens = torch.randint(0, VOCAB, (2, 18), generator=torch.Generator().manual_seed(6))
    hidden = {}
    for kernel in ("eager", "flex"):
        use_kernel(model, kernel)
        memory, hidden[kernel] = model.empty_memory(2), []
        with torch.no_grad():
            for x in tokens.split(3, dim=1):
                out = model(x, memory, mem_len=4, cmem_len=3, same_length=True)
                memory = out.memory
                hidden[kernel].append(out.hidden)
    for flex, eager in zip(hidden["flex"], hidden["eager"], strict=True):
        torch.testing.assert_close(flex, eager, **TOL)


def test_xl_flex_trains_with_sdpa_saying_so_once(monkeypatch, caplog):
    """flex_attention has no backward on CPU: a step that records a gradient runs the fused SDPA
    kernel (the same numbers as "sdpa", bit for bit), and the log says so once."""
    import longctx.methods.transformer_xl.relative_attention as relative_attention

    monkeypatch.setattr(relative_attention, "relative_flex_attention", lambda *a: pytest.fail("flex ran"))
    attention_kernel._say_flex_trains_with_sdpa.cache_clear()
    model = xl_network().train()
    x = torch.randint(0, VOCAB, (2, 4))
    runs = []
    with caplog.at_level(logging.WARNING, logger=attention_kernel.__name__):
        for kernel in ("sdpa", "flex", "flex"):
            use_kernel(model, kernel)
            model.zero_grad()
            out = model(x, model(x, model.empty_memory(2), mem_len=4).memory, mem_len=4)
            out.hidden.sum().backward()
            runs.append((out.hidden, model.layers[0].attn.qkv_net.weight.grad.clone()))
    assert [r.getMessage() for r in caplog.records] == [
        "attention 'flex' computes evaluation only (flex_attention has no backward on CPU and no attention "
        "dropout): training steps run 'sdpa', equal to float rounding"
    ]
    for hidden, grad in runs[1:]:
        torch.testing.assert_close(hidden, runs[0][0], rtol=0, atol=0)
        torch.testing.assert_close(grad, runs[0][1], rtol=0, atol=0)


def test_dynamic_span_refuses_flex_in_one_line():
    expected = (
        r"^attention 'flex' needs a fixed or adaptive span \(the dynamic span's attended length changes "
        r"every block, a compilation each\): use 'sdpa' \(fused\) or 'eager'$"
    )
    with pytest.raises(ValueError, match=expected):
        span_network("dynamic", attention="flex")


# ------------------------------------------------------------------ adaptive span


def span_network(
    span: str, dropout: float = 0.0, z_ratio: list[float] | None = None, **kwargs
) -> SpanTransformer:
    """z_ratio: every layer's z' per head (None: the initial ones)."""
    torch.manual_seed(0)
    model = SpanTransformer.Config(
        d_model=16,
        n_layers=2,
        n_heads=2,
        d_inner=32,
        attn_span=80,
        dropout=dropout,
        span_kind=span,
        span_ramp=8,
        chunk_size=8,
        **kwargs,
    ).build(VOCAB)
    if z_ratio is not None:
        with torch.no_grad():
            for layer in model.layers:
                layer.attn.adaptive_mask.z_ratio.copy_(torch.tensor(z_ratio))
    return model


def span_eager_and_fused(
    model: SpanTransformer, tokens: torch.Tensor, lengths: list[int], fused: str = "sdpa"
):
    """Blocks of the given lengths with the cache carried (row 0 reset before the third block); per
    kernel ("eager" and `fused`) the blocks' (logits, per-token NLL) and the gradients of their summed
    NLL and span penalty (when gradients are recorded)."""
    results = []
    for kernel in ("eager", fused):
        use_kernel(model, kernel)
        model.zero_grad()
        cache, outputs, start, loss = model.init_cache(2, device=tokens.device), [], 0, 0.0
        for s, n in enumerate(lengths):
            if s == 2:
                cache = cache.reset_rows(torch.tensor([True, False]))
            out = model(tokens[:, start : start + n], cache)
            target = tokens[:, start + 1 : start + n + 1]
            nll = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), target, reduction="none")
            outputs.append((out.logits, nll))
            loss = loss + nll.sum() + (out.penalty if out.penalty is not None else 0.0)
            cache, start = out.cache, start + n
        if loss.requires_grad:
            loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((outputs, grads))
    (eager, eager_grads), (fused, fused_grads) = results
    return eager, fused, eager_grads, fused_grads


@pytest.mark.parametrize(
    ("span", "z_ratio", "span_trim"),
    [
        ("fixed", None, "head"),
        ("adaptive", [1.0, 1.0], "head"),  # untrimmed: every head attends all S = 80 positions
        ("adaptive", [0.3, 0.05], "head"),  # heads trimmed to their own 64- and 1·64-rounded lengths
        ("adaptive", [0.9, 0.05], "layer"),  # the code's per-layer trimming; masks 0 inside the band
        ("dynamic", None, "head"),
    ],
)
def test_adaptive_span_fused_equals_eager(span, z_ratio, span_trim):
    """Logits, per-token NLL and every gradient (z' and the dynamic span's projection included)
    through blocks with the cache carried, a reset row and a short last block."""
    model = span_network(span, span_trim=span_trim, z_ratio=z_ratio).train()
    tokens = torch.randint(0, VOCAB, (2, 63), generator=torch.Generator().manual_seed(5))
    eager, fused, eager_grads, fused_grads = span_eager_and_fused(model, tokens, [20, 20, 20, 2])
    assert len(eager_grads) == len(list(model.parameters()))
    assert_equal_runs(eager, fused, eager_grads, fused_grads)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("span", "z_ratio", "span_trim"),
    [("fixed", None, "head"), ("adaptive", [0.3, 0.05], "head"), ("adaptive", [0.9, 0.05], "layer")],
)
def test_adaptive_span_evaluation_flex_equals_eager(span, z_ratio, span_trim):
    """Compiled flex_attention (position logits and log-mask per query and distance in one table) equals
    eager at evaluation: fixed span, heads trimmed to their own lengths, the code's per-layer trimming,
    the cache carried, a reset row and a short last block."""
    model = span_network(span, span_trim=span_trim, z_ratio=z_ratio).eval()
    tokens = torch.randint(0, VOCAB, (2, 63), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert_equal_runs(*span_eager_and_fused(model, tokens, [20, 20, 20, 2], fused="flex"))


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
@pytest.mark.parametrize("mask_kind", ["none", "per_head", "per_query"])
def test_band_attention_fused_equals_eager_with_zero_mask_entries(chunk_size, mask_kind):
    """Masks with exact zeros (log m = −inf) and values inside the ramp; the gradients of q, k, v, the
    position embedding and the mask stay finite and equal."""
    g = torch.Generator().manual_seed(6)
    B, H, M, L, Dh = 2, 3, 13, 5, 4
    tensors = [torch.randn(B, H, M, Dh, generator=g), *torch.randn(2, B, H, L + M, Dh, generator=g)]
    tensors.append(torch.randn(Dh, L, generator=g))
    if mask_kind != "none":
        shape = (1, H, 1, L) if mask_kind == "per_head" else (B, H, M, L)
        mask = torch.rand(shape, generator=g).sub(0.3).clamp(0.0, 1.0)
        mask[..., -1] = 1.0  # distance 1 always has mask 1
        assert (mask == 0).any()
        tensors.append(mask)
    outs, grads = [], []
    for fused in (False, True):
        leaves = [t.clone().requires_grad_() for t in tensors]
        q, k, v, pe, *mask = leaves
        out = band_attention(q, k, v, pe, mask[0] if mask else None, torch.nn.Dropout(0.0), chunk_size, fused)
        out.square().sum().backward()
        outs.append(out)
        grads.append([t.grad for t in leaves])
    torch.testing.assert_close(outs[1], outs[0], **TOL)
    for fused_grad, eager_grad in zip(grads[1], grads[0], strict=True):
        assert fused_grad.isfinite().all()
        torch.testing.assert_close(fused_grad, eager_grad, **TOL)


def test_adaptive_span_fused_differs_from_eager_only_by_the_codes_epsilon():
    """The code renormalises by Σ m·p + 1e-8 (p: the unmasked softmax): eager is the log-mask softmax
    times 1 / (1 + 1e-8 / Σ m·p). One query, two keys: distance 2 (mask 0) takes all but p₁ = 1e-4
    of the probability, distance 1 (mask 1) p₁; the output is its value, shrunk by eager only."""
    q = torch.tensor([1.0, 0.0], dtype=torch.double).view(1, 1, 1, 2)
    p1 = 1e-4
    k = torch.zeros(1, 1, 3, 2, dtype=torch.double)
    k[0, 0, 0, 0] = math.log((1 - p1) / p1) * math.sqrt(2)  # distance-2 key: score log((1 − p₁)/p₁)
    v = torch.ones(1, 1, 3, 2, dtype=torch.double)
    pe, mask = (
        torch.zeros(2, 2, dtype=torch.double),
        torch.tensor([0.0, 1.0], dtype=torch.double).view(1, 1, 1, 2),
    )
    out = {
        fused: band_attention(q, k, v, pe, mask, torch.nn.Dropout(0.0), 64, fused) for fused in (False, True)
    }
    torch.testing.assert_close(out[True], torch.ones_like(out[True]), rtol=1e-12, atol=0)
    torch.testing.assert_close(
        out[False] / out[True], torch.full_like(out[True], 1 / (1 + 1e-8 / p1)), rtol=1e-9, atol=0
    )


def test_adaptive_span_is_fused_by_default():
    assert all(layer.attn.attention == "sdpa" for layer in span_network("adaptive").layers)


def test_fused_band_attention_drops_normalised_probabilities():
    """Dropout on the renormalised probabilities (scaled by 1/(1 − p)), as the code: a fresh draw per
    call whose average over draws is the output without dropout."""
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 2, 6, 4, generator=g), *torch.randn(2, 1, 2, 11, 4, generator=g)
    pe, mask = torch.randn(4, 5, generator=g), torch.rand(1, 2, 1, 5, generator=g)
    dropout = torch.nn.Dropout(0.5)
    draws = torch.stack([band_attention(q, k, v, pe, mask, dropout, 4, fused=True) for _ in range(1000)])
    assert not torch.equal(draws[0], draws[1])
    expected = band_attention(q, k, v, pe, mask, dropout.eval(), 4, fused=False)
    torch.testing.assert_close(draws.mean(0), expected, rtol=0, atol=0.15)


# ------------------------------------------------------------------ the knob in the modules


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_the_modules_hand_the_knob_to_every_layer(attention):
    """`model.init_args.network.attention` of the configs reaches every attention layer."""
    sizes = {"n_layers": 2, "d_model": 8, "n_heads": 2, "d_inner": 16}
    xl = TransformerXLLM(vocab_size=30, network={**sizes, "attention": attention})
    flex = TransformerXLLM(vocab_size=30, network={**sizes, "attention": "flex"})
    assert [layer.attn.attention for layer in flex.net.layers] == ["flex"] * 2
    span = AdaptiveSpanLM(vocab_size=30, network={**sizes, "attn_span": 16})
    assert span.net.layers[0].attn.attention == "sdpa"  # the default
    span = AdaptiveSpanLM(vocab_size=30, network={**sizes, "attn_span": 16, "attention": attention})
    assert [layer.attn.attention for layer in xl.net.layers] == [attention] * 2
    assert [layer.attn.attention for layer in span.net.layers] == [attention] * 2
