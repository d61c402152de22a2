"""`longctx.runtime.atomic`: whole files or none, with the mode a plain `open` gives under the umask."""

import os
import stat
from pathlib import Path

import pytest

from longctx.runtime.atomic import atomic_path, write_json_atomic, write_text_atomic


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_written_file_has_the_umask_mode_not_0600(tmp_path, umask_027):
    dest = tmp_path / "sub" / "summary.json"
    write_json_atomic(dest, {"b": 1, "a": [1.5]})
    assert dest.read_text() == '{\n  "a": [\n    1.5\n  ],\n  "b": 1\n}\n'
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert stat.S_IMODE(plain.stat().st_mode) == stat.S_IMODE(dest.stat().st_mode)


def test_a_failed_write_leaves_neither_a_partial_file_nor_a_temporary(tmp_path):
    dest = tmp_path / "model.ckpt"
    write_text_atomic(dest, "old")
    with pytest.raises(OSError, match="disk full"), atomic_path(dest) as tmp:
        tmp.write_text("half")
        raise OSError("disk full")
    assert dest.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


def test_a_failed_write_leaves_no_folder_it_made(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(OSError, match="disk full"), atomic_path(tmp_path / "runs" / "a" / "b" / "x.json"):
        raise OSError("disk full")
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*")] == [Path("runs")]  # runs was there
