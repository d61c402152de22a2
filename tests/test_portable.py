"""The tests run on a stranger's machine: no absolute paths, `../shared` located in one place
(`shared_dir` in tests/helpers/environment.py), subprocesses started with `sys.executable` (read
from the sources' AST)."""

from __future__ import annotations

import ast
import re

import pytest

from tests.helpers.environment import REPO

TESTS = sorted((REPO / "tests").rglob("*.py"))
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}


def bare_python_calls(source: str) -> list[int]:
    """Lines of `subprocess.*([...])` calls whose command list starts with a literal python."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List)):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0].elts[0] if node.args[0].elts else None
        literal = isinstance(first, ast.Constant) and str(first.value).startswith("python")
        if name in SUBPROCESS_CALLS and literal:
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", TESTS, ids=lambda p: str(p.relative_to(REPO / "tests")))
def test_no_absolute_paths_no_own_shared_lookup_no_bare_python(path):
    source = path.read_text()
    assert not re.search(r"""["'](/work|/home|/root|/Users)/""", source), "an absolute path"
    if path.name != "environment.py":
        own_lookup = re.search(r"""(\.parent|\.parents\[\d+\])\s*/\s*["']shared["']""", source)
        assert not own_lookup, "locate ../shared with tests.helpers.environment.shared_dir()"
    assert bare_python_calls(source) == [], "start subprocesses with sys.executable"


def test_the_python_check_tells_a_command_from_an_expected_list():
    calls = 'subprocess.run(["python", "-m", "x"])\nexpected = ["python", "-m", "x"]\nrun([sys.executable])\n'
    assert bare_python_calls(calls) == [1]
