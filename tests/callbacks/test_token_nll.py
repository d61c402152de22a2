"""Per-token output (`--write_token_nll true`): `token_nll.npz` holds one NLL per scored target, named
by its offset in the split, and adds up to the logged total NLL for every method and protocol."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.callbacks.token_nll import TOKEN_NLL_FILE, TokenNLLWriter
from longctx.commands.cli import LongCtxTrainer, main
from longctx.core.base import LMBase, StepOutput
from longctx.core.recall import TargetMarks
from longctx.data.cache import TokenizedCorpus, TokenizedSplit
from longctx.data.datamodule import LMDataModule
from longctx.data.streams import SegmentStream
from longctx.methods.recurrence.module import RecurrentGPT2LM
from longctx.methods.transformer_xl.module import drop_last_scored
from tests.helpers.environment import REPO
from tests.helpers.lm_fixtures import SyntheticData, WindowData, cpu_trainer
from tests.helpers.methods import TINY, tiny

N_TOKENS = 1003


class TargetEchoLM(LMBase):
    """Its "NLL" of a target is the target's id: the file then shows which token each offset scored."""

    def __init__(self, vocab_size: int = 64) -> None:
        super().__init__(vocab_size=vocab_size)
        self.save_hyperparameters()
        self.unused = nn.Parameter(torch.zeros(()))

    def step(self, batch: dict[str, Tensor], memory: None) -> StepOutput:
        return StepOutput(nll=batch["target"].float())


# Every method (tests/helpers/methods.py) plus the protocols and variants with their own evaluation paths:
# (model factory, data module class).
METHODS = {
    **{name: (method.build, method.data) for name, method in TINY.items()},
    "transformer_xl_trams_protocol": (lambda: tiny("transformer_xl", protocol="trams"), SyntheticData),
    "trams": (
        lambda: tiny("transformer_xl", protocol="trams", trams={"attended": 8, "kept": 4}),
        SyntheticData,
    ),
    "rpe": (lambda: tiny("transformer_xl", mem_len=0), SyntheticData),
    "gpt2_window": (lambda: tiny("recurrence", recurrence=False), WindowData),
}


def validate_writing(
    model: pl.LightningModule, data: pl.LightningDataModule, root: Path, **trainer_kwargs
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """`trainer.validate` with the writer: (logged metrics, the arrays of token_nll.npz)."""
    trainer = cpu_trainer(root, callbacks=[TokenNLLWriter()], **trainer_kwargs)
    metrics = trainer.validate(model, datamodule=data, verbose=False)[0]
    return metrics, read_npz(root / TOKEN_NLL_FILE)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return dict(archive)


def assert_adds_up(arrays: dict[str, np.ndarray], loss: float, tokens: float) -> None:
    """The file is one float32 NLL per scored target, at unique sorted offsets, summing to the total."""
    nll, offset = arrays["nll"], arrays["offset"]
    assert nll.dtype == np.float32 and offset.dtype == np.int64
    assert nll.shape == offset.shape == (tokens,)
    assert (np.diff(offset) > 0).all()  # sorted, every target once
    assert nll.astype(np.float64).sum() == pytest.approx(loss * tokens, rel=1e-6)


# ------------------------------------------------------------------ the batch's offsets
@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"overlap": 4, "windows_per_batch": 2},
        {"doc_offsets": np.array([0, 40, 41, 90, 200])},
    ],
)
def test_evaluation_batches_name_each_targets_index_in_the_split(layout):
    """Token ids are positions, so a target's id is its index: `offset` must equal it everywhere a
    real target sits (scored or in a window's overlap) and be -1 on padding; training batches have none."""
    tokens = np.arange(200, dtype=np.uint32)
    stream = SegmentStream(tokens, 3, 16, pad=True, **layout)
    scored = []
    for batch in stream:
        offset, target = batch["offset"], batch["target"]
        assert offset.dtype == torch.int64 and offset.shape == target.shape
        real = offset >= 0
        torch.testing.assert_close(offset[real], target[real])
        assert real[batch["mask"]].all()
        scored.append(offset[batch["mask"]])
    starts = set(layout.get("doc_offsets", [0]))  # a document's first token is never a target
    assert sorted(torch.cat(scored).tolist()) == [i for i in range(200) if i not in starts]
    training = SegmentStream(tokens, 3, 16, **{k: v for k, v in layout.items() if k != "overlap"})
    assert "offset" not in next(iter(training))


# ------------------------------------------------------------------ the file
def test_the_nll_at_offset_i_is_the_prediction_of_token_i(tmp_path):
    data = SyntheticData(n_tokens=N_TOKENS, eval_batch_size=4, seq_len=16)
    metrics, arrays = validate_writing(TargetEchoLM(), data, tmp_path)
    np.testing.assert_array_equal(arrays["offset"], np.arange(1, N_TOKENS))
    np.testing.assert_array_equal(arrays["nll"], data.tokens[1:].astype(np.float32))
    assert set(arrays) == {"nll", "offset"}  # no documents in this corpus
    assert_adds_up(arrays, metrics["val/loss"], metrics["val/tokens"])


