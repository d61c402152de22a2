"""The Compressive Transformer (Rae et al. 2020) against Transformer-XL on the same weights and against
hand computations: n_cm = 0 is XL; c = 1 with an identity f_c is XL with memory n_m + n_cm; the FIFO
order of both memories and eviction at partial memories; a document reset of one row; the
reconstruction loss reaches f_c only; each f_c against a direct computation; the FLOPs by hand; the
Lightning module's evaluation sizes, logs and separate gradient clipping."""

from __future__ import annotations

import dataclasses
import logging
from functools import partial
from types import SimpleNamespace

import lightning
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from torch.utils.flop_counter import FlopCounterMode

from longctx.methods.compressive_transformer.compression import Decoder, build_compression
from longctx.methods.compressive_transformer.flops import macs_per_token
from longctx.methods.compressive_transformer.memory import evicted_count
from longctx.methods.compressive_transformer.module import (
    CompressiveEvaluationMemory,
    CompressiveLengths,
    CompressiveTransformerLM,
)
from longctx.methods.compressive_transformer.network import CompressiveTransformer
from longctx.methods.transformer_xl.network import TransformerXL
from tests.helpers.environment import REPO
from tests.helpers.lm_fixtures import SyntheticData, cpu_trainer
from tests.helpers.methods import tiny as tiny_method

SIZES = dict(n_layers=2, d_model=16, n_heads=2, d_inner=24, dropout=0.0)
VOCAB = 30


def xl_and_compressive(**compressive) -> tuple[TransformerXL, CompressiveTransformer]:
    """A Transformer-XL and a Compressive Transformer holding the same weights (double, eval)."""
    torch.manual_seed(0)
    xl = TransformerXL.Config(**SIZES).build(VOCAB).double().eval()
    ct = CompressiveTransformer.Config(**compressive, **SIZES).build(VOCAB).double().eval()
    missing, unexpected = ct.load_state_dict(xl.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("compressors.") for k in missing)
    return xl, ct


