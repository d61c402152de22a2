"""Transformer-XL building blocks against straightforward references: the relative shift, the sinusoid,
one attention layer against a loop over (query, key) pairs, the same_length mask against the code's
triu/tril construction, the segment memory against one pass over the whole stream, document resets,
the adaptive softmax, the parameter count of the wt103 config, and the Lightning module."""

from __future__ import annotations

import logging
import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from longctx.core.base import detach_memory
from longctx.core.knob_groups import override_groups
from longctx.methods.transformer_xl.adaptive_softmax import ProjectedAdaptiveLogSoftmax
from longctx.methods.transformer_xl.flops import macs_per_token as xl_macs
from longctx.methods.transformer_xl.memory import MemoryLengths, XLMemory
from longctx.methods.transformer_xl.module import EvaluationMemory, TransformerXLLM, drop_last_scored
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.relative_attention import (
    RelMultiHeadAttention,
    rel_shift,
    sinusoid_positions,
    window_blocked,
)
from longctx.methods.transformer_xl.trams import TramsSettings
from tests.helpers.environment import REPO
from tests.helpers.knob_checks import assert_same_weights, save_with_hparams
from tests.helpers.lm_fixtures import SyntheticData, cpu_trainer
from tests.helpers.methods import VOCAB
from tests.helpers.methods import tiny as tiny_method
from tests.helpers.xl_layers import attend, attention_layer

RESOLVED = REPO / "tests" / "fixtures" / "resolved_configs"


def net(n_layers: int = 2, d_model: int = 16, n_heads: int = 2, vocab: int = 30, **kwargs) -> TransformerXL:
    torch.manual_seed(0)
    return (
        TransformerXL.Config(n_layers, d_model, n_heads, d_inner=24, dropout=0.0, **kwargs)
        .build(vocab)
        .double()
        .eval()
    )


