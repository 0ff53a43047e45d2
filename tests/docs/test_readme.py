"""README.md stays a user's guide and the docs stay true to the tree.

- README.md is at most 400 lines;
- every relative link in README.md, ARCHITECTURE.md and docs/*.md names a file that exists,
  and a link ``file.md#anchor`` (or ``#anchor``) a heading that exists there;
- README.md and docs/ carry no dated notebook: no "later the same day" and the like, and a
  date only in the caption of a table (the paragraph right above it: when it was measured);
  README.md has at most one such caption (its performance table). History belongs in
  PERFORMANCE-HISTORY.md;
- the Python snippets of README.md and docs/*.md compile, and every name they use is
  imported or defined (in that snippet or an earlier one of the same page).
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED = [README, ROOT / "ARCHITECTURE.md", *DOCS]  # every link must resolve
CURRENT = [README, *DOCS]  # current facts only: no notebook
MAX_README_LINES = 400

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_TABLE_ROW = re.compile(r"^\s*\|")
# what a lab notebook says and a user's guide does not
NOTEBOOK = [re.compile(p, re.I) for p in (
    r"\b(?:later|earlier) (?:the same|that|in the) day\b",
    r"\bthe day before\b",
    r"\b(?:one|two|three|four|\d+) days? (?:earlier|later|before|after)\b",
    r"\b(?:first|second|third|last) run of the day\b",
    r"\bin a (?:slow|slower|fast|faster|quiet|busier) hour\b",
    r"\b(?:since|until|as of) 20\d\d-\d\d",
    r"\bsuperseded\b",
    r"\bthe (?:code|build) before (?:this|that) (?:work|change)\b",
    r"\bbefore (?:this|that|the) change\b",
)]


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, line in _prose(path.read_text()):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return broken


def notebook_lines(text: str, name: str = "text") -> tuple[list[str], int]:
    """Lines that read like a dated notebook, and how many dated table captions there are.
    A date is allowed only in a caption: the paragraph that ends right above a table."""
    lines = _prose(text)
    found, captions = [], 0
    # paragraphs: runs of consecutive non-blank prose lines
    paragraphs: list[list[tuple[int, str]]] = []
    for number, line in lines:
        if line.strip() and paragraphs and paragraphs[-1][-1][0] == number - 1 and not _TABLE_ROW.match(line) \
                and not _TABLE_ROW.match(paragraphs[-1][-1][1]):
            paragraphs[-1].append((number, line))
        elif line.strip():
            paragraphs.append([(number, line)])
    for i, para in enumerate(paragraphs):
        is_table = _TABLE_ROW.match(para[0][1]) is not None
        next_is_table = i + 1 < len(paragraphs) and _TABLE_ROW.match(paragraphs[i + 1][0][1]) is not None
        dated = [(n, line) for n, line in para if _DATE.search(line)]
        if dated and not is_table and next_is_table:
            captions += 1
        elif dated:
            found += [f"{name}:{n}: a date outside a table's caption: {line.strip()}" for n, line in dated]
        for n, line in para:
            for pattern in NOTEBOOK:
                if pattern.search(line):
                    found.append(f"{name}:{n}: notebook phrase {pattern.pattern!r}: {line.strip()}")
    return found, captions


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if current is None and re.match(r"^```\s*(python|py)\s*$", stripped):
            current, start = [], number + 1
        elif current is not None and stripped.startswith("```"):
            blocks.append((start, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def _bound(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def snippet_problems(text: str, name: str = "text") -> list[str]:
    problems, known = [], set(dir(builtins))
    for start, source in python_blocks(text):
        try:
            tree = ast.parse(compile(source, f"{name}:{start}", "exec", ast.PyCF_ONLY_AST))
        except SyntaxError as exc:
            problems.append(f"{name}:{start + (exc.lineno or 1) - 1}: does not compile: {exc.msg}")
            continue
        known |= _bound(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in known:
                problems.append(f"{name}:{start + node.lineno - 1}: {node.id!r} is never imported or defined")
    return problems


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move depth to docs/"


def test_docs_exist_and_say_what_they_are_for():
    assert DOCS, "docs/ has no pages"
    for page in DOCS:
        body = [line for _, line in _prose(page.read_text()) if line.strip() and not line.startswith("#")]
        assert body and "for" in body[0].lower(), f"{page.relative_to(ROOT)} should start with what it is for"


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", CURRENT, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_notebook(path):
    found, captions = notebook_lines(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], "history belongs in PERFORMANCE-HISTORY.md:\n" + "\n".join(found)
    if path == README:
        assert captions <= 1, "README.md: one dated table at most (its performance table)"


@pytest.mark.parametrize("path", CURRENT, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_snippets_compile_and_define_their_names(path):
    assert snippet_problems(path.read_text(), str(path.relative_to(ROOT))) == []


# the checks themselves: they must catch what the old README had

OLD_README = """\
## Performance

**Beside vLLM CPU on an AVX2-only CPU** (an AMD EPYC without AVX-512, 2 cores, shared,
2026-12-06; vLLM 0.32 CPU started as "Beside a peer" below says).

The latest rows (2026-12-07, later in the day), one run per row:

| workload | radixmesh out tok/s |
|---|---|
| decode, batch 1 | 53.6 |

Earlier the same day (before those two changes, the same commands): 1.67 / 1.55x.
Later the same day the C++ backend began storing a step's new K and V rows in one call.
the thread chooser's change (see *Threads*), in a slower hour (vLLM's own figures 4-29%
below the table's). Two days earlier the same comparison stood at 0.77 / 0.78x.
"""


def test_the_notebook_check_catches_the_old_readme():
    found, captions = notebook_lines(OLD_README, "old")
    text = "\n".join(found)
    assert "old:4:" in text  # a dated paragraph that is not a table's caption
    assert all(f"old:{n}:" in text for n in (12, 13, 14, 15))
    assert captions == 1  # "The latest rows (2026-12-07, ...)" sits right above its table
    assert "later in the day" in text


def test_the_notebook_check_passes_a_caption():
    text = "Measured on a 2-core AMD EPYC, 2026-12-07:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert notebook_lines(text) == ([], 1)


def test_the_snippet_check_catches_a_missing_import():
    text = "```python\nreply = '{}'\njson.loads(reply)\n```\n"
    assert snippet_problems(text) == ["text:3: 'json' is never imported or defined"]
    text = "```python\nwith rl.Runtime('http://x') as rt:\n    f(document=text)\n```\n"
    assert {p.split("'")[1] for p in snippet_problems(text)} == {"rl", "f", "text"}
    assert snippet_problems("```python\nimport json\n```\n\n```python\njson.loads('1')\n```\n") == []
    assert "does not compile" in snippet_problems("```python\nprint(\n```\n")[0]


def test_the_link_check_resolves_anchors():
    assert "run-it" in anchors(README)
    assert _slug("Prefill and decode: `--kv-transfer`") == "prefill-and-decode---kv-transfer"
