"""A griffe extension for the documentation site: elsewhere's docstrings, read as Markdown.

The docstrings are written for ``help()`` and for readers of the source, in a light reST:
roles (``:class:`~elsewhere.Job```), literal blocks after ``::``, doctest lines, simple
tables framed by ``====`` rules, and ``#:`` comments above class attributes. mkdocstrings reads
Markdown, so before it renders, this extension turns each of those into its Markdown form
(roles into code spans, ``::`` blocks and doctests into fenced code, simple tables into pipe
tables) and gives an attribute without a docstring the text of its ``#:`` comment. The source
stays as it is. Loaded by mkdocs.yml (``extensions:`` of the python handler).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj|const|term|ref):`~?([^`]+)`")
_RULE = re.compile(r"^ *=+( +=+)+ *$")


def _role(match: re.Match[str]) -> str:
    target = match.group(1)
    if "<" in target and target.endswith(">"):  # :ref:`text <target>`
        return f"`{target.split('<', 1)[0].strip()}`"
    shown = target.rsplit(".", 1)[-1] if match.group(0).split("`")[1].startswith("~") else target
    return f"`{shown}`"


def _cell(text: str) -> str:
    return text.strip().replace("|", "\\|")


def _split_row(line: str, starts: list[int]) -> list[str]:
    """A row's cells at the columns' starts; a cell whose text runs past its column's end
    (as docstrings do, for a long name) ends at the next gap of two spaces instead."""
    cells: list[str] = []
    pos = starts[0]
    for k in range(len(starts)):
        if k + 1 == len(starts):
            cells.append(line[pos:])
            break
        end = starts[k + 1]
        if end <= len(line) and end > pos and line[end - 1] != " ":
            gap = line.find("  ", end)
            end = gap if gap != -1 else len(line)
        cells.append(line[pos:end])
        pos = end
    return cells


def _table(lines: list[str]) -> list[str]:
    """A reST simple table (its lines, rules included) as a Markdown pipe table."""
    rule = lines[0]
    indent = len(rule) - len(rule.lstrip())
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", rule)]
    rows: list[list[str]] = []
    rules_seen = 0
    for line in lines:
        if _RULE.match(line):
            rules_seen += 1
            continue
        if not line.strip():
            continue
        cells = _split_row(line, [s for s, _ in spans])
        if rows and not cells[0].strip():  # a continuation line: its cells join the row above
            rows[-1] = [f"{a} {b.strip()}".strip() for a, b in zip(rows[-1], cells)]
        else:
            rows.append([c.strip() for c in cells])
    has_header = rules_seen >= 3
    header = rows[0] if has_header else [""] * len(spans)
    body = rows[1:] if has_header else rows
    pad = " " * indent
    out = [pad + "| " + " | ".join(_cell(c) for c in header) + " |",
           pad + "|" + "|".join("---" for _ in spans) + "|"]  # fmt: skip
    out += [pad + "| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return ["", *out, ""]


def to_markdown(text: str) -> str:
    """elsewhere's reST-flavoured docstring text as Markdown."""
    text = _ROLE.sub(_role, text)
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _RULE.match(line):  # a simple table: up to the rule that closes it
            j, rules = i + 1, 1
            while j < len(lines):
                if _RULE.match(lines[j]):
                    rules += 1
                    if rules == 3 or (j + 1 < len(lines) and not lines[j + 1].strip()):
                        break
                j += 1
            out += _table(lines[i : j + 1])
            i = j + 1
            continue
        if line.lstrip().startswith(">>> "):  # doctest lines, up to a blank line
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            cut = len(line) - len(line.lstrip())
            out += ["", "```pycon", *[x[cut:] for x in lines[i:j]], "```", ""]
            i = j
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            # "Text::" then an indented literal block: "Text:" and a fenced block
            base = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            k = j
            block: list[str] = []
            while k < len(lines) and (
                not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) > base
            ):
                block.append(lines[k])
                k += 1
            while block and not block[-1].strip():
                block.pop()
            head = line.rstrip()[:-2].rstrip()
            if block:
                cut = min(len(b) - len(b.lstrip()) for b in block if b.strip())
                pad = " " * base
                out += ([head + ":"] if head.strip() else []) + [
                    "", pad + "```text", *[pad + b[cut:] for b in block], pad + "```", ""]  # fmt: skip
                i = k
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _comment_doc(obj: griffe.Object) -> str | None:
    """The ``#:`` comment lines right above an attribute, as its docstring."""
    try:
        lines = obj.lines_collection[obj.filepath]  # type: ignore[index]
    except (KeyError, TypeError, AttributeError):
        return None
    if not obj.lineno:
        return None
    found: list[str] = []
    n = obj.lineno - 2  # 0-based index of the line above
    while n >= 0 and lines[n].strip().startswith("#:"):
        found.insert(0, lines[n].strip()[2:].strip())
        n -= 1
    return " ".join(found) or None


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring of the loaded package as Markdown (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        self._walk(pkg, seen)

    def _walk(self, obj: griffe.Object, seen: set[int]) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if obj.docstring is None and obj.is_attribute:
            text = _comment_doc(obj)
            if text:
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)  # type: ignore[arg-type]
