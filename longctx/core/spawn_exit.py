"""DDP with `start_method="spawn"` whose workers end as `longctx.runtime.process_exit` ends a CLI rank.

A spawned worker is a fresh interpreter that finalizes when its function returns, beside gloo's
worker threads: the abort `longctx.runtime.process_exit` explains (it hit a `ddp_spawn` test on CI). Lightning
offers no hook after the worker's function, so the spawn strategies of Lightning's registry
(`ddp_spawn`, `ddp_spawn_find_unused_parameters_{true,false}`) are registered again, once, with
`SpawnDDPStrategy`: the same DDPStrategy whose launcher ends a worker with `end_process(0)` once
Lightning's function returned (its results are in the queue by then). A worker that raises is left
to Lightning and torch as before: they report the error and the status.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

from longctx.runtime.process_exit import end_process


class SpawnLauncher(_MultiProcessingLauncher):
    """Lightning's launcher, ending each spawned worker after its function without finalizing."""

    def _wrapping_function(self, *args: Any, **kwargs: Any) -> None:
        super()._wrapping_function(*args, **kwargs)
        end_process(0)


class SpawnDDPStrategy(DDPStrategy):
    """DDPStrategy whose spawned workers end through `SpawnLauncher`; other start methods unchanged
    (forked workers already end with `os._exit`, `popen` ranks are CLI processes)."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._start_method == "spawn":
            self._launcher = SpawnLauncher(self, start_method="spawn")


def register_spawn_strategies() -> None:
    """Point every registered plain-DDP spawn strategy name at `SpawnDDPStrategy` (idempotent)."""
    for name, entry in list(StrategyRegistry.items()):
        if entry["strategy"] is DDPStrategy and entry["init_params"].get("start_method") == "spawn":
            StrategyRegistry.register(
                name, SpawnDDPStrategy, entry["description"], override=True, **entry["init_params"]
            )