def segments(n_segments: int, n: int = 3, batch: int = 2, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return list(torch.randint(0, VOCAB, (batch, n * n_segments), generator=g).split(n, dim=1))


# ---------------------------------------------------------------------------------- against XL
@pytest.mark.parametrize("same_length", [False, True])
def test_no_compressed_memory_is_exactly_transformer_xl(same_length):
    xl, ct = xl_and_compressive(compression="conv", compression_rate=2)
    xl_memory, ct_memory = xl.empty_memory(2), ct.empty_memory(2)
    for x in segments(5):
        want = xl(x, xl_memory, mem_len=4, same_length=same_length, clamp_len=3)
        got = ct(x, ct_memory, mem_len=4, cmem_len=0, same_length=same_length, clamp_len=3)
        xl_memory, ct_memory = want.memory, got.memory
        assert torch.equal(got.hidden, want.hidden)
        assert all(torch.equal(a, b) for a, b in zip(ct_memory.hidden, xl_memory.hidden))
        assert torch.equal(ct_memory.valid, xl_memory.valid)
        assert ct_memory.compressed_valid.shape[1] == 0


@pytest.mark.parametrize("same_length", [False, True])
def test_rate_one_identity_compression_is_xl_with_memory_n_m_plus_n_cm(same_length):
    xl, ct = xl_and_compressive(compression="max_pool", compression_rate=1)  # max over 1 = identity
    xl_memory, ct_memory = xl.empty_memory(2), ct.empty_memory(2)
    for x in segments(6):
        want = xl(x, xl_memory, mem_len=7, same_length=same_length)
        got = ct(x, ct_memory, mem_len=4, cmem_len=3, same_length=same_length)
        xl_memory, ct_memory = want.memory, got.memory
        torch.testing.assert_close(got.hidden, want.hidden, rtol=0, atol=1e-12)
        for cm, m, xl_m in zip(ct_memory.compressed, ct_memory.hidden, xl_memory.hidden):
            assert torch.equal(torch.cat([cm, m], dim=1), xl_m)
        assert torch.equal(torch.cat([ct_memory.compressed_valid, ct_memory.valid], 1), xl_memory.valid)
    assert ct_memory.compressed_valid.shape[1] == 3 and ct_memory.valid.shape[1] == 4


# ---------------------------------------------------------------------------------- the memories
def test_fifo_order_of_both_memories_hand_computed():
    """n_s = 3, n_m = 4, n_cm = 3, c = 2, mean pooling; layer 0 stores the embeddings e_1, e_2, …:
    segment 1: m = e1..e3;                      cm = -
    segment 2: evict e1 e2;                     m = e3..e6,  cm = (e1+e2)/2
    segment 3: overflow 3, evict 2 (whole pair) m = e5..e9,  cm = e12, e34
    segment 4: overflow 4, evict e5..e8;        m = e9..e12, cm = e34, e56, e78 (e12 drops out)
    segment 5: overflow 3, evict e9 e10;        m = e11..e15, cm = e56, e78, e9,10"""
    _, ct = xl_and_compressive(compression="mean_pool", compression_rate=2)
    tokens = torch.arange(1, 16)[None].repeat(2, 1)
    emb = ct.word_emb(tokens)[0]  # e_t = emb[t − 1]

    def pair(t: int) -> torch.Tensor:
        return (emb[t - 1] + emb[t]) / 2

    expected = [
        (range(1, 4), []),
        (range(3, 7), [1]),
        (range(5, 10), [1, 3]),
        (range(9, 13), [3, 5, 7]),
        (range(11, 16), [5, 7, 9]),
    ]
    memory = ct.empty_memory(2)
    for x, (kept, pairs) in zip(tokens.split(3, dim=1), expected):
        memory = ct(x, memory, mem_len=4, cmem_len=3).memory
        torch.testing.assert_close(memory.hidden[0][1], emb[[t - 1 for t in kept]])
        want_cm = torch.stack([pair(t) for t in pairs]) if pairs else emb[:0]
        torch.testing.assert_close(memory.compressed[0][1], want_cm)
        assert memory.valid.all() and memory.compressed_valid.all()


@pytest.mark.parametrize(
    ("held", "segment", "mem_len", "rate", "compressing", "evicted"),
    [
        (0, 3, 4, 2, True, 0),  # the memory fills
        (3, 3, 4, 2, True, 2),  # overflow 2
        (4, 3, 4, 2, True, 2),  # overflow 3: one state waits for its pair
        (5, 3, 4, 2, True, 4),
        (4, 3, 4, 2, False, 3),  # nothing compressed (n_cm = 0): exactly XL's overflow
        (0, 5, 0, 2, True, 4),  # no memory: the segment itself is compressed, one state waits
        (2, 3, 4, 3, True, 0),  # overflow 1 < c
    ],
)
def test_eviction_at_partial_memories_is_whole_groups(held, segment, mem_len, rate, compressing, evicted):
    assert evicted_count(held, segment, mem_len, rate, compressing) == evicted


def test_reset_of_one_row_clears_both_memories_and_the_row_restarts_as_fresh():
    _, ct = xl_and_compressive(compression="mean_pool", compression_rate=2)
    stream = segments(7, n=2, batch=2, seed=3)
    run = partial(ct, mem_len=4, cmem_len=2)
    memory = ct.empty_memory(2)
    for x in stream[:4]:
        memory = run(x, memory).memory
    cleared = memory.reset_rows(torch.tensor([False, True]))
    for before, after in zip([*memory.hidden, *memory.compressed], [*cleared.hidden, *cleared.compressed]):
        assert torch.equal(after[0], before[0]) and not after[1].any()
    assert torch.equal(cleared.valid[0], memory.valid[0]) and not cleared.valid[1].any()
    assert cleared.compressed_valid[0].all() and not cleared.compressed_valid[1].any()
    kept, fresh = memory, ct.empty_memory(1)
    memory = cleared
    for x in stream[4:]:
        out, untouched = run(x, memory), run(x, kept)
        alone = run(x[1:], fresh)
        memory, kept, fresh = out.memory, untouched.memory, alone.memory
        torch.testing.assert_close(out.hidden[0], untouched.hidden[0], rtol=0, atol=1e-12)  # row 0
        torch.testing.assert_close(out.hidden[1:], alone.hidden, rtol=0, atol=1e-12)  # row 1


# ---------------------------------------------------------------------------------- key/value cache
@pytest.mark.parametrize(
    "compression,pre_lnorm,same_length",
    [("conv", False, False), ("most_used", True, True), ("mean_pool", False, True)],
)
def test_the_key_value_cache_gives_the_uncached_outputs_and_memories(compression, pre_lnorm, same_length):
    """Every segment's output and both memories equal the uncached run's (double precision) through
    partial memories, compression, a trimmed compressed memory and a reset row; the caches hold the
    layers' own projections of the slots."""
    torch.manual_seed(0)
    ct = CompressiveTransformer.Config(
        compression=compression, compression_rate=2, pre_lnorm=pre_lnorm, **SIZES
    ).build(VOCAB)
    ct = ct.double().eval()
    lengths = dict(mem_len=4, cmem_len=3, clamp_len=5, same_length=same_length)
    plain, cached = ct.empty_memory(2), ct.empty_memory(2)
    with torch.no_grad():
        for step, x in enumerate(segments(8)):
            if step == 5:  # row 0 starts a new document: the cache is dropped and restarts
                reset = torch.tensor([True, False])
                plain, cached = (m.reset_rows(reset) for m in (plain, cached))
                assert cached.kv is None and cached.compressed_kv is None
            want, got = ct(x, plain, **lengths), ct(x, cached, **lengths, cache_kv=True)
            plain, cached = want.memory, got.memory
            torch.testing.assert_close(got.hidden, want.hidden, rtol=0, atol=1e-12)
            for a, b in zip([*cached.hidden, *cached.compressed], [*plain.hidden, *plain.compressed]):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
            assert torch.equal(cached.valid, plain.valid) and torch.equal(
                cached.compressed_valid, plain.compressed_valid
            )
            for layer, kv, h, ckv, cm in zip(
                ct.layers, cached.kv, cached.hidden, cached.compressed_kv, cached.compressed
            ):
                torch.testing.assert_close(kv, layer.attn.project_kv(h), rtol=0, atol=1e-12)
                torch.testing.assert_close(ckv, layer.attn.project_kv(cm), rtol=0, atol=1e-12)
    assert plain.kv is None and cached.compressed_valid.shape[1] == 3  # filled, then trimmed to n_cm


def test_the_module_evaluates_with_the_cache_by_default_and_equally_without_it():
    cached = tiny(evaluation={"cmem_len": 3}).eval()
    plain = tiny(evaluation={"cmem_len": 3, "cache_kv": False}).eval()
    assert (cached.eval_cache_kv, plain.eval_cache_kv) == (True, False)
    g = torch.Generator().manual_seed(0)
    memories = [model.init_memory(2) for model in (cached, plain)]
    with torch.no_grad():
        for _ in range(6):
            batch = {
                "input": torch.randint(0, 64, (2, 4), generator=g),
                "target": torch.randint(0, 64, (2, 4), generator=g),
            }
            outs = [model.step(batch, memory) for model, memory in zip((cached, plain), memories)]
            memories = [out.memory for out in outs]
            torch.testing.assert_close(outs[0].nll, outs[1].nll, rtol=0, atol=1e-5)
    assert memories[0].kv is not None and memories[1].kv is None


# ---------------------------------------------------------------------------------- training f_c
def gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("reconstruction", ["attention", "autoencoding"])
def test_reconstruction_loss_leaves_main_gradients_unchanged_and_reaches_only_f_c(reconstruction):
    torch.manual_seed(0)
    ct = (
        CompressiveTransformer.Config(compression_rate=2, reconstruction=reconstruction, **SIZES)
        .build(VOCAB)
        .double()
    )
    stream = segments(4)
    memory = ct.empty_memory(2)
    with torch.no_grad():
        for x in stream[:3]:
            memory = ct(x, memory, mem_len=4, cmem_len=2).memory
    assert memory.compressed_valid.shape[1] == 2  # f_c's output is attended in the last segment

    def losses() -> tuple[torch.Tensor, torch.Tensor]:
        out = ct(stream[3], memory, mem_len=4, cmem_len=2, need_reconstruction=True)
        return ct.nll(out.hidden, stream[3]).mean(), out.reconstruction_loss

    lm, reconstruction_loss = losses()
    assert reconstruction_loss.item() > 0
    alone = gradients(ct, lm)
    lm, reconstruction_loss = losses()
    both = gradients(ct, lm + 5.0 * reconstruction_loss)
    trained_by_it = {k for k in both if k.startswith(("compressors.", "decoders."))}
    assert trained_by_it and any(k.startswith("decoders.") for k in trained_by_it) == (
        reconstruction == "autoencoding"
    )
    for name, grad in both.items():
        if name in trained_by_it:
            assert alone[name] is None  # the language-model loss never reaches f_c
            assert grad is not None and grad.abs().sum() > 0
        else:
            assert torch.equal(grad, alone[name]), name


def test_reconstruction_is_a_zero_tied_to_f_c_before_anything_is_compressed():
    torch.manual_seed(0)
    ct = CompressiveTransformer.Config(compression_rate=2, **SIZES).build(VOCAB)
    out = ct(segments(1)[0], ct.empty_memory(2), mem_len=4, cmem_len=2, need_reconstruction=True)
    assert out.reconstruction_loss.item() == 0
    out.reconstruction_loss.backward()  # every f_c parameter gets a (zero) gradient: DDP needs one
    assert all(p.grad is not None and not p.grad.any() for p in ct.compressors.parameters())


# ---------------------------------------------------------------------------------- f_c
def grouped(states: torch.Tensor, rate: int) -> torch.Tensor:
    return states.view(states.shape[0], -1, rate, states.shape[2])  # (B, k, c, d)


@pytest.mark.parametrize("kind", ["max_pool", "mean_pool"])
def test_pooling_against_direct_computation(kind):
    states = torch.randn(2, 6, 4, dtype=torch.double)
    want = grouped(states, 3).amax(2) if kind == "max_pool" else grouped(states, 3).mean(2)
    torch.testing.assert_close(build_compression(kind, 4, 3)(states), want)


def test_convolution_against_direct_computation():
    torch.manual_seed(0)
    f_c = build_compression("conv", 4, 3).double()
    states = torch.randn(2, 6, 4, dtype=torch.double)
    w, b = f_c.conv.weight, f_c.conv.bias  # (d_out, d_in, c), (d_out,)
    want = torch.einsum("oit,bkti->bko", w, grouped(states, 3)) + b
    torch.testing.assert_close(f_c(states), want)


def test_dilated_convolutions_against_direct_computation():
    """c = 4: kernel-2 convolutions with dilations 1 and 2, causal within each group of 4."""
    torch.manual_seed(0)
    f_c = build_compression("dilated_conv", 3, 4).double()
    assert [conv.dilation[0] for conv in f_c.convs] == [1, 2]
    states = torch.randn(2, 8, 3, dtype=torch.double)
    (w1, b1), (w2, b2) = [(conv.weight, conv.bias) for conv in f_c.convs]  # (d, d, 2), (d,)
    want = torch.empty(2, 2, 3, dtype=torch.double)
    for b in range(2):
        for k in range(2):
            x = states[b, 4 * k : 4 * k + 4]  # (4, d)

            def tap(seq, t, w, bias, dilation):
                back = seq[t - dilation] if t >= dilation else torch.zeros_like(seq[t])
                return bias + w[:, :, 0] @ back + w[:, :, 1] @ seq[t]

            y1 = torch.stack([F.relu(tap(x, t, w1, b1, 1)) for t in range(4)])
            want[b, k] = tap(y1, 3, w2, b2, 2)
    torch.testing.assert_close(f_c(states), want)


def test_most_used_keeps_the_most_attended_states_in_order():
    states = torch.arange(12.0).view(1, 6, 2)
    usage = torch.tensor([[0.1, 0.5, 0.0, 0.3, 0.05, 0.2]])
    kept = build_compression("most_used", 2, 2)(states, usage)  # 3 of 6: slots 1, 3, 5
    torch.testing.assert_close(kept, states[:, [1, 3, 5]])


def test_decoder_is_a_transposed_convolution():
    torch.manual_seed(0)
    g = Decoder(4, 3).double()
    compressed = torch.randn(2, 2, 4, dtype=torch.double)
    w, b = g.deconv.weight, g.deconv.bias  # (d_in, d_out, c)
    want = torch.einsum("ios,bki->bkso", w, compressed).reshape(2, 6, 4) + b
    torch.testing.assert_close(g(compressed), want)


def test_unknown_compression_names_the_choices():
    with pytest.raises(ValueError, match="compression must be one of conv, max_pool"):
        build_compression("avg", 4, 2)


# ---------------------------------------------------------------------------------- FLOPs
def test_flops_counted_by_hand():
    """d = 8, 2 heads of 4, d_inner 16, V = 10, n = 4, n_m = 4, n_cm = 2 (P = 6, W = 10), c = 2.
    Per layer: q,k,v 3·8·8 = 192; memory k,v again 2·8·8·6/4 = 192; positions 8·8·10/4 = 160;
    scores and sum 3·8·10 = 240; output 8·8 = 64; feed-forward 2·8·16 = 256: 1104, + conv f_c
    8² = 64 per evicted state, one per token. Softmax 8·10 = 80."""

    def config(compression: str, rate: int) -> CompressiveTransformer.Config:
        sizes = dict(n_layers=2, d_model=8, n_heads=2, d_head=4, d_inner=16)
        return CompressiveTransformer.Config(**sizes, compression=compression, compression_rate=rate)

    lengths = CompressiveLengths(mem_len=4, cmem_len=2)
    conv = macs_per_token(config("conv", 2), 10, lengths, 4)
    assert conv == 2 * 1168 + 80
    assert macs_per_token(config("max_pool", 3), 10, lengths, 4) == 2 * 1104 + 80
    assert macs_per_token(config("dilated_conv", 4), 10, lengths, 4) == 2 * (1104 + 2 * 64 * 2) + 80
    # With the key/value cache the memories are not projected again (− 192); the n/c = 2 states
    # compressed per segment are, once: 2·8·8·2/4 = 64.
    cached = macs_per_token(config("conv", 2), 10, lengths, 4, cache_kv=True)
    assert cached == 2 * (1168 - 192 + 64) + 80
    network = dict(n_layers=2, d_model=8, n_heads=2, d_inner=16, compression_rate=2)
    sizes = dict(vocab_size=10, network=network, mem_len=9, cmem_len=9)
    evaluation = dict(mem_len=4, cmem_len=2)
    assert (
        CompressiveTransformerLM(**sizes, evaluation=evaluation).flops_per_token(4) == 2 * cached
    )  # cache: on
    uncached = CompressiveTransformerLM(**sizes, evaluation={**evaluation, "cache_kv": False})
    assert uncached.flops_per_token(4) == 2 * conv


@pytest.mark.parametrize("cache_kv", [False, True], ids=["projected again", "key/value cache"])
def test_flops_are_what_an_evaluation_step_computes(cache_kv):
    """torch's FLOP counter over a steady-state evaluation step (both memories full, conv f_c; one
    batch row: the position projection is computed once per segment for all rows) equals the
    module's count per token: without the cache the memories' keys and values are projected again,
    with it only the n/c newly compressed states. The reconstruction loss, logged at evaluation, is
    left out of both (flops.py)."""
    lm = tiny(network={"attention": "eager"}, evaluation={"cache_kv": cache_kv}).eval()  # n_m 8, n_cm 4, c 2
    n = 8
    memory = lm.init_memory(1)
    x = torch.randint(0, lm.vocab_size, (1, 4 * n)).split(n, dim=1)
    lengths = dict(**dataclasses.asdict(lm.eval_lengths), cache_kv=cache_kv)
    with torch.no_grad():
        for segment in x[:-1]:  # fill n_m = 8 and n_cm = 4 (8 evicted, compressed 2:1)
            memory = lm.net(segment, memory, **lengths).memory
        with FlopCounterMode(display=False) as counter:
            lm.net.nll(lm.net(x[-1], memory, **lengths).hidden, x[-1])
    assert memory.valid.all() and memory.compressed_valid.all()
    assert counter.get_total_flops() / n == lm.flops_per_token(n)


# ---------------------------------------------------------------------------------- Lightning module
def tiny(**kwargs) -> CompressiveTransformerLM:
    torch.manual_seed(0)
    return tiny_method("compressive_transformer", **kwargs, optimizer=partial(torch.optim.Adam, lr=1e-3))


def test_module_evaluates_with_its_own_memory_sizes():
    model = tiny(evaluation={"mem_len": 6, "cmem_len": 3}, log_compressed_attention=True).eval()
    batch = {"input": torch.randint(0, 64, (2, 4)), "target": torch.randint(0, 64, (2, 4))}
    memory = model.init_memory(2)
    with torch.no_grad():
        for _ in range(6):
            out = model.step(batch, memory)
            memory = out.memory
    assert memory.valid.shape[1] == 6 and memory.compressed_valid.shape[1] == 3
    assert out.extra_loss is None  # evaluation: the reconstruction loss is logged, not trained
    assert {"reconstruction_loss", "compressed_mass", "compressed_mass_layer1"} <= out.logs.keys()
    assert 0 < out.logs["compressed_mass"] < 1
    model.log_compressed_attention = False  # the default: no probabilities asked, fused attention
    assert "compressed_mass" not in model.step(batch, memory).logs


def test_gradient_norm_clipping_clips_the_main_network_and_f_c_apart():
    model = tiny()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    main, compression = model._split_parameters()
    model.configure_gradient_clipping(None, gradient_clip_val=0.25, gradient_clip_algorithm="norm")
    for params in (main, compression):
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        torch.testing.assert_close(norm, torch.tensor(0.25), rtol=1e-5, atol=0)
    model.compression_lr = 1e-4
    groups = model.optimizer_param_groups()
    assert groups[1]["lr"] == 1e-4 and len(groups[1]["params"]) == len(compression)


def test_lightning_fit_and_validate_log_the_reconstruction_and_compressed_attention(tmp_path):
    data = SyntheticData(n_tokens=401, batch_size=2, seq_len=8, eval_batch_size=2)
    model = tiny(reconstruction_weight=2.0, log_compressed_attention=True)
    trainer = cpu_trainer(tmp_path, max_steps=4, limit_val_batches=0, gradient_clip_val=0.25)
    trainer.fit(model, datamodule=data)
    metrics = cpu_trainer(tmp_path, limit_val_batches=6).validate(model, datamodule=data, verbose=False)[0]
    assert metrics["val/reconstruction_loss"] > 0 and 0 < metrics["val/compressed_mass"] < 1
    assert metrics["val/flops_per_token"] == model.flops_per_token(8)


def test_memory_warmup_trains_without_either_memory_then_with_both(caplog):
    """`mem_warmup_steps` (Transformer-XL's curriculum, `longctx/core/memory_warmup.py`): before step N
    the training step reads and keeps neither memory (the loss of the same weights at n_m = n_cm = 0);
    from step N the configured memories'. Dropped at fit start on text bound beyond the segment, as XL's."""
    warm, plain, none = tiny(mem_warmup_steps=1), tiny(), tiny(mem_len=0, cmem_len=0)
    for model in (warm, none):
        model.load_state_dict(plain.state_dict())
    stream = torch.randint(0, 64, (2, 41))
    batches = [{"input": stream[:, i : i + 8], "target": stream[:, i + 1 : i + 9]} for i in range(0, 40, 8)]

    def last_nll(model: CompressiveTransformerLM) -> torch.Tensor:
        model.train()
        memory = model.init_memory(2)
        for batch in batches:  # five segments of 8: n_m = 8 full, states compressed into n_cm
            out = model.step(batch, memory)
            memory = out.memory
        return out.nll

    assert torch.equal(last_nll(warm), last_nll(none))  # global_step 0 < 1
    assert not torch.allclose(last_nll(plain), last_nll(none))
    warm.mem_warmup_steps = 0  # the warm-up is over
    assert torch.equal(last_nll(warm), last_nll(plain))
    far = tiny(mem_warmup_steps=1000, mem_warmup_min_within=0.1)
    far._trainer = SimpleNamespace(datamodule=SimpleNamespace(train_answers_within_segment=0.0))
    with caplog.at_level(logging.INFO):
        far.on_fit_start()
    assert far.mem_warmup_steps == 0 and "no memory warm-up" in caplog.text
    with pytest.raises(ValueError, match="mem_warmup_steps must be >= 0"):
        tiny(mem_warmup_steps=-1)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        (dict(cmem_len=-1), "cmem_len must be >= 0"),
        (dict(evaluation={"mem_len": -2, "cmem_len": -1}), "eval_mem_len, eval_cmem_len must be >= 0"),
        (dict(network={"compression_rate": 0}), r"compression_rate \(c\) must be >= 1, got 0"),
        (
            dict(network={"reconstruction": "bptt"}),
            "reconstruction must be 'attention' or 'autoencoding', got 'bptt'",
        ),
    ],
)
def test_bad_knobs_are_one_line_errors_naming_them(knobs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**knobs)


