"""The layout's one rule that code can break silently: a method's network is pure PyTorch.

Each `longctx/methods/<method>/` holds its network, FLOPs count and memory type (pure PyTorch, usable
without Lightning) beside its LightningModule and callbacks. This reads the imports (AST, nothing is
executed) of every `network.py`, `flops.py` and `memory.py`, and of every longctx module they import,
transitively.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import yaml

from longctx import run_layout
from longctx.core.base import LMBase
from longctx.methods import registry
from tests.methods import TINY

REPO = Path(__file__).resolve().parents[1]
METHODS = sorted(p for p in (REPO / "longctx" / "methods").iterdir() if (p / "__init__.py").is_file())
PURE_ROLES = ("network.py", "flops.py", "memory.py")
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def source_of(module: str) -> Path | None:
    """The file of a longctx module (None for anything else, or for a name that is not a module)."""
    if module.split(".")[0] != "longctx":
        return None
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def lightning_imports(root: Path) -> dict[str, list[str]]:
    """{file: Lightning modules it imports} over `root` and the longctx modules it reaches."""
    seen, todo, found = set(), [root], {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        modules = imported_modules(path)
        if hits := sorted(m for m in modules if m.split(".")[0] in LIGHTNING):
            found[str(path.relative_to(REPO))] = hits
        todo.extend(p for m in modules if (p := source_of(m)) is not None)
    return found


def test_every_method_has_a_network_and_a_module():
    expected = {"adaptive_span", "transformer_xl", "recurrence", "window_transformer"}
    assert {p.name for p in METHODS} >= expected
    for method in METHODS:
        assert (method / "network.py").is_file() and (method / "module.py").is_file(), method.name


def test_every_method_folder_is_registered_with_its_module_and_tiny_recipe():
    """One line in `longctx/methods/registry.py` and one in the tests' table per method folder; the
    line names the folder's own module, and its tiny recipe trains that module."""
    folders = {p.name for p in METHODS}
    assert set(registry.METHODS) == folders
    assert set(TINY) == folders  # every cross-method test runs every method
    for name, method in registry.METHODS.items():
        assert method.module.startswith(f"longctx.methods.{name}.module."), name
        module_class = method.module_class()
        assert issubclass(module_class, LMBase) and type(TINY[name].build()) is module_class, name
        config = yaml.safe_load((REPO / method.tiny_config).read_text())
        assert config["model"]["class_path"] == method.module, method.tiny_config
        assert config["data"].get("mode", "segments") == module_class.batch_mode, method.tiny_config


# What a method may import from another method, name by name: Transformer-XL's pure-PyTorch parts, on
# which the Compressive Transformer is built (docs/architecture.md, "Which XL parts other methods may
# import"). Never a whole module, nor another method's LightningModule, conversion, TRAMS, evaluation
# cache (slot store), callbacks or figures: those belong to their method alone, and may change with it.
SHARED_METHOD_PARTS = {
    "longctx/methods/transformer_xl/network.py": {"TransformerXL", "XLBlock", "PositionwiseFF"},
    "longctx/methods/transformer_xl/relative_attention.py": {
        "RelMultiHeadAttention",
        "AttentionOutput",
        "sinusoid_positions",
        "rel_shift",
        "window_blocked",
    },
    "longctx/methods/transformer_xl/adaptive_softmax.py": {
        "AdaptiveEmbedding",
        "ProjectedAdaptiveLogSoftmax",
        "cutoffs_within",
    },
    "longctx/methods/transformer_xl/memory.py": {
        "XLMemory",
        "empty_memory",
        "zero_memory",
        "update_memory",
        "reset_memory_rows",
    },
    "longctx/methods/transformer_xl/flops.py": {"macs_per_token"},
}


