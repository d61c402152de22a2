"""TRAMS memory selection (Yu et al. 2023; lwaekfjlk/TRAMS): the cheap metric against the
materialised d_model-sized K′, the layer against a re-statement of the released code's computation,
and the invariants: selecting everything is XL over the whole pool, the output is XL attention over
the [selected, kept, segment] window, k = 0 is XL with memory m, the pool is XL's memory, the oracle
picks the largest attention mass; the score cache (each slot scored once, carried with its key)
selects and outputs as scoring the pool every segment."""

from __future__ import annotations

import math

import pytest
import torch

from longctx.methods.transformer_xl.flops import macs_per_token
from longctx.methods.transformer_xl.memory import MemoryLengths
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.relative_attention import (
    RelMultiHeadAttention,
    rel_shift,
    sinusoid_positions,
)
from longctx.methods.transformer_xl.trams import (
    TramsSettings,
    gather_rows,
    layer_scores,
    query_factor,
    score_matrix,
    select_memory,
    select_windows,
    trams_scores,
    window_index,
)
from tests.helpers.xl_layers import attend, attention_layer, selected_slots

D, H, DH = 12, 3, 4


def layer(seed: int = 0) -> RelMultiHeadAttention:
    torch.manual_seed(seed)
    return attention_layer(d_model=D, n_heads=H, d_head=DH).double()


def inputs(B: int = 2, P: int = 12, n: int = 4, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, D, generator=g, dtype=torch.double)
    mem = torch.randn(B, P, D, generator=g, dtype=torch.double)
    u = torch.randn(H, DH, generator=g, dtype=torch.double)
    v = torch.randn(H, DH, generator=g, dtype=torch.double)
    return x, mem, torch.ones(B, P, dtype=torch.bool), sinusoid_positions(P + n, D, dtype=torch.double), u, v


def keys(attn: RelMultiHeadAttention, h: torch.Tensor) -> torch.Tensor:
    """Content keys (B, H, T, Dh) of hidden states h (B, T, d)."""
    w_k = attn.qkv_net.weight[H * DH : 2 * H * DH]
    B, T, _ = h.shape
    return (h @ w_k.T).view(B, T, H, DH).transpose(1, 2)