def sinusoid(dist: float, d: int) -> torch.Tensor:
    inv_freq = torch.tensor([10000 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.double)
    return torch.cat([torch.sin(dist * inv_freq), torch.cos(dist * inv_freq)])


# ---------------------------------------------------------------------------------- positions
@pytest.mark.parametrize(("n", "W"), [(1, 1), (3, 3), (4, 9), (5, 7)])
def test_rel_shift_equals_a_direct_gather_on_causal_entries(n, W):
    x = torch.randn(2, 3, n, W)
    out = rel_shift(x)
    for i in range(n):
        for j in range(W - n + i + 1):  # causal keys of query i
            # column c of x holds distance W-1-c; the key j of query i is at distance W-n+i-j
            torch.testing.assert_close(out[..., i, j], x[..., i, W - 1 - (W - n + i - j)])


def test_sinusoid_is_sin_then_cos_from_klen_minus_one_to_zero_with_clamp():
    pos = sinusoid_positions(7, 8, clamp_len=4, dtype=torch.double)
    for row, dist in enumerate([4, 4, 4, 4, 3, 2, 1, 0][1:]):  # positions 6..0 capped at 4
        torch.testing.assert_close(pos[row], sinusoid(dist, 8))
    torch.testing.assert_close(sinusoid_positions(3, 8, dtype=torch.double)[0], sinusoid(2, 8))


# ---------------------------------------------------------------------------------- one layer
def naive_attention(
    attn: RelMultiHeadAttention,
    x: torch.Tensor,
    mem: torch.Tensor,
    valid: torch.Tensor,
    u: torch.Tensor,
    v: torch.Tensor,
    clamp_len: int = 0,
    same_length: int | None = None,
) -> torch.Tensor:
    """The layer computed one (batch, head, query, key) at a time from the paper's formula."""
    B, n, d = x.shape
    P = mem.shape[1]
    H, Dh = attn.n_heads, attn.d_head
    cat = torch.cat([mem, x], 1)
    wq, wk, wv = attn.qkv_net.weight.split(H * Dh)
    wr = attn.r_net.weight
    vec = torch.zeros(B, n, H * Dh, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            rows = slice(h * Dh, (h + 1) * Dh)
            for i in range(n):
                q = wq[rows] @ x[b, i]
                scores, values = [], []
                for j in range(P + n):
                    dist = P + i - j
                    if dist < 0 or (j < P and not valid[b, j]) or (same_length and dist >= same_length):
                        continue
                    k = wk[rows] @ cat[b, j]
                    r = wr[rows] @ sinusoid(min(dist, clamp_len) if clamp_len else dist, d)
                    scores.append(((q + u[h]) @ k + (q + v[h]) @ r) / math.sqrt(Dh))
                    values.append(wv[rows] @ cat[b, j])
                p = torch.softmax(torch.stack(scores), 0)
                vec[b, i, rows] = (p[:, None] * torch.stack(values)).sum(0)
    return attn.layer_norm(x + attn.o_net(vec))


@pytest.mark.parametrize(
    ("P", "clamp_len", "same_length", "reset_row"),
    [(0, 0, None, False), (5, 0, None, False), (5, 3, None, False), (5, 0, 4, False), (5, 0, None, True)],
)
def test_attention_layer_equals_a_naive_loop(P, clamp_len, same_length, reset_row):
    torch.manual_seed(0)
    attn = attention_layer(d_model=6, n_heads=2, d_head=3).double()
    B, n = 2, 3
    x, mem = torch.randn(B, n, 6, dtype=torch.double), torch.randn(B, P, 6, dtype=torch.double)
    valid = torch.ones(B, P, dtype=torch.bool)
    if reset_row:
        valid[1, :3] = False  # row 1 lost its 3 oldest slots
    u, v = torch.randn(2, 3, dtype=torch.double), torch.randn(2, 3, dtype=torch.double)
    pos = sinusoid_positions(P + n, 6, clamp_len, dtype=torch.double)
    out = attend(attn, x, mem, valid, pos, u, v, same_length=same_length).out
    torch.testing.assert_close(out, naive_attention(attn, x, mem, valid, u, v, clamp_len, same_length))


def test_attention_layer_gradients_match_finite_differences():
    torch.manual_seed(0)
    attn = attention_layer(d_model=4, n_heads=2, d_head=2).double()
    mem, valid = torch.randn(1, 3, 4, dtype=torch.double), torch.ones(1, 3, dtype=torch.bool)
    pos = sinusoid_positions(5, 4, dtype=torch.double)
    u = torch.randn(2, 2, dtype=torch.double, requires_grad=True)
    x = torch.randn(1, 2, 4, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, u: attend(attn, x, mem, valid, pos, u, u * 0.5).out, (x, u))


def test_the_attention_exposes_its_per_head_query_key_and_value_weights():
    """`query_weight`, `key_weight`, `value_weight` (H, Dh, D) are the projections the layer attends
    with: the keys and values of [memory, segment] it attends are W_K h and W_V h, and the three are
    `qkv_net.weight`'s [W_Q; W_K; W_V] blocks (views: the Compressive Transformer's loss reads them)."""
    torch.manual_seed(0)
    attn = attention_layer(d_model=6, n_heads=2, d_head=3).double()
    x, mem = torch.randn(2, 3, 6, dtype=torch.double), torch.randn(2, 4, 6, dtype=torch.double)
    u, v = torch.randn(2, 3, dtype=torch.double), torch.randn(2, 3, dtype=torch.double)
    pos = sinusoid_positions(7, 6, dtype=torch.double)
    out = attend(attn, x, mem, torch.ones(2, 4, dtype=torch.bool), pos, u, v)
    cat = torch.cat([mem, x], 1)
    torch.testing.assert_close(out.window.k, torch.einsum("hed,btd->bhte", attn.key_weight(), cat))
    torch.testing.assert_close(out.window.v, torch.einsum("hed,btd->bhte", attn.value_weight(), cat))
    blocks = [attn.query_weight(), attn.key_weight(), attn.value_weight()]
    assert all(w.shape == (2, 3, 6) for w in blocks)
    assert torch.equal(torch.cat([w.reshape(6, 6) for w in blocks]), attn.qkv_net.weight)
    assert all(w.data_ptr() == attn.qkv_net.weight[6 * i].data_ptr() for i, w in enumerate(blocks))


@pytest.mark.parametrize(("mlen", "n", "mem_len"), [(0, 4, 6), (3, 4, 6), (6, 4, 6), (8, 4, 6), (2, 5, 3)])
def test_same_length_mask_equals_the_code_construction_and_counts(mlen, n, mem_len):
    klen = mlen + n
    ones = torch.ones(n, klen)
    mask_len = klen - mem_len
    shift = n - mask_len if mask_len > 0 else n
    code_masked = (torch.triu(ones, 1 + mlen) + torch.tril(ones, -shift)).bool()  # kimiyoung's mask
    allowed = ~window_blocked(torch.ones(1, 1, klen, dtype=torch.bool), n, same_length=mem_len)[0, 0]
    if mem_len >= n:  # the code's construction is meant for mem_len >= tgt_len
        assert torch.equal(allowed, ~code_masked)
    counts = allowed.sum(-1)
    assert counts.tolist() == [min(mem_len, mlen + i + 1) for i in range(n)]


# ---------------------------------------------------------------------------------- memory
@pytest.mark.parametrize("clamp_len", [0, 5])
def test_segments_with_memory_equal_one_pass_over_the_stream_while_history_fits(clamp_len):
    model = net(n_layers=3)
    x = torch.randint(0, 30, (2, 12))
    full = model(x, model.empty_memory(2), mem_len=12, clamp_len=clamp_len).hidden
    memory, outs = model.empty_memory(2), []
    for s in range(3):
        out = model(x[:, 4 * s : 4 * s + 4], memory, mem_len=8, clamp_len=clamp_len)
        memory = out.memory
        outs.append(out.hidden)
        assert memory.valid.shape[1] == min(8, 4 * s + 4)
    torch.testing.assert_close(torch.cat(outs, 1), full)


def test_same_length_segments_equal_a_sliding_window_over_the_stream():
    model = net()
    x = torch.randint(0, 30, (2, 20))  # history longer than the memory
    full = model(x, model.empty_memory(2), mem_len=6, same_length=True).hidden
    memory, outs = model.empty_memory(2), []
    for s in range(5):
        out = model(x[:, 4 * s : 4 * s + 4], memory, mem_len=6, same_length=True)
        memory, outs = out.memory, [*outs, out.hidden]
    torch.testing.assert_close(torch.cat(outs, 1), full)


def test_memory_holds_the_last_inputs_of_each_layer_and_rpe_has_none():
    model = net()
    x = torch.randint(0, 30, (2, 10))
    captured = []
    hooks = [layer.register_forward_pre_hook(lambda m, a: captured.append(a[0])) for layer in model.layers]
    out = model(x[:, 5:], model(x[:, :5], model.empty_memory(2), mem_len=7).memory, mem_len=7)
    for hook in hooks:
        hook.remove()
    for layer in range(2):  # inputs of the second segment at this layer, with the first segment's
        expected = torch.cat([captured[layer], captured[2 + layer]], 1)[:, -7:]
        torch.testing.assert_close(out.memory.hidden[layer], expected)
        assert not out.memory.hidden[layer].requires_grad
    # Transformer+RPE: no memory, each segment on its own
    a = model(x[:, 5:], model(x[:, :5], model.empty_memory(2), mem_len=0).memory, mem_len=0)
    assert a.memory.valid.shape == (2, 0)
    torch.testing.assert_close(a.hidden, model(x[:, 5:], model.empty_memory(2), mem_len=0).hidden)


def test_the_base_detaches_a_typed_memory_field_by_field():
    hidden = [torch.randn(2, 3, 4, requires_grad=True) * 2 for _ in range(2)]
    key = [h.view(2, 1, 3, 4) for h in hidden]
    valid = torch.tensor([[False, True, True], [True, True, True]])
    for memory in (XLMemory(hidden, valid), XLMemory(hidden, valid, key, key)):
        out = detach_memory(memory)
        assert type(out) is XLMemory and torch.equal(out.valid, memory.valid)
        assert all(torch.equal(a, b) and not a.requires_grad for a, b in zip(out.hidden, hidden))
        assert (out.key is None) == (memory.key is None)
        assert all(not k.requires_grad for k in out.key or [])


@pytest.mark.parametrize("same_length", [False, True])
def test_reset_row_behaves_like_a_fresh_row(same_length):
    model = net()
    x = torch.randint(0, 30, (3, 8))
    memory = model(x[:, :4], model.empty_memory(3), mem_len=6).memory
    memory = memory.reset_rows(torch.tensor([False, True, False]))
    out = model(x[:, 4:], memory, mem_len=6, same_length=same_length)
    fresh = model(x[1:2, 4:], model.empty_memory(1), mem_len=6, same_length=same_length)
    torch.testing.assert_close(out.hidden[1:2], fresh.hidden)
    others = XLMemory([h[::2] for h in memory.hidden], memory.valid[::2])
    kept = model(x[::2, 4:], others, mem_len=6, same_length=same_length)
    torch.testing.assert_close(out.hidden[::2], kept.hidden)


# ---------------------------------------------------------------------------------- adaptive softmax
@pytest.mark.parametrize(("div_val", "d_embed"), [(1, 12), (1, 8), (2, 12)])
def test_adaptive_softmax_normalises_and_nll_reads_the_target(div_val, d_embed):
    torch.manual_seed(0)
    crit = ProjectedAdaptiveLogSoftmax(40, d_embed, 12, cutoffs=[10, 25], div_val=div_val).double()
    for p in crit.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5)
    hidden = torch.randn(7, 12, dtype=torch.double)
    logp = crit.log_prob(hidden)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(7, dtype=torch.double))
    target = torch.tensor([0, 9, 10, 24, 25, 39, 3])  # every cluster, both ends
    torch.testing.assert_close(crit(hidden, target), -logp.gather(1, target[:, None]).squeeze(1))
    # the head holds the 10 shortlist words then one logit per tail cluster; tail i reads column -i
    head = crit._logits(hidden, *crit._cluster_params(0)).log_softmax(-1)
    assert head.shape == (7, 12)
    tail = crit._logits(hidden, *crit._cluster_params(1)).log_softmax(-1)
    torch.testing.assert_close(logp[:, 10:25], head[:, -1:] + tail)