def test_a_smaller_compressed_memory_applies_at_once():
    _, ct = xl_and_compressive(compression="mean_pool", compression_rate=2)
    memory = ct.empty_memory(2)
    for x in segments(4):
        memory = ct(x, memory, mem_len=4, cmem_len=3).memory
    assert memory.compressed_valid.shape[1] == 3
    x = segments(1, n=1)[0]  # nothing evicted: overflow 1 < c
    assert ct(x, memory, mem_len=4, cmem_len=1).memory.compressed_valid.shape[1] == 1
    assert ct(x, memory, mem_len=4, cmem_len=0).memory.compressed_valid.shape[1] == 0


def test_most_used_in_the_network_keeps_evicted_states_in_their_order():
    """Layer 0 stores embeddings: each compressed slot is the embedding of one evicted token, newer
    slots of newer tokens, and every slot is one of the states its segment evicted."""
    _, ct = xl_and_compressive(compression="most_used", compression_rate=2)
    tokens = torch.arange(1, 16)[None].repeat(2, 1)
    emb = ct.word_emb(tokens)[0]
    memory = ct.empty_memory(2)
    for x in tokens.split(3, dim=1):
        memory = ct(x, memory, mem_len=4, cmem_len=3).memory
    # cm after the last segment: 1 kept of e1 e2... e9 e10 evicted in segments 3-5 (see the FIFO test)
    kept = [int((emb - slot).abs().sum(-1).argmin()) + 1 for slot in memory.compressed[0][0]]
    assert kept == sorted(kept) and len(kept) == 3
    assert kept[0] in (5, 6, 7, 8) and kept[1] in (5, 6, 7, 8) and kept[2] in (9, 10)
    for slot, t in zip(memory.compressed[0][0], kept):
        torch.testing.assert_close(slot, emb[t - 1])


