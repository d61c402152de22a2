"""Recurrence for pretrained transformers (Yoshida et al. 2020) on a small random GPT-2.

What is proved here:
- the registered attention functions: without h_prev the model is the stock GPT-2 bit for bit (sdpa and
  eager, with and without padding); with h_prev, block ℓ_ins attends to exactly one extra key/value
  from its own projections (checked against a hand-written reference), every position from ℓ_ins up
  changes and nothing below; causality, positions, padding masks, sdpa = eager; a stock model is
  refused (it would silently ignore the slot);
- eq. 1 pooling and the FFN; BPTT through K windows with per-window checkpointing equals BPTT without
  (loss and every gradient, dropout on); the gradient of window k's loss reaches window k−1;
- the LightningModule: memory carried across batches equals one long batch, resets inside a batch,
  the baseline is the stock model on independent windows, a tiny Trainer run, export -> pretrained;
- FLOPs per token against the paper's table;
- overlap evaluation: every token scored once, o = T−1 without recurrence = per-token sliding window.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from longctx.data.streams import SegmentStream
from longctx.methods.recurrence.export import lm_from_checkpoint, main
from longctx.methods.recurrence.flops import (
    flops_per_scored_token,
    hf_model_flops_per_scored_token,
    kaplan_non_embedding_params,
)
from longctx.methods.recurrence.hf import register_recurrence_attention
from longctx.methods.recurrence.module import RecurrentGPT2LM
from longctx.methods.recurrence.network import (
    RECURRENCE_EAGER,
    RECURRENCE_SDPA,
    SLOT_KWARG,
    LayerPooling,
    RecurrenceFFN,
    RecurrenceSlot,
    WindowRecurrence,
    run_window,
    valid_positions,
)
from tests.helpers.environment import REPO, shared_dir, skip_without_shared
from tests.helpers.knob_checks import assert_same_weights, save_with_hparams
from tests.helpers.lm_fixtures import NoTextFacts
from tests.helpers.memory_checks import assert_losses_depend_on_windows_from_their_memory_start

VOCAB, D, N_LAYER, N_HEAD, L_INS = 101, 32, 4, 4, 2
TINY = {"n_layer": N_LAYER, "n_embd": D, "n_head": N_HEAD, "n_positions": 64}


def gpt2(impl: str = "sdpa", dropout: float = 0.0, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        bos_token_id=None,
        eos_token_id=None,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        **TINY,
    )
    config.use_cache = False  # HF's cached path rounds differently (eager, by one ulp) from the uncached one
    lm = GPT2LMHeadModel(config)
    register_recurrence_attention()
    lm.set_attn_implementation(impl)
    return lm.eval()


def pair(impl: str = "sdpa") -> tuple[GPT2LMHeadModel, GPT2LMHeadModel]:
    """A stock model and the same weights running the recurrence attention."""
    stock = gpt2(impl)
    rec = gpt2({"sdpa": RECURRENCE_SDPA, "eager": RECURRENCE_EAGER}[impl])
    rec.load_state_dict(stock.state_dict())
    return stock, rec


def slot(h_prev: torch.Tensor, lm: GPT2LMHeadModel, present: torch.Tensor | None = None) -> RecurrenceSlot:
    net = WindowRecurrence.Config(insert_layer=L_INS).build(D, N_LAYER)
    present = torch.ones(h_prev.shape[0], dtype=torch.bool) if present is None else present
    return net.slot_for(lm, h_prev, present)


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ the attention function
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_without_h_prev_the_model_is_stock_gpt2_bit_for_bit(impl):
    stock, rec = pair(impl)
    x = tokens(3, 12)
    a = stock(x, output_hidden_states=True)
    b = run_window(rec, x, output_hidden_states=True)
    assert torch.equal(a.logits, b.logits)
    assert all(torch.equal(p, q) for p, q in zip(a.hidden_states, b.hidden_states, strict=True))
    # With a padding mask (left padding) too: the registered mask function builds the same mask.
    attn = torch.ones(3, 12, dtype=torch.long)
    attn[0, :4] = 0
    assert torch.equal(stock(x, attention_mask=attn).logits, rec(x, attention_mask=attn).logits)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_h_prev_changes_every_position_from_l_ins_up_and_nothing_below(impl):
    stock, rec = pair(impl)
    x = tokens(2, 10)
    h_prev = torch.randn(2, D)
    a = stock(x, output_hidden_states=True).hidden_states  # (embeddings, block 0, ..., block L-1)
    b = run_window(rec, x, slot=slot(h_prev, rec), output_hidden_states=True).hidden_states
    for i, (p, q) in enumerate(zip(a, b, strict=True)):
        if i <= L_INS:  # embeddings and blocks 0 .. ℓ_ins − 1
            assert torch.equal(p, q), i
        else:  # every position, position 0 included, of blocks ℓ_ins ..
            assert (p - q).abs().amax(-1).min() > 1e-6, i


def reference_with_slot(lm: GPT2LMHeadModel, x: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
    """Logits with block ℓ_ins's attention written out: T queries, 1 + T keys, the slot's key/value
    from c_attn(ln_1(h_prev)), visible to every query; the other blocks are the stock modules."""
    tr = lm.transformer
    batch, length = x.shape
    h = tr.wte(x) + tr.wpe(torch.arange(length))
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    additive = torch.zeros(length, length).masked_fill(~causal, torch.finfo(torch.float32).min)[None, None]
    for i, block in enumerate(tr.h):
        if i != L_INS:
            h = block(h, attention_mask=additive)
            continue
        attn = block.attn
        q, k, v = attn.c_attn(block.ln_1(h)).split(D, dim=2)  # (B, T, d)
        _, ks, vs = attn.c_attn(block.ln_1(h_prev)[:, None]).split(D, dim=2)  # (B, 1, d): no query
        k, v = torch.cat([ks, k], 1), torch.cat([vs, v], 1)  # (B, 1 + T, d)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, t.shape[1], N_HEAD, D // N_HEAD).transpose(1, 2)

        scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(D // N_HEAD)  # (B, H, T, 1 + T)
        allowed = torch.ones(length, length + 1, dtype=torch.bool).tril(1)  # slot column + causal
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out = (probs @ heads(v)).transpose(1, 2).reshape(batch, length, D)
        h = h + attn.c_proj(out)
        h = h + block.mlp(block.ln_2(h))
    return lm.lm_head(tr.ln_f(h))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_slot_is_one_extra_key_and_value_from_the_layers_own_projections(impl):
    _, rec = pair(impl)
    x, h_prev = tokens(2, 9), torch.randn(2, D)
    got = run_window(rec, x, slot=slot(h_prev, rec)).logits
    torch.testing.assert_close(got, reference_with_slot(rec, x, h_prev), rtol=1e-5, atol=1e-5)


def test_causality_and_positions_with_h_prev():
    _, rec = pair()
    x, h_prev = tokens(2, 10), torch.randn(2, D)
    seen = []
    hook = rec.transformer.wpe.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    base = run_window(rec, x, slot=slot(h_prev, rec)).logits
    hook.remove()
    assert torch.equal(seen[0].flatten(), torch.arange(10))  # the slot takes no position
    explicit = run_window(rec, x, slot=slot(h_prev, rec), position_ids=torch.arange(10)[None]).logits
    assert torch.equal(base, explicit)
    for t in (0, 4, 9):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % VOCAB
        changed = run_window(rec, y, slot=slot(h_prev, rec)).logits
        assert torch.equal(changed[:, :t], base[:, :t])  # positions before t never see token t
        assert not torch.allclose(changed[:, t], base[:, t])


def test_sdpa_and_eager_agree_with_mixed_rows_and_padding():
    _, sdpa = pair("sdpa")
    _, eager = pair("eager")
    x, h_prev = tokens(3, 11), torch.randn(3, D)
    present = torch.tensor([True, False, True])
    attn = torch.ones(3, 11, dtype=torch.long)
    attn[2, :3] = 0  # left padding in row 2
    outs = [
        run_window(lm, x, slot=slot(h_prev, lm, present), attention_mask=attn).logits for lm in (sdpa, eager)
    ]
    real = attn.bool()  # padded queries see no key in sdpa and eager alike: their outputs are arbitrary
    torch.testing.assert_close(outs[0][real], outs[1][real], rtol=1e-5, atol=1e-5)


def test_rows_without_h_prev_equal_the_stock_model_and_padding_masks_work():
    stock, rec = pair()
    x, h_prev = tokens(3, 10), torch.randn(3, D)
    present = torch.tensor([True, False, True])
    mixed = run_window(rec, x, slot=slot(h_prev, rec, present)).logits
    torch.testing.assert_close(mixed[1], stock(x[1:2]).logits[0], rtol=1e-5, atol=1e-5)
    alone = run_window(rec, x[2:], slot=slot(h_prev[2:], rec)).logits
    torch.testing.assert_close(mixed[2], alone[0], rtol=1e-5, atol=1e-5)
    # Left padding: the real tokens of a padded row (with shifted position ids) equal the unpadded row,
    # which needs the padding mask to reach the slot attention (mask functions registered).
    pad = 3
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), x[:1]], 1)
    attn = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)], 1)
    pos = (attn.cumsum(1) - 1).clamp_min(0)
    got = run_window(rec, padded, slot=slot(h_prev[:1], rec), attention_mask=attn, position_ids=pos).logits
    torch.testing.assert_close(got[:, pad:], mixed[:1], rtol=1e-5, atol=1e-5)
    ones = torch.ones_like(attn)  # (no mask at all would be read from the position ids as packed sequences)
    without_mask = run_window(
        rec, padded, slot=slot(h_prev[:1], rec), attention_mask=ones, position_ids=pos
    ).logits
    assert (without_mask[:, pad:] - mixed[:1]).abs().max() > 1e-4  # the mask matters


def test_a_stock_attention_is_refused_because_it_ignores_the_slot():
    stock, rec = pair()
    x, h_prev = tokens(2, 8), torch.randn(2, D)
    s = slot(h_prev, rec)
    # The trap: a stock model takes the keyword and silently returns the model without recurrence.
    assert torch.equal(stock(x, **{SLOT_KWARG: s}).logits, stock(x).logits)
    with pytest.raises(RuntimeError, match="ignores the recurrence slot"):
        run_window(stock, x, slot=s)
    with pytest.raises(RuntimeError, match="consumed by 0"):
        run_window(rec, x, slot=RecurrenceSlot(N_LAYER + 3, s.state, s.present))
    with pytest.raises(RuntimeError, match="ignores the recurrence slot"):
        recurrence = WindowRecurrence.Config().build(D, N_LAYER)
        recurrence(stock, x[:, None], x[:, None], torch.ones(2, 1, 8, dtype=torch.bool),
                   torch.zeros(2, 1, dtype=torch.bool))  # fmt: skip


# ------------------------------------------------------------------ pooling, FFN, BPTT
def test_layer_pooling_is_eq_1_over_real_positions():
    torch.manual_seed(0)
    pool = LayerPooling(3)
    with torch.no_grad():
        pool.weight_logits.copy_(torch.tensor([0.5, -1.0, 2.0]))
    states = [torch.randn(2, 5, 4) for _ in range(3)]
    valid = torch.tensor([[True] * 5, [True, True, True, False, False]])
    w = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), 0)
    expected = torch.stack(
        [sum(w[l] * states[l][b, : int(valid[b].sum())].mean(0) for l in range(3)) for b in range(2)]
    )
    torch.testing.assert_close(pool(states, valid), expected)
    mask = torch.tensor([[False, False, True, True, False, False]])  # overlap prefix, then padding
    assert valid_positions(mask).tolist() == [[True, True, True, True, False, False]]


def test_ffn_has_three_hidden_layers_of_200():
    ffn = RecurrenceFFN(768)
    shapes = [tuple(m.weight.shape) for m in ffn.modules() if isinstance(m, torch.nn.Linear)]
    assert shapes == [(200, 768), (200, 200), (200, 200), (768, 200)]
    assert ffn(torch.randn(5, 768)).shape == (5, 768)


def window_batch(
    batch: int = 2, n_windows: int = 3, length: int = 8, seed: int = 3
) -> dict[str, torch.Tensor]:
    x = tokens(batch, n_windows, length + 1, seed=seed)
    return {
        "input": x[..., :-1],
        "target": x[..., 1:],
        "mask": torch.ones(batch, n_windows, length, dtype=torch.bool),
        "reset": torch.zeros(batch, n_windows, dtype=torch.bool),
    }


def bptt(checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    lm = gpt2(RECURRENCE_SDPA, dropout=0.1).train()
    torch.manual_seed(5)
    net = WindowRecurrence.Config(insert_layer=L_INS).build(D, N_LAYER)
    b = window_batch()
    torch.manual_seed(7)  # dropout masks
    nll, h, _ = net(lm, b["input"], b["target"], b["mask"], b["reset"], torch.randn(2, D), checkpointing)
    loss = nll.mean() + h.square().mean()
    loss.backward()
    params = {**dict(lm.named_parameters()), **{f"rec.{k}": v for k, v in net.named_parameters()}}
    return loss.detach(), {k: p.grad for k, p in params.items()}


@pytest.mark.slow  # ~10-30 s on 2 CPU cores: the fast tier stays within 3 minutes
def test_checkpointed_bptt_equals_plain_bptt_loss_and_gradients():
    loss_plain, grads_plain = bptt(False)
    loss_ckpt, grads_ckpt = bptt(True)
    assert torch.equal(loss_plain, loss_ckpt)
    assert grads_plain.keys() == grads_ckpt.keys()
    for name in grads_plain:
        assert grads_plain[name] is not None, name
        torch.testing.assert_close(grads_ckpt[name], grads_plain[name], rtol=1e-5, atol=1e-7, msg=name)


def saved_for_backward_bytes(checkpointing: bool, n_windows: int) -> int:
    """Bytes of the distinct storages autograd keeps for backward after the forward over K windows."""
    lm = gpt2(RECURRENCE_SDPA)
    net = WindowRecurrence.Config(insert_layer=L_INS).build(D, N_LAYER)
    b = window_batch(n_windows=n_windows, length=16)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(lm, b["input"], b["target"], b["mask"], b["reset"], None, checkpointing)
    return sum(storages.values())


def test_checkpointing_keeps_only_z_and_h_prev_per_window():
    """Paper §3.2: per window only its inputs (held by the checkpoint), z_i and h_prev,i (with the small
    FFN's activations) stay in memory; without checkpointing every activation of the window does."""
    plain = (saved_for_backward_bytes(False, 8) - saved_for_backward_bytes(False, 1)) / 7
    ckpt = (saved_for_backward_bytes(True, 8) - saved_for_backward_bytes(True, 1)) / 7
    batch, ffn = 2, 3 * 200
    assert ckpt <= 4 * batch * (ffn + 4 * D)  # float32 z, h_prev and the FFN's hidden activations
    assert ckpt < 0.02 * plain


def test_gradient_of_window_k_reaches_window_k_minus_1_except_across_a_reset():
    lm = gpt2(RECURRENCE_SDPA)
    net = WindowRecurrence.Config(insert_layer=L_INS).build(D, N_LAYER)
    b = window_batch(batch=3, n_windows=2)
    b["reset"][0, 1] = True  # row 0 starts a new document at window 1
    embeddings: list[torch.Tensor] = []

    def keep(module, args, out):
        out.retain_grad()
        embeddings.append(out)

    hook = lm.transformer.wte.register_forward_hook(keep)
    nll, _, _ = net(lm, b["input"], b["target"], b["mask"], b["reset"], h_prev=None)
    hook.remove()
    nll[:, 1].sum().backward()  # window 1's loss only
    window0_grad = embeddings[0].grad.abs().sum((1, 2))  # (B,) gradient at window 0's embeddings
    assert window0_grad[0] == 0  # across the reset: nothing flows back
    assert (window0_grad[1:] > 0).all()  # through h_prev into the previous window
    assert net.pooling.weight_logits.grad.abs().sum() > 0  # the layer weights of eq. 1
    assert all(p.grad.abs().sum() > 0 for p in net.ffn.parameters())


# ------------------------------------------------------------------ the LightningModule
def module(recurrence: bool = True, **kwargs) -> RecurrentGPT2LM:
    torch.manual_seed(0)
    config = {**TINY, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    return RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config=config, recurrence=recurrence, **kwargs).eval()


def split_windows(b: dict[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
    return {k: v[:, start:stop] for k, v in b.items()}


def test_memory_across_batches_equals_one_long_batch_and_resets_apply_per_window():
    m = module()
    b = window_batch(n_windows=4)
    with torch.no_grad():
        whole = m.step(b, None)
        first = m.step(split_windows(b, 0, 2), None)
        second = m.step(split_windows(b, 2, 4), first.memory)
        torch.testing.assert_close(torch.cat([first.nll, second.nll], 1), whole.nll)
        torch.testing.assert_close(second.memory, whole.memory)
        # Row 0 starts a new document at window 2: its window 2 equals a fresh start, row 1 does not.
        b["reset"][0, 2] = True
        reset = m.step(b, None)
        fresh = m.step(split_windows(b, 2, 3), None)
    torch.testing.assert_close(reset.nll[0, 2], fresh.nll[0, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reset.nll[1], whole.nll[1])
    assert not torch.allclose(whole.nll[0, 2], fresh.nll[0, 0])


@pytest.mark.parametrize(("eval_h_prev", "begins"), [("carried", [0] * 4), ("reset", [0, 1, 2, 3])])
def test_the_memory_start_is_the_rows_start_or_with_h_prev_reset_the_windows_own(eval_h_prev, begins):
    """token_nll.npz `memory_start` (`evaluation_memory_start`): h_prev carries every earlier window of
    the row into a window's loss, and none with `eval_h_prev: reset`."""
    model = module(eval_h_prev=eval_h_prev)
    assert (
        assert_losses_depend_on_windows_from_their_memory_start(model, window_batch(n_windows=4), VOCAB)
        == begins
    )


def test_reset_rows_starts_those_rows_a_document_at_the_next_batch():
    """`RecurrenceMemory.reset_rows` (the `RowMemory` protocol): the next batch reads as if those rows'
    first window were a document start; the empty memory reads as no memory."""
    m = module()
    b = window_batch(n_windows=4)
    first, second = split_windows(b, 0, 2), split_windows(b, 2, 4)
    with torch.no_grad():
        memory = m.step(first, m.init_memory(2)).memory
        cleared = m.step(second, memory.reset_rows(torch.tensor([True, False]))).nll
        reset = second["reset"].clone()
        reset[0, 0] = True
        started = m.step({**second, "reset": reset}, memory).nll
        assert torch.equal(m.step(first, m.init_memory(2)).nll, m.step(first, None).nll)
        carried = m.step(second, memory).nll
    assert torch.equal(cleared, started)
    assert torch.equal(cleared[1], carried[1]) and not torch.allclose(cleared[0, 0], carried[0, 0])


def test_baseline_is_the_stock_model_on_independent_windows_and_checkpointing_is_exact():
    m = module(recurrence=False)
    b = window_batch(n_windows=3)
    stock = gpt2()
    stock.load_state_dict(m.lm.state_dict())
    with torch.no_grad():
        out = m.step(b, None)
    assert out.memory is None
    for k in range(3):
        logits = stock(b["input"][:, k]).logits
        ref = F.cross_entropy(logits.transpose(1, 2), b["target"][:, k], reduction="none")
        assert torch.equal(out.nll[:, k], ref)
    grads = []
    for ckpt in (False, True):
        m.train()
        m.checkpoint_windows = ckpt
        m.zero_grad()
        m.step(b, None).nll.mean().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for g0, g1 in zip(*grads, strict=True):
        torch.testing.assert_close(g0, g1, rtol=1e-5, atol=1e-7)


class WindowData(NoTextFacts, pl.LightningDataModule):
    """Window streams over fixed pseudo-random tokens (no data layer needed)."""

    mode = "windows"

    def __init__(self, length: int = 8, overlap: int = 2, n_windows: int = 3) -> None:
        super().__init__()
        self.tokens = np.random.default_rng(0).integers(0, VOCAB, size=1500).astype(np.int64)
        self.length, self.overlap, self.n_windows = length, overlap, n_windows
        self.eval_overlap = overlap
        self.metric = "ppl"

    def train_dataloader(self) -> SegmentStream:
        return SegmentStream(
            self.tokens, 2, self.length, overlap=self.overlap, windows_per_batch=self.n_windows
        )

    def val_dataloader(self) -> SegmentStream:
        return SegmentStream(
            self.tokens[:300], 3, self.length, overlap=self.eval_overlap, windows_per_batch=1, pad=True
        )


@pytest.mark.slow  # ~10-30 s on 2 CPU cores: the fast tier stays within 3 minutes
@skip_without_shared("data", "gpt2")  # the tokenizer files the export copies
def test_tiny_trainer_run_export_and_reload_as_pretrained(tmp_path):
    m = module(lr_scheduler=None)
    data = WindowData()
    trainer = pl.Trainer(
        max_steps=4, val_check_interval=4, limit_val_batches=3, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(m, datamodule=data)
    metrics = trainer.callback_metrics
    assert math.isfinite(float(metrics["train/loss"])) and float(metrics["val/ppl"]) > 1
    expected = hf_model_flops_per_scored_token(m.lm, 8, 2, output_layer=True)
    # By hand: N = 2·d·n_layer·(2·d + 4·d) = 49,152 (d = 32, 4 layers), plus the LM head d·V
    # (V = m.vocab_size); (2N + 2·n_layer·T·d)·T/(T − o).
    n_params = 49_152 + 32 * m.lm.config.vocab_size
    assert expected == (2 * n_params + 2 * 4 * 8 * 32) * 8 / 6
    assert float(metrics["val/flops_per_token"]) == pytest.approx(expected, rel=1e-6)
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    out = tmp_path / "hf"
    main([str(ckpt), str(out), "--tokenizer", str(shared_dir() / "data" / "gpt2")])
    assert (out / "vocab.json").is_file() and (out / "merges.txt").is_file()
    reloaded = RecurrentGPT2LM(vocab_size=VOCAB, pretrained=str(out), recurrence=True).eval()
    x = tokens(2, 8)
    assert torch.equal(reloaded.lm(x).logits, m.lm.eval()(x).logits)
    assert torch.equal(lm_from_checkpoint(ckpt)(x).logits, m.lm(x).logits)


# ------------------------------------------------------------------ FLOPs
@pytest.mark.parametrize(("overlap", "paper"), [(0, 1.75e8), (30, 1.94e8), (200, 5.25e8)])
def test_flops_per_token_reproduce_the_papers_table(overlap, paper):
    n_params = kaplan_non_embedding_params(n_layers=12, d_model=768)  # GPT-2 small
    assert n_params == 84_934_656
    got = flops_per_scored_token(n_params, n_layers=12, window=300, d_model=768, overlap=overlap)
    assert abs(got / paper - 1) < 0.005
    with torch.device("meta"):
        small = GPT2LMHeadModel(GPT2Config())
    assert hf_model_flops_per_scored_token(small, 300, overlap) == got
    # Counting biases and LayerNorms too (85,056,000) misses the o = 30 entry: the paper used Kaplan's N.
    embeddings = {id(p) for m in small.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    counted = sum(p.numel() for p in small.parameters() if id(p) not in embeddings)
    assert counted == 85_056_000
    if overlap == 30:
        assert abs(flops_per_scored_token(counted, 12, 300, 768, overlap) / paper - 1) > 0.005


# ------------------------------------------------------------------ overlap evaluation
def scored_targets(m: RecurrentGPT2LM, stream: SegmentStream) -> tuple[list[int], float]:
    """Every scored target id and the total NLL of one pass over the stream, memory carried."""
    memory, targets, total = None, [], 0.0
    with torch.no_grad():
        for batch in stream:
            out = m.step(batch, memory)
            memory = out.memory
            targets += batch["target"][batch["mask"]].tolist()
            total += float((out.nll.double() * batch["mask"]).sum())
    return targets, total


@pytest.mark.parametrize("recurrence", [False, True])
@pytest.mark.parametrize(
    ("overlap", "n_windows"), [(0, 1), (3, 1), pytest.param(7, 2, marks=pytest.mark.slow)]
)
def test_overlap_evaluation_scores_every_token_once(recurrence, overlap, n_windows):
    m = module(recurrence=recurrence)
    ids = np.arange(97, dtype=np.int64)  # distinct ids: a scored id names its position
    stream = SegmentStream(ids, 3, 8, overlap=overlap, windows_per_batch=n_windows, pad=True)
    targets, total = scored_targets(m, stream)
    assert sorted(targets) == list(range(1, 97))
    assert math.isfinite(total)


@pytest.mark.slow  # ~10-30 s on 2 CPU cores: the fast tier stays within 3 minutes
def test_overlap_t_minus_1_without_recurrence_is_the_per_token_sliding_window():
    m = module(recurrence=False)
    length, ids = 8, np.random.default_rng(1).integers(0, VOCAB, size=60).astype(np.int64)
    stream = SegmentStream(ids, 1, length, overlap=length - 1, windows_per_batch=1, pad=True)  # one row
    _, total = scored_targets(m, stream)
    reference, t = 0.0, torch.from_numpy(ids)
    with torch.no_grad():
        for j in range(1, len(ids)):  # token j given at most `length` previous tokens
            context = t[max(0, j - length) : j][None]
            logits = m.lm(context).logits[0, -1]
            reference -= float(torch.log_softmax(logits.double(), -1)[t[j]])
    assert total == pytest.approx(reference, rel=1e-6)


# ------------------------------------------------------------------ CLI on real text
def test_evaluate_overlaps_from_the_cli_on_real_wikitext_raw(tmp_path, monkeypatch, capsys):
    """`evaluate_overlaps` of the tiny config on the bundled WikiText-103-raw test split (GPT-2 BPE)."""
    from pathlib import Path

    from longctx.commands.cli import main as cli_main

    repo = REPO
    shared = shared_dir() / "data"
    if not (shared / "wikitext-raw").is_dir():
        pytest.skip(f"{shared / 'wikitext-raw'} is not present (../shared, or set $LONGCTX_SHARED)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cli = cli_main([
        "evaluate_overlaps",
        "--config", str(repo / "configs" / "recurrent_gpt2_tiny.yaml"),
        "--data.root", str(shared),
        "--data.tokenizer", str(shared / "gpt2"),
        "--data.cache_dir", str(tmp_path / "cache"),
        "--model.init_args.gpt2_config", '{"n_layer": 3, "n_embd": 32, "n_head": 2, "n_positions": 64}',
        "--overlaps", "[0,16,48]",
        "--trainer.limit_test_batches", "2",
        "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--run_name", "overlaps",
    ])  # fmt: skip
    assert cli.model.vocab_size == 50_257
    lines = capsys.readouterr().out.strip().splitlines()
    header = lines.index(next(line for line in lines if line.split()[:1] == ["overlap"]))
    names = lines[header].split()
    rows = [
        dict(zip(names, map(float, line.split()), strict=True)) for line in lines[header + 1 : header + 4]
    ]
    assert [r["overlap"] for r in rows] == [0, 16, 48]
    flops = [r["test/flops_per_token"] for r in rows]
    assert flops[1] / flops[0] == pytest.approx(64 / 48, rel=1e-4)  # T / (T − o), T = 64
    assert flops[2] / flops[0] == pytest.approx(64 / 16, rel=1e-4)
    # 2 batches of 8 rows: the first windows score all 64 targets, later ones the last T − o.
    assert [r["test/tokens"] for r in rows] == [2 * 8 * 64, 8 * 64 + 8 * 48, 8 * 64 + 8 * 16]
    assert all(math.isfinite(r["test/ppl"]) for r in rows)
    assert (Path(cli.trainer.default_root_dir) / "overlaps_test.png").stat().st_size > 0


# ------------------------------------------------------------------ knobs (issue 21: one source per knob)
# Recorded before `WindowRecurrence.Config` existed: the knobs moved, the weights' names did not.
GPT2_BLOCK_KEYS = (
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias",
)  # fmt: skip
STATE_DICT_KEYS = [
    "lm.transformer.wte.weight", "lm.transformer.wpe.weight",
    *(f"lm.transformer.h.{i}.{name}" for i in range(N_LAYER) for name in GPT2_BLOCK_KEYS),
    "lm.transformer.ln_f.weight", "lm.transformer.ln_f.bias", "lm.lm_head.weight",
    "recurrence.pooling.weight_logits",
    *(f"recurrence.ffn.net.{i}.{name}" for i in (0, 2, 4, 6) for name in ("weight", "bias")),
]  # fmt: skip
RECURRENCE_KNOBS = {
    "insert_layer": 1, "ffn_width": 8, "ffn_hidden_layers": 2, "ffn_activation": "gelu", "slot_norm": False,
}  # fmt: skip
# What `module(window_recurrence=RECURRENCE_KNOBS)` saved as hyper_parameters before the group.
FLAT_HPARAMS = {
    "vocab_size": VOCAB, "pretrained": None,
    "gpt2_config": {**TINY, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "recurrence": True, "insert_layer": 1, "ffn_width": 8, "ffn_hidden_layers": 2, "ffn_activation": "gelu",
    "pool_embeddings": False, "slot_norm": False, "checkpoint_windows": True, "window_by_window": True,
    "checkpoint_blocks": False, "loss_chunk": 0, "attn_implementation": "sdpa", "eval_h_prev": "carried",
}  # fmt: skip


def test_state_dict_keys_are_those_recorded_before_the_knob_groups():
    assert list(module().state_dict()) == STATE_DICT_KEYS
    assert list(module(recurrence=False).state_dict()) == [k for k in STATE_DICT_KEYS if k.startswith("lm.")]


@pytest.mark.parametrize("recurrence", [True, False])
def test_the_module_from_its_recurrence_group_as_a_dataclass_equals_the_one_from_a_dict(recurrence):
    grouped = module(recurrence, window_recurrence=WindowRecurrence.Config(**RECURRENCE_KNOBS))
    from_dict = module(recurrence, window_recurrence=RECURRENCE_KNOBS)
    assert dict(grouped.hparams) == dict(from_dict.hparams)
    assert grouped.hparams["window_recurrence"] == {**RECURRENCE_KNOBS, "pool_embeddings": False}
    assert_same_weights(grouped, from_dict)
    if recurrence:
        assert grouped.recurrence.config == WindowRecurrence.Config(**RECURRENCE_KNOBS)
        assert from_dict.recurrence.config == grouped.recurrence.config
        assert isinstance(grouped.recurrence.ffn.net[1], torch.nn.GELU)
    else:
        assert grouped.recurrence is None and from_dict.recurrence is None  # the windowed baseline


def test_a_checkpoint_with_the_old_flat_hyperparameters_loads_into_the_same_knobs_and_weights(tmp_path):
    model = module(window_recurrence=RECURRENCE_KNOBS)
    path = save_with_hparams(model, FLAT_HPARAMS, tmp_path / "flat.ckpt")
    loaded = RecurrentGPT2LM.load_from_checkpoint(path, eval_h_prev="reset")
    assert loaded.recurrence.config == WindowRecurrence.Config(**RECURRENCE_KNOBS)
    assert dict(loaded.hparams) == {**model.hparams, "eval_h_prev": "reset"}
    assert_same_weights(loaded, model)
    baseline = module(recurrence=False)
    path = save_with_hparams(baseline, {**FLAT_HPARAMS, "recurrence": False}, tmp_path / "window.ckpt")
    loaded = RecurrentGPT2LM.load_from_checkpoint(path)
    assert loaded.recurrence is None and loaded.hparams["recurrence"] is False
    assert_same_weights(loaded, baseline)


def test_config_build_equals_the_recurrence_from_its_config():
    config = WindowRecurrence.Config(**RECURRENCE_KNOBS)
    torch.manual_seed(0)
    built = config.build(D, N_LAYER)
    torch.manual_seed(0)
    constructed = WindowRecurrence(D, N_LAYER, config)
    assert built.config == constructed.config == config
    assert_same_weights(built, constructed)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"insert_layer": -1}, r"^insert_layer \(ℓ_ins\) counts blocks from 0, got -1$"),
        ({"ffn_width": 0}, r"^the FFN needs ffn_width >= 1 and ffn_hidden_layers >= 0, got 0 and 3$"),
        (
            {"ffn_activation": "swish"},
            r"^ffn_activation must be one of \['gelu', 'relu', 'tanh'\], got '\w+'$",
        ),
    ],
)
def test_a_bad_recurrence_knob_is_one_line_when_the_config_is_made(knobs, message):
    with pytest.raises(ValueError, match=message):
        WindowRecurrence.Config(**knobs)


def test_an_insert_layer_beyond_the_lm_is_one_line_when_built():
    with pytest.raises(ValueError, match=r"^insert_layer \(ℓ_ins\) must be in \[0, 4\), got 4$"):
        WindowRecurrence.Config(insert_layer=4).build(D, N_LAYER)
