"""Checkpoints, in one place: reading them safely (`safe_unpickle.py`: tensors and the authors' pickles,
never arbitrary code), checking one fits the configured model before Lightning loads it
(`fit_check.py`), writing them whole or not at all (`saving.py`), and a converted checkpoint of the
authors' loaded into the model (`convert.py`: what a method's `methods/<method>/convert.py` returns;
the command is `python -m longctx convert`, `longctx.commands.convert`). Shared code: it names no
method."""
