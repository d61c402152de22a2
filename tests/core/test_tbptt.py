"""Truncated backpropagation through k segments for segment-mode methods (`LMBase.tbptt_segments`).

A training batch holds k consecutive segments per row (the segment stream grouped by k,
`data.windows_per_batch`), read in order with the memory carried with its gradient and detached at
the batch's end: the forward is k detached steps' bit for bit, the gradient of the last segment
reaches the first segment of its batch (k − 1 back) and not the batch before (k back).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from longctx.core.base import detach_memory
from longctx.core.data_facts import DataMismatch
from longctx.data.datamodule import LMDataModule
from longctx.data.streams import SegmentStream
from tests.helpers.lm_fixtures import SyntheticData, cpu_trainer
from tests.helpers.methods import VOCAB, tiny

L, K = 8, 3


def segment_batches(k: int) -> list[dict[str, torch.Tensor]]:
    """Training batches of k segments (B = 2, L = 8) over documents, so rows restart inside batches."""
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=400)
    doc_offsets = np.array([0, 61, 150, 230, 400])
    return list(SegmentStream(tokens, 2, L, doc_offsets=doc_offsets, windows_per_batch=k))


def xl(tbptt_segments: int | None, n_layers: int = 2):
    """A tiny Transformer-XL whose memory holds one segment (so reaching s segments back takes s hops)."""
    torch.manual_seed(0)
    network = {"dropout": 0.0, "n_layers": n_layers}
    model = tiny("transformer_xl", network=network, mem_len=L, tbptt_segments=tbptt_segments)
    return model.train()


def adaptive_span(tbptt_segments: int | None, n_layers: int = 2):
    """A tiny adaptive span (its caches hold 32 states: four segments back in one hop)."""
    torch.manual_seed(0)
    network = {"dropout": 0.0, "n_layers": n_layers}
    return tiny("adaptive_span", network=network, tbptt_segments=tbptt_segments).train()


def compressive(tbptt_segments: int | None, n_layers: int = 2):
    """A tiny Compressive Transformer whose memory holds one segment (n_m = 8) and whose compressed
    memory 4 slots at c = 2 (the segment before it)."""
    torch.manual_seed(0)
    network = {"n_layers": n_layers}
    return tiny("compressive_transformer", network=network, tbptt_segments=tbptt_segments).train()


def embedding(model) -> torch.nn.Module:
    return model.net.word_emb if hasattr(model.net, "word_emb") else model.net.in_emb


METHODS = {"transformer_xl": xl, "adaptive_span": adaptive_span, "compressive_transformer": compressive}


def outside_a_trainer(model):
    """`training_step` without a Trainer: one process, nothing logged."""
    model._trainer = SimpleNamespace(world_size=1)
    model.log = lambda *args, **kwargs: None
    return model


@pytest.mark.parametrize("method", list(METHODS))
def test_k_segments_per_batch_are_k_detached_steps_bit_for_bit_forward(method):
    tbptt, plain = METHODS[method](K), METHODS[method](1)
    plain.load_state_dict(tbptt.state_dict())
    batches = segment_batches(K)[:4]
    assert any(batch["reset"][:, 1:].any() for batch in batches)  # a document starts inside a batch
    for batch in batches:
        out = tbptt._train_segments(batch)
        tbptt._memory["train"] = detach_memory(out.memory)
        for i in range(K):
            segment = {key: value[:, i] for key, value in batch.items()}
            step = plain._train_segments(segment)
            plain._memory["train"] = detach_memory(step.memory)
            assert torch.equal(out.nll[:, i], step.nll)
            assert torch.equal(out.mask[:, i], segment["mask"])


@pytest.mark.parametrize("method", list(METHODS))
def test_the_gradient_reaches_k_minus_1_segments_back_and_not_k(method):
    embedded: list[torch.Tensor] = []

    def record(module, args, output):
        output.retain_grad()
        embedded.append(output)

    # Three layers reach three segments back through the memory; a batch spans k = 3.
    model = outside_a_trainer(METHODS[method](K, n_layers=3))
    embedding(model).register_forward_hook(record)
    first, second = segment_batches(K)[:2]
    last_only = {**second, "mask": second["mask"].clone()}
    last_only["mask"][:, : K - 1] = False  # the loss of the batch's last segment alone

    model.training_step(first, 0)
    model.training_step(last_only, 1).backward()
    grads = [e.grad for e in embedded]
    assert grads[3] is not None and grads[3].abs().sum() > 0  # the batch's first segment: k − 1 back
    assert grads[:3] == [None] * 3  # the batch before: k back and more, cut at the batch's end

    # Without the cut at the batch's end the same network reaches the batch before.
    embedded.clear()
    model._memory["train"] = model._train_segments(first).memory
    out = model._train_segments(last_only)
    out.nll[:, K - 1].sum().backward()
    assert embedded[K - 1].grad is not None and embedded[K - 1].grad.abs().sum() > 0


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("k", [1, K])
def test_null_trains_through_the_segments_each_batch_holds_as_that_number_does(method, k):
    """`tbptt_segments: null` (the data module's layout decides, `data.far_text_layout`): on batches
    of k segments the same losses and gradients as `tbptt_segments: k`, step after step."""
    batches = segment_batches(k)[:3]
    if k == 1:
        batches = [{key: value[:, 0] for key, value in batch.items()} for batch in batches]
    following, fixed = (outside_a_trainer(METHODS[method](n)) for n in (None, k))
    fixed.load_state_dict(following.state_dict())
    for i, batch in enumerate(batches):
        losses = [model.training_step(batch, i) for model in (following, fixed)]
        for loss in losses:
            loss.backward()
        assert torch.equal(losses[0], losses[1])
        for (name, a), b in zip(following.named_parameters(), fixed.parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None), name
            assert a.grad is None or torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), name


def test_one_segment_per_batch_keeps_the_papers_stop_gradient():
    model = xl(1)
    batch = {key: value[:, 0] for key, value in segment_batches(K)[0].items()}
    memory = model._train_segments(batch).memory
    assert not any(h.requires_grad for h in memory.hidden)


def test_the_compressive_transformer_carries_the_graph_of_its_memory_alone():
    """Under truncated BPTT the Compressive Transformer's memory n_m keeps its graph within a batch; its
    compressed memory stays a stop-gradient and f_c learns from the reconstruction loss alone (§3.2):
    the language-model loss leaves f_c without a gradient, and the reconstruction loss leaves the
    main network without one."""
    model = outside_a_trainer(compressive(K))
    first = segment_batches(K)[0]
    out = model._train_segments(first)
    assert model.net.learns_compression and out.memory.compressed_valid.any()
    assert all(h.requires_grad for h in out.memory.hidden)
    assert not any(c.requires_grad for c in out.memory.compressed)
    compression = {id(p) for p in model.net.compression_parameters()}
    out.nll.sum().backward()
    for name, p in model.named_parameters():
        assert (p.grad is None) == (id(p) in compression), name
    model.zero_grad(set_to_none=True)
    out = model._train_segments(first)
    out.extra_loss.backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None and p.grad.abs().sum() > 0) == (id(p) in compression), name


def test_batches_of_another_number_of_segments_are_one_line_errors():
    batch = segment_batches(K)[0]
    one = {key: value[:, 0] for key, value in batch.items()}
    with pytest.raises(
        DataMismatch,
        match=r"^TransformerXLLM trains with truncated BPTT over 2 segments \(model\.init_args\.tbptt_"
        r"segments\), but the training batches hold 3 segments per row \(data\.windows_per_batch\): set "
        r"data\.windows_per_batch: 2$",
    ):
        xl(2)._train_segments(batch)
    with pytest.raises(DataMismatch, match=r"hold 1 segment per row .*: set data\.windows_per_batch: 2$"):
        xl(2)._train_segments(one)
    with pytest.raises(DataMismatch, match=r"^WindowTransformerLM trains on one segment per batch \(it has"):
        tiny("window_transformer").train()._train_segments(batch)
    with pytest.raises(
        ValueError, match=r"^tbptt_segments must be 1 or more \(or null: as the batches hold\), got 0$"
    ):
        tiny("transformer_xl", tbptt_segments=0)


def test_segment_mode_windows_per_batch_groups_the_segment_stream_and_resumes_exactly(tmp_path):
    tokens = np.random.default_rng(1).integers(0, VOCAB, size=300)

    def data(windows_per_batch: int) -> LMDataModule:
        module = LMDataModule(
            "sample", cache_dir=str(tmp_path), batch_size=2, tgt_len=L, windows_per_batch=windows_per_batch
        )
        module._corpus = SimpleNamespace(split=lambda name: SimpleNamespace(tokens=tokens, doc_offsets=None))
        return module

    single, grouped = data(1), data(K)
    segments = list(single.stream("train", train=True))
    batches = list(grouped.stream("train", train=True))
    assert single.stream("train", train=True).state_dict()["windows_per_batch"] is None  # as before
    assert len(batches) == -(-len(segments) // K)
    for index, batch in enumerate(batches[:-1]):
        for key, value in batch.items():
            assert torch.equal(value, torch.stack([s[key] for s in segments[K * index : K * index + K]], 1))
    assert grouped.stream("valid", train=False).batch(0)["input"].dim() == 2  # evaluation: one segment

    stream = grouped.stream("train", train=True)
    iterator = iter(stream)
    next(iterator), next(iterator)
    resumed = grouped.stream("train", train=True)
    resumed.load_state_dict(stream.state_dict())
    for expected, got in zip(batches[2:], resumed, strict=True):
        assert all(torch.equal(expected[key], got[key]) for key in expected)


class GroupedData(SyntheticData):
    """The synthetic segments, k per training batch."""

    def train_dataloader(self) -> SegmentStream:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return SegmentStream(
            self.tokens, self.batch_size, self.seq_len, windows_per_batch=K, rank=rank, world_size=world
        )


def test_a_fit_trains_on_k_segments_per_step(tmp_path):
    torch.manual_seed(0)
    model = tiny("transformer_xl", tbptt_segments=K)
    trainer = cpu_trainer(tmp_path, max_steps=2, limit_val_batches=1, val_check_interval=2)
    trainer.fit(model, datamodule=GroupedData(n_tokens=401, batch_size=2, seq_len=L))
    assert trainer.global_step == 2 and torch.isfinite(trainer.callback_metrics["train/loss"])
    assert trainer.callback_metrics["val/loss"] > 0  # evaluation reads one segment per batch
