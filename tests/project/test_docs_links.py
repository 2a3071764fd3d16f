"""Every relative link of README.md, CHANGELOG.md and docs/*.md points at a file of the
repository and, when it names an anchor, at a heading of that file (GitHub's slugs: lower
case, what is not a letter, digit, space, ``-`` or ``_`` dropped, spaces to ``-``,
repeats numbered)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.paths import ROOT

PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    text = re.sub(r"`|\*\*|\*", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    found, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            found += LINK.findall(line)
    return [t for t in found if not re.match(r"^[a-z]+:", t)]  # http:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_slugs_follow_github() -> None:
    # worked by hand from GitHub's rendering of such headings
    assert slug(" The +20 dB calibration") == "the-20-db-calibration"
    assert slug(" Why `omega_policy` exists: Eq. 29 as printed gives Ω = 1") == (
        "why-omega_policy-exists-eq-29-as-printed-gives-ω--1"
    )
    assert slug(" The edge server's aggregation rate") == "the-edge-servers-aggregation-rate"