def test_adaptive_embedding_and_tying():
    torch.manual_seed(0)
    model = (
        TransformerXL.Config(1, 12, 2, 16, d_embed=12, cutoffs=[10, 25], div_val=2, dropout=0.0)
        .build(40)
        .double()
    )
    emb, crit = model.word_emb, model.crit
    x = torch.tensor([[0, 9, 10, 24, 25, 39]])
    expected = []
    for t in x[0].tolist():
        i = 0 if t < 10 else 1 if t < 25 else 2
        lo = [0, 10, 25][i]
        expected.append(emb.emb_projs[i] @ emb.emb_layers[i].weight[t - lo] * math.sqrt(12))
    torch.testing.assert_close(emb(x)[0], torch.stack(expected))
    for i in range(3):
        assert crit.out_layers[i].weight is emb.emb_layers[i].weight
    assert crit.out_projs[0] is not emb.emb_projs[0]  # tie_projs default [False, True, True]
    assert crit.out_projs[1] is emb.emb_projs[1] and crit.out_projs[2] is emb.emb_projs[2]


def test_initialisation_follows_the_code():
    torch.manual_seed(0)
    model = TransformerXL.Config(4, 64, 4, 256, cutoffs=[100, 200], dropout=0.0).build(300)
    ln = torch.cat([layer.attn.layer_norm.weight for layer in model.layers])
    assert abs(ln.mean().item() - 1) < 0.01 and abs(ln.std().item() - 0.02) < 0.005
    w = model.layers[0].ff.fc1.weight
    assert abs(w.std().item() - 0.02) < 0.002 and model.layers[0].ff.fc1.bias.abs().max() == 0
    assert abs(model.r_w_bias.std().item() - 0.02) < 0.01
    assert model.crit.out_layers[0].bias.abs().max() == 0


