"""Divergence is an error: NaN propagates through every evaluation metric, a non-finite or exploded
loss stops `fit` with one line and status `diverged`, and no checkpoint is chosen from NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from longctx.callbacks.divergence import DivergenceError, StopOnDivergence, advice
from longctx.callbacks.nan_origin import ALL_BAD_FIX
from longctx.commands.cli import main
from longctx.core.base import StepOutput
from tests.helpers.lm_fixtures import CarryLM, SyntheticData, cpu_trainer
from tests.helpers.methods import tiny


class NanLM(CarryLM):
    """CarryLM whose NLL turns NaN (or `scale` times larger) from training step `train_from`, and NaN
    at validation from step `val_from` on (None: never)."""

    def __init__(
        self,
        train_from: int | None = None,
        val_from: int | None = None,
        scale: float | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.train_from, self.val_from, self.scale = train_from, val_from, scale

    def step(self, batch, memory) -> StepOutput:
        out = super().step(batch, memory)
        start = self.train_from if self.training else self.val_from
        if start is not None and self.global_step >= start:
            out.nll = out.nll * self.scale if self.scale is not None else out.nll + math.nan
        return out


def test_validation_metrics_propagate_nan(tmp_path):
    """torchmetrics' default drops NaN values: a NaN model would score loss 0, bpc 0 (perplexity 1)."""
    model, data = NanLM(val_from=0), SyntheticData(n_tokens=400, eval_batch_size=3, seq_len=16)
    result = cpu_trainer(tmp_path).validate(model, datamodule=data, verbose=False)[0]
    assert math.isnan(result["val/loss"]) and math.isnan(result["val/bpc"])
    assert result["val/tokens"] == 399  # the tokens are counted, the NLL is not made up


def _fit(tmp_path: Path, **kwargs) -> None:
    trainer = cpu_trainer(
        tmp_path, max_steps=6, val_check_interval=2, limit_val_batches=2, callbacks=[StopOnDivergence()]
    )
    trainer.fit(NanLM(**kwargs), datamodule=SyntheticData(n_tokens=2000))


def test_nan_training_loss_stops_the_fit_at_its_step(tmp_path):
    with pytest.raises(DivergenceError, match=r"^diverged: training loss is nan at step 4; try: lower "):
        _fit(tmp_path, train_from=3)  # the 4th optimizer step is at global_step 3


def test_loss_above_the_bound_stops_the_fit(tmp_path):
    """Finite but exploded: above 10 × log(64) = 41.6 nats."""
    bound = r"training loss .* at step 3 exceeds the divergence bound 41\.59"
    with pytest.raises(DivergenceError, match=bound):
        _fit(tmp_path, train_from=2, scale=1e3)


def test_the_verdict_is_read_every_n_steps_and_before_every_checkpoint(tmp_path):
    """No host sync per step: the first bad step is kept on the device and read every N steps, and
    before any checkpoint is written (here one every step), so a diverged model is never saved."""
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    stop = StopOnDivergence(check_every_n_steps=50)
    trainer = cpu_trainer(
        tmp_path, max_steps=20, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint, stop]
    )
    with pytest.raises(DivergenceError, match="training loss is nan at step 3;"):
        trainer.fit(NanLM(train_from=2), datamodule=SyntheticData(n_tokens=2000))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "epoch=0-step=1.ckpt",
        "epoch=0-step=2.ckpt",
    ]

    stop = StopOnDivergence(check_every_n_steps=4)
    trainer = cpu_trainer(tmp_path, max_steps=20, limit_val_batches=0, callbacks=[stop])
    with pytest.raises(DivergenceError, match="training loss is nan at step 3;"):
        trainer.fit(NanLM(train_from=2), datamodule=SyntheticData(n_tokens=2000))
    assert trainer.global_step == 4


