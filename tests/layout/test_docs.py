"""The docs cite files of this repository that exist, and every relative link in README.md and
docs/*.md reaches a file and, with an anchor, a heading of it: a moved or renamed module, page
or section fails here, not in a reader's hands."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A path into one of this repository's folders (other projects' files are cited by their
# project's name and no such folder, e.g. SGLang's `srt/...`).
TOPS = ("fleetgen", "producer", "workers", "tests", "tools", "bench",
        "docs", "compose")
CITED = re.compile(r"(?<![\w./-])((?:" + "|".join(TOPS) + r")/[\w./-]*\w)")
# docs/simulator.md is left out: it cites llama.cpp's own `tools/server/`, a folder name this
# repository shares.
DOCS = ("README.md", "docs/design.md", "docs/cluster.md", "docs/faults.md",
        "docs/performance.md", "docs/reference.md", "docs/formats.md", "docs/engines.md",
        "docs/report.md", "docs/training.md", "docs/testing.md", "docs/acceptance.md",
        "docs/architecture.md")
PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
# [text](target) and ![alt](target); code (fenced blocks, `spans`) is not a link.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
SPAN = re.compile(r"`[^`\n]*`")


def cited(text: str) -> set[str]:
    return {m.group(1).rstrip(".") for m in CITED.finditer(text)}


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_a_doc_cites_exists(doc: str) -> None:
    paths = cited((ROOT / doc).read_text())
    assert paths  # the scan finds the citations at all
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{doc} cites files that are not in the repository: {missing}"


def test_a_missing_file_is_found() -> None:
    assert cited("see `producer/nowhere.py` and tests/e2e/, not srt/x.py") == \
        {"producer/nowhere.py", "tests/e2e"}


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: Counter[str] = Counter()
    found = set()
    for line in FENCE.sub("", text).splitlines():
        if not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The relative links of `page` that reach no file, or no heading of the file they name."""
    text = page.read_text()
    targets = [m.group(1) for m in LINK.finditer(SPAN.sub("", FENCE.sub("", text)))]
    broken = []
    for target in targets:
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(root.resolve()) or not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target} (no such heading in {file.name})")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_reaches_its_file_and_heading(page: str) -> None:
    assert not broken_links(ROOT / page), f"{page}: broken links {broken_links(ROOT / page)}"


def test_the_pages_link_at_all() -> None:
    # The scan finds links: the README leads to every page of docs/ and shows the report.
    readme = (ROOT / "README.md").read_text()
    linked = {m.group(1).partition("#")[0] for m in LINK.finditer(readme)}
    pages = {p for p in PAGES if p != "README.md"}
    assert pages <= linked, f"the README does not lead to {sorted(pages - linked)}"
    assert "docs/report.png" in linked
    shown = "".join((ROOT / p).read_text() for p in PAGES)
    assert "(live.png)" in shown and "(report.png)" in shown  # both screenshots are shown


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "a.md"
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Every turn (`--turns all`)\n\n## Twice\n"
                                            "## Twice\n```\n# not a heading\n```\n")
    page.write_text("[ok](b.md#every-turn---turns-all) [ok](b.md#twice-1) [ok](#a) "
                    "[web](https://example.com/x) `[code](nowhere.md)`\n# A\n"
                    "[gone](c.md) [no heading](b.md#not-a-heading) [out](../../x.md)\n")
    assert broken_links(page, tmp_path) == ["c.md (no such file)",
                                            "b.md#not-a-heading (no such heading in b.md)",
                                            "../../x.md (no such file)"]
