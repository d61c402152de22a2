"""`methods/recurrence/hf.py`, longctx's one surface on `transformers`: importing a recurrence module
registers nothing in transformers' tables; `register_recurrence_attention` does, and a second call is
harmless. Checked in a fresh interpreter: the test session has registered long before."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.helpers.environment import REPO

RECURRENCE = REPO / "longctx" / "methods" / "recurrence"

PROBE = """
import importlib, json, sys
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

def registered():
    return sorted(n for n in ("recurrence_sdpa", "recurrence_eager")
                  if n in AttentionInterface._global_mapping or n in ALL_MASK_ATTENTION_FUNCTIONS)

for name in sys.argv[1:]:
    importlib.import_module(name)
after_import = registered()
from longctx.methods.recurrence.hf import register_recurrence_attention
register_recurrence_attention()
register_recurrence_attention()
wrapped = [AttentionInterface._global_mapping[n].__name__ for n in ("recurrence_sdpa", "recurrence_eager")]
print(json.dumps({"after_import": after_import, "after_register": registered(), "wrapped": wrapped}))
"""


def test_no_recurrence_module_calls_anything_at_import():
    """The fast check of the rule: a module-level call statement (as `register_recurrence_attention()`
    was) runs at import; one under `if __name__ == "__main__":` is not at module level."""
    for path in sorted(RECURRENCE.glob("*.py")):
        body = ast.parse(path.read_text(), filename=str(path)).body
        calls = [ast.unparse(n) for n in body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        assert calls == [], path.name


@pytest.mark.slow  # a fresh interpreter importing transformers and Lightning: ~10 s here
def test_importing_the_recurrence_registers_nothing_until_asked_and_twice_is_harmless():
    modules = sorted(f"longctx.methods.recurrence.{p.stem}" for p in RECURRENCE.glob("*.py"))
    assert "longctx.methods.recurrence.network" in modules and "longctx.methods.recurrence.module" in modules
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, check=True, cwd=REPO
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["after_import"] == []
    assert result["after_register"] == ["recurrence_eager", "recurrence_sdpa"]
    # The second call replaces the wrappers of the stock functions; it does not wrap a wrapper.
    assert result["wrapped"] == ["recurrence_sdpa_attention_forward", "recurrence_eager_attention_forward"]


UNPICKLE = """
import pickle, sys, torch
module = pickle.loads(open(sys.argv[1], "rb").read())  # imports longctx; registers nothing itself
batch = torch.load(sys.argv[2])
print(float(module.step(batch, None).nll.sum()))
"""


@pytest.mark.slow  # a fresh interpreter: ~10 s here
def test_an_unpickled_recurrent_gpt2_runs_in_a_fresh_interpreter(tmp_path):
    """ddp_spawn's path: the spawned process registers the recurrence attention when it unpickles."""
    import pickle

    import torch

    from longctx.methods.recurrence.module import RecurrentGPT2LM

    torch.manual_seed(0)
    tiny = {"n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 32}
    recurrence = {"insert_layer": 1, "ffn_width": 8}
    module = RecurrentGPT2LM(vocab_size=50, gpt2_config=tiny, window_recurrence=recurrence).eval()
    x = torch.randint(0, 50, (2, 3, 8))
    batch = {"input": x, "target": x, "mask": torch.ones_like(x, dtype=torch.bool)}
    batch["reset"] = torch.zeros(2, 3, dtype=torch.bool)
    with torch.no_grad():
        expected = float(module.step(batch, None).nll.sum())  # installs transformers' hooks
    (tmp_path / "module.pkl").write_bytes(pickle.dumps(module))
    torch.save(batch, tmp_path / "batch.pt")
    out = subprocess.run(
        [sys.executable, "-c", UNPICKLE, str(tmp_path / "module.pkl"), str(tmp_path / "batch.pt")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) == pytest.approx(expected, rel=1e-6)
