"""The documentation: every relative link of every Markdown file in the tree resolves (file and anchor), pages in
docs/ link only to pages in docs/ (the site holds nothing else), the README stays a short read, and the site
builds with ``mkdocs build --strict`` (when mkdocs is installed: it is in the dev extra).

Anchors are checked the way each file is read: a link into docs/ must hit a heading by both GitHub's slug
(the pages are read on GitHub too) and Python-Markdown's (the site's), so a heading whose two slugs differ
("A / B" is ``a--b`` on GitHub, ``a-b`` on the site) cannot be linked to by anchor until it is renamed.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 150

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)


def markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted(REPO / p for p in listed if (REPO / p).is_file())


def prose(text: str) -> str:
    """The text with fenced blocks and code spans blanked out (a link there is an example, not a link)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def heading_text(raw: str) -> str:
    text = CODE_SPAN.sub(lambda m: m.group(2), raw)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[*_]{1,3}(\S[^*_]*?)[*_]{1,3}", r"\1", text)


def github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def site_slug(text: str) -> str:
    """Python-Markdown's ``toc`` slugify, which MkDocs uses."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path, slug, dup_sep: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading_text(match.group(2)))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}{dup_sep}{n}")
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    text = prose(path.read_text(encoding="utf-8"))
    in_docs = path.parent == DOCS
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("//"):
            continue  # http:, https:, mailto:
        line = text.count("\n", 0, match.start()) + 1
        where = f"{path.relative_to(REPO)}:{line}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if in_docs and not (dest.is_file() and dest.parent == DOCS and dest.suffix == ".md"):
            problems.append(f"{where}: a docs page may link only to docs/*.md (name a source file as `code`)")
            continue
        if anchor and dest.suffix == ".md":
            wanted = [("GitHub", github_slug, "-")] + ([("the site", site_slug, "_")] if dest.parent == DOCS else [])
            for reader, slug, sep in wanted:
                if anchor not in anchors(dest, slug, sep):
                    problems.append(f"{where}: no heading with anchor #{anchor} as {reader} reads it")
    return problems


def test_every_relative_link_resolves_to_a_file_and_heading():
    files = markdown_files()
    assert REPO / "README.md" in files and len([f for f in files if f.parent == DOCS]) >= 5
    problems = [p for f in files for p in broken_links(f)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_finds_a_missing_file_anchor_and_a_link_out_of_docs(tmp_path, monkeypatch):
    page = DOCS / "concepts.md"
    assert "the-experience-queue" in anchors(page, github_slug, "-") & anchors(page, site_slug, "_")
    assert github_slug("Defaults that differ from Hugging Face / TRL") != site_slug("Defaults that differ from Hugging Face / TRL")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A / B\n\n## Seen `here`\n")
    (docs / "b.md").write_text("[ok](a.md#seen-here) [gone](nope.md) [anchor](a.md#a-b) [out](../x.py)\n"
                               "`[code](nope.md)`\n\n```\n[fenced](nope.md)\n```\n")
    (tmp_path / "x.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "DOCS", docs)
    problems = broken_links(docs / "b.md")
    assert [p.split(": ", 2)[1:] for p in problems] == [
        ["nope.md", "no such file"],
        ["a.md#a-b", "no heading with anchor #a-b as GitHub reads it"],
        ["../x.py", "a docs page may link only to docs/*.md (name a source file as `code`)"],
    ]


def test_the_readme_stays_a_short_read_with_the_commands_ci_and_newcomers_use():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES, "move detail into docs/ and link to it"
    for command in ("make demo", "make test", "fleetrl run"):
        assert command in readme


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra: pip install -e '.[dev]'")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    collect = Collect()
    logger = logging.getLogger("mkdocs")
    logger.addHandler(collect)
    try:
        config = load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
        build(config)
    except Abort as exc:
        pytest.fail(f"mkdocs build --strict: {exc}\n" + "\n".join(collect.messages))
    finally:
        logger.removeHandler(collect)
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "concepts" / "index.html").is_file()