def xl_init_args(name: str) -> dict:
    """The model's init arguments as the config resolves them (composed from configs/base/): read from
    the stored `--print_config` of tests/fixtures/resolved_configs, which tests/test_configs.py keeps
    equal to what the config resolves to (building the CLI parser here would take seconds)."""
    resolved = yaml.safe_load((RESOLVED / name).read_text())
    prefix = "model.init_args."
    args: dict = {}
    for key, value in resolved.items():
        if key.startswith(prefix) and not key.startswith((prefix + "optimizer", prefix + "lr_scheduler")):
            *groups, knob = key.removeprefix(prefix).split(".")  # `network.d_model`: a knob group's
            target = args
            for group in groups:
                target = target.setdefault(group, {})
            target[knob] = value
    return args


def test_wt103_config_has_the_papers_151M_parameters():
    with torch.device("meta"):
        model = TransformerXLLM(vocab_size=267735, **xl_init_args("transformer_xl_wt103.yaml"))
    assert sum(p.numel() for p in model.parameters()) == 151_107_538
    assert model.net.crit.out_layers[0].weight is model.net.word_emb.emb_layers[0].weight


# ---------------------------------------------------------------------------------- Lightning module
def tiny(**kwargs) -> TransformerXLLM:
    torch.manual_seed(0)
    adam = partial(torch.optim.Adam, lr=1e-3)
    return tiny_method(
        "transformer_xl", **override_groups({"network": {"dropout": 0.0}}, kwargs), optimizer=adam
    )


@pytest.mark.slow  # a fit and three evaluations through Lightning (~12 s CPU)
def test_lightning_fit_then_eval_knobs_change_without_retraining(tmp_path):
    data = SyntheticData(n_tokens=1201, batch_size=3, seq_len=16, eval_batch_size=2)
    model = tiny()
    cpu_trainer(tmp_path, max_steps=3, limit_val_batches=0).fit(model, datamodule=data)
    state = model.state_dict()

    def validate(**knobs) -> dict[str, float]:
        evaluated = tiny(**knobs)
        evaluated.load_state_dict(state)
        metrics = cpu_trainer(tmp_path).validate(evaluated, datamodule=data, verbose=False)[0]
        return {k: float(v) for k, v in metrics.items()}

    xl = validate(log_attention_mass=True)
    rpe = validate(evaluation={"mem_len": 0}, log_attention_mass=True)
    trams_protocol = validate(protocol="trams")
    selected = validate(evaluation={"mem_len": 32}, trams={"attended": 16, "kept": 8})
    assert xl["val/tokens"] == 1200
    # two rows of 600 targets = 37 full segments of 16 + one of 8 targets then padding: the TRAMS
    # protocol drops the last real target of every segment, the short final one included
    assert trams_protocol["val/tokens"] == 1200 - 2 * math.ceil(600 / 16)
    assert rpe["trams/mem_mass"] == 0 and xl["trams/mem_mass"] > 0
    assert "trams/mem_mass" not in trams_protocol  # off by default: the fused kernel gives no mass
    assert len({xl["val/loss"], rpe["val/loss"], trams_protocol["val/loss"], selected["val/loss"]}) == 4


