"""Read the pickles the authors released without running any code they name.

A pickle can make `pickle.load` call any importable function. The released files that are pickles
(kimiyoung's `model.pt`, a whole pickled `MemTransformerLM`; Hugging Face's `vocab.pkl`, a pickled
tokenizer `__dict__`) only need to *name* a few of the authors' classes. `RecordUnpickler` turns
every object of an allowed class into an inert `Record` (its class name and its `__dict__`/state),
rebuilds tensors through PyTorch's own `weights_only` rules, and refuses anything else with an error
naming the global: nothing outside builtins containers and the allowed names is ever imported.
"""

from __future__ import annotations

import _compat_pickle
import pickle
import re
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch._weights_only_unpickler import _get_allowed_globals


class UnsafePickleError(ValueError):
    """The pickle names a global that is not on the allowed list."""


class NotACheckpoint(ValueError):
    """A file that is not a complete PyTorch file of tensors and plain data (the message names it)."""


# How torch.load(weights_only=True) names the global it refused: one not on its list, or one of a
# module it blocks outright (`os.system` pickles as `posix.system`).
_REFUSED_GLOBAL = re.compile(
    r"GLOBAL (\S+) was not an allowed global|unsupported GLOBAL (\S+) whose module \S+ is blocked"
)
# Modules `os` re-exports: a global of theirs is named as `os.<name>`, as its author wrote it.
_OS_MODULES = ("posix", "nt")
# What random bytes drive the unpickler's stack machine into (pop from an empty stack, a memo key
# never put): the file is not a pickle torch wrote.
_GARBLED_PICKLE = (IndexError, KeyError, TypeError, AttributeError, AssertionError, OverflowError)
# Lines of torch's weights_only message that say how to load anyway, not what was refused.
_WEIGHTS_ONLY_NOISE = ("Weights only load failed", "Check the documentation", "Please file an issue")


def load_tensors_file(path: str | Path, mmap: bool = False) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU, with one-line errors for what users hand in.

    A truncated file, random bytes or another kind of file raise `NotACheckpoint` saying so instead
    of torch's internals (`PytorchStreamReader failed ...`, `mmap can only be used with ...`); a file
    whose pickle names anything but tensors and plain data is refused as unsafe, naming the global,
    never with torch's advice to retry with `weights_only=False` (which would run that code).
    `mmap` (tensors stay on disk) applies to the zip format; a legacy-format file is read whole.
    """
    path = Path(path)
    if not path.is_file():
        raise NotACheckpoint(f"{path}: no such file")
    zipped = zipfile.is_zipfile(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipped)
    except pickle.UnpicklingError as err:
        if refused := _refused(str(err)):
            raise NotACheckpoint(
                f"{path} is not a longctx checkpoint: its pickle names {refused}, which is neither a tensor "
                "nor plain data, and longctx refuses unsafe content (unpickling it could run any code); "
                "give a checkpoint that longctx wrote or converted"
            ) from err
        reason = _weights_only_reason(str(err)) if zipped else "not a zip archive, nor a legacy torch.save"
        raise NotACheckpoint(_unreadable(path, reason)) from err
    except PermissionError as err:
        raise NotACheckpoint(f"{path}: cannot read it ({err.strerror})") from err
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, *_GARBLED_PICKLE) as err:
        reason = "an incomplete zip archive" if zipped else "not a zip archive: truncated or another kind"
        raise NotACheckpoint(_unreadable(path, reason)) from err


def _refused(message: str) -> str | None:
    """The global torch's weights_only loader refused, as its author would name it (with the name the
    pickle holds when it differs: `os.system (posix.system)`, `subprocess.Popen (commands.Popen)` in a
    protocol-2 pickle), or None."""
    if not (match := _REFUSED_GLOBAL.search(message)):
        return None
    name = match.group(1) or match.group(2)
    module, _, attribute = name.rpartition(".")
    module, attribute = _compat_pickle.NAME_MAPPING.get((module, attribute), (module, attribute))
    module = "os" if module in _OS_MODULES else _compat_pickle.IMPORT_MAPPING.get(module, module)
    written = f"{module}.{attribute}" if module else attribute
    return written if written == name else f"{written} ({name})"


def _weights_only_reason(message: str) -> str:
    """The line of torch's weights_only message that says what it refused."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return next((line for line in lines if not line.startswith(_WEIGHTS_ONLY_NOISE)), "")


