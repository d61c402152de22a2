"""Golden numbers: what the code computed at its last deliberate update, compared on every run, so a
commit that changes a number says so (as torchtitan's loss-compare CI does).

- `tests/golden/quickstart_losses.json`: the training loss of each of the first 100 steps of
  `configs/quickstart.yaml` (its seed 0, one CPU thread), through the CLI (slow tier).
- `tests/golden/method_evals.json`: one `val/loss` per method and variant on fixed tiny weights
  (`tests/golden/weights/<name>.pt`) and a fixed token sequence (stored in the file), through
  `trainer.validate` (fast tier).

A number outside its tolerance fails with the recorded and the new numbers. If the change is meant,
rewrite the files (`UPDATE`) and say in the commit message why the numbers moved.
"""

from __future__ import annotations

import json
import math
import platform
import re
from pathlib import Path

import lightning
import pytest
import torch

from longctx.methods.registry import METHODS
from tests.helpers.golden_runs import (
    EVALUATED,
    QUICKSTART_STEPS,
    REPO,
    evaluation_loss,
    quickstart_args,
    quickstart_losses,
    sample_tokens,
    trained_weights,
)

GOLDEN = REPO / "tests" / "golden"
QUICKSTART_FILE = GOLDEN / "quickstart_losses.json"
EVALS_FILE = GOLDEN / "method_evals.json"
WEIGHTS = GOLDEN / "weights"
UPDATE = "python -m pytest -q -m '' tests/integration/test_golden.py --update-golden"

# The quickstart runs on one thread: two runs on one thread are bitwise equal here, while one thread
# against two (another order of float32 sums, as another CPU's kernels give) first differs at step
# 6 (8.6e-8 relative), 7.8e-7 by step 11, 9e-6 by step 21, and then grows as training amplifies it:
# at most 0.78% (0.024 nats) over steps 1-100. So steps 1-10, which any change of the data, the
# model, the loss or the optimizer moves, are held to 1e-5 (13x that floor), and the later steps,
# where only the floor's growth is known, to 2%.
QUICKSTART_THREADS = 1
EARLY_STEPS, EARLY_REL, LATE_REL = 10, 1e-5, 2e-2
# An evaluation of fixed weights gave bitwise the same loss on one and on two threads; 1e-5 leaves
# room for another CPU's float32 kernels (a few ulps of each of ~500 summed NLLs).
EVAL_REL = 1e-5


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return request.config.getoption("--update-golden")


def versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
    }