def test_trams_protocol_starts_from_attended_zero_memory_and_xl_from_empty():
    model = tiny(evaluation={"mem_len": 12}, protocol="trams").eval()
    memory = model.init_memory(2)
    assert memory.valid.shape == (2, 12) and memory.valid.all()
    assert all(h.abs().max() == 0 for h in memory.hidden)
    assert model.train().init_memory(2).valid.shape == (2, 0)  # training: Transformer-XL's
    assert tiny().eval().init_memory(2).valid.shape == (2, 0)
    with pytest.raises(ValueError, match="trams_kept"):
        tiny(trams={"attended": 8})
    with pytest.raises(ValueError, match="cannot exceed"):
        tiny(trams={"attended": 20, "kept": 4})


@pytest.mark.parametrize(("stage", "attended"), [("val", True), ("train", False)])
def test_the_base_resets_rows_under_the_memorys_own_convention(stage, attended):
    """TRAMS's evaluation protocol: a new document's slots become attended zeros (its `init_mems`);
    training (Transformer-XL's): they are masked. The memory carries its convention from segment to
    segment, so the base's generic `reset_rows` needs no word from the module."""
    model = tiny(evaluation={"mem_len": 6}, protocol="trams").train(stage == "train")
    x = torch.randint(0, 64, (2, 4))
    batch = {"input": x, "target": x, "mask": torch.ones(2, 4), "reset": torch.tensor([True, False])}
    with torch.no_grad():
        model._memory[stage] = model.step(batch, model.init_memory(2)).memory
        memory = model._memory_for(stage, batch)
    assert memory.zero_attended is attended and memory.valid.shape[1] > 0
    assert memory.valid[0].eq(attended).all() and memory.valid[1].all()
    assert all(h[0].abs().max() == 0 and h[1].abs().max() > 0 for h in memory.hidden)


def test_xl_macs_per_token_by_hand():
    # 2 layers, d=16, 2 heads of 8 (HD=16), inner 32, V=64, segments of n=16 and P=16 memory slots.
    # Per layer: q, k, v 3·16·16 = 768; positions of the W = 32 keys projected per segment 16·16·32/16
    # = 512; (q+u)·k, (q+v)·r, probs·v 3·16·32 = 1536; output projection 256; feed-forward 2·16·32 =
    # 1024. Softmax 16·64. Without the key/value cache the memory is projected again: 2·16·16·16/16.
    config = TransformerXL.Config(n_layers=2, d_model=16, n_heads=2, d_head=8, d_inner=32)
    per_layer = 768 + 512 + 1536 + 256 + 1024
    assert xl_macs(config, 64, MemoryLengths(mem_len=16), 16, cache_kv=True) == 2 * per_layer + 16 * 64
    assert xl_macs(config, 64, MemoryLengths(mem_len=16), 16) == 2 * (per_layer + 512) + 16 * 64
    # Adaptive softmax, cutoffs 20/40: the head (20 words + 2 clusters) and both tails, full log-prob.
    adaptive = TransformerXL.Config(n_layers=2, d_model=16, n_heads=2, d_head=8, d_inner=32, cutoffs=(20, 40))
    no_memory = MemoryLengths(mem_len=0)
    assert xl_macs(adaptive, 64, no_memory, 16) - xl_macs(config, 64, no_memory, 16) == 16 * 2


