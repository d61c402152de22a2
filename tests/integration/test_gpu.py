"""The GPU tier (`python -m pytest -q -m gpu`; `bash benchmarks/gpu.sh` runs it with the benchmarks):
every method of the registry (tests/helpers/methods.py) on CUDA in bf16-mixed, compiled, with its fused
attention against eager, under one-GPU NCCL DDP, and the recurrent GPT-2's slot path against the CPU.

Every `gpu` test skips, with one reason, where CUDA is not available (tests/conftest.py). The module-level
kernel check also runs on the CPU in the fast tier, so the code of this tier runs on every machine;
the CPU's own detailed checks are tests/methods/test_fused_attention.py, whose helpers the CUDA
variants reuse.
Tolerances are the issue's 1e-5 in float32; TF32 is off in every test here (see `_exact_float32`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor, nn

from longctx.callbacks.compile import compile_network
from longctx.core.base import LMBase, detach_memory
from longctx.core.knob_groups import at_path, override_groups
from longctx.methods.transformer_xl.trams import TramsSettings
from tests.commands.test_cli import quick_args
from tests.helpers.environment import cuda_missing
from tests.helpers.lm_fixtures import cpu_trainer
from tests.helpers.methods import TINY, VOCAB
from tests.methods.test_fused_attention import (
    TOL,
    assert_equal_runs,
    span_eager_and_fused,
    span_network,
    xl_eager_and_fused,
    xl_network,
    xl_stream,
)
from tests.methods.test_fused_attention import VOCAB as FUSED_VOCAB

GPU = pytest.mark.gpu
CUDA = torch.device("cuda")
ON_CPU_AND_CUDA = [pytest.param("cpu", id="cpu"), pytest.param("cuda", marks=GPU, id="cuda")]
# Kernels other than eager; "flex" (torch.nn.attention.flex_attention) is checked wherever the knob
# accepts it and skipped, saying so, where it does not. Its compile takes a minute on the CPU: slow.
FUSED_KERNELS = ("sdpa", pytest.param("flex", marks=pytest.mark.slow))
# Lightning's launcher sets these for the one-GPU DDP run: restored after it.
DDP_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture(autouse=True)
def _exact_float32() -> Iterator[None]:
    """float32 matmuls in float32, not TF32, whatever a CLI run (`--float32_matmul_precision`) set."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)


def test_the_gpu_tier_skips_with_one_reason_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_missing() == "no CUDA device (torch.cuda.is_available() is False): the GPU tier needs one"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_missing() is None


# ------------------------------------------------------------------ the module-level runs


def tiny(method: str, device: str | torch.device, **knobs) -> LMBase:
    """The method's tiny module with `knobs` on `device`, dropout off (so train-mode runs compare)."""
    torch.manual_seed(0)
    model = TINY[method].build(**knobs)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model.to(device)


def batches(model: LMBase, device: str | torch.device, n: int = 3) -> list[dict[str, Tensor]]:
    """n batches of random tokens in the model's batch mode (2 rows of 16 tokens, or of 2 windows
    of 8); row 0 starts a new document at the third."""
    g = torch.Generator().manual_seed(1)
    shape = (2, 2, 8) if model.batch_mode == "windows" else (2, 16)
    out = []
    for i in range(n):
        tokens = torch.randint(0, VOCAB, (*shape[:-1], shape[-1] + 1), generator=g)
        reset = torch.zeros(shape[:-1], dtype=torch.bool)
        reset.view(2, -1)[0, 0] = i == 2
        batch = {
            "input": tokens[..., :-1],
            "target": tokens[..., 1:],
            "mask": torch.ones(shape, dtype=torch.bool),
            "reset": reset,
        }
        out.append({name: t.to(device) for name, t in batch.items()})
    return out


