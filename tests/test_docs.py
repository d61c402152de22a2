"""The README and docs/ as a reader meets them: every relative link and image resolves to a file and,
with `#anchor`, to a heading of it (GitHub's anchors); every test a page names exists; the README fits
on a page; its install and test commands are the ones CI (`.ci/run`) runs."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.environment import REPO

README = REPO / "README.md"
MARKDOWN = [
    README,
    REPO / "configs" / "README.md",
    REPO / "benchmarks" / "RESULTS.md",
    *sorted((REPO / "docs").rglob("*.md")),
]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a bash block is not a heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: link text kept, lower case, punctuation but `-` and `_` dropped,
    each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in `path`; a repeated heading's later ones get `-1`, `-2`, ... as on GitHub."""
    seen: Counter[str] = Counter()
    result = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        if match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            anchor = github_anchor(match.group(1))
            result.add(anchor if not seen[anchor] else f"{anchor}-{seen[anchor]}")
            seen[anchor] += 1
    return result


def relative_links(path: Path) -> list[str]:
    """The link and image targets of `path` that point into the repository (no scheme)."""
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        targets += LINK.findall(CODE_SPAN.sub("", line))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_github_anchor_follows_githubs_rules():
    assert github_anchor("5. A sweep (array job)") == "5-a-sweep-array-job"
    assert github_anchor("Your own text: `text_files`") == "your-own-text-text_files"
    assert github_anchor("A worked example: does Transformer-XL's memory carry the passage?") == (
        "a-worked-example-does-transformer-xls-memory-carry-the-passage"
    )


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{path.relative_to(REPO)}: " + "; ".join(broken)


# `tests/x/test_y.py::test_z`, `test_y.py::test_z` (a file name is unique under tests/), or `::test_z`
# (another test of the file named before it on the line).
TEST_REFERENCE = re.compile(r"`((?:tests/)?(?:[\w/]+/)?(test_\w+\.py))?::(\w+)")


def test_every_test_a_page_names_exists():
    """docs/bad_inputs.md names the test of each row: a moved or renamed test must not leave a page
    pointing at nothing."""
    files = list((REPO / "tests").rglob("test_*.py"))
    by_name = {path.name: [p for p in files if p.name == path.name] for path in files}
    missing = []
    for page in MARKDOWN:
        for line in page.read_text(encoding="utf-8").splitlines():
            current: Path | None = None
            for match in TEST_REFERENCE.finditer(line):
                reference, name, test = match.groups()
                if reference:
                    found = [REPO / reference] if "/" in reference else by_name.get(name, [])
                    current = found[0] if len(found) == 1 and found[0].is_file() else None
                if current is None or not re.search(rf"^\s*(async )?def {test}\(", current.read_text(), re.M):
                    missing.append(f"{page.relative_to(REPO)}: {match.group(0)}")
    assert not missing, "no such test: " + "; ".join(missing)


def test_the_readme_fits_on_a_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_ci_installs_and_tests_as_the_readme_says():
    """`.ci/run` installs and tests "exactly as README.md says": each command of the README's Install block
    and both test tiers it names are lines of `.ci/run`."""
    readme = README.read_text(encoding="utf-8")
    ci = {line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()}
    install = readme.split("## Install", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    pip = [line.split("#")[0].strip() for line in install.splitlines() if line.startswith("pip install")]
    assert pip == ["pip install torch==2.13.0", 'pip install -e ".[dev]"']
    assert set(pip) <= ci
    for tier in ("python -m pytest -q", "python -m pytest -q -m slow"):
        assert f"`{tier}`" in readme or f"\n{tier} " in readme
        assert f"{tier} || status=1" in ci