@pytest.mark.parametrize("div_val", [1, 2])
def test_flops_count_the_adaptive_input_and_softmax_for_the_tokens_computed(div_val):
    """torch's FLOP counter over an evaluation step (memory full, one batch row: the position
    projection is computed once per segment for all rows) equals the module's count per token: the
    adaptive softmax's head for every target, a tail cluster only for the targets in it, and (div_val
    > 1) each input token projected from its cluster's width, read from the tokens computed since
    `eval()`. Before any token, and after `eval()` again: every cluster for every token."""
    lm = tiny(
        network={"cutoffs": [20, 40], "div_val": div_val, "attention": "eager"}
    ).eval()  # 64 words: 20, 20, 24
    tokens = torch.tensor([[0, 5, 19, 20, 39, 40, 63, 7, 1, 2, 3, 4, 8, 9, 10, 11]])  # 2 in each tail
    full = lm.flops_per_token(16)
    memory = lm.init_memory(1)
    with torch.no_grad():
        memory = lm.step({"input": tokens, "target": tokens}, memory).memory  # fills the memory of 16
        with FlopCounterMode(display=False) as counter:
            lm.step({"input": tokens, "target": tokens}, memory)
    assert counter.get_total_flops() / 16 == lm.flops_per_token(16)
    d_1, d_2 = 16 // div_val, 16 // div_val**2  # the tails' widths
    # Not computed for 14 of 16 targets: each tail's logits (and its projection from d 16, div_val 2);
    # not computed for 4 of 16 inputs the head's projection, for 14 of 16 each tail's (div_val 2).
    softmax = (1 - 2 / 16) * (d_1 * 20 + d_2 * 24 + (16 * (d_1 + d_2) if div_val > 1 else 0))
    embedding = 16 * ((1 - 12 / 16) * 16 + (1 - 2 / 16) * (d_1 + d_2)) if div_val > 1 else 0
    assert full - lm.flops_per_token(16) == pytest.approx(2 * (softmax + embedding), rel=1e-12)
    assert lm.eval().flops_per_token(16) == full


def test_evaluation_logs_the_forward_flops_per_scored_token(tmp_path):
    data = SyntheticData(n_tokens=401, batch_size=3, seq_len=16, eval_batch_size=2)
    xl = cpu_trainer(tmp_path).validate(tiny(), datamodule=data, verbose=False)[0]
    per_layer = 768 + 512 + 1536 + 256 + 1024  # see test_xl_macs_per_token_by_hand (P = mem_len 16)
    assert float(xl["val/flops_per_token"]) == 2 * (2 * per_layer + 16 * 64)
    trams = tiny(evaluation={"mem_len": 32}, trams={"attended": 16, "kept": 8}, protocol="trams")
    logged = cpu_trainer(tmp_path).validate(trams, datamodule=data, verbose=False)[0]["val/flops_per_token"]
    per_layer = (
        768 + 512 + 1536 + 160 + 256 + 1024
    )  # see tests/methods/transformer_xl/test_trams.py: test_trams_macs_per_token_by_hand
    assert float(logged) == pytest.approx(2 * (2 * per_layer + 16 * 64) * 16 / 15, rel=1e-6)


def test_trams_protocol_leaves_out_the_last_real_target_of_each_row():
    mask = torch.tensor(
        [[True] * 6, [True] * 4 + [False] * 2, [False] * 6, [False, True, True, False, False, False]]
    )
    expected = torch.tensor(
        [[True] * 5 + [False], [True] * 3 + [False] * 3, [False] * 6, [False, True] + [False] * 4]
    )
    assert torch.equal(drop_last_scored(mask), expected)
    # Through the module: a padded short final segment scores one target fewer per row, not one more.
    model = tiny(protocol="trams").eval()
    batch = {
        "input": torch.randint(0, 64, (2, 6)),
        "target": torch.randint(0, 64, (2, 6)),
        "mask": mask[:2],
        "reset": torch.ones(2, dtype=torch.bool),
    }
    with torch.no_grad():
        out = model.step(batch, model.init_memory(2))
    assert torch.equal(out.mask, expected[:2])


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_key_value_cache_equals_projecting_the_memory_again(pre_lnorm):
    model = net(pre_lnorm=pre_lnorm)
    x = torch.randint(0, 30, (2, 20))
    plain, cached = model.zero_memory(2, 6), model.zero_memory(2, 6)
    for s in range(5):
        a = model(x[:, 4 * s : 4 * s + 4], plain, mem_len=6)
        b = model(x[:, 4 * s : 4 * s + 4], cached, mem_len=6, cache_kv=True)
        torch.testing.assert_close(b.hidden, a.hidden)
        plain, cached = a.memory, b.memory
        assert cached.key[1].shape == (2, 2, 6, 8)
        if s == 2:  # a reset drops the cache; the next segment projects the memory again
            cached = cached.reset_rows(torch.tensor([True, False]))
            plain = plain.reset_rows(torch.tensor([True, False]))
            assert cached.key is None