def write_json(path: Path, content: dict) -> None:
    """One number a line (a commit's diff shows which moved), a list of token ids on one line."""
    text = json.dumps(content, indent=1)
    text = re.sub(r"\[\s*(\d+(?:,\s*\d+)*)\s*\]", lambda ids: "[" + " ".join(ids[1].split()) + "]", text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def moved_message(what: str, rows: list[str], recorded_versions: dict[str, str]) -> str:
    """The failure: what moved, recorded against new numbers, and how to accept the change."""
    now = versions()
    changed = {
        k: f"{recorded_versions.get(k)} -> {v}" for k, v in now.items() if recorded_versions.get(k) != v
    }
    return "\n".join(
        [
            f"{what} moved beyond the tolerance"
            + (f" (recorded with other versions: {changed})" if changed else "")
            + ":",
            *rows,
            f"If the change is meant, rewrite the golden numbers: {UPDATE}",
            "and say in the commit message why the numbers moved.",
        ]
    )


def row(label: str, recorded: float, new: float) -> str:
    return f"  {label}: recorded {recorded!r}, now {new!r} (difference {new - recorded:+.3g})"


@pytest.mark.slow  # 100 training steps on one thread, through the CLI (~30 s of CPU)
def test_the_quickstart_trains_as_recorded(tmp_path, update_golden):
    losses = quickstart_losses(tmp_path, threads=QUICKSTART_THREADS)
    assert len(losses) == QUICKSTART_STEPS and all(map(math.isfinite, losses))
    if update_golden:
        args = [arg.removeprefix(f"{REPO}/") for arg in quickstart_args(Path("<tmp>"))]
        write_json(
            QUICKSTART_FILE,
            {
                "what": f"training loss (the objective training_step returns: mean NLL plus the span "
                f"penalty) of each of the first {QUICKSTART_STEPS} steps of configs/quickstart.yaml "
                f"(seed 0), on {QUICKSTART_THREADS} CPU thread",
                "command": f"python -m longctx {' '.join(args)}  # in-process, torch.set_num_threads"
                f"({QUICKSTART_THREADS})",
                "update": UPDATE,
                "versions": versions(),
                "losses": losses,
            },
        )
        pytest.skip(f"--update-golden: rewrote {QUICKSTART_FILE.name}")
    golden = json.loads(QUICKSTART_FILE.read_text())
    recorded = golden["losses"]
    assert len(recorded) == QUICKSTART_STEPS
    moved = [
        row(f"step {step}", old, new)
        for step, (old, new) in enumerate(zip(recorded, losses), start=1)
        if not math.isclose(new, old, rel_tol=EARLY_REL if step <= EARLY_STEPS else LATE_REL)
    ]
    if moved:
        pytest.fail(
            moved_message(
                f"The quickstart's training loss (tolerance: relative {EARLY_REL} for steps 1-{EARLY_STEPS}, "
                f"{LATE_REL} after) at {len(moved)} of {QUICKSTART_STEPS} steps",
                moved[:12] + (["  ..."] if len(moved) > 12 else []),
                golden["versions"],
            ),
            pytrace=False,
        )


def test_every_registered_method_has_a_golden_evaluation():
    """Each method of the registry is evaluated under at least one golden name."""
    models = [factory() for factory, _ in EVALUATED.values()]
    evaluated = {f"{type(model).__module__}.{type(model).__name__}" for model in models}
    assert {method.module for method in METHODS.values()} <= evaluated


def stored_weights(name: str) -> dict[str, torch.Tensor]:
    return torch.load(WEIGHTS / f"{name}.pt", weights_only=True)


def updated_weights(name: str, tokens: list[int], root: Path) -> tuple[dict[str, torch.Tensor], bool]:
    """The stored weights if they still load into the method's model (strict), else new ones
    (`trained_weights`): (weights, whether they were made anew)."""
    path = WEIGHTS / f"{name}.pt"
    if path.exists():
        weights = stored_weights(name)
        try:
            EVALUATED[name][0]().load_state_dict(weights)
            return weights, False
        except RuntimeError:
            pass
    weights = trained_weights(name, tokens, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(weights, path)
    return weights, True


@pytest.mark.parametrize("name", list(EVALUATED))
def test_each_method_evaluates_fixed_weights_as_recorded(tmp_path, name, update_golden):
    golden = json.loads(EVALS_FILE.read_text()) if EVALS_FILE.exists() else {}
    if update_golden:
        tokens = golden.get("tokens") or sample_tokens()
        weights, made = updated_weights(name, tokens, tmp_path)
        golden.update(
            what="val/loss (mean NLL, nats) of each method's tiny model (tests/helpers/methods.py sizes; "
            "tests/helpers/golden_runs.py EVALUATED) with the weights tests/golden/weights/<name>.pt "
            "(trained 100 Adam steps on the tokens when made), through trainer.validate on `tokens` "
            "(the first bytes of the bundled sample text, modulo 64) on one CPU thread",
            update=UPDATE,
            versions=versions(),
            tokens=tokens,
            val_loss={**golden.get("val_loss", {}), name: evaluation_loss(name, weights, tokens, tmp_path)},
        )
        write_json(EVALS_FILE, golden)
        pytest.skip(
            f"--update-golden: rewrote {name}'s number" + (" and made its weights anew" if made else "")
        )
    assert name in golden.get("val_loss", {}), f"no golden number for {name}: {UPDATE}"
    try:
        new = evaluation_loss(name, stored_weights(name), golden["tokens"], tmp_path)
    except RuntimeError as err:  # load_state_dict: a weight renamed, added or reshaped
        pytest.fail(
            f"{name}: the stored weights {WEIGHTS.name}/{name}.pt no longer fit the model "
            f"({str(err).splitlines()[0]} ...); if the change is meant, {UPDATE} makes its weights "
            "anew (its number moves), and the commit message says why",
            pytrace=False,
        )
    old = golden["val_loss"][name]
    if not math.isclose(new, old, rel_tol=EVAL_REL):
        pytest.fail(
            moved_message(
                f"{name}'s val/loss on its fixed weights (tolerance: relative {EVAL_REL})",
                [row(name, old, new)],
                golden["versions"],
            ),
            pytrace=False,
        )