class RecordingLogger(Logger):
    """The metrics a logger (W&B's, the CSV's) receives, one dict per `log_metrics` call."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[dict[str, float]] = []

    name, version = "recording", 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append(dict(metrics))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def test_the_logger_receives_the_reconstruction_loss_and_each_layers_compressed_attention(tmp_path):
    """train/ every logged step, val/ at each validation: what W&B and metrics.jsonl are given."""
    data = SyntheticData(n_tokens=401, batch_size=2, seq_len=8, eval_batch_size=2)
    logger = RecordingLogger()
    trainer = cpu_trainer(
        tmp_path, max_steps=4, limit_val_batches=6, val_check_interval=4, log_every_n_steps=1, logger=logger
    )
    trainer.fit(tiny(log_compressed_attention=True), datamodule=data)
    train = [m for m in logger.logged if "train/loss" in m]
    assert len(train) == 4 and all(m["train/reconstruction_loss"] >= 0 for m in train)
    assert any(m["train/reconstruction_loss"] > 0 for m in train)  # f_c learns once memories overflow
    (val,) = [m for m in logger.logged if "val/loss" in m]
    layers = [val[f"val/compressed_mass_layer{i}"] for i in range(2)]
    assert all(0 < mass < 1 for mass in layers) and val["val/reconstruction_loss"] > 0
    assert val["val/compressed_mass"] == pytest.approx(sum(layers) / 2)


# ---------------------------------------------------------------------------------- knob groups (issue 21)
# The tiny module's hyperparameters as saved before the groups (every knob flat), and its state-dict
# keys recorded then (tests/fixtures/compressive_transformer_state_keys.txt).
FLAT_KNOBS = dict(
    vocab_size=64, n_layers=2, d_model=16, n_heads=2, d_head=None, d_inner=32, d_embed=None, dropout=0.0,
    dropatt=0.0, pre_lnorm=False, cutoffs=[8, 32], div_val=2, tie_weight=True, tie_projs=None,
    init_std=0.02, proj_init_std=0.01, untie_r=False, attention="sdpa", mem_len=8, cmem_len=4,
    compression="conv", compression_rate=2, reconstruction="autoencoding", reconstruction_weight=1.0,
    compression_lr=None, clamp_len=0, same_length=False, eval_mem_len=None, eval_cmem_len=6,
    eval_clamp_len=None, eval_same_length=None, log_compressed_attention=False,
)  # fmt: skip
STATE_KEYS = REPO / "tests" / "fixtures" / "compressive_transformer_state_keys.txt"


def grouped_tiny() -> CompressiveTransformerLM:
    """`FLAT_KNOBS` given as the groups."""
    torch.manual_seed(0)
    network = CompressiveTransformer.Config(
        n_layers=2, d_model=16, n_heads=2, d_inner=32, dropout=0.0, cutoffs=[8, 32], div_val=2,
        compression="conv", compression_rate=2, reconstruction="autoencoding",
    )  # fmt: skip
    return CompressiveTransformerLM(
        vocab_size=64,
        network=network,
        mem_len=8,
        cmem_len=4,
        evaluation=CompressiveEvaluationMemory(cmem_len=6),
    )


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    assert list(a.state_dict()) == list(b.state_dict())
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name


def test_the_module_saves_its_groups_as_dicts():
    grouped = grouped_tiny()
    assert grouped.hparams["network"]["compression_rate"] == 2 and "compression_rate" not in grouped.hparams
    assert grouped.hparams["evaluation"] == dict(
        mem_len=None, cmem_len=6, clamp_len=None, same_length=None, cache_kv=True
    )
    assert grouped.eval_lengths == CompressiveLengths(mem_len=8, cmem_len=6, clamp_len=0, same_length=False)


def test_a_checkpoint_with_the_flat_hyperparameters_of_before_loads(tmp_path):
    model = grouped_tiny()
    path = tmp_path / "before_groups.ckpt"
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": dict(FLAT_KNOBS),
         "pytorch-lightning_version": lightning.__version__},
        path,
    )  # fmt: skip
    loaded = CompressiveTransformerLM.load_from_checkpoint(path, evaluation={"mem_len": 5})
    assert loaded.net.config == model.net.config
    assert loaded.eval_lengths == CompressiveLengths(mem_len=5, cmem_len=6, clamp_len=0, same_length=False)
    assert loaded.hparams == {**model.hparams, "evaluation": {**model.hparams["evaluation"], "mem_len": 5}}
    assert_same_weights(loaded, model)
    # Saved with the groups, a group's dict overrides only the fields it names at loading.
    torch.save({**torch.load(path, weights_only=True), "hyper_parameters": dict(model.hparams)}, path)
    again = CompressiveTransformerLM.load_from_checkpoint(
        path, evaluation={"cmem_len": 9}, compression_lr=1e-4
    )
    assert again.eval_lengths == CompressiveLengths(mem_len=8, cmem_len=9, clamp_len=0, same_length=False)
    assert again.net.config == model.net.config and again.compression_lr == 1e-4
    assert_same_weights(again, model)


def test_the_state_dict_keys_are_those_recorded_before_the_groups():
    assert list(grouped_tiny().state_dict()) == STATE_KEYS.read_text().split()


def test_config_build_equals_the_network_from_its_config():
    config = grouped_tiny().net.config
    assert isinstance(config, TransformerXL.Config) and config.cutoffs == (8, 32)
    nets = []
    for build in (
        lambda: config.build(64),
        lambda: CompressiveTransformer(64, config),
    ):
        torch.manual_seed(0)
        nets.append(build())
    for net in nets[1:]:
        assert net.config == config
        assert_same_weights(net, nets[0])
    assert {k for k in nets[0].state_dict() if k.startswith("decoders.")}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(compression_rate=0), r"^compression_rate \(c\) must be >= 1, got 0$"),
        (dict(compression="avg"), "^compression must be one of conv, max_pool, mean_pool, dilated_conv, "
         "most_used; got 'avg'$"),
        (dict(reconstruction="bptt"), "^reconstruction must be 'attention' or 'autoencoding', got 'bptt'$"),
        (dict(d_model=15), "^d_model \\(15\\) must be even"),  # XL's own check still runs
    ],
)  # fmt: skip
def test_a_bad_network_field_is_one_line_at_config_construction(fields, message):
    with pytest.raises(ValueError, match=message):
        CompressiveTransformer.Config(**fields)


def test_a_bad_network_field_on_the_command_line_is_its_one_line(tmp_path, capsys):
    """The Config's error, not jsonargparse's union error and a dump of every setting (cli.py,
    `ReportGroupErrors`)."""
    from longctx.commands.cli import main

    config = REPO / "configs" / "compressive_transformer_tiny.yaml"
    args = ["fit", "--config", str(config), "--data.corpus", "sample", "--data.split_sources", "null",
            "--data.cache_dir", str(tmp_path), "--trainer.logger", "false",
            "--model.init_args.network.compression_rate", "0"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(args)
    expected = (
        "error: model.init_args.network: CompressiveTransformerConfig: "
        "compression_rate (c) must be >= 1, got 0"
    )
    assert info.value.code == expected
    assert "Traceback" not in capsys.readouterr().err