def test_the_per_step_check_holds_no_host_sync():
    """On the meta device (shapes, no values) any host read raises: a step's verdict stays a tensor."""
    from types import SimpleNamespace

    strategy = SimpleNamespace(reduce=lambda tensor, reduce_op: tensor)
    trainer = SimpleNamespace(accumulate_grad_batches=2, strategy=strategy, global_step=7)
    stop = StopOnDivergence()
    for _ in range(2):
        stop.on_train_batch_end(trainer, CarryLM(), {"loss": torch.empty((), device="meta")}, None, 0)
    step, value = stop._first_bad
    assert step.device.type == value.device.type == "meta"
    with pytest.raises(RuntimeError):  # what a per-step read would do
        float(value)
    # Where a NaN came from: a step keeps references and a flag on the device, read only at a read step.
    module = CarryLM()
    stop.on_train_batch_start(trainer, module, {"input": torch.empty(2, 4, device="meta")}, 0)
    stop.on_before_backward(trainer, module, torch.empty((), device="meta"))
    assert stop._micro_batches[0].nonfinite.device.type == "meta"
    stop.on_before_optimizer_step(trainer, module, None)  # step 8 of every 50: not read, nothing raised


def test_the_advice_fits_the_trainer():
    from types import SimpleNamespace

    fp16_clipped = advice(SimpleNamespace(gradient_clip_val=0.25, precision="16-mixed"))
    assert "bf16-mixed instead of 16-mixed" in fp16_clipped and "clip gradients" not in fp16_clipped
    fp32_unclipped = advice(SimpleNamespace(gradient_clip_val=None, precision="32-true"))
    assert (
        "clip gradients (--trainer.gradient_clip_val 1.0)" in fp32_unclipped and "bf16" not in fp32_unclipped
    )


def test_the_bound_is_a_knob():
    module = CarryLM(vocab_size=256)
    assert StopOnDivergence(max_loss_factor=2.0).max_loss(module) == pytest.approx(2 * math.log(256))
    assert StopOnDivergence(max_loss_factor=None).max_loss(module) is None
    with pytest.raises(ValueError, match="max_loss_factor must be positive or null"):
        StopOnDivergence(max_loss_factor=0)
    with pytest.raises(ValueError, match="check_every_n_steps must be positive"):
        StopOnDivergence(check_every_n_steps=0)


def _cli_args(run_name: str, *extra: str) -> list[str]:
    return [
        "fit",
        "--model", "tests.callbacks.test_divergence.NanLM",
        "--data.corpus", "sample", "--data.batch_size", "4", "--data.tgt_len", "32",
        "--data.cache_dir", "cache",
        "--trainer.accelerator", "cpu", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.max_steps", "6", "--trainer.val_check_interval", "2",
        "--trainer.check_val_every_n_epoch", "null", "--trainer.limit_val_batches", "2",
        "--trainer.callbacks+=longctx.callbacks.RunCheckpoint",
        "--trainer.callbacks.monitor", "val/loss", "--trainer.callbacks.save_last", "true",
        "--run_name", run_name,
        *extra,
    ]  # fmt: skip