# Every third target marked, as the answers of episodes of 4 queries (offsets 2, 5, 8, ...).
MARKS = TargetMarks(np.arange(2, N_TOKENS, 3), np.arange(len(range(2, N_TOKENS, 3))) % 4)


@pytest.mark.parametrize("method", list(METHODS))
def test_every_methods_file_adds_up_to_the_logged_total_and_its_correctness_to_the_recall(tmp_path, method):
    """The file's NLL sums to the logged total; its `correct` on the marked offsets gives the logged
    recall accuracies (tests/core/test_recall.py checks `correct` is each method's argmax)."""
    build, data_class = METHODS[method]
    pl.seed_everything(0)
    data = data_class(n_tokens=N_TOKENS, eval_batch_size=4, seq_len=16, marks=MARKS)
    metrics, arrays = validate_writing(build(), data, tmp_path)
    assert_adds_up(arrays, metrics["val/loss"], metrics["val/tokens"])
    assert np.isfinite(arrays["nll"]).all() and (arrays["nll"] > 0).all()
    if "trams" not in method:
        np.testing.assert_array_equal(arrays["offset"], np.arange(1, N_TOKENS))
    assert_recall_is_read_from_the_file(arrays, metrics)


def assert_recall_is_read_from_the_file(arrays: dict[str, np.ndarray], metrics: dict[str, float]) -> None:
    """val/recall_acc* equal the share of `correct` on the marked offsets the file holds (all, query 0)."""
    assert arrays["correct"].dtype == bool and arrays["correct"].shape == arrays["nll"].shape
    marked = np.isin(arrays["offset"], MARKS.offset)
    query = MARKS.query[np.searchsorted(MARKS.offset, arrays["offset"][marked])]
    hits = arrays["correct"][marked]
    assert metrics["val/recall_answers"] == marked.sum() > 0
    assert metrics["val/recall_acc"] == pytest.approx(hits.mean(), abs=1e-7)
    assert metrics["val/recall_acc_first"] == pytest.approx(hits[query == 0].mean(), abs=1e-7)


def test_the_trams_protocol_file_leaves_out_the_first_token_of_every_segment(tmp_path):
    """TRAMS never scores a segment's first token: in a row, the target that opens its next segment."""
    data = SyntheticData(n_tokens=N_TOKENS, eval_batch_size=4, seq_len=16)
    _, arrays = validate_writing(METHODS["transformer_xl_trams_protocol"][0](), data, tmp_path)
    stream = SegmentStream(data.tokens, 4, 16, pad=True)
    expected = np.concatenate([b["offset"][drop_last_scored(b["mask"])].numpy() for b in stream])
    np.testing.assert_array_equal(arrays["offset"], np.sort(expected))
    segment_rows = sum(int(b["mask"].any(1).sum()) for b in stream)
    assert arrays["offset"].size == N_TOKENS - 1 - segment_rows


def test_documents_are_named_where_the_corpus_has_them(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 64, 120).astype(np.uint8)
    doc_offsets = np.array([0, 10, 25, 120])
    data = LMDataModule("sample", cache_dir=str(tmp_path / "cache"), eval_batch_size=2, tgt_len=8)
    split = TokenizedSplit(tokens=tokens, doc_offsets=doc_offsets, n_words=None)
    data._corpus = TokenizedCorpus(data.info, 64, {"valid": split}, tmp_path, np.ones(64, np.int64))
    data.prepare_data = lambda: None  # the corpus above stands in for the cache
    metrics, arrays = validate_writing(TargetEchoLM(), data, tmp_path)
    expected_offsets = [i for i in range(1, 120) if i not in (10, 25)]
    np.testing.assert_array_equal(arrays["offset"], expected_offsets)
    np.testing.assert_array_equal(arrays["document"], [0] * 9 + [1] * 14 + [2] * 94)
    np.testing.assert_array_equal(arrays["nll"], tokens[expected_offsets].astype(np.float32))
    assert_adds_up(arrays, metrics["val/loss"], metrics["val/tokens"])