def run(model: LMBase, data: list[dict[str, Tensor]], train: bool) -> tuple[list[Tensor], dict[str, Tensor]]:
    """Per batch the per-token NLL, the memory carried (detached) and row resets applied as in training;
    with `train`, the gradients of every batch's summed NLL plus extra loss, accumulated."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    memory, nlls = model.init_memory(2), []
    with torch.set_grad_enabled(train):
        for batch in data:
            if memory is not None and batch["reset"].dim() == 1:  # segments; windows: the step's own
                memory = memory.reset_rows(batch["reset"])
            out = model.step(batch, memory)
            if train:
                (out.nll.sum() + (0.0 if out.extra_loss is None else out.extra_loss)).backward()
            nlls.append(out.nll.detach())
            memory = detach_memory(out.memory)
    return nlls, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def assert_same_runs(expected: tuple[list[Tensor], dict], actual: tuple[list[Tensor], dict]) -> None:
    """Equal per-token NLL per batch and equal gradients (compared on the first run's device)."""
    (nll_e, grads_e), (nll_a, grads_a) = expected, actual
    for e, a in zip(nll_e, nll_a, strict=True):
        torch.testing.assert_close(a.to(e.device), e, **TOL)
    assert grads_a.keys() == grads_e.keys()
    for name, grad in grads_e.items():
        torch.testing.assert_close(
            grads_a[name].to(grad.device), grad, **TOL, msg=lambda m, name=name: f"{name}: {m}"
        )


# ------------------------------------------------------------------ fused attention = eager


@pytest.mark.parametrize("device", ON_CPU_AND_CUDA)
@pytest.mark.parametrize("kernel", FUSED_KERNELS)
@pytest.mark.parametrize("method", sorted(TINY))
def test_fused_attention_equals_eager_for_every_method(method, kernel, device, monkeypatch):
    """Per-token NLL in evaluation and training, and every gradient, through three batches with the
    memory carried and a reset row, on the same weights; SDPA's kernel did run in training (in
    evaluation Transformer-XL computes op by op while it logs the attention mass). Flex attention has
    no backward on the CPU: there it is compared in evaluation only."""
    knob = TINY[method].kernel_knob
    if knob is None:
        pytest.skip(f"{method} has only the fused (SDPA) attention: no eager path to compare")
    try:
        TINY[method].build(**at_path(knob, kernel))
    except (ValueError, KeyError) as err:
        pytest.skip(f"{method}: {knob}={kernel!r} is not accepted in this tree ({err})")
    # CUDA's flex kernel needs a head dimension of 16 (attention_kernel.FLEX_CUDA_MIN_HEAD_DIM): d_model 32.
    wider = {"network": {"d_model": 32}} if kernel == "flex" and device == "cuda" else {}
    eager = tiny(method, device, **override_groups(at_path(knob, "eager"), wider))
    fused = tiny(method, device, **override_groups(at_path(knob, kernel), wider))
    fused.load_state_dict(eager.state_dict())
    data = batches(eager, device)
    assert_same_runs(run(eager, data, train=False), run(fused, data, train=False))
    if kernel == "flex" and device == "cpu":
        return
    expected = run(eager, data, train=True)
    assert len(expected[1]) > 0
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    assert_same_runs(expected, run(fused, data, train=True))
    assert calls or kernel != "sdpa"


@GPU
@pytest.mark.parametrize(
    ("mem_len", "same_length", "clamp_len", "cache_kv"),
    [(0, False, 0, False), (6, True, 0, False), (5, True, 3, False), (6, True, 3, True)],
)
def test_xl_options_fused_equal_eager_on_cuda(mem_len, same_length, clamp_len, cache_kv):
    """tests/methods/test_fused_attention.py's Transformer-XL runs on CUDA: empty, partial and full memory, a
    reset row and a short last segment; training (with every gradient) or the evaluation K/V cache."""
    model = xl_network().to(CUDA).train(not cache_kv)
    tokens = torch.randint(0, FUSED_VOCAB, (2, 15), generator=torch.Generator().manual_seed(1)).to(CUDA)

    def segments(m):
        options = dict(mem_len=mem_len, same_length=same_length, clamp_len=clamp_len, cache_kv=cache_kv)
        with torch.set_grad_enabled(not cache_kv):
            return xl_stream(m, tokens, [4, 4, 4, 2], m.empty_memory(2), **options)

    assert_equal_runs(*xl_eager_and_fused(model, segments))


@GPU
@pytest.mark.parametrize("cache_kv", [False, True])
def test_trams_fused_equals_eager_on_cuda(cache_kv):
    """TRAMS's per-head windows (m = 4 of a pool M = 8) from a zero-filled first memory, on CUDA."""
    model = xl_network().to(CUDA).eval()
    tokens = torch.randint(0, FUSED_VOCAB, (2, 23), generator=torch.Generator().manual_seed(4)).to(CUDA)

    def segments(m):
        with torch.no_grad():
            trams = TramsSettings(4, 2, "code", "compact")
            return xl_stream(
                m, tokens, [4] * 5 + [2], m.zero_memory(2, 8), mem_len=8, same_length=True,
                cache_kv=cache_kv, trams=trams,
            )  # fmt: skip

    assert_equal_runs(*xl_eager_and_fused(model, segments))


@GPU
@pytest.mark.parametrize(("span", "z_ratio"), [("adaptive", [0.3, 0.05]), ("dynamic", None)])
def test_adaptive_span_fused_equals_eager_on_cuda(span, z_ratio):
    """Trimmed per-head spans and the dynamic span on CUDA: logits, NLL and every gradient."""
    model = span_network(span).to(CUDA).train()
    if z_ratio is not None:
        with torch.no_grad():
            for layer in model.layers:
                layer.attn.adaptive_mask.z_ratio.copy_(torch.tensor(z_ratio))
    tokens = torch.randint(0, FUSED_VOCAB, (2, 63), generator=torch.Generator().manual_seed(5)).to(CUDA)
    assert_equal_runs(*span_eager_and_fused(model, tokens, [20, 20, 20, 2]))


# ------------------------------------------------------------------ bf16, compile, DDP


@GPU
@pytest.mark.parametrize("method", sorted(TINY))
def test_bf16_mixed_fits_on_cuda(method, tmp_path):
    """A few bf16-mixed training steps on the GPU: the linear layers compute in bf16, the loss is
    finite, the master weights stay float32 (Lightning moves the module back to the CPU after fit)."""
    pl.seed_everything(0)
    lm = TINY[method].build()
    linear_outputs: set[tuple[torch.dtype, str]] = set()
    for module in lm.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(
                lambda mod, args, out: linear_outputs.add((out.dtype, out.device.type))
            )
    trainer = cpu_trainer(
        tmp_path,
        accelerator="gpu",
        precision="bf16-mixed",
        max_steps=4,
        val_check_interval=2,
        limit_val_batches=2,
    )
    trainer.fit(lm, datamodule=TINY[method].data(seq_len=16))
    assert (torch.bfloat16, "cuda") in linear_outputs
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    assert math.isfinite(float(trainer.callback_metrics["val/loss"]))
    assert all(p.dtype == torch.float32 for p in lm.parameters())


@GPU
def test_quickstart_cli_fits_in_bf16_on_cuda(tmp_path, monkeypatch):
    """The user's path: `python -m longctx fit` with the GPU trainer flags, a few steps."""
    from longctx.commands.cli import main

    monkeypatch.chdir(tmp_path)
    cli = main(
        quick_args(
            tmp_path,
            *("--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "bf16-mixed"),
            *("--float32_matmul_precision", "high"),
        )
    )
    assert cli.trainer.strategy.root_device.type == "cuda"  # (fit's teardown moves the module to the CPU)
    assert math.isfinite(float(cli.trainer.callback_metrics["val/bpc"]))


@GPU
@pytest.mark.parametrize("method", sorted(TINY))
def test_compiled_network_equals_eager_on_cuda(method):
    """torch.compile of the network (as `CompileNetwork` does) on CUDA: per-token NLL equal to eager's
    through three evaluation batches with the memory carried; a compiled training pass has finite
    gradients."""
    torch._dynamo.reset()
    eager = tiny(method, CUDA)
    compiled = tiny(method, CUDA)
    compiled.load_state_dict(eager.state_dict())
    compile_network(getattr(compiled, compiled.network_attribute))
    data = batches(eager, CUDA)
    expected, actual = run(eager, data, train=False)[0], run(compiled, data, train=False)[0]
    for e, a in zip(expected, actual, strict=True):
        torch.testing.assert_close(a, e, **TOL)
    grads = run(compiled, data, train=True)[1]
    assert grads and all(g.isfinite().all() for g in grads.values())


class BackendProbe(pl.Callback):
    """The process group's backend and size, read when training starts."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.backend = torch.distributed.get_backend()
        self.world_size = torch.distributed.get_world_size()


@GPU
@pytest.mark.parametrize("method", sorted(TINY))
def test_one_gpu_ddp_nccl_fits(method, tmp_path, monkeypatch):
    """strategy ddp on one GPU with the NCCL backend, a few steps: the process group is NCCL's, the
    loss finite (the gradient all-reduce and the token-count all-reduce of `LMBase` ran)."""
    for name in DDP_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)  # restored (removed) after the test
    pl.seed_everything(0)
    lm, probe = TINY[method].build(), BackendProbe()
    trainer = cpu_trainer(
        tmp_path,
        accelerator="gpu",
        devices=1,
        strategy=DDPStrategy(process_group_backend="nccl"),
        max_steps=3,
        limit_val_batches=0,
        callbacks=[probe],
    )
    try:
        trainer.fit(lm, datamodule=TINY[method].data(seq_len=16))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert (probe.backend, probe.world_size) == ("nccl", 1)
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))


# ------------------------------------------------------------------ the recurrent GPT-2 on CUDA


@GPU
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_recurrent_gpt2_slot_path_on_cuda_equals_cpu(attn_implementation, train):
    """The slot (h_prev as one extra key and value at ℓ_ins) through SDPA or eager attention on CUDA:
    per-token NLL and, in training (windows checkpointed, backward window by window), every gradient
    equal to the CPU's in float32."""
    on_cpu = tiny("recurrence", "cpu", attn_implementation=attn_implementation)
    on_cuda = tiny("recurrence", CUDA, attn_implementation=attn_implementation)
    on_cuda.load_state_dict(on_cpu.state_dict())
    expected = run(on_cpu, batches(on_cpu, "cpu"), train)
    assert_same_runs(expected, run(on_cuda, batches(on_cuda, CUDA), train))
    if train:  # the slot was read: the recurrence's own weights got gradients
        assert any(name.startswith("recurrence.") and g.abs().sum() > 0 for name, g in expected[1].items())