@pytest.mark.parametrize("module", ["transformer_xl", "compressive_transformer"])
def test_word_level_cutoffs_on_a_byte_vocabulary_give_a_full_softmax(module, caplog):
    """transformer_xl_tiny's cutoffs [2000, 8000] read at byte level (256 symbols): the network is the
    full-softmax one (same parameters, same FLOPs count) and one line says so."""
    from longctx.methods.compressive_transformer.module import CompressiveTransformerLM

    cls = TransformerXLLM if module == "transformer_xl" else CompressiveTransformerLM
    sizes = dict(n_layers=1, d_model=16, n_heads=2, d_inner=32)

    def build(cutoffs: list[int]) -> TransformerXLLM:
        return cls(vocab_size=256, network={**sizes, "cutoffs": cutoffs}, mem_len=8)

    with caplog.at_level("INFO"):
        word_recipe = build([200, 2000, 8000])
    full = build([])
    assert word_recipe.net.config.cutoffs == (200,) and full.net.config.cutoffs == ()
    assert word_recipe.net.crit.cutoffs == [200, 256]
    assert "cutoffs [200, 2000, 8000] reach past the vocabulary (256)" in caplog.text
    beyond = build([2000, 8000])
    assert beyond.net.config.cutoffs == () and beyond.net.crit.cutoffs == [256]
    assert {k: v.shape for k, v in beyond.net.state_dict().items()} == {
        k: v.shape for k, v in full.net.state_dict().items()
    }
    assert beyond.flops_per_token(16) == full.flops_per_token(16)


# ---------------------------------------------------------------------------------- knob groups (issue 21)
# A tiny model's state-dict keys and `hparams` as the module saved them before the knob groups
# (recorded at commit 8e5b1a2 with the knobs of `grouped_xl` below): a checkpoint of that time.
KEYS_BEFORE_GROUPS = [
    "net.r_w_bias", "net.r_r_bias", *(f"net.word_emb.emb_layers.{i}.weight" for i in range(3)),
    *(f"net.word_emb.emb_projs.{i}" for i in range(3)), "net.crit.cluster_weight", "net.crit.cluster_bias",
    *(f"net.crit.out_layers.{i}.{p}" for i in range(3) for p in ("weight", "bias")),
    *(f"net.crit.out_projs.{i}" for i in range(3)),
    *(
        f"net.layers.{i}.{name}"
        for i in range(2)
        for name in (
            "attn.qkv_net.weight", "attn.r_net.weight", "attn.o_net.weight", "attn.layer_norm.weight",
            "attn.layer_norm.bias", "ff.fc1.weight", "ff.fc1.bias", "ff.fc2.weight", "ff.fc2.bias",
            "ff.layer_norm.weight", "ff.layer_norm.bias",
        )
    ),
]  # fmt: skip
FLAT_HPARAMS_BEFORE_GROUPS = {
    "vocab_size": 40, "n_layers": 2, "d_model": 16, "n_heads": 2, "d_head": None, "d_inner": 32,
    "d_embed": None, "dropout": 0.1, "dropatt": 0.0, "pre_lnorm": False, "cutoffs": [10, 20], "div_val": 2,
    "tie_weight": True, "tie_projs": None, "init_std": 0.02, "proj_init_std": 0.01, "untie_r": True,
    "mem_len": 8, "clamp_len": 0, "same_length": False, "eval_mem_len": None, "eval_clamp_len": None,
    "eval_same_length": None, "protocol": "xl", "trams_attended": None, "trams_pool": None,
    "trams_kept": None, "trams_metric": "code", "trams_positions": "compact", "log_attention_mass": False,
    "eval_cache_kv": True, "attention": "sdpa",
    "_class_path": "longctx.methods.transformer_xl.module.TransformerXLLM",  # a CLI run's checkpoint
}  # fmt: skip


def grouped_xl(**knobs) -> TransformerXLLM:
    torch.manual_seed(0)
    network = TransformerXL.Config(n_layers=2, d_model=16, n_heads=2, d_inner=32, cutoffs=(10, 20), div_val=2,
                                   untie_r=True)  # fmt: skip
    return TransformerXLLM(vocab_size=40, network=network, mem_len=8, **knobs)


def test_the_module_from_its_groups_as_dataclasses_equals_the_one_from_dicts():
    grouped = grouped_xl(evaluation=EvaluationMemory(mem_len=12), trams=TramsSettings(6, 4, pool=12))
    torch.manual_seed(0)
    network = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_inner": 32, "cutoffs": [10, 20], "div_val": 2,
               "untie_r": True}  # fmt: skip
    trams = {"attended": 6, "kept": 4, "pool": 12}
    dicts = TransformerXLLM(
        vocab_size=40, network=network, mem_len=8, evaluation={"mem_len": 12}, trams=trams
    )
    assert dict(grouped.hparams) == dict(dicts.hparams)
    assert grouped.hparams["trams"] == {"attended": 6, "kept": 4, "metric": "code", "positions": "compact",
                                        "pool": 12}  # fmt: skip
    assert_same_weights(grouped, dicts)
    assert list(grouped.state_dict()) == KEYS_BEFORE_GROUPS
    assert (grouped.eval_lengths.mem_len, grouped.trams) == (12, TramsSettings(6, 4, pool=12))