def reformulated_keys(k: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """K′ = W_Q⁽ʰ⁾ᵀ k materialised, as the released code's `QKk`: (B, H, P, Dh) -> (B, H, P, D)."""
    return torch.einsum("bhpd,hdc->bhpc", k, w_q)


def brute_force_metric(k: torch.Tensor, w_q: torch.Tensor, metric: str) -> torch.Tensor:
    K = reformulated_keys(k, w_q)  # (B, H, P, D), the released code's QKk
    if metric == "code":
        return K.norm(dim=-1) * K.sum(-1).abs()
    ones = torch.ones_like(K)
    return torch.nn.functional.cosine_similarity(K, ones, dim=-1) * K.norm(dim=-1)


# ---------------------------------------------------------------------------------- the metric
@pytest.mark.parametrize("metric", ["code", "paper"])
def test_cheap_metric_equals_the_materialised_reformulated_keys(metric):
    torch.manual_seed(0)
    k, w_q = torch.randn(2, H, 9, DH, dtype=torch.double), torch.randn(H, DH, D, dtype=torch.double)
    torch.testing.assert_close(trams_scores(k, w_q, metric), brute_force_metric(k, w_q, metric))
    R, s = query_factor(w_q)
    assert R.shape == (H, DH, DH) and s.shape == (H, DH)  # never d_model-sized per token
    K = reformulated_keys(k, w_q)
    torch.testing.assert_close(torch.linalg.vector_norm(k @ R.transpose(-1, -2), dim=-1), K.norm(dim=-1))


def test_reformulated_key_gives_the_query_key_product():
    attn, (x, mem, *_) = layer(), inputs()
    k = keys(attn, mem)  # (B, H, P, Dh)
    q = (x @ attn.qkv_net.weight[: H * DH].T).view(2, 4, H, DH).transpose(1, 2)
    K = reformulated_keys(k, attn.query_weight())  # (B, H, P, D)
    torch.testing.assert_close(q @ k.transpose(-1, -2), x[:, None] @ K.transpose(-1, -2))


def test_selection_helpers():
    scores = torch.tensor([[[0.1, 5.0, 0.3, 4.0, 2.0]]])
    assert select_memory(scores, 3).tolist() == [[[1, 3, 4]]]  # top 3, back in time order
    assert select_memory(scores, 9).tolist() == [[[0, 1, 2, 3, 4]]]
    window = window_index(torch.tensor([[[1, 3]]]), pool=8, kept=3, n=2)
    assert window.tolist() == [[[1, 3, 5, 6, 7, 8, 9]]]
    with pytest.raises(ValueError):
        TramsSettings(attended=4, kept=5)


# ---------------------------------------------------------------------------------- one layer
@pytest.mark.parametrize(("metric", "kept", "attended"), [("code", 3, 7), ("paper", 3, 7), ("code", 0, 5)])
def test_layer_selects_the_top_of_the_brute_force_metric_and_keeps_the_newest(metric, kept, attended):
    attn, (x, mem, valid, pos, u, v) = layer(), inputs()
    settings = TramsSettings(attended, kept, metric)
    out = attend(attn, x, mem, valid, pos, u, v, trams=settings)
    P = mem.shape[1]
    metric_values = brute_force_metric(keys(attn, mem)[:, :, : P - kept], attn.query_weight(), metric)
    expected = metric_values.topk(attended - kept, dim=-1).indices.sort(-1).values
    assert torch.equal(selected_slots(out, settings), expected)
    kept_block = out.window.slots[..., attended - kept : attended]
    assert torch.equal(kept_block, torch.arange(P - kept, P).expand(2, H, -1))


def released_trams_layer(attn, x, mem, u, vb, topk: int, remain: int) -> torch.Tensor:
    """The released code's `RelPartialLearnableMultiHeadAttn.forward` with topk_num > 0, restated
    batch-first: d_model-sized QKk for every key, ‖QKk‖·|ΣQKk| over the older slots, top-k in time
    order, AC = w·QKk + r_w_bias·k, the last (topk + remain + n) position rows, post-LN."""
    B, n, d = x.shape
    cat = torch.cat([mem, x], 1)
    klen = cat.shape[1]
    Q, K, V = attn.qkv_net.weight.chunk(3, dim=0)
    kK = (cat @ K.T).view(B, klen, H, DH)
    QKk = torch.einsum("bjnd,ndk->bjnk", kK, Q.view(H, DH, d))  # (B, klen, H, d)
    vv = (cat @ V.T).view(B, klen, H, DH)
    stdlen = n + remain
    mem_QKk = QKk[:, :-stdlen]
    score = mem_QKk.norm(dim=-1) * mem_QKk.sum(-1).abs()  # (B, P - remain, H)
    idx = score.topk(topk, dim=1).indices.sort(dim=1).values  # (B, topk, H)

    def pick(t):
        sel = t[:, :-stdlen].gather(1, idx[..., None].expand(-1, -1, -1, t.shape[-1]))
        return torch.cat([sel, t[:, -stdlen:]], 1)

    QKk_w, k_w, v_w = pick(QKk), pick(kK), pick(vv)
    W = topk + stdlen
    r = attn.r_net(sinusoid_positions(klen, d, dtype=x.dtype))[-W:].view(W, H, DH)
    q = (x @ Q.T).view(B, n, H, DH)
    AC = torch.einsum("bik,bjnk->bijn", x, QKk_w) + torch.einsum("nd,bjnd->bjn", u, k_w)[:, None]
    BD = rel_shift(torch.einsum("bind,jnd->bnij", q + vb, r)).permute(0, 2, 3, 1)  # (B, n, W, H)
    mask = torch.triu(torch.ones(n, klen), 1 + mem.shape[1]).bool()[:, -W:]
    score = ((AC + BD) / math.sqrt(DH)).masked_fill(mask[None, :, :, None], float("-inf"))
    vec = torch.einsum("bijn,bjnd->bind", score.softmax(dim=2), v_w).reshape(B, n, H * DH)
    return attn.layer_norm(x + attn.o_net(vec))


def test_layer_equals_the_released_code_computation():
    attn, (x, mem, valid, pos, u, v) = layer(), inputs()
    out = attend(attn, x, mem, valid, pos, u, v, trams=TramsSettings(attended=7, kept=3))
    torch.testing.assert_close(out.out, released_trams_layer(attn, x, mem, u, v, topk=4, remain=3))


@pytest.mark.parametrize("metric", ["code", "paper", "oracle"])
@pytest.mark.parametrize("positions", ["compact", "true"])
@pytest.mark.parametrize("kept", [0, 5, 12])
def test_selecting_everything_equals_xl_over_the_whole_pool(metric, positions, kept):
    attn, (x, mem, valid, pos, u, v) = layer(), inputs()
    xl = attend(attn, x, mem, valid, pos, u, v, need_mass=True)
    trams = attend(
        attn, x, mem, valid, pos, u, v, trams=TramsSettings(12, kept, metric, positions), need_mass=True
    )
    torch.testing.assert_close(trams.out, xl.out)
    torch.testing.assert_close(trams.mem_mass, xl.mem_mass)


@pytest.mark.parametrize("metric", ["code", "oracle"])
def test_compact_output_is_xl_attention_over_the_selected_kept_segment_window(metric):
    attn, (x, mem, valid, pos, u, v) = layer(), inputs()
    kept, attended = 3, 7
    settings = TramsSettings(attended, kept, metric)
    out = attend(attn, x, mem, valid, pos, u, v, trams=settings, need_weights=True)
    P = mem.shape[1]
    for b in range(2):
        for h in range(H):
            window = torch.cat([mem[b, selected_slots(out, settings)[b, h]], mem[b, P - kept :]])[
                None
            ]  # (1, m, d)
            ref = attend(
                attn, x[b : b + 1], window, valid[b : b + 1, :attended], pos, u, v, need_weights=True
            )
            torch.testing.assert_close(out.heads[b, h], ref.heads[0, h])


def test_true_positions_output_is_xl_attention_restricted_to_the_window():
    attn, (x, mem, valid, pos, u, v) = layer(), inputs()
    kept, attended = 3, 7
    settings = TramsSettings(attended, kept, "code", "true")
    out = attend(attn, x, mem, valid, pos, u, v, trams=settings, need_weights=True)
    P = mem.shape[1]
    for b in range(2):
        for h in range(H):
            in_window = torch.zeros(1, P, dtype=torch.bool)
            in_window[0, selected_slots(out, settings)[b, h]] = True
            in_window[0, P - kept :] = True
            ref = attend(attn, x[b : b + 1], mem[b : b + 1], in_window, pos, u, v, need_weights=True)
            torch.testing.assert_close(out.heads[b, h], ref.heads[0, h])


def test_oracle_selects_the_largest_attention_mass_of_the_full_pool():
    attn, (x, mem, valid, pos, u, v) = layer(), inputs()
    kept, attended = 3, 7
    full = attend(attn, x, mem, valid, pos, u, v, need_weights=True)
    mass = full.probs[..., : mem.shape[1] - kept].sum(-2)  # (B, H, P - kept)
    settings = TramsSettings(attended, kept, "oracle")
    out = attend(attn, x, mem, valid, pos, u, v, trams=settings)
    assert torch.equal(selected_slots(out, settings), mass.topk(attended - kept, -1).indices.sort(-1).values)


def test_missing_slots_are_not_selected_while_real_ones_remain():
    attn, (x, mem, valid, pos, u, v) = layer(), inputs()
    valid[1, :5] = False  # row 1 has only its 7 newest slots (a document started there)
    settings = TramsSettings(attended=6, kept=2)
    chosen = selected_slots(attend(attn, x, mem, valid, pos, u, v, trams=settings), settings)
    assert chosen[1].min() >= 5  # 4 selected among the 5 real older slots 5..9
    assert chosen[0].min() < 5  # row 0 still chooses from all (seeded: not only the newest)


# ---------------------------------------------------------------------------------- the network
def network() -> TransformerXL:
    torch.manual_seed(0)
    return (
        TransformerXL.Config(n_layers=2, d_model=D, n_heads=H, d_inner=20, dropout=0.0)
        .build(40)
        .double()
        .eval()
    )


def test_no_selection_is_xl_with_memory_m_and_the_pool_is_xls_memory():
    model = network()
    x = torch.randint(0, 40, (2, 24))
    trams_mem, xl_mem, pool_mem = model.empty_memory(2), model.empty_memory(2), model.empty_memory(2)
    only_kept = TramsSettings(attended=6, kept=6)
    for s in range(6):
        seg = x[:, 4 * s : 4 * s + 4]
        trams = model(seg, trams_mem, mem_len=12, trams=only_kept)
        xl = model(seg, xl_mem, mem_len=6)
        xl_pool = model(seg, pool_mem, mem_len=12)
        torch.testing.assert_close(trams.hidden, xl.hidden)
        trams_mem, xl_mem, pool_mem = trams.memory, xl.memory, xl_pool.memory
        assert trams_mem.valid.shape[1] == min(12, 4 * s + 4)
        torch.testing.assert_close(trams_mem.hidden[0], pool_mem.hidden[0])  # embeddings
        torch.testing.assert_close(trams_mem.hidden[1][:, -6:], xl_mem.hidden[1])


def test_selection_changes_the_network_output_only_beyond_the_kept_memory():
    model = network()
    x = torch.randint(0, 40, (2, 28))
    memory = model.zero_memory(2, 16)  # TRAMS's protocol: zero-filled pool
    for s in range(7):
        out = model(x[:, 4 * s : 4 * s + 4], memory, mem_len=16, trams=TramsSettings(8, 4), need_mass=True)
        memory = out.memory
        assert all(selected_slots(a, TramsSettings(8, 4)).shape == (2, H, 4) for a in out.attn)
        assert all(a.window.k.shape[2] == 8 + 4 for a in out.attn)  # m keys of the pool, then the segment
        assert all(0 < float(a.mem_mass) < 1 for a in out.attn)
    assert memory.valid.all() and memory.valid.shape == (2, 16)


@pytest.mark.parametrize("metric", ["code", "oracle"])
def test_trams_with_the_key_value_cache_equals_projecting_the_pool_again(metric):
    model = network()
    x = torch.randint(0, 40, (2, 28))
    settings = TramsSettings(8, 4, metric)
    plain, cached = model.zero_memory(2, 16), model.zero_memory(2, 16)
    for s in range(7):
        seg = x[:, 4 * s : 4 * s + 4]
        a = model(seg, plain, mem_len=16, trams=settings)
        b = model(seg, cached, mem_len=16, trams=settings, cache_kv=True)
        torch.testing.assert_close(b.hidden, a.hidden)
        assert all(torch.equal(p.window.slots, q.window.slots) for p, q in zip(a.attn, b.attn))
        plain, cached = a.memory, b.memory


def test_trams_macs_per_token_by_hand():
    # 2 layers, d=16, 2 heads of 8 (HD=16), inner 32, V=64; segments of n=16, pool P=32, m=16 attended
    # of which 8 kept, key/value cache on. Per layer: q, k, v 3·16·16 = 768; positions of the W = 16 + 16
    # window projected per segment 16·16·32/16 = 512; scores and values 2·16·32 + 16·32 = 1536 over the
    # window; the released metric on the 16 keys entering the pool (the score cache scores each slot
    # once), H·(Dh² + 2·Dh) = 160 each, per segment: 160·16/16 = 160 (without the K/V cache the 32 − 8
    # older slots: 240); output projection 256; feed-forward 2·16·32 = 1024. Softmax 16·64.
    per_layer = 768 + 512 + 1536 + 160 + 256 + 1024
    sizes = (TransformerXL.Config(n_layers=2, d_model=16, n_heads=2, d_head=8, d_inner=32), 64)
    pool = MemoryLengths(mem_len=32)
    trams = TramsSettings(attended=16, kept=8)
    macs = macs_per_token(*sizes, pool, 16, cache_kv=True, trams=trams)
    assert macs == 2 * per_layer + 16 * 64
    # The paper's metric costs H·Dh per slot; the TRAMS protocol scores n − 1 targets per segment.
    paper = TramsSettings(attended=16, kept=8, metric="paper")
    assert macs_per_token(*sizes, pool, 16, cache_kv=True, trams=paper) == macs - 2 * (160 - 2 * 8 * 16 / 16)
    # Without the K/V cache every segment re-scores the 24 older slots and re-projects the memory.
    uncached = macs_per_token(*sizes, pool, 16, cache_kv=False, trams=trams)
    assert uncached == macs + 2 * (240 - 160 + 2 * 16 * 16 * 32 / 16)
    assert (
        macs_per_token(*sizes, pool, 16, cache_kv=True, trams=trams, scored_per_segment=15) == macs * 16 / 15
    )


# ---------------------------------------------------------------------------------- the score cache
def test_gather_rows_equals_gather_for_any_layout():
    torch.manual_seed(0)
    index = torch.tensor([[[0, 3], [1, 2], [4, 5]], [[2, 5], [0, 1], [3, 4]]])  # (B, H, W)
    layouts = (
        torch.randn(2, H, 6, DH),  # contiguous
        torch.randn(2, 6, H, DH).transpose(1, 2),  # projected keys
        torch.randn(2, H, 9, DH)[:, :, 2:8],  # a view of a cache buffer
        torch.randn(2, 2, H, 9, DH)[..., 1:7, :],  # keys and values of a cache buffer
        torch.randn(2, 6, 2, H, DH).permute(2, 0, 3, 1, 4),  # projected keys and values
        torch.randn(2, H, 6, 2 * DH)[..., :DH],  # rows not contiguous in storage: gather
    )
    for t in layouts:
        expected = t.gather(-2, index[..., None].expand(*t.shape[:-2], -1, DH))
        assert torch.equal(gather_rows(index, t), expected)


def score_cache_streams(model, x, memory, settings, mem_len, resets):
    """Run the segments of x three ways and yield each segment's outputs: with the score cache
    (`cache_kv`), with the key/value cache but every pool slot scored again (the computation before
    the score cache), and with neither (the memory projected and scored again, the released code).
    Row 0 starts a document after each segment in `resets`."""
    cached = rescored = plain = memory
    for s in range(x.shape[1] // 4):
        seg = x[:, 4 * s : 4 * s + 4]
        a = model(seg, cached, mem_len=mem_len, trams=settings, cache_kv=True)
        b = model(seg, rescored._replace(score=None), mem_len=mem_len, trams=settings, cache_kv=True)
        c = model(seg, plain, mem_len=mem_len, trams=settings)
        yield a, b, c
        cached, rescored, plain = a.memory, b.memory, c.memory
        if s in resets:  # each memory clears the row under its own convention (`zero_attended`)
            rows = torch.tensor([True, False])
            cached, rescored, plain = (m.reset_rows(rows) for m in (cached, rescored, plain))
            assert cached.key is None and cached.score is None  # dropped with the keys


@pytest.mark.parametrize(
    ("metric", "positions", "pre_lnorm", "first"),
    [
        ("code", "compact", False, "zero"),
        ("code", "true", False, "empty"),
        ("paper", "compact", True, "empty"),
        ("paper", "true", True, "zero"),
        ("code", "compact", True, "zero"),
    ],
)
def test_score_cache_selects_and_outputs_as_scoring_every_segment(metric, positions, pre_lnorm, first):
    torch.manual_seed(0)
    model = TransformerXL.Config(2, D, H, 20, dropout=0.0, pre_lnorm=pre_lnorm).build(40).double().eval()
    x = torch.randint(0, 40, (2, 32))
    settings = TramsSettings(8, 4, metric, positions)
    zero_fill = first == "zero"  # TRAMS's protocol (zero-filled pool) or XL's (empty memory)
    memory = model.zero_memory(2, 16) if zero_fill else model.empty_memory(2)
    resets = {2, 5}  # row 0 starts a document after segments 2 and 5
    with torch.no_grad():  # evaluation: the cache is appended in place (`slot_store.py`)
        for a, b, c in score_cache_streams(model, x, memory, settings, 16, resets):
            for cached, rescored, plain in zip(a.attn, b.attn, c.attn):
                if cached.window.slots is not None or plain.window.slots is not None:
                    assert torch.equal(cached.window.slots, rescored.window.slots)
                    assert torch.equal(cached.window.slots, plain.window.slots)
            assert torch.equal(a.hidden, b.hidden)  # same keys, same selection: the same computation
            torch.testing.assert_close(a.hidden, c.hidden)
            # The carried scores are those of the carried keys, −inf where a slot holds no token.
            empty = ~a.memory.valid[:, None, :]
            for layer, key, score in zip(model.layers, a.memory.key, a.memory.score):
                assert score.shape == key.shape[:3]
                expected = trams_scores(key, layer.attn.query_weight(), metric).masked_fill(
                    empty, float("-inf")
                )
                torch.testing.assert_close(score, expected)


def test_select_windows_equals_selecting_layer_by_layer():
    torch.manual_seed(0)
    L, B, P, n, settings = 3, 2, 12, 4, TramsSettings(8, 3)
    score = torch.randn(L, B, H, P, dtype=torch.double)
    key_valid = torch.ones(B, P + n, dtype=torch.bool)
    key_valid[1, :5] = False  # row 1 lost its 5 oldest slots: their cached scores are −inf
    score[:, 1, :, :5] = float("-inf")
    batched = select_windows(score, key_valid, settings, n)
    for layer in range(L):
        selected = select_memory(score[layer, ..., : P - settings.kept], settings.selected)
        window = window_index(selected, P, settings.kept, n)
        assert torch.equal(batched.selected[layer], selected)
        assert torch.equal(batched.window[layer], window)
        assert torch.equal(batched.valid[layer], key_valid[:, None, :].expand(B, H, -1).gather(2, window))
    # Row 1 has 4 real older slots for k = 5: each layer and head attends one empty slot, masked.
    assert (~batched.valid[:, 1]).sum(-1).eq(1).all() and batched.valid[:, 0].all()


def test_score_cache_scores_only_the_segment_once_the_pool_is_cached(monkeypatch):
    from longctx.methods.transformer_xl import trams_pool

    pool_scored, segment_scored, matrices = [], [], []

    def recording(fn, log, entry):
        def wrapped(*args, **kwargs):
            log.append(entry(*args))
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(
        trams_pool, "trams_scores", recording(trams_scores, pool_scored, lambda k, *_: k.shape[2])
    )
    keys_per_layer = lambda keys, S: [k.shape[2] for k in keys]  # noqa: E731
    monkeypatch.setattr(trams_pool, "layer_scores", recording(layer_scores, segment_scored, keys_per_layer))
    monkeypatch.setattr(trams_pool, "score_matrix", recording(score_matrix, matrices, lambda *_: "matrix"))
    model, x = network(), torch.randint(0, 40, (2, 16))
    memory, settings = model.zero_memory(2, 16), TramsSettings(8, 4)
    for s in range(4):
        memory = model(x[:, 4 * s : 4 * s + 4], memory, mem_len=16, trams=settings, cache_kv=True).memory
    # Segment 0 scores the zero-filled pool (16 slots) in each layer; every segment scores its 4 new
    # keys of both layers in one batched call; the score matrices are computed once and carried.
    assert pool_scored == [16, 16]
    assert segment_scored == [[4, 4]] * 4
    assert matrices == ["matrix"] * 2
    for layer, S in zip(model.layers, memory.score_matrix):
        torch.testing.assert_close(S, score_matrix(layer.attn.query_weight()))
    pool_scored.clear()
    model(x[:, :4], memory, mem_len=16, trams=settings)  # no key/value cache: the 16 − 4 older slots
    assert pool_scored == [12, 12]


def test_layer_scores_equal_scoring_each_layer():
    torch.manual_seed(0)
    w_q = [torch.randn(H, DH, D, dtype=torch.double) for _ in range(3)]
    keys = [torch.randn(2, 5, H, DH, dtype=torch.double).transpose(1, 2) for _ in range(3)]  # projected
    for metric in ("code", "paper"):
        S = torch.stack([score_matrix(w, metric) for w in w_q])
        expected = torch.stack([brute_force_metric(k, w, metric) for k, w in zip(keys, w_q)])
        torch.testing.assert_close(layer_scores(keys, S), expected)


def test_oracle_is_not_cached_and_needs_no_score(monkeypatch):
    from longctx.methods.transformer_xl import trams_pool

    monkeypatch.setattr(trams_pool, "trams_scores", lambda *a: pytest.fail("the oracle scored keys"))
    model, x = network(), torch.randint(0, 40, (2, 8))
    memory = model.zero_memory(2, 16)
    for s in range(2):
        memory = model(
            x[:, 4 * s : 4 * s + 4], memory, mem_len=16, trams=TramsSettings(8, 4, "oracle"), cache_kv=True
        ).memory
        assert memory.key is not None and memory.score is None
    with pytest.raises(ValueError, match="TRAMS scores are cached for 'code' or 'paper', got 'oracle'"):
        score_matrix(layer().query_weight(), "oracle")
