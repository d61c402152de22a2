"""What every method's LightningModule stands on: `LMBase` and `StepOutput` (`base.py`), the protocol
of a carried memory (`memory.py`), the RNG state a checkpoint carries (`rng_state.py`) and the
per-token losses of an evaluation (`token_nll.py`).
Shared code: it imports no method."""