def test_overlap_evaluation_writes_one_file_per_overlap(tmp_path):
    """evaluate_overlaps scores the same targets at every overlap, each in its own file."""
    pl.seed_everything(0)
    data = LMDataModule(
        "sample", cache_dir=str(tmp_path / "cache"), mode="windows", eval_batch_size=2, tgt_len=16
    )
    model = RecurrentGPT2LM(
        vocab_size=256,
        gpt2_config={"n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 16},
        window_recurrence={"insert_layer": 1},
    )
    trainer = LongCtxTrainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[TokenNLLWriter()],
        limit_test_batches=6,
    )
    rows = trainer.evaluate_overlaps(model, data, overlaps=[0, 8])
    files = {o: read_npz(tmp_path / f"token_nll_overlap{o}.npz") for o in (0, 8)}
    assert not (tmp_path / TOKEN_NLL_FILE).exists()
    for row in rows:
        assert_adds_up(files[row["overlap"]], row["test/loss"], row["test/tokens"])
    # 6 windows of 16 per row: stride 16 scores 96 targets, stride 8 scores 16 + 5 × 8 = 56.
    starts = [int(files[0]["offset"][0]), int(files[0]["offset"][96])]
    for o, per_row in ((0, 96), (8, 56)):
        expected = np.concatenate([np.arange(s, s + per_row) for s in starts])
        np.testing.assert_array_equal(files[o]["offset"], expected)
    # Row 0's first window (offsets 1..16) is read alike; offsets 17..56 see more context at overlap 8.
    np.testing.assert_allclose(files[0]["nll"][:16], files[8]["nll"][:16], rtol=1e-5)
    assert not np.allclose(files[0]["nll"][16:56], files[8]["nll"][16:56], rtol=1e-3)


# ------------------------------------------------------------------ bad input
def test_a_data_module_without_offsets_is_a_one_line_error(tmp_path):
    class NoOffsets(SyntheticData):
        def val_dataloader(self):
            return self._stream(self.eval_batch_size, pad=False)  # a stream without `offset`

    with pytest.raises(ValueError, match=r"needs evaluation batches with an `offset` key"):
        validate_writing(TargetEchoLM(), NoOffsets(n_tokens=N_TOKENS), tmp_path)


# ------------------------------------------------------------------ CLI
def tiny_on_sample_text(tmp_path: Path) -> list[str]:
    """The no-memory baseline's tiny config on the bundled byte-level sample text, with the flag."""
    return [
        "--config", str(REPO / "configs" / "window_transformer_tiny.yaml"),
        "--data.corpus", "sample",
        "--data.split_sources", "null",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--write_token_nll", "true",
    ]  # fmt: skip


@pytest.mark.parametrize("subcommand", [pytest.param("validate", marks=pytest.mark.slow), "test"])
def test_the_cli_flag_writes_the_run_directorys_file_on_bytes(tmp_path, monkeypatch, subcommand):
    """`--write_token_nll true` on the byte-level sample text: the file adds up to the logged metrics,
    and the NLL at offset i is the model's prediction of byte i of the split (recomputed here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    limit = f"--trainer.limit_{'val' if subcommand == 'validate' else 'test'}_batches"
    cli = main([subcommand, *tiny_on_sample_text(tmp_path), limit, "3", "--run_name", "per_token"])
    stage = "val" if subcommand == "validate" else "test"
    metrics = cli.trainer.callback_metrics
    arrays = read_npz(tmp_path / "runs" / "per_token" / TOKEN_NLL_FILE)
    assert_adds_up(arrays, float(metrics[f"{stage}/loss"]), float(metrics[f"{stage}/tokens"]))
    split = cli.datamodule.corpus.split("valid" if stage == "val" else "test").tokens
    window = 32  # the config's eval_tgt_len: the first window of row 0 reads bytes 0..31
    with torch.no_grad():
        ids = torch.from_numpy(split[: window + 1].astype(np.int64))
        logits = cli.model.eval().net(ids[None, :window])[0]
        expected = F.cross_entropy(logits, ids[1:], reduction="none")
    np.testing.assert_allclose(arrays["nll"][:window], expected.numpy(), rtol=1e-5)
    np.testing.assert_array_equal(arrays["offset"][:window], np.arange(1, window + 1))


def test_fit_with_the_flag_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(SystemExit, match=r"^error: --write_token_nll applies to validate, test and"):
        main(["fit", *tiny_on_sample_text(tmp_path)])


# ------------------------------------------------------------------ DDP
@pytest.mark.ddp
@pytest.mark.parametrize("method", ["transformer_xl", "trams", "recurrence"])
def test_two_ranks_write_the_one_process_file(tmp_path, method):
    """Each rank scores its own block of rows; the merged file is the single-process file."""
    build, data_class = METHODS[method]
    pl.seed_everything(0)
    model = build()
    data = data_class(n_tokens=N_TOKENS, eval_batch_size=4, seq_len=16, marks=MARKS)
    _, single = validate_writing(model, data, tmp_path / "single")
    ddp_metrics, ddp = validate_writing(model, data, tmp_path / "ddp", devices=2, strategy="ddp_spawn")
    assert_adds_up(ddp, ddp_metrics["val/loss"], ddp_metrics["val/tokens"])
    np.testing.assert_array_equal(ddp["offset"], single["offset"])
    np.testing.assert_allclose(ddp["nll"], single["nll"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ddp["correct"], single["correct"])
    assert_recall_is_read_from_the_file(ddp, ddp_metrics)  # the sums of both ranks