@pytest.mark.slow  # two in-process CLI fits, ~6 s
def test_cli_fit_that_diverges_says_so_in_one_line_and_in_its_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    # NaN at the first validation after training started (step 2): Lightning's ModelCheckpoint would
    # keep it as the first "best" checkpoint (its score replaced by inf), and save last.ckpt.
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args("nan_val", "--model.init_args.val_from", "1"))
    assert exit_info.value.code == 1
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("longctx:")]
    assert err_lines == [
        "longctx: diverged: validation loss is nan at step 2; try: lower the learning rate "
        "(model.init_args.optimizer.init_args.lr), clip gradients (--trainer.gradient_clip_val 1.0); "
        "checkpoints saved before it are kept (--ckpt_path last resumes)"
    ]
    run_dir = tmp_path / "runs" / "nan_val"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["statuses"]) == ("diverged", {"fit": "diverged"})
    assert summary["error"].startswith("DivergenceError: diverged: validation loss is nan at step 2")
    assert not list(run_dir.rglob("*.ckpt"))  # nothing saved from the NaN model, "best" or last

    # NaN training loss at step 4, after a healthy validation at step 2: the checkpoints of step 2
    # stay (best and last, finite), nothing after it is written.
    with pytest.raises(SystemExit):
        main(_cli_args("nan_train", "--model.init_args.train_from", "3"))
    run_dir = tmp_path / "runs" / "nan_train"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "diverged"
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    assert checkpoints == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_model_checkpoint_never_keeps_a_nan_validation_as_best(tmp_path):
    """The callback runs before ModelCheckpoint (Lightning orders checkpoint callbacks last)."""
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_last=True)
    trainer = cpu_trainer(
        tmp_path,
        max_steps=6,
        val_check_interval=2,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        enable_checkpointing=True,
        callbacks=[checkpoint, StopOnDivergence()],
    )
    with pytest.raises(DivergenceError, match="validation loss is nan at step 2"):
        trainer.fit(NanLM(val_from=0), datamodule=SyntheticData(n_tokens=2000))
    assert checkpoint.best_model_path == "" and checkpoint.best_model_score is None
    assert not (tmp_path / "ckpt").exists()


def test_a_diverged_fit_is_recorded_as_diverged(tmp_path):
    from longctx.callbacks.run_record import RunRecord, recorded

    trainer = cpu_trainer(tmp_path, max_steps=6, callbacks=[StopOnDivergence(), RunRecord()])
    with pytest.raises(DivergenceError), recorded(trainer, "fit"):
        trainer.fit(NanLM(train_from=1), datamodule=SyntheticData(n_tokens=2000))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["global_step"]) == ("diverged", 6)  # read when training ended
    assert summary["error"].startswith("DivergenceError: diverged: training loss is nan at step 2;")


# ------------------------------------------------------------------ where a non-finite loss came from
def _stopped_fit(tmp_path: Path, model, check_every_n_steps: int = 50) -> str:
    trainer = cpu_trainer(
        tmp_path, max_steps=6, callbacks=[StopOnDivergence(check_every_n_steps=check_every_n_steps)]
    )
    with pytest.raises(DivergenceError) as info:
        trainer.fit(model, datamodule=SyntheticData(n_tokens=2000))
    return str(info.value)


def test_the_line_names_the_weight_whose_gradient_went_non_finite(tmp_path):
    """A NaN in one weight's gradient only (the loss of that step is finite): the next step's loss is
    NaN, and the line names that weight, the first non-finite one the backward reaches."""
    model = NanLM()
    model.out.weight.register_hook(lambda grad: grad * math.nan if model.global_step == 2 else grad)
    message = _stopped_fit(tmp_path, model)
    assert message.startswith("diverged: training loss is nan at step 4; try: ")
    assert message.endswith(
        "; the weights were already non-finite before step 4: an update before it applied a non-finite "
        "gradient while the loss was finite, first (in the backward's order) to out.weight (1 of 3 weight "
        "tensors non-finite)"
    )


def test_a_loss_made_non_finite_outside_the_modules_and_weights_non_finite_from_the_start(tmp_path):
    message = _stopped_fit(tmp_path, NanLM(train_from=2))  # NaN added to the loss itself
    assert message.endswith(
        "; at step 3 every module's output was finite: the loss computed from them is not"
    )
    model = NanLM()
    with torch.no_grad():
        model.embed.weight[3, 0] = math.nan
    assert _stopped_fit(tmp_path, model).endswith(
        "; the weights were non-finite as the fit started: embed.weight (1 of 3 tensors)"
    )


def poisoned_xl():
    """A tiny Transformer-XL whose second block's feed-forward outputs NaN from the 3rd step on."""
    model = tiny("transformer_xl", network={"dropout": 0.0})
    poisoned = model.net.layers[1].ff
    poisoned.register_forward_hook(
        lambda module, args, out: out * math.nan if model.global_step >= 2 else None
    )
    return model


