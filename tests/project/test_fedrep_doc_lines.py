"""docs/extending.md's worked FedRep port names the lines of
examples/fedrep/mecsim_fedrep/__init__.py that make each choice point: each cited line
still holds what the page says it does (an edit of the module that moves them fails
here, naming the line to update in the page)."""

from __future__ import annotations

import re

from support.paths import ROOT

MODULE = ROOT / "examples" / "fedrep" / "mecsim_fedrep" / "__init__.py"
DOC = ROOT / "docs" / "extending.md"

#: line cited in the page -> what that line of the module holds
CITED = {
    38: "**BatchNorm statistics**",
    117: "def head_mask(",
    129: "layout.layer_names",
    168: "static_attributes",
    209: "def configure_fit(",
    213: "def upload_size(",
    269: "ctx.state.get(self.STATE_KEY)",
    282: "p.requires_grad_(",
    296: "finally:",
    306: '"fedrep/head"',
    307: '"fedrep/body"',
    310: "ctx.state[self.STATE_KEY] = ",
    311: "flat[~mask]",
}


def _section() -> str:
    text = DOC.read_text()
    start = text.index("### A worked port: FedRep")
    return text[start : text.index("\n### ", start + 1)]


def test_every_cited_line_holds_what_the_page_says() -> None:
    lines = MODULE.read_text().splitlines()
    wrong = {n: lines[n - 1].strip() for n, want in CITED.items() if want not in lines[n - 1]}
    assert not wrong, f"docs/extending.md's FedRep lines moved: {wrong}"


def test_the_page_cites_exactly_these_lines() -> None:
    cited: set[int] = set()
    for a, b in re.findall(r"lines?\s+(\d+)(?:-(\d+))?", _section()):
        cited |= set(range(int(a), int(b or a) + 1))
    assert cited == set(CITED), sorted(cited ^ set(CITED))
