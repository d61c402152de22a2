"""What every test may rely on, and nothing about this machine.

- `shared_dir()` (`tests/helpers/environment.py`): the folder of real corpus pieces, GPT-2 BPE files and the
  authors' checkpoints, `../shared` beside the repository (or `$LONGCTX_SHARED`). A stranger's clone
  has none: tests that need it carry `skip_without_shared(...)` and skip, saying which path is
  missing. Point `LONGCTX_SHARED` at an empty folder to check that the suite skips (never fails)
  without it. Test modules import these helpers from `tests/helpers/environment.py`, never this file.
- W&B is off unless a test turns it on (no account, no network, no `wandb/` folders).
- Token caches go to a temporary folder of each test (`$LONGCTX_CACHE`), never to the user's cache;
  the W&B folders a CLI run points into its run directory are unset again after each test.
- torch runs one intra-op thread (`OMP_NUM_THREADS=1` unless set; subprocesses inherit it): the
  tests' tiny models run about twice as fast on one thread as contending for two (CI has two cores).
- Two tiers (pyproject's `addopts` deselects `slow` and `gpu`): `python -m pytest -q` is the fast tier,
  `python -m pytest -q -m slow` the rest (compile, DDP, SLURM, resume), `-m ''` all. The fast tier
  runs on one pytest-xdist worker per core (`-n auto` in `addopts`); any selection that takes slow or
  GPU tests runs in one process, as `-n 0` does (their DDP process groups, CLI subprocesses with
  time limits and GPU memory are not to be shared). The GPU tier,
  `python -m pytest -q -m gpu`, skips each test with one reason when CUDA is not available.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.helpers.environment import cuda_missing

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # read when torch is imported, after this file


@pytest.fixture(autouse=True)
def _token_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data module without `cache_dir` writes to `$LONGCTX_CACHE`: a folder of this test's own."""
    monkeypatch.setenv("LONGCTX_CACHE", str(tmp_path_factory.mktemp("token-cache")))


@pytest.fixture(autouse=True)
def _wandb_folders_restored() -> Iterator[None]:
    """`cli.keep_wandb_in` sets W&B's folder variables for the process: restore them after each test."""
    names = ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")  # cli.WANDB_FOLDERS
    saved = {name: os.environ.get(name) for name in names}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _no_wandb_run_outlives_its_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An in-process `fit` leaves its W&B run active (a CLI process would end with it): finish it with
    its test, or a later test's `report` logs into it and W&B writes its files relative to the
    working folder, the repository's. Asks for `monkeypatch` so that this runs before a test's
    `chdir` is undone."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and isinstance(wandb.run, wandb.sdk.wandb_run.Run):  # not a test's stand-in
        wandb.run.finish()


@pytest.hookimpl(optionalhook=True)  # `-p no:xdist` runs without the plugin that defines it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker per core for the fast tier, none (one process) when slow or GPU tests may run."""
    if "not slow" not in config.getoption("markexpr") or "not gpu" not in config.getoption("markexpr"):
        return 0
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="tests/integration/test_golden.py: rewrite the golden numbers in tests/golden/ instead of "
        "comparing them (a deliberate act: the commit message says why the numbers moved)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every multi-process DDP test is in the slow tier (before `-m` selects by marker); every GPU test
    skips, with one reason, where CUDA is not available."""
    for item in items:
        if item.get_closest_marker("ddp") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and (reason := cuda_missing()) is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