def test_a_checkpoint_with_the_flat_hparams_of_before_loads_into_the_same_knobs_and_weights(tmp_path):
    model = grouped_xl()
    path = save_with_hparams(model, FLAT_HPARAMS_BEFORE_GROUPS, tmp_path / "before.ckpt")
    loaded = TransformerXLLM.load_from_checkpoint(
        path, evaluation={"mem_len": 16}, trams={"attended": 8, "kept": 6}
    )
    assert_same_weights(model, loaded)
    assert loaded.net.config == model.net.config
    assert (loaded.eval_lengths.mem_len, loaded.trams) == (16, TramsSettings(8, 6))
    assert loaded.hparams["evaluation"]["mem_len"] == 16 and "eval_mem_len" not in loaded.hparams
    off = TransformerXLLM.load_from_checkpoint(path)  # trams_attended None: TRAMS stays off
    assert off.trams is None and off.eval_lengths.mem_len == 8


def test_bad_group_fields_are_one_line_at_construction():
    with pytest.raises(ValueError, match=r"^d_model \(15\) must be even"):
        TransformerXL.Config(d_model=15)
    with pytest.raises(ValueError, match=r"^TRAMS's kept \(trams_kept"):
        TramsSettings(attended=8)
    with pytest.raises(ValueError, match=r"^evaluation mem_len \(-1\)"):
        grouped_xl(evaluation={"mem_len": -1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'eval_memlen'"):
        grouped_xl(eval_memlen=3)


def test_memory_warmup_trains_as_rpe_then_with_the_memory():
    """`mem_warmup_steps`: before step N the training step reads and keeps no memory (the loss of
    Transformer+RPE on the same weights); from step N, Transformer-XL's."""
    warm, plain = tiny(mem_len=8, mem_warmup_steps=1), tiny(mem_len=8)
    rpe = tiny(mem_len=0)
    for model in (warm, plain, rpe):
        model.load_state_dict(plain.state_dict())
        model.train()
    stream = torch.randint(0, VOCAB, (2, 33))
    segments = [{"input": stream[:, i : i + 16], "target": stream[:, i + 1 : i + 17]} for i in (0, 16)]

    def second_segment_nll(model: TransformerXLLM) -> torch.Tensor:
        memory = model.init_memory(2)
        for segment in segments:
            out = model.step(segment, memory)
            memory = detach_memory(out.memory)
        return out.nll

    assert torch.equal(second_segment_nll(warm), second_segment_nll(rpe))  # global_step 0 < 1
    assert not torch.allclose(second_segment_nll(plain), second_segment_nll(rpe))
    warm.mem_warmup_steps = 0  # the warm-up is over
    assert torch.equal(second_segment_nll(warm), second_segment_nll(plain))
    with pytest.raises(ValueError, match="mem_warmup_steps must be >= 0"):
        tiny(mem_warmup_steps=-1)


@pytest.mark.parametrize(
    ("within", "warmup_left"), [(0.0, 0), (0.09, 0), (0.1, 1000), (0.5, 1000), (None, 1000)]
)
def test_memory_warmup_is_dropped_on_text_bound_beyond_the_segment(caplog, within, warmup_left):
    """`mem_warmup_min_within`: at fit start the warm-up is dropped, in one line, when fewer of the
    training answers than that are bound within their segment; kept otherwise, and when the data
    cannot say (no answers, or no data module)."""
    model = tiny(mem_len=8, mem_warmup_steps=1000, mem_warmup_min_within=0.1)
    model._trainer = SimpleNamespace(datamodule=SimpleNamespace(train_answers_within_segment=within))
    with caplog.at_level(logging.INFO):
        model.on_fit_start()
    assert model.mem_warmup_steps == warmup_left
    said = [r.getMessage() for r in caplog.records if "no memory warm-up" in r.getMessage()]
    assert len(said) == (warmup_left == 0)
    model._trainer.datamodule.train_answers_within_segment = 0.5  # a later fit, on near text
    model.on_fit_start()
    assert model.mem_warmup_steps == 1000
    alone = tiny(mem_len=8, mem_warmup_steps=1000, mem_warmup_min_within=0.1)
    alone._trainer = SimpleNamespace()  # loaders passed to fit directly
    alone.on_fit_start()
    assert alone.mem_warmup_steps == 1000
    with pytest.raises(ValueError, match=r"mem_warmup_min_within is a fraction in \[0, 1\]"):
        tiny(mem_warmup_min_within=1.5)
