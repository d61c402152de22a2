"""`evaluate_overlaps` keeps its work: each finished overlap in the run folder at once (CSV and every
overlap in summary.json, apart from the run's test metrics), one progress line per overlap, Ctrl-C
keeps the finished ones, and the same command again evaluates only the rest."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from longctx.methods.recurrence.overlap_record import evaluated, finished_overlaps, save_overlaps
from tests.helpers.environment import REPO
from tests.helpers.methods import GPT2_SIZES, VOCAB, tiny

SOURCE = {"split": "test", "checkpoint": None, "settings": "abc"}


def test_finished_overlaps_are_read_back_only_for_the_same_checkpoint_and_settings(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "metrics": {"val/loss": 1.0}}))
    rows = [{"overlap": 0, "test/loss": 2.5}, {"overlap": 8, "test/loss": 2.25}]
    save_overlaps(tmp_path, "test", SOURCE, rows)
    assert finished_overlaps(tmp_path, SOURCE) == {0: rows[0], 8: rows[1]}
    assert finished_overlaps(tmp_path, {**SOURCE, "settings": "other"}) == {}
    assert finished_overlaps(tmp_path, {**SOURCE, "checkpoint": {"path": "x.ckpt"}}) == {}
    with (tmp_path / "overlaps_test.csv").open() as table:
        assert list(csv.DictReader(table)) == [
            {"overlap": "0", "test/loss": "2.5"},
            {"overlap": "8", "test/loss": "2.25"},
        ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metrics"] == {"val/loss": 1.0} and summary["status"] == "finished"  # kept as they were


def test_a_record_written_before_the_knob_groups_is_still_recognised():
    """The settings hash reads the model's knobs under their flat names, as earlier versions saved them."""
    trainer = SimpleNamespace(limit_test_batches=2, precision="32-true", world_size=1)
    data = SimpleNamespace(hparams={"corpus": "sample", "eval_overlap": 8})
    flat_hparams = {
        "vocab_size": VOCAB, "pretrained": None, "gpt2_config": GPT2_SIZES, "recurrence": True,
        "insert_layer": 1, "ffn_width": 200, "ffn_hidden_layers": 3, "ffn_activation": "relu",
        "pool_embeddings": False, "slot_norm": True, "checkpoint_windows": True, "window_by_window": True,
        "checkpoint_blocks": False, "loss_chunk": 0, "attn_implementation": "sdpa", "eval_h_prev": "carried",
    }  # fmt: skip
    # What the code before the groups hashed (`evaluated`, commit b7f3239).
    settings = {"model": flat_hparams, "data": {"corpus": "sample"}, "limit_batches": 2}
    settings |= {"precision": "32-true", "world_size": 1}
    before = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert evaluated(trainer, tiny("recurrence"), data, None, "test")["settings"] == before


def overlaps_args(tmp_path: Path, overlaps: str, *extra: str) -> list[str]:
    """evaluate_overlaps of a tiny random GPT-2 with recurrence on the bundled sample text."""
    return [
        "evaluate_overlaps", "--config", str(REPO / "configs" / "recurrent_gpt2_tiny.yaml"),
        "--data.corpus", "sample", "--data.root", "null", "--data.split_sources", "null",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--model.init_args.gpt2_config", '{"n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 32}',
        "--model.init_args.window_recurrence.insert_layer", "1",
        "--data.tgt_len", "32", "--data.eval_tgt_len", "32",
        "--data.eval_batch_size", "2", "--trainer.limit_test_batches", "2", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--run_name", "overlaps", "--overlaps", overlaps, *extra,
    ]  # fmt: skip


@pytest.mark.slow  # three in-process evaluations (~15 s)
def test_overlaps_are_kept_as_they_finish_and_a_rerun_skips_them(tmp_path, monkeypatch, capsys):
    from longctx.commands.cli import main
    from longctx.methods.recurrence.module import RecurrentGPT2LM

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_dir = Path("runs/overlaps")
    test_step = RecurrentGPT2LM.test_step

    def ctrl_c_at_overlap_16(self, *args, **kwargs):
        if self.trainer.datamodule.eval_overlap == 16:
            raise KeyboardInterrupt
        return test_step(self, *args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(SystemExit) as exit_info:
        patch.setattr(RecurrentGPT2LM, "test_step", ctrl_c_at_overlap_16)
        main(overlaps_args(tmp_path, "[0,8,16]"))
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    assert "longctx: overlap 0 (1/3): test/loss " in err and "longctx: overlap 8 (2/3): test/loss " in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert [row["overlap"] for row in summary["overlaps"]] == [0, 8]
    assert not any(name.startswith("test/") for name in summary["metrics"])  # never the "test result"
    with (run_dir / "overlaps_test.csv").open() as table:
        kept = list(csv.DictReader(table))
    assert [row["overlap"] for row in kept] == ["0", "8"]
    assert float(kept[1]["test/loss"]) == summary["overlaps"][1]["test/loss"]

    main(overlaps_args(tmp_path, "[0,8,16]"))  # the same command again: only overlap 16 runs
    err = capsys.readouterr().err
    assert "longctx: overlap 0 (1/3): " in err and "(finished earlier, kept)" in err
    assert err.count("(finished earlier, kept)") == 2 and "longctx: overlap 16 (3/3): test/loss " in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["overlaps"][:2] == json.loads(
        json.dumps(kept_rows(kept))
    )
    assert [row["overlap"] for row in summary["overlaps"]] == [0, 8, 16]

    main(overlaps_args(tmp_path, "[0,8,16]", "--trainer.limit_test_batches", "1"))  # other settings
    assert "finished earlier" not in capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [row["test/tokens"] for row in summary["overlaps"]] == [2 * 32.0] * 3  # 1 batch, 2 windows


def kept_rows(table: list[dict[str, str]]) -> list[dict[str, float]]:
    return [
        {name: float(value) if name != "overlap" else int(value) for name, value in row.items()}
        for row in table
    ]
