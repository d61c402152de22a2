"""`AdaptiveSpanLM` inside a real Lightning Trainer: the loss with the span penalty, z' clamped after
every optimizer step, the span logs, the span figure at the end of fit, memory carried across batches."""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

import longctx.methods.adaptive_span.figures as adaptive_span_figures
from longctx.methods.adaptive_span.figures import SPAN_FIGURE
from longctx.methods.adaptive_span.memory import SpanCache
from longctx.methods.adaptive_span.module import AdaptiveSpanLM
from longctx.methods.adaptive_span.network import SpanTransformer
from longctx.optim.adagrad import ClippedAdagrad
from tests.helpers.lm_fixtures import SyntheticData, cpu_trainer

S, H, N_LAYERS = 64, 2, 2


def tiny(span: str = "adaptive", span_loss: float = 1e-3, optimizer=None) -> AdaptiveSpanLM:
    torch.manual_seed(0)
    network = SpanTransformer.Config(
        d_model=16, n_layers=N_LAYERS, n_heads=H, d_inner=32, attn_span=S, dropout=0.0, span_kind=span,
        span_ramp=8, chunk_size=8,
    )  # fmt: skip
    return AdaptiveSpanLM(
        vocab_size=64,
        network=network,
        span_loss=span_loss,
        optimizer=optimizer or partial(torch.optim.SGD, lr=0.1),
    )


def set_spans(model: AdaptiveSpanLM, z_ratio: list[list[float]]) -> None:
    with torch.no_grad():
        for layer, z in zip(model.net.layers, z_ratio):
            layer.attn.adaptive_mask.z_ratio.copy_(torch.tensor(z))


def z_ratios(model: AdaptiveSpanLM) -> torch.Tensor:
    return torch.stack([layer.attn.adaptive_mask.z_ratio.detach().clone() for layer in model.net.layers])


def fit(model: AdaptiveSpanLM, tmp_path: Path, callbacks=(), logger=False, **kwargs) -> pl.Trainer:
    trainer = cpu_trainer(
        tmp_path,
        logger=logger,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=list(callbacks),
        **kwargs,
    )
    trainer.fit(model, datamodule=SyntheticData(n_tokens=2001, batch_size=3, seq_len=16))
    return trainer


class Record(Callback):
    """Keeps every training batch, the loss before backward, and z' before and after each step."""

    def __init__(self) -> None:
        self.batches, self.losses, self.z_before, self.z_after, self.memories = [], [], [], [], []
        self.embeddings = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append({k: v.clone() for k, v in batch.items()})
        self.memories.append(pl_module._memory_for("train", batch))
        self.embeddings.append(pl_module.net.in_emb.weight.detach().clone())
        if pl_module.net.config.span_kind == "adaptive":
            self.z_before.append(z_ratios(pl_module))

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.losses.append(loss.detach().clone())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.net.config.span_kind == "adaptive":
            self.z_after.append(z_ratios(pl_module))


# ---------------------------------------------------------------------------------- the loss
def test_training_loss_is_mean_nll_plus_lambda_over_heads_times_sum_of_spans(tmp_path):
    model, record = tiny(span_loss=2e-3), Record()
    set_spans(model, [[0.1, 0.3], [0.5, 0.9]])
    fit(model, tmp_path, callbacks=[record], max_steps=1)
    batch, z_ratio = record.batches[0], record.z_before[0]
    # The weights before the update: the same seed rebuilds the same initial model.
    reference = tiny(span_loss=2e-3)
    set_spans(reference, z_ratio.tolist())
    with torch.no_grad():
        out = reference.net(batch["input"], reference.net.init_cache(3))
        nll = F.cross_entropy(out.logits.transpose(1, 2), batch["target"], reduction="none")
    mean_nll = (nll * batch["mask"]).sum() / batch["mask"].sum()
    # (λ/M)·Σ_i z_i over all heads of all layers, M = heads per layer, z = S·z'
    penalty = 2e-3 / H * (S * z_ratio).sum()
    assert penalty == pytest.approx(2e-3 * (0.1 + 0.3 + 0.5 + 0.9) * S / 2)
    torch.testing.assert_close(record.losses[0], mean_nll + penalty)


