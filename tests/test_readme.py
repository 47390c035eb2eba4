"""README.md is the front door: short, the two commands first, and every relative link in it and
in docs/ leads to a file that exists (reference text moved to docs/ stays reachable)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 200
# [text](target): the target up to the first space or ")" (a title after a space is not a path)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")
FENCE = re.compile(r"^(```|~~~)")


def markdown_pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(page: Path) -> list[str]:
    """The link targets of ``page`` that point into the repository (not URLs, not in-page
    anchors), outside code blocks, where a bracket pair is code and not a link."""
    targets, in_code = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                continue
            targets.append(target)
    return targets


def test_readme_is_at_most_200_lines_and_starts_with_make_demo_and_make_test():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; reference text belongs in docs/"
    head = "\n".join(lines[:8])
    assert "make demo" in head and "make test" in head


def test_every_command_quantkit_lists_has_a_docs_page_linked_from_the_readme():
    from typer.main import get_command

    from quantkit.cli import app

    linked = {ROOT / target for target in relative_links(README)}
    pages = {path for path in linked if path.parent == ROOT / "docs" / "commands"}
    text = "\n".join(path.read_text(encoding="utf-8") for path in pages)
    for name in get_command(app).commands:
        assert f"quantkit {name}" in text, f"no docs/commands page linked from README.md names `quantkit {name}`"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(page):
    assert relative_links(page) or page != README, "README.md links to no page"
    missing = [
        target
        for target in relative_links(page)
        if not (page.parent / target.split("#")[0]).exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_each_docs_page_starts_with_an_example():
    """A reader sees a command (and what it prints or writes) before the reference text."""
    for page in sorted((ROOT / "docs").rglob("*.md")):
        body = [line for line in page.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert body[0].startswith("# "), page
        assert FENCE.match(body[1].strip()), f"{page.relative_to(ROOT)}: no example right after the title"