def imported_names(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every `from module import name` of a file, (module, None) for `import module`
    (relative imports resolved against its package, as `imported_modules`)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.extend((base, alias.name) for alias in node.names)
    return found


def cross_method_imports(methods_root: Path) -> list[str]:
    """`importer -> imported:name` for every name a file of a method imports from another method that
    `SHARED_METHOD_PARTS` does not declare (`imported:*` for a whole module: `import x`, or `from pkg
    import module`)."""
    found = []
    for path in sorted(methods_root.rglob("*.py")):
        own = path.relative_to(methods_root).parts[0]
        for module, name in imported_names(path):
            submodule = source_of(f"{module}.{name}") if name is not None else None
            target = submodule or source_of(module)
            if target is None or methods_root not in target.parents or target.parent == methods_root:
                continue
            if target.relative_to(methods_root).parts[0] == own:
                continue
            imported = str(target.relative_to(REPO))
            whole = name is None or submodule is not None or name == "*"
            if whole or name not in SHARED_METHOD_PARTS.get(imported, ()):
                found.append(f"{path.relative_to(REPO)} -> {imported}:{'*' if whole else name}")
    return sorted(set(found))


def test_methods_import_from_each_other_only_the_declared_parts():
    assert cross_method_imports(REPO / "longctx" / "methods") == []
    for part, names in SHARED_METHOD_PARTS.items():
        defined = {
            node.name if not isinstance(node, ast.Assign) else node.targets[0].id
            for node in ast.parse((REPO / part).read_text()).body
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
            or (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name))
        }
        assert names <= defined, f"{part} no longer defines {sorted(names - defined)}"


def test_the_cross_method_check_finds_an_undeclared_import(tmp_path, monkeypatch):
    methods = tmp_path / "longctx" / "methods"
    for folder in ("a", "b"):
        (methods / folder).mkdir(parents=True)
        (methods / folder / "__init__.py").write_text("")
    (methods / "a" / "module.py").write_text("X = 1\n")
    (methods / "a" / "network.py").write_text("Shared = 1\nPrivate = 2\n")
    (methods / "b" / "network.py").write_text(
        "from . import network\n"  # its own: fine
        "from longctx.methods.a.module import X\n"  # a file with no declared name
        "from longctx.methods.a.network import Shared, Private\n"  # one declared, one not
        "from longctx.methods.a import network as whole\n"  # a whole module
        "import longctx.methods.a.network\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(
        sys.modules[__name__], "SHARED_METHOD_PARTS", {"longctx/methods/a/network.py": {"Shared"}}
    )
    assert cross_method_imports(methods) == [
        "longctx/methods/b/network.py -> longctx/methods/a/module.py:X",
        "longctx/methods/b/network.py -> longctx/methods/a/network.py:*",
        "longctx/methods/b/network.py -> longctx/methods/a/network.py:Private",
    ]


def test_code_shared_by_the_methods_imports_no_method():
    """`longctx/methods/*.py` (the attention kernel knob, the FIFO memory, the registry) serve every
    method: they import none (the registry names modules by import path)."""
    shared = list((REPO / "longctx" / "methods").glob("*.py"))
    assert {"fifo.py", "attention_kernel.py", "registry.py"} <= {p.name for p in shared}
    assert {p.name: method_imports(p) for p in shared} == {p.name: [] for p in shared}


