"""`RunVocabulary`: a fit on a text whose words the data numbers keeps that vocabulary in its run
directory (the file `--data.vocab_file` takes to read another text with the checkpoint's ids)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longctx.commands.cli import main
from tests.helpers.lm_fixtures import carry_lm_cli, run_cli_in


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_cli_in(tmp_path, monkeypatch)
    return tmp_path


def test_a_words_fit_keeps_its_vocabulary_in_the_run_directory_and_a_bytes_fit_keeps_none(in_tmp):
    Path("a.txt").write_text("k1 v7 k2 v7 k1 f3\n" * 200 + "v9 v9 v9\n", encoding="utf-8")
    files = "{train: a.txt, valid: a.txt, test: a.txt}"
    main(
        carry_lm_cli(
            "fit", "words", "--data.corpus", "text_files", "--data.files", files, "--data.tokenizer", "words"
        )
    )
    kept = Path("runs/words/vocabulary.txt")
    (cache,) = Path("cache").glob("text_files-*/vocab.txt")
    assert kept.read_bytes() == cache.read_bytes()
    # <eos> first, then by count in the train file (ties in first-seen order), <unk> last.
    assert kept.read_text().split() == ["<eos>", "k1", "v7", "k2", "f3", "v9", "<unk>"]
    artifacts = json.loads(Path("runs/words/summary.json").read_text())["artifacts"]
    assert artifacts["vocabulary.txt"]["subcommand"] == "fit"

    main(carry_lm_cli("fit", "bytes"))  # the bundled sample, bytes: ids fixed by the tokenizer
    assert Path("runs/bytes/summary.json").is_file() and not Path("runs/bytes/vocabulary.txt").exists()
