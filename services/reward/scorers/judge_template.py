"""The judge's prompt template: parsed once from the operator's settings, filled with request data by plain
concatenation.

The text of a request (prompt, response, label) is *data*: it is inserted where the template names it and never
read again, so a response holding ``{label}``, ``{response}`` or ``{0.__class__}`` is sent as those characters.
``str.format`` on a template that already holds user text, or on user text itself, would expand them: that is
the injection this module exists to avoid. Only the template (operator settings) may hold placeholders;
``{{`` and ``}}`` write literal braces there.

Placeholders: ``{prompt}``, ``{response}``, ``{label}`` (pointwise), ``{responses}`` and ``{n}`` (group mode),
``{response_a}`` and ``{response_b}`` (pairwise mode).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PLACEHOLDERS = frozenset({"prompt", "response", "label", "responses", "n", "response_a", "response_b"})
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


@dataclass(frozen=True)
class Template:
    """A parsed template: literal text and placeholder names, in order."""

    parts: tuple[tuple[bool, str], ...]  # (is_placeholder, text or name)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(text for is_name, text in self.parts if is_name)

    def render(self, values: Mapping[str, str]) -> str:
        """The template with each placeholder replaced by ``values[name]`` as it is (never re-parsed)."""
        return "".join(values[text] if is_name else text for is_name, text in self.parts)


def parse_template(template: str) -> Template:
    """Parse an operator's template; ``ValueError`` names a brace that is not a known placeholder."""
    parts: list[tuple[bool, str]] = []
    at = 0
    for m in _TOKEN.finditer(template):
        if m.start() > at:
            parts.append((False, template[at:m.start()]))
        token = m.group(0)
        if token in ("{{", "}}"):
            parts.append((False, token[0]))
        elif m.group(1) is not None and m.group(1) in PLACEHOLDERS:
            parts.append((True, m.group(1)))
        else:
            raise ValueError(
                f"template has {token!r} at character {m.start()}, which is not a placeholder; the placeholders are "
                f"{', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))}; write {{{{ and }}}} for literal braces")
        at = m.end()
    if at < len(template):
        parts.append((False, template[at:]))
    return Template(tuple(parts))


def label_text(label: object) -> str:
    """A label as the judge reads it: strings as they are, other JSON values as JSON, None as empty."""
    if label is None:
        return ""
    if isinstance(label, str):
        return label
    return json.dumps(label, ensure_ascii=False)


def numbered_responses(responses: Sequence[str]) -> str:
    """``{responses}`` of group mode: each response in ``<response id="k">`` tags, numbered from 1."""
    return "\n\n".join(f'<response id="{k}">\n{r}\n</response>' for k, r in enumerate(responses, start=1))