@pytest.mark.parametrize(
    "path",
    [m / role for m in METHODS for role in PURE_ROLES if (m / role).is_file()],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_networks_flops_and_memories_import_no_lightning(path):
    assert lightning_imports(path) == {}


def test_the_check_finds_direct_and_transitive_lightning_imports():
    """A LightningModule fails it twice: its own import and the one of `LMBase` it reaches."""
    found = lightning_imports(REPO / "longctx" / "methods" / "window_transformer" / "module.py")
    assert "lightning.pytorch.cli" in found["longctx/methods/window_transformer/module.py"]
    assert "lightning.pytorch" in found["longctx/core/base.py"]


def import_cycles(root: Path) -> list[list[str]]:
    """Groups of longctx modules under `root` that import each other, directly or through others
    (imports inside functions count: they are the usual way a cycle is hidden)."""
    graph = {
        path: {p for m in imported_modules(path) if (p := source_of(m)) is not None and p != path}
        for path in sorted(root.rglob("*.py"))
    }

    def reachable(start: Path) -> set[Path]:
        seen, todo = set(), list(graph.get(start, ()))
        while todo:
            path = todo.pop()
            if path not in seen:
                seen.add(path)
                todo.extend(graph.get(path, ()))
        return seen

    reach = {path: reachable(path) for path in graph}
    groups = {frozenset(q for q in reach[p] if p in reach.get(q, ())) for p in graph if p in reach[p]}
    return sorted(sorted(str(p.relative_to(REPO)) for p in group) for group in groups)


def test_no_module_of_longctx_imports_itself_through_others():
    assert import_cycles(REPO / "longctx") == []


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    package = tmp_path / "longctx"
    package.mkdir()
    (package / "a.py").write_text("def f():\n    from longctx.b import g\n")
    (package / "b.py").write_text("from longctx.a import f\n")
    (package / "c.py").write_text("from longctx import a\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert import_cycles(package) == [["longctx/a.py", "longctx/b.py"]]


# The names the layout defines (DEFAULT_ROOT, LOCK, SUMMARY, ...: its upper-case constants).
RUN_FILE_NAMES = {value for name, value in vars(run_layout).items() if name.isupper()}


def spelled_run_file_names(root: Path) -> list[str]:
    """`file:line name` for every string constant of the run layout spelled outside `run_layout.py`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "run_layout.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and node.value in RUN_FILE_NAMES:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    return found


def test_the_run_directory_layout_is_spelled_only_in_run_layout():
    """One module owns where a run's files go; the CLI, sweep, run record and lock take names from it."""
    assert {"runs", ".lock", "config.yaml", "summary.json", "metrics.jsonl", "checkpoints"} <= RUN_FILE_NAMES
    assert spelled_run_file_names(REPO / "longctx") == []


def test_the_run_layout_check_finds_a_spelled_name(tmp_path, monkeypatch):
    (tmp_path / "longctx").mkdir()
    (tmp_path / "longctx" / "sweep.py").write_text('SUMMARY = "summary.json"\n"""docs: summary.json"""\n')
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert spelled_run_file_names(tmp_path / "longctx") == ["longctx/sweep.py:1 summary.json"]


def test_the_run_layout_imports_neither_lightning_nor_torch():
    path = REPO / "longctx" / "run_layout.py"
    assert lightning_imports(path) == {}
    assert not {m for m in imported_modules(path) if m.split(".")[0] in ("torch", "numpy")}


# Shared modules that still reach methods: the `context` command's per-method axes (each axis names
# the module class it applies to). Everything else outside `longctx/methods/` imports no method.
REACHES_METHODS = {"longctx/diagnostics/axes.py", "longctx/context.py"}


def method_imports(root: Path) -> list[str]:
    """The method modules (`longctx/methods/<method>/...`) `root` reaches, directly or transitively."""
    seen, todo = set(), [root]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(p for m in imported_modules(path) if (p := source_of(m)) is not None)
    methods = REPO / "longctx" / "methods"
    return sorted(str(p.relative_to(REPO)) for p in seen if p.parent != methods and methods in p.parents)


SHARED = sorted(
    p for p in (REPO / "longctx").rglob("*.py") if "methods" not in p.relative_to(REPO / "longctx").parts
)


@pytest.mark.parametrize("path", SHARED, ids=lambda p: str(p.relative_to(REPO / "longctx")))
def test_shared_code_imports_no_method(path):
    """The generic CLI, the command table, the checkpoints and the base work for any method: a method
    is reached through a table of import paths (`commands.py`, `checkpoints/convert.py`), never imported."""
    if str(path.relative_to(REPO)) in REACHES_METHODS:
        assert method_imports(path) != []  # drop it from REACHES_METHODS when it no longer does
    else:
        assert method_imports(path) == []


def test_the_method_import_check_sees_through_other_modules():
    assert "longctx/methods/window_transformer/module.py" in method_imports(REPO / "longctx" / "context.py")
