"""What tests may ask of the machine they run on: the folder of real corpus pieces (`shared_dir`,
`skip_without_shared`) and whether the GPU tier can run (`cuda_missing`). Helpers, imported by test
modules; `conftest.py` holds only fixtures and hooks (pytest discourages importing it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
"""The repository's root: tests locate its files from here, never by their own depth."""


def shared_dir() -> Path:
    """`$LONGCTX_SHARED`, else `../shared` beside the repository; it may not exist."""
    return Path(os.environ.get("LONGCTX_SHARED", REPO.parent / "shared")).expanduser().resolve()


def skip_without_shared(*parts: str) -> pytest.MarkDecorator:
    """Skip unless `shared_dir() / parts` exists (e.g. `skip_without_shared("data", "gpt2")`)."""
    path = shared_dir().joinpath(*parts)
    return pytest.mark.skipif(
        not path.exists(), reason=f"{path} is not present (../shared, or set $LONGCTX_SHARED)"
    )


def cuda_missing() -> str | None:
    """Why the GPU tier cannot run here (None: it can)."""
    import torch  # only when GPU tests were collected

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False): the GPU tier needs one"
    return None
