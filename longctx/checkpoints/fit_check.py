"""Does a checkpoint's weights fit a model? One clear error before Lightning loads it.

The CLI builds the model from the config and the flags (never from the hyperparameters saved in the
checkpoint), so evaluation settings may differ from training's while the architecture must not. A
checkpoint of another method, or of other sizes, would otherwise fail deep inside
`load_state_dict` with a dump of key names, or (strict loading off) load partly.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from longctx.checkpoints.safe_unpickle import load_tensors_file

CLASS_PATH_KEY = "_class_path"  # where LightningCLI's instantiator records the model's class
SHOWN = 3  # example keys per kind of mismatch in the message


class CheckpointMismatch(ValueError):
    """The checkpoint's weights do not fit the configured model."""


def class_path(model: nn.Module) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def examples(items: list[str], sep: str = ", ") -> str:
    return sep.join(items[:SHOWN]) + (sep + "..." if len(items) > SHOWN else "")


def check_checkpoint_fits(path: str | Path, model: nn.Module, strict: bool = True) -> None:
    """Raise `CheckpointMismatch` naming the checkpoint and the model when the checkpoint's class (if
    it recorded one) or its state dict's keys (only when `strict`) or shapes differ from `model`'s.

    Classes are compared by name, so a checkpoint written before a module moved still loads. A file
    that is no checkpoint at all (truncated, random bytes, unsafe pickle) raises `NotACheckpoint`.
    """
    # mmap: the tensors stay on disk; only names and shapes are read here.
    ckpt = load_tensors_file(path, mmap=True)
    if not isinstance(ckpt, dict):
        raise CheckpointMismatch(
            f"checkpoint {path} holds a {type(ckpt).__name__}, not a Lightning checkpoint"
        )
    saved_class = (ckpt.get("hyper_parameters") or {}).get(CLASS_PATH_KEY)
    saved = ckpt.get("state_dict")
    if not isinstance(saved, dict):
        raise CheckpointMismatch(f"checkpoint {path} has no state_dict: it is not a Lightning checkpoint")
    expected = model.state_dict()
    problems = []
    if saved_class and saved_class.rsplit(".", 1)[-1] != type(model).__name__:
        problems.append(f"it holds a {saved_class}")
    if strict:
        if missing := sorted(expected.keys() - saved.keys()):
            problems.append(f"{len(missing)} weights missing ({examples(missing)})")
        if unexpected := sorted(saved.keys() - expected.keys()):
            problems.append(f"{len(unexpected)} unexpected weights ({examples(unexpected)})")
    shapes = [
        f"{key}: {tuple(saved[key].shape)} vs {tuple(expected[key].shape)}"
        for key in sorted(saved.keys() & expected.keys())
        if saved[key].shape != expected[key].shape
    ]
    if shapes:
        problems.append(f"{len(shapes)} shapes differ, checkpoint vs model ({examples(shapes, '; ')})")
    if problems:
        raise CheckpointMismatch(
            f"checkpoint {path} does not fit the configured model {class_path(model)}: "
            f"{', '.join(problems)}; give the config it was trained with (evaluation settings may differ, "
            "the architecture may not)"
        )