def test_dynamic_span_penalty_is_in_the_loss(tmp_path):
    model, record = tiny("dynamic", span_loss=1e-2), Record()
    fit(model, tmp_path, callbacks=[record], max_steps=1)
    reference = tiny("dynamic", span_loss=1e-2)
    batch = record.batches[0]
    with torch.no_grad():
        out = reference.net(batch["input"], reference.net.init_cache(3))
        nll = F.cross_entropy(out.logits.transpose(1, 2), batch["target"], reduction="none").mean()
        h = reference.net.in_emb(batch["input"])
        z_first = reference.net.layers[0].attn.dynamic_span(h)  # (B, H, M) spans of layer 0
    assert out.penalty > 0 and z_first.std() > 0
    torch.testing.assert_close(out.penalty, sum(z.mean() for z in _dynamic_spans(reference, batch["input"])))
    torch.testing.assert_close(record.losses[0], nll + 1e-2 * out.penalty)


def _dynamic_spans(model: AdaptiveSpanLM, x: torch.Tensor) -> list[torch.Tensor]:
    """z_t of every layer by running the blocks by hand (zero caches)."""
    h, spans = model.net.in_emb(x), []
    for layer, cache in zip(model.net.layers, model.net.init_cache(x.shape[0]).h_cache):
        spans.append(layer.attn.dynamic_span(h))
        h, _, _ = layer(h, cache, model.net.key_pe)
    return spans


def test_fixed_span_has_no_penalty_and_no_span_parameters(tmp_path):
    model, record = tiny("fixed"), Record()
    assert not [n for n, _ in model.named_parameters() if "z_ratio" in n or "dynamic" in n]
    fit(model, tmp_path, callbacks=[record], max_steps=1)
    reference = tiny("fixed")
    batch = record.batches[0]
    with torch.no_grad():
        out = reference.net(batch["input"], reference.net.init_cache(3))
        nll = F.cross_entropy(out.logits.transpose(1, 2), batch["target"], reduction="none").mean()
    assert out.penalty is None
    torch.testing.assert_close(record.losses[0], nll)
    assert not (tmp_path / SPAN_FIGURE).exists()


# ---------------------------------------------------------------------------------- clamping
@pytest.mark.parametrize(
    ("optimizer", "start", "bound"),
    [
        (partial(torch.optim.SGD, lr=1.0), [[0.01, 0.5], [0.02, 0.3]], 0.0),  # λ·S/H pushes below 0
        (partial(torch.optim.SGD, lr=1.0, maximize=True), [[0.99, 0.5], [0.98, 0.7]], 1.0),  # above 1
        (partial(ClippedAdagrad, lr=0.07, grad_clip=0.03), [[0.0, 0.5], [0.0, 0.3]], 0.0),  # paper optim
    ],
)
def test_z_ratio_is_clamped_after_every_optimizer_step(tmp_path, optimizer, start, bound):
    model, record = tiny(span_loss=1.0, optimizer=optimizer), Record()
    set_spans(model, start)
    fit(model, tmp_path, callbacks=[record], max_steps=3)
    assert len(record.z_after) == 3
    for after in record.z_after:
        assert after.min() >= 0.0 and after.max() <= 1.0
    # The first head of each layer was pushed past the bound (|∂penalty/∂z'| = λ·S/H = 32 dominates)
    # and sits exactly on it; the unclamped update would have left [0, 1].
    torch.testing.assert_close(record.z_after[0][:, 0], torch.full((N_LAYERS,), bound))
    assert not torch.equal(record.z_after[0][:, 1], record.z_before[0][:, 1])  # the others moved


def test_clamping_happens_only_on_optimizer_steps_with_gradient_accumulation(tmp_path):
    model, record = tiny(span_loss=1.0, optimizer=partial(torch.optim.SGD, lr=1.0)), Record()
    set_spans(model, [[0.01, 0.5], [0.02, 0.3]])
    fit(model, tmp_path, callbacks=[record], max_steps=1, accumulate_grad_batches=2)
    assert len(record.z_after) == 2
    torch.testing.assert_close(record.z_after[0], record.z_before[0])  # no step after the 1st batch
    torch.testing.assert_close(record.z_after[1][:, 0], torch.zeros(N_LAYERS))