def test_the_line_names_the_module_whose_output_went_non_finite(tmp_path):
    """The step is replayed with a hook on every module, before its update, and the first non-finite
    output (in the order the forwards return) is the poisoned module's."""
    message = _stopped_fit(tmp_path, poisoned_xl())
    assert message.startswith("diverged: training loss is nan at step 3; try: ")
    assert message.endswith("; the first non-finite output at step 3: net.layers.1.ff (PositionwiseFF)")


def test_found_after_its_update_the_line_says_how_to_find_the_origin(tmp_path, monkeypatch):
    """Where reading a step's flag before its update would cost a sync (a GPU between two reads), the
    update has spread the NaN to every weight by the time the verdict is read: the line says so, and
    how to name the origin. No step is read early (no sync) but the verdict's own."""
    monkeypatch.setattr(StopOnDivergence, "_free_to_read", staticmethod(lambda flag: False))
    assert _stopped_fit(tmp_path, poisoned_xl()).endswith(  # read when training ended
        "; every weight tensor is non-finite by the time it was read (the update of step 3 applied the "
        f"non-finite gradient): {ALL_BAD_FIX}"
    )
    assert _stopped_fit(tmp_path, poisoned_xl(), check_every_n_steps=4).endswith(  # read at step 4
        "; every weight tensor was already non-finite before step 4 (an update before it applied a "
        f"non-finite gradient): {ALL_BAD_FIX}"
    )


class NanOnRankOne(NanLM):
    """NaN training loss on rank 1 only: rank 0's own loss stays finite."""

    def step(self, batch, memory) -> StepOutput:
        out = super().step(batch, memory)
        if self.training and self.global_rank == 1 and self.global_step >= 2:
            out.nll = out.nll + math.nan
        return out


class RecordedStop(StopOnDivergence):
    """Writes `rank{r}.txt` when it stops this rank's fit (ddp_spawn workers call no `on_exception`)."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = Path(folder)

    def _stop_if_diverged(self, trainer, pl_module) -> None:
        try:
            super()._stop_if_diverged(trainer, pl_module)
        except DivergenceError:
            (self.folder / f"rank{trainer.global_rank}.txt").write_text(f"step {trainer.global_step}")
            raise


@pytest.mark.ddp
def test_every_rank_stops_at_the_same_step_under_ddp(tmp_path):
    """A rank stopping alone would leave the other waiting in the next gradient all-reduce."""
    trainer = cpu_trainer(
        tmp_path,
        devices=2,
        strategy="ddp_spawn",
        max_steps=8,
        callbacks=[RecordedStop(str(tmp_path))],
    )
    with pytest.raises(Exception, match="training loss is nan at step 3"):
        trainer.fit(NanOnRankOne(), datamodule=SyntheticData(n_tokens=2000, eval_batch_size=4))
    # Read at the end of training (step 8, before check_every_n_steps), on both ranks.
    stops = {path.name: path.read_text() for path in tmp_path.glob("rank*.txt")}
    assert stops == {"rank0.txt": "step 8", "rank1.txt": "step 8"}


def test_the_validation_bound_holds_only_when_training_counts_every_target():
    """With `data.train_targets: marked` the model never trains on the other targets that `val/loss`
    scores: a recall fit's val/loss above 10·log(V) is no divergence (a false stop at step 1,200 of a
    recall curriculum that was learning, 0.62 accuracy at 1,000)."""
    from types import SimpleNamespace

    from longctx.callbacks.divergence import trains_on_all

    assert trains_on_all(SimpleNamespace(datamodule=SimpleNamespace(train_targets="all")))
    assert trains_on_all(SimpleNamespace(datamodule=None))  # loaders passed to fit directly
    assert not trains_on_all(SimpleNamespace(datamodule=SimpleNamespace(train_targets="marked")))
