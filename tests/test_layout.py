"""The layout's one rule that code can break silently: a method's network is pure PyTorch.

Each `longctx/methods/<method>/` holds its network, FLOPs count and memory type (pure PyTorch, usable
without Lightning) beside its LightningModule and callbacks. This reads the imports (AST, nothing is
executed) of every `network.py`, `flops.py` and `memory.py`, and of every longctx module they import,
transitively.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from longctx.core.base import LMBase
from longctx.methods import registry
from longctx.runtime import run_layout
from tests.helpers.environment import REPO
from tests.helpers.methods import TINY
from tests.test_configs import load_expected

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


TEST_ONLY_FOLDERS = ("helpers", "integration")  # shared helpers; what a user runs end to end


def test_the_tests_mirror_the_package():
    """Each method's tests are in `tests/methods/<method>/`, and every test folder mirrors a folder of
    `longctx/` (or `benchmarks/`, the scripts its tests run), or is one of `TEST_ONLY_FOLDERS`; each
    is a package (its modules import as `tests.<folder>.<module>`)."""
    folders = [p.parent for p in (REPO / "tests").rglob("*.py") if p.parent != REPO / "tests"]
    strays = sorted(
        str(folder.relative_to(REPO))
        for folder in set(folders)
        if (part := folder.relative_to(REPO / "tests")).parts[0] not in TEST_ONLY_FOLDERS
        and not (REPO / "longctx" / part).is_dir()
        and not (REPO / part).is_dir()
    )
    assert not strays, f"test folders that mirror no folder of longctx/: {strays}"
    packages = [REPO / "tests" / "methods" / p.name for p in METHODS] + folders
    missing = sorted({str(f.relative_to(REPO)) for f in packages if not (f / "__init__.py").is_file()})
    assert not missing, f"test folders without __init__.py: {missing}"
    untested = [p.name for p in METHODS if not any((REPO / "tests" / "methods" / p.name).glob("test_*.py"))]
    assert not untested, f"methods without tests/methods/<method>/test_*.py: {untested}"


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
        # Its resolved values, bases included (tests/test_configs.py checks they are the config's).
        resolved = load_expected(Path(method.tiny_config).stem)
        assert resolved["model.class_path"] == method.module, method.tiny_config
        assert resolved["data.mode"] == module_class.batch_mode, method.tiny_config


# What a method may import from another method, name by name: Transformer-XL's pure-PyTorch parts, on
# which the Compressive Transformer is built, and the recurrent GPT-2's GPT-2 plumbing, on which the
# Recurrent Memory Transformer runs (docs/architecture.md, "Which parts other methods may import").
# Never a whole module, nor another method's LightningModule, conversion, TRAMS, evaluation cache
# (slot store), callbacks or figures: those belong to their method alone, and may change with it.
SHARED_METHOD_PARTS = {
    "longctx/methods/transformer_xl/network.py": {"TransformerXL", "XLBlock", "PositionwiseFF"},
    "longctx/methods/transformer_xl/relative_attention.py": {
        "RelMultiHeadAttention",
        "AttentionOutput",
        "KeyWindow",
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
        "MemoryLengths",
        "SegmentMemory",
    },
    "longctx/methods/transformer_xl/flops.py": {"macs_per_token"},
    # The recurrent GPT-2's Hugging Face surface, on which the Recurrent Memory Transformer runs its
    # GPT-2.
    "longctx/methods/recurrence/hf.py": {
        "HF_CONFIG_KEY",
        "build_lm",
        "drop_output_capturing_hooks",
        "restore_after_unpickling",
    },
    "longctx/methods/transformer_xl/context_axes.py": {"MEMORY"},
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


def import_graph(root: Path) -> dict[Path, set[Path]]:
    """{file: the files of the longctx modules it imports} for every module under `root` (imports inside
    functions count: they are the usual way a cycle or an upward import is hidden)."""
    return {
        path: {p for m in imported_modules(path) if (p := source_of(m)) is not None and p != path}
        for path in sorted(root.rglob("*.py"))
    }


def reachable(graph: dict[Path, set[Path]], start: Path) -> set[Path]:
    """The files `start` imports in `graph`, directly or through others."""
    seen, todo = set(), list(graph.get(start, ()))
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(graph.get(path, ()))
    return seen


def import_cycles(root: Path) -> list[list[str]]:
    """Groups of longctx modules under `root` that import each other, directly or through others."""
    graph = import_graph(root)
    reach = {path: reachable(graph, path) for path in graph}
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
    (tmp_path / "longctx" / "commands").mkdir(parents=True)
    (tmp_path / "longctx" / "commands" / "sweep.py").write_text(
        'SUMMARY = "summary.json"\n"""docs: summary.json"""\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert spelled_run_file_names(tmp_path / "longctx") == ["longctx/commands/sweep.py:1 summary.json"]


def test_the_run_layout_imports_neither_lightning_nor_torch():
    path = REPO / "longctx" / "runtime" / "run_layout.py"
    assert lightning_imports(path) == {}
    assert not {m for m in imported_modules(path) if m.split(".")[0] in ("torch", "numpy")}


def reached_modules(root: Path) -> set[Path]:
    """The files of the longctx modules `root` imports, directly or transitively (`root` included)."""
    seen, todo = set(), [root]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(p for m in imported_modules(path) if (p := source_of(m)) is not None)
    return seen


def method_imports(root: Path) -> list[str]:
    """The method modules (`longctx/methods/<method>/...`) `root` reaches, directly or transitively."""
    methods = REPO / "longctx" / "methods"
    reached = reached_modules(root)
    return sorted(str(p.relative_to(REPO)) for p in reached if p.parent != methods and methods in p.parents)


# The package's rooms: the commands (`longctx/commands/`) stand on the library folders beside them
# and are imported by none; the package top holds the entry points and little else.
MAX_LOOSE_MODULES = 6
LIBRARY_ROOMS = {"core", "data", "methods", "optim", "callbacks", "checkpoints", "diagnostics", "runtime"}


def loose_modules(package: Path) -> list[str]:
    """The modules at the package top, outside every room."""
    return sorted(p.name for p in package.glob("*.py"))


def upward_imports(package: Path) -> list[str]:
    """`importer -> commands module` for every module of a library room (any folder of the package but
    `commands/`) that reaches the commands, directly or through others (imports inside functions
    count). A `__main__.py` is no library code but an entry point: `python -m` runs it, nothing imports
    it, so it may import its command."""
    commands = package / "commands"
    rooms = [p for p in package.iterdir() if (p / "__init__.py").is_file() and p != commands]
    graph = import_graph(package)
    found = []
    for start in sorted(f for room in rooms for f in room.rglob("*.py") if f.name != "__main__.py"):
        upward = sorted(p for p in reachable(graph, start) if commands in p.parents)
        found += [f"{start.relative_to(REPO)} -> {p.relative_to(REPO)}" for p in upward]
    return sorted(found)


def test_the_package_top_holds_few_modules_and_no_library_room_imports_the_commands():
    package = REPO / "longctx"
    assert len(loose_modules(package)) <= MAX_LOOSE_MODULES, loose_modules(package)
    rooms = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == LIBRARY_ROOMS | {"commands"}  # a new folder is a library room unless it is listed here
    assert upward_imports(package) == []


def test_the_rooms_check_finds_loose_modules_and_imports_that_run_up(tmp_path, monkeypatch):
    package = tmp_path / "longctx"
    for room in ("commands", "data", "callbacks", "core"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "commands" / "cli.py").write_text("X = 1\n")
    (package / "commands" / "sweep.py").write_text("from longctx.commands.cli import X\n")
    (package / "sweep.py").write_text("from longctx.commands.sweep import main\n")  # an entry point
    (package / "data" / "__main__.py").write_text("from longctx.commands import cli\n")  # an entry point
    (package / "callbacks" / "record.py").write_text("def f():\n    from longctx.commands.cli import X\n")
    (package / "core" / "base.py").write_text("from longctx import sweep\n")  # through the entry point
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert upward_imports(package) == [
        "longctx/callbacks/record.py -> longctx/commands/cli.py",
        "longctx/core/base.py -> longctx/commands/cli.py",
        "longctx/core/base.py -> longctx/commands/sweep.py",
    ]
    for name in ("__init__", "__main__", "a", "b", "c", "d", "e"):
        (package / f"{name}.py").write_text("")
    assert len(loose_modules(package)) == 8 > MAX_LOOSE_MODULES


SHARED = sorted(
    p for p in (REPO / "longctx").rglob("*.py") if "methods" not in p.relative_to(REPO / "longctx").parts
)


@pytest.mark.parametrize("path", SHARED, ids=lambda p: str(p.relative_to(REPO / "longctx")))
def test_shared_code_imports_no_method(path):
    """The generic CLI, the command table, the checkpoints, `report`, `context` and the base work for
    any method: a method is reached through the registry (import paths), never imported."""
    assert method_imports(path) == []


def test_the_method_import_check_sees_through_other_modules(tmp_path, monkeypatch):
    for folder in ("longctx/methods/m", "longctx/diagnostics"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "longctx" / "methods" / "m" / "module.py").write_text("X = 1\n")
    (tmp_path / "longctx" / "diagnostics" / "axes.py").write_text("from longctx.methods.m.module import X\n")
    (tmp_path / "longctx" / "context.py").write_text("def f():\n    from longctx.diagnostics import axes\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert method_imports(tmp_path / "longctx" / "context.py") == ["longctx/methods/m/module.py"]


def method_names_in_code(path: Path, methods: Iterable[str]) -> list[str]:
    """`file:line text` for every string in `path`'s code (docstrings aside: they may cite an example)
    that names a method's folder (`longctx.methods.<m>`, `methods/<m>`) or is a method's name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    pattern = re.compile(rf"^({'|'.join(methods)})$|methods[./]({'|'.join(methods)})\b")
    found = [
        (node.lineno, node.col_offset, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        and pattern.search(node.value)
    ]  # fmt: skip
    return [f"{path.relative_to(REPO)}:{line} {value}" for line, _, value in sorted(found)]


# Code that serves every method and must name none: the package outside the method folders (the
# registry aside: it is the one table naming them), the compile benchmark, the tests' method table and
# golden runs, and the cross-method tests that iterate the registry.
ITERATES_THE_REGISTRY = [
    *(p for p in SHARED),
    *(p for p in (REPO / "longctx" / "methods").glob("*.py") if p.name != "registry.py"),
    REPO / "benchmarks" / "compile.py",
    REPO / "tests" / "helpers" / "methods.py",
    REPO / "tests" / "helpers" / "golden_runs.py",
]


@pytest.mark.parametrize("path", ITERATES_THE_REGISTRY, ids=lambda p: str(p.relative_to(REPO)))
def test_shared_code_names_no_method(path):
    """Adding a method is its folder, its configs and its registry entry (docs/architecture.md): no
    shared table lists methods by hand."""
    assert method_names_in_code(path, registry.METHODS) == []


def test_the_method_name_check_finds_a_hand_kept_table(tmp_path, monkeypatch):
    path = tmp_path / "table.py"
    path.write_text(
        '"""Docs may cite longctx.methods.a.module."""\n'
        'TABLE = {"a": 1, "formats": "longctx.methods.a.convert", "other": "ab"}\n'
        'PATH = "longctx/methods/a/module.py"\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert method_names_in_code(path, ["a"]) == [
        "table.py:2 a",
        "table.py:2 longctx.methods.a.convert",
        "table.py:3 longctx/methods/a/module.py",
    ]


# A method's notation table (its package docstring) maps the paper's symbols to `file.py:Name` or
# `file.py:Name.attr` in the method's folder, or to `longctx/<path>.py:Name` elsewhere. A path of the
# authors' code (`pytorch/mem_transformer.py`) is no reference: a path's last part never matches alone.
REFERENCE = re.compile(r"(?<![\w/.-])((?:longctx/(?:\w+/)*)?\w+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
TABLE_RULE = re.compile(r"^\|(?:[ :]*-+[ :]*\|)+$", re.MULTILINE)  # the rule under a markdown table's header


def defined_names(body: list[ast.stmt]) -> dict[str, ast.AST | None]:
    """Names a module or class body defines (functions, classes, assignments, annotated fields), each
    with its class node (None for anything else). Imports define nothing here: a reference names the
    file that defines it."""
    names: dict[str, ast.AST | None] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((n.id, None) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def class_attributes(cls: ast.ClassDef) -> dict[str, ast.AST | None]:
    """What `Class.attr` can name: the class body's names and the `self.attr` its methods assign."""
    names = defined_names(cls.body)
    for node in ast.walk(cls):
        target = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        if target and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.setdefault(node.attr, None)
    return names


def resolves(path: Path, dotted: str) -> bool:
    """Whether `dotted` (Name, Name.attr, Class.Nested.attr) is defined in the file at `path`."""
    if not path.is_file():
        return False
    names = defined_names(ast.parse(path.read_text(), filename=str(path)).body)
    *scopes, last = dotted.split(".")
    for part in scopes:
        node = names.get(part)
        if not isinstance(node, ast.ClassDef):
            return False
        names = class_attributes(node)
    return last in names


def notation_problems(package: Path) -> list[str]:
    """What is wrong with a method package's notation table: no table, or references that name no
    file or no definition in it."""
    init = package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(), filename=str(init))) or ""
    references = REFERENCE.findall(doc)
    if not TABLE_RULE.search(doc) or not references:
        return [f"{init.relative_to(REPO)}: no notation table of `file.py:Name` references"]
    return [
        f"{init.relative_to(REPO)}: {file}:{dotted} is not defined there"
        for file, dotted in references
        if not resolves(REPO / file if "/" in file else package / file, dotted)
    ]


@pytest.mark.parametrize("method", sorted(registry.METHODS))
def test_every_method_maps_its_papers_symbols_to_code_that_exists(method):
    """Each method's `__init__.py` holds its notation table (docs/architecture.md, "Adding a method"),
    and every `file.py:Name` in it is defined in that file (a rename that forgets the table fails)."""
    assert notation_problems(REPO / "longctx" / "methods" / method) == []


def test_the_notation_check_finds_a_missing_table_and_a_stale_reference(tmp_path, monkeypatch):
    package = tmp_path / "longctx" / "methods" / "m"
    package.mkdir(parents=True)
    (tmp_path / "longctx" / "core").mkdir(parents=True)
    (tmp_path / "longctx" / "core" / "flops.py").write_text("def count():\n    pass\n")
    (package / "network.py").write_text(
        "class Net:\n    size = 1\n\n    def __init__(self):\n        self.S, self.R = 1, 2\n\n"
        "def mask():\n    pass\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (package / "__init__.py").write_text('"""Method m (Someone 2020, §2). See network.py:Net."""\n')
    assert notation_problems(package) == [
        "longctx/methods/m/__init__.py: no notation table of `file.py:Name` references"
    ]
    table = (
        "| symbol | longctx |\n|--------|---------|\n"
        "| S, R | network.py:Net.S, network.py:Net.R, network.py:Net.size |\n"
        "| m_z | network.py:mask, longctx/core/flops.py:count (code: pytorch/mem_transformer.py:Net.x) |\n"
        "| z | network.py:Net.z, network.py:masks, memory.py:Net, longctx/core/flops.py:mask |\n"
    )
    (package / "__init__.py").write_text(f'"""Method m.\n\n{table}"""\n')
    assert notation_problems(package) == [
        "longctx/methods/m/__init__.py: network.py:Net.z is not defined there",
        "longctx/methods/m/__init__.py: network.py:masks is not defined there",
        "longctx/methods/m/__init__.py: memory.py:Net is not defined there",
        "longctx/methods/m/__init__.py: longctx/core/flops.py:mask is not defined there",
    ]


# Module-level names that several methods define on purpose: the FLOPs convention of every method and
# the protocol `longctx.commands.convert` calls on a method's `convert.py`. Any other name defined
# in two method folders is renamed (docs/architecture.md, "Adding a method").
SHARED_PROTOCOL_NAMES = {
    "flops_per_token",
    "macs_per_token",
    "MODEL_CLASS",
    "ARCH_KEYS",
    "architecture",
    "configured",
    "read_vocab",
    "convert",
}


def colliding_names(methods_root: Path) -> dict[str, list[str]]:
    """{name: files} for module-level names defined in two or more method folders, protocol aside."""
    where: dict[str, set[str]] = {}
    for path in sorted(methods_root.glob("*/*.py")):
        for name in defined_names(ast.parse(path.read_text(), filename=str(path)).body):
            where.setdefault(name, set()).add(str(path.relative_to(methods_root)))
    return {
        name: sorted(files)
        for name, files in sorted(where.items())
        if len({f.split("/")[0] for f in files}) > 1 and name not in SHARED_PROTOCOL_NAMES
    }


def test_no_two_methods_define_the_same_module_level_name():
    assert colliding_names(REPO / "longctx" / "methods") == {}


def test_the_collision_check_finds_a_name_two_methods_define(tmp_path):
    for folder, source in (("a", "def empty_memory():\n    pass\n"), ("b", "empty_memory = None\nX = 1\n")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "memory.py").write_text(source + "def flops_per_token():\n    pass\n")
    (tmp_path / "b" / "network.py").write_text("X = 2\n")  # one method's own repeat is not a collision
    assert colliding_names(tmp_path) == {"empty_memory": ["a/memory.py", "b/memory.py"]}