# ---------------------------------------------------------------------------------- logs and figure
class FakeWandb(Logger):
    """Stands in for WandbLogger: records metrics and images."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict[str, float]] = []
        self.images: list[tuple[str, list]] = []

    @property
    def name(self) -> str:
        return "fake"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append(dict(metrics))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_image(self, key: str, images: list, **kwargs) -> None:
        self.images.append((key, images))


def test_span_logs_and_figure_at_fit_end(tmp_path, monkeypatch):
    monkeypatch.setattr(adaptive_span_figures, "WandbLogger", FakeWandb)
    model, record, logger = tiny(span_loss=1e-3), Record(), FakeWandb()
    set_spans(model, [[0.1, 0.3], [0.5, 0.9]])
    fit(model, tmp_path, callbacks=[record], logger=logger, max_steps=2)
    first = next(m for m in logger.metrics if "span/avg" in m)
    z = S * record.z_before[0]  # spans during the first step
    assert first["span/z_avg"] == pytest.approx(float(z.mean()), rel=1e-6)
    assert first["span/z_max"] == pytest.approx(float(z.max()), rel=1e-6)
    for i in range(N_LAYERS):
        for j in range(H):
            assert first[f"span/z/layer{i}/head{j}"] == pytest.approx(float(z[i, j]), rel=1e-6)
    # The released code's report (R = 8): per layer ceil(S·z') + R of the heads' mean / max z',
    # clipped to S = 64; mean / max over layers. Layer means 0.2, 0.7 -> 13 + 8, 45 + 8; maxima
    # 0.3, 0.9 -> 20 + 8, 58 + 8 clipped to 64.
    assert first["span/avg"] == (21 + 53) / 2
    assert first["span/max"] == 64
    assert first["train/extra_loss"] == pytest.approx(1e-3 * float(z.sum()) / H, rel=1e-6)  # the penalty
    # attended positions per layer: largest span + R rounded up to 64 positions of S = 64
    assert first["span/attended"] == 64
    assert "train/loss" in first and first["train/bpc"] == pytest.approx(first["train/loss"] / math.log(2))
    path = tmp_path / SPAN_FIGURE
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert logger.images == [("span/by_layer", [str(path)])]


def test_dynamic_span_figure_uses_the_last_training_spans(tmp_path):
    model = tiny("dynamic")
    fit(model, tmp_path, max_steps=1)
    spans = model.head_spans()
    assert len(spans) == N_LAYERS and all(z.shape == (H,) for z in spans)
    assert all(0 < float(z.min()) < S for z in spans)  # S·σ(-4) ≈ 1.2 at init, not the fixed S
    assert (tmp_path / SPAN_FIGURE).is_file()


def test_validation_logs_the_forward_flops_per_token_of_the_current_spans(tmp_path):
    model = tiny()
    set_spans(model, [[0.1, 0.3], [0.5, 0.9]])
    data = SyntheticData(n_tokens=401, batch_size=3, seq_len=16)
    metrics = cpu_trainer(tmp_path).validate(model, datamodule=data, verbose=False)[0]
    # d=16, inner 32, V=64, S=64, R=8, blocks of 16. z = 6.4, 19.2 | 32, 57.6; attended z + R capped
    # at S: 14.4, 27.2 | 40, 64. Per layer: 2048 weight MACs, 3·16·(mean head span), and the cache
    # (trimmed length 64 for both layers) projected again every block: 2·16²·64/16 = 2048. Output 16·64.
    macs = (2048 + 3 * 16 * (14.4 + 27.2) / 2 + 2048) + (2048 + 3 * 16 * (40 + 64) / 2 + 2048) + 16 * 64
    assert float(metrics["val/flops_per_token"]) == pytest.approx(2 * macs, rel=1e-6)


# ---------------------------------------------------------------------------------- memory
def test_training_carries_the_cache_across_batches(tmp_path):
    model, record = tiny(), Record()
    set_spans(model, [[0.1, 0.3], [0.5, 0.9]])
    fit(model, tmp_path, callbacks=[record], max_steps=2)
    # The second batch continues the first row by row; its memory is the first block's cache.
    first, second = record.batches
    assert torch.equal(first["input"][:, 1:], first["target"][:, :-1])
    assert torch.equal(second["input"][:, 0], first["target"][:, -1])
    memory = record.memories[1].h_cache
    assert [tuple(m.shape) for m in memory] == [(3, 64, 16)] * N_LAYERS
    # layer 0's cache ends with the embeddings of the first block's tokens (the weights of step 0)
    torch.testing.assert_close(memory[0][:, -16:], F.embedding(first["input"], record.embeddings[0]))
    assert memory[0][:, :-16].abs().max() == 0  # the zero-initialised part of the cache


def test_reset_rows_clears_only_those_rows():
    memory = SpanCache(tuple(torch.randn(3, 64, 16) for _ in range(N_LAYERS)))
    reset = torch.tensor([False, True, False])
    out = memory.reset_rows(reset)
    for before, after in zip(memory.h_cache, out.h_cache):
        assert after[1].abs().max() == 0
        torch.testing.assert_close(after[[0, 2]], before[[0, 2]])


# ---------------------------------------------------------------------------------- the knobs in groups
# The flat hyperparameters the module saved before its network's knobs became a group (issue 21), as a
# CLI run saved them (`_class_path` included): such checkpoints must still load.
OLD_FLAT_HPARAMS = {
    "_class_path": "longctx.methods.adaptive_span.module.AdaptiveSpanLM",
    "vocab_size": 11, "d_model": 8, "n_layers": 2, "n_heads": 2, "d_inner": 16, "attn_span": 16,
    "dropout": 0.3, "emb_dropout": 0.0, "span": "adaptive", "span_loss": 5e-07, "span_ramp": 32,
    "span_init": 0.0, "dynamic_bias_init": -4.0, "chunk_size": 64, "span_trim": "head",
    "eval_span_cap": None, "attention": "sdpa",
}  # fmt: skip
# The state-dict keys of that model (n_layers 2), recorded before the change: checkpoints keep loading.
LAYER_KEYS = [
    "attn.proj_query.weight", "attn.proj_key.weight", "attn.proj_val.weight", "attn.proj_out.weight",
    "attn.adaptive_mask.z_ratio", "norm1.weight", "norm1.bias", "ff.fc1.weight", "ff.fc1.bias",
    "ff.fc2.weight", "ff.fc2.bias", "norm2.weight", "norm2.bias",
]  # fmt: skip
STATE_KEYS = [
    "net.key_pe", "net.in_emb.weight", "net.out_emb.weight", "net.out_emb.bias",
    *(f"net.layers.{i}.{key}" for i in range(2) for key in LAYER_KEYS),
]  # fmt: skip
NETWORK = SpanTransformer.Config(d_model=8, n_layers=2, n_heads=2, d_inner=16, attn_span=16)


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    assert list(a.state_dict()) == list(b.state_dict())
    for name, tensor in a.state_dict().items():
        torch.testing.assert_close(tensor, b.state_dict()[name], rtol=0, atol=0)


def test_the_module_saves_its_network_group_as_a_dict_and_reads_it_back():
    torch.manual_seed(0)
    grouped = AdaptiveSpanLM(vocab_size=11, network=NETWORK, eval_span_cap=8)
    torch.manual_seed(0)
    from_dict = AdaptiveSpanLM(vocab_size=11, network=dataclasses.asdict(NETWORK), eval_span_cap=8)
    assert grouped.hparams == from_dict.hparams
    network = {
        {"span": "span_kind"}.get(k, k): v  # the kind of span, renamed after the flat checkpoints
        for k, v in OLD_FLAT_HPARAMS.items()
        if k not in ("_class_path", "vocab_size", "span_loss", "eval_span_cap")
    }
    assert dict(grouped.hparams) == {
        "vocab_size": 11,
        "network": network,
        "span_loss": 5e-07,
        "eval_span_cap": 8,
        "tbptt_segments": 1,
        "mem_warmup_steps": 0,
        "mem_warmup_min_within": 0.0,
    }
    assert grouped.net.config == from_dict.net.config == NETWORK
    assert_same_weights(grouped, from_dict)
    with pytest.raises(
        TypeError, match=r"AdaptiveSpanLM.__init__\(\) got an unexpected keyword argument 'mem_len'"
    ):
        AdaptiveSpanLM(vocab_size=11, mem_len=4)


def test_the_warmup_caps_every_span_at_the_ramp_then_lets_the_spans_read_all_of_it():
    """`mem_warmup_steps`: before step N a fixed-span model attends at most R back (the network with
    span_cap = R, what an adaptive span attends at z' = 0), from step N all S; evaluation keeps its own
    cap; without a ramp the warm-up is refused in one line."""
    fixed = dataclasses.replace(NETWORK, span_kind="fixed", span_ramp=4, chunk_size=8, dropout=0.0)
    torch.manual_seed(0)
    model = AdaptiveSpanLM(vocab_size=11, network=fixed, mem_warmup_steps=1).train()
    x = torch.randint(0, 11, (2, 24))
    batches = [{"input": x[:, i : i + 8], "target": x[:, i + 1 : i + 9]} for i in (0, 8)]

    def last_nll(span_cap: int | None = None, through_the_module: bool = True) -> torch.Tensor:
        memory = model.init_memory(2)
        for batch in batches:
            if through_the_module:
                out = model.step(batch, memory)
                nll, memory = out.nll, out.memory
            else:
                out = model.net(batch["input"], memory, span_cap=span_cap)
                nll, memory = (
                    F.cross_entropy(out.logits.transpose(1, 2), batch["target"], reduction="none"),
                    out.cache,
                )
        return nll

    with torch.no_grad():
        assert model.span_cap() == 4
        torch.testing.assert_close(last_nll(), last_nll(4, through_the_module=False), rtol=1e-6, atol=1e-6)
        assert not torch.allclose(last_nll(), last_nll(None, through_the_module=False))
        model.mem_warmup_steps = 0  # the warm-up is over
        assert model.span_cap() is None
        torch.testing.assert_close(last_nll(), last_nll(None, through_the_module=False), rtol=1e-6, atol=1e-6)
    model.eval_span_cap = 6
    assert model.eval().span_cap() == 6
    with pytest.raises(
        ValueError, match=r"^mem_warmup_steps caps the spans at the ramp R \(network\.span_ramp\)"
    ):
        AdaptiveSpanLM(vocab_size=11, network=dataclasses.replace(fixed, span_ramp=0), mem_warmup_steps=5)


def test_the_state_dict_keys_are_those_of_before_the_groups():
    assert list(AdaptiveSpanLM(vocab_size=11, network=NETWORK).state_dict()) == STATE_KEYS


def test_a_checkpoint_with_the_flat_hparams_of_before_loads(tmp_path):
    torch.manual_seed(0)
    saved = AdaptiveSpanLM(vocab_size=11, network=NETWORK, span_loss=5e-07)  # OLD_FLAT_HPARAMS' values
    path = tmp_path / "old.ckpt"
    torch.save(
        {"state_dict": saved.state_dict(), "hyper_parameters": OLD_FLAT_HPARAMS,
         "pytorch-lightning_version": pl.__version__},
        path,
    )  # fmt: skip
    loaded = AdaptiveSpanLM.load_from_checkpoint(path, eval_span_cap=4)
    assert loaded.net.config == NETWORK and loaded.span_loss == 5e-07 and loaded.eval_span_cap == 4
    assert loaded.hparams["network"] == dataclasses.asdict(NETWORK)
    assert_same_weights(loaded, saved)


def test_a_checkpoint_that_saved_the_span_kind_as_span_loads_with_that_kind(tmp_path):
    """`network.span` was renamed `network.span_kind`: a checkpoint saved before reads as it was
    trained (a fixed-span checkpoint read as the default, adaptive, would be a wrong number)."""
    network = dataclasses.replace(NETWORK, span_kind="fixed")
    saved = AdaptiveSpanLM(vocab_size=11, network=network)
    hparams = {**saved.hparams, "network": {**dataclasses.asdict(network)}}
    hparams["network"]["span"] = hparams["network"].pop("span_kind")
    path = tmp_path / "old.ckpt"
    version = pl.__version__
    torch.save(
        {"state_dict": saved.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": version},
        path,
    )
    loaded = AdaptiveSpanLM.load_from_checkpoint(path)
    assert loaded.net.config == network and loaded.net.layers[0].attn.adaptive_mask is None
    assert AdaptiveSpanLM.flatten_knobs(hparams)["span_kind"] == "fixed"  # a run config of before, in report


def test_the_network_config_builds_the_network():
    torch.manual_seed(0)
    built = NETWORK.build(11)
    torch.manual_seed(0)
    constructed = SpanTransformer(11, NETWORK)
    assert built.config == constructed.config == NETWORK
    assert_same_weights(built, constructed)


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"span_ramp": -1},
            r"^attn_span \(8192\) and chunk_size \(64\) must be positive and span_ramp \(-1\) >= 0$",
        ),
        ({"d_model": 10, "n_heads": 3}, r"^d_model \(10\) must be divisible by n_heads \(3\)$"),
        ({"span_kind": "dynamic", "attention": "flex"}, r"^attention 'flex' needs a fixed or adaptive span"),
        ({"span_trim": "row"}, r"^span_trim must be 'layer' \(the released code\) or 'head', got 'row'$"),
    ],
)
def test_a_bad_network_field_is_one_line_at_config_construction(fields, message):
    with pytest.raises(ValueError, match=message):
        SpanTransformer.Config(**fields)