def _unreadable(path: Path, reason: str) -> str:
    return (
        f"{path} is not a readable PyTorch checkpoint ({reason}); give a complete checkpoint file "
        "(a copy that was cut short or is still being written fails like this)"
    )


class Record:
    """An object of one of the authors' classes, kept as data: `cls` ("module.Name"), the arguments
    it was called with (`args`) and its pickled state (`state`, a dict)."""

    cls = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Record:
        self = super().__new__(cls)
        self.args, self.state = args, {}
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        # nn.Module pickles its __dict__; a (dict, slots) pair is the other standard form.
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict | None):
            state = {**(state[0] or {}), **(state[1] or {})}
        self.state = state if isinstance(state, dict) else {"state": state}

    def __repr__(self) -> str:
        return f"Record({self.cls})"


def _record_class(full: str) -> type[Record]:
    return type(full.rsplit(".", 1)[-1], (Record,), {"cls": full})


# Plain containers the authors' objects hold; never anything callable beyond constructing them.
_BUILTINS = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("__builtin__", "set"): set,  # protocol-2 pickles name Python 2's module
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("collections", "Counter"): Counter,
}


class RecordUnpickler(pickle.Unpickler):
    """Unpickler that builds `Record`s for `allowed` class names ("module.Name") and refuses the rest.

    Tensors are allowed through the same globals as `torch.load(weights_only=True)` (storages,
    `_rebuild_tensor_v2`, `Parameter`); torch's loader adds the storages' `persistent_load`.
    """

    def __init__(self, file: Any, allowed: set[str], source: str) -> None:
        super().__init__(file)
        self.allowed, self.source = allowed, source
        self._torch = _get_allowed_globals()
        self._classes: dict[str, type[Record]] = {}

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if (module, name) in _BUILTINS:
            return _BUILTINS[(module, name)]
        if full in self._torch:
            return self._torch[full]
        if full in self.allowed:
            if full not in self._classes:
                self._classes[full] = _record_class(full)
            return self._classes[full]
        raise UnsafePickleError(
            f"{self.source}: the pickle names {full!r}, which is not on the list of classes this "
            f"reader rebuilds ({', '.join(sorted(self.allowed)) or 'none'}); refusing to load it "
            "(loading arbitrary pickles can run any code)"
        )


def load_pickle(path: Path, allowed: set[str]) -> Any:
    """A plain pickle file (e.g. `vocab.pkl`), with only `allowed` classes, as Records."""
    with open(path, "rb") as f:
        try:
            return RecordUnpickler(f, allowed, str(path)).load()
        except (pickle.UnpicklingError, EOFError) as err:
            raise NotACheckpoint(f"{path} is not a pickle file (truncated or another kind of file)") from err


def load_torch_pickle(path: Path, allowed: set[str]) -> Any:
    """A `torch.save` file whose pickle holds objects of `allowed` classes, as Records.

    The tensors' storages are read by PyTorch's own loader (zip or legacy format); only the
    unpickler of the objects is ours.
    """

    class _Pickle:
        """The `pickle_module` torch.load calls: our unpickler with torch's persistent_load."""

        class Unpickler(RecordUnpickler):
            def __init__(self, file: Any, **kwargs: Any) -> None:
                super().__init__(file, allowed, str(path))

        @staticmethod
        def load(file: Any, **kwargs: Any) -> Any:
            return _Pickle.Unpickler(file).load()

    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_Pickle)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        raise NotACheckpoint(_unreadable(path, "neither a zip archive nor a legacy torch.save")) from err
