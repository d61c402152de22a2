"""Checkpoints, in one place: reading them safely (`safe_unpickle.py`: tensors and the authors' pickles,
never arbitrary code), checking one fits the configured model before Lightning loads it
(`fit_check.py`), writing them whole or not at all (`saving.py`), and converting the authors' released
checkpoints into longctx ones (`convert.py`, `python -m longctx convert`; each method's converter is
its own `methods/<method>/convert.py`). Shared code: it names methods only as import paths."""
