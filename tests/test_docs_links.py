"""Every reference in the docs resolves inside the repository.

A clone must explain itself: a relative markdown link points at a file of the repo (and, with `#anchor`, at a
heading of it, by GitHub's slug rule), a repo path written in backticks in a user page names a file that exists,
and no file sends the reader to a document the repo does not hold. The journal (`docs/journal/`) is history: its
links are checked, its backticked paths are not (they name files as they were at the commit each entry records).
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The three documents that once lived outside the repository; spelled in pieces so that this file does not
# mention them itself.
OUTSIDE_DOCUMENTS = ("DESIGN" + ".md", "STYLE" + ".md", "RAY" + "_NOTES")

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
REPO_PATH = re.compile(r"^(?:platform|docs|benchmarks|studies|objectives|tasks|tests|examples)/[\w./-]*[\w/]$")


def tracked_files(root: Path = ROOT) -> list[Path]:
    """Files git tracks, plus new files it does not ignore (so the test also sees what is about to be committed)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return sorted({root / line for line in out.splitlines() if line and (root / line).is_file()})


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [p for p in tracked_files(root) if p.suffix == ".md"]


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0]
            elif stripped.startswith(fence * 3):
                fence = None
            continue
        if fence is None:
            yield number, line


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a markdown file offers: its headings' slugs (repeats get -1, -2, ...) and <a id> tags."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """'FILE:LINE: target (why)' for every relative link of one markdown file that does not resolve."""
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        without_code = INLINE_CODE.sub("", line)
        for target in LINK.findall(without_code) + IMAGE.findall(without_code):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not resolved.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where} (no heading with that anchor in {resolved.name})")
    return problems


def missing_paths(path: Path, root: Path = ROOT) -> list[str]:
    """'FILE:LINE: path' for every repo path in backticks that names nothing in the repository."""
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for _, code in INLINE_CODE.findall(line):
            candidate = code.strip().split("::")[0]
            if any(c in candidate for c in "*<>{}…") or not REPO_PATH.match(candidate):
                continue
            if not (root / candidate).exists():
                problems.append(f"{path.relative_to(root)}:{number}: {candidate}")
    return problems


# Copies of study reports: their image links point into the study folder they were written in (`plots/*.png`).
# The journal's logs/ holds the superseded ones.
STUDY_REPORT_COPIES = ("benchmarks/results/", "docs/journal/logs/")


def test_every_relative_link_in_the_docs_resolves_to_a_file_and_heading():
    pages = [md for md in markdown_files() if not md.relative_to(ROOT).as_posix().startswith(STUDY_REPORT_COPIES)
             or md == RESULTS_INDEX]
    problems = [p for md in pages for p in broken_links(md)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_repo_path_named_in_backticks_outside_the_journal_exists():
    pages = [md for md in markdown_files() if "docs/journal/" not in md.relative_to(ROOT).as_posix()]
    problems = [p for md in pages for p in missing_paths(md)]
    assert not problems, "paths that do not exist:\n" + "\n".join(problems)


RESULTS = ROOT / "benchmarks" / "results"
RESULTS_INDEX = RESULTS / "README.md"
CLAIM_PAGES = ("README.md", "docs/results.md", "docs/throughput.md", "docs/statistics.md")
"""The pages whose claims benchmarks/results/README.md maps to the files that back them."""


def indexed_results(index: Path = RESULTS_INDEX) -> set[str]:
    """The files the results index links to, by name (its links into benchmarks/results/ itself)."""
    return {t for t in LINK.findall(index.read_text(encoding="utf-8")) if "/" not in t and "#" not in t}


def cited_results(pages: tuple[str, ...] = CLAIM_PAGES, root: Path = ROOT) -> dict[str, list[str]]:
    """Result file name -> 'PAGE:LINE' of each line of the claim pages that names it (by path, link or name)."""
    names = {p.name for p in (root / "benchmarks" / "results").iterdir() if p.is_file() and p.name != "README.md"}
    found: dict[str, list[str]] = {}
    for page in pages:
        for number, line in enumerate((root / page).read_text(encoding="utf-8").splitlines(), 1):
            for name in re.findall(r"[\w.-]+\.(?:md|json|log|parquet|png)\b", line):
                if name in names:
                    found.setdefault(name, []).append(f"{page}:{number}")
    return found


def test_the_results_index_names_existing_files_and_every_result_the_claim_pages_cite():
    indexed = indexed_results()
    assert len(indexed) > 20, "the index names almost no file: the check would check nothing"
    missing = sorted(n for n in indexed if not (RESULTS / n).is_file())
    assert not missing, f"{RESULTS_INDEX.relative_to(ROOT)} names files that do not exist: {missing}"
    unindexed = {n: where for n, where in cited_results().items() if n not in indexed}
    assert not unindexed, "result files the claim pages cite that benchmarks/results/README.md does not name:\n" + \
        "\n".join(f"{n} ({', '.join(w)})" for n, w in sorted(unindexed.items()))


def test_the_results_index_check_sees_a_cited_file_the_index_leaves_out(tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    for name in ("a.json", "b.log", "README.md"):
        (tmp_path / "benchmarks" / "results" / name).write_text("")
    (tmp_path / "page.md").write_text("Figures in `benchmarks/results/a.json`; the log [b](b.log); c.log is not ours.\n")
    index = tmp_path / "benchmarks" / "results" / "README.md"
    index.write_text("| claim | [a.json](a.json) |\n")
    assert indexed_results(index) == {"a.json"}
    assert cited_results(("page.md",), root=tmp_path) == {"a.json": ["page.md:1"], "b.log": ["page.md:1"]}


def test_no_file_refers_to_a_document_outside_the_repository():
    problems = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for name in OUTSIDE_DOCUMENTS:
                if name in line:
                    problems.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert not problems, "references to documents outside the repo:\n" + "\n".join(problems)


def test_the_checker_catches_a_broken_link_a_broken_anchor_and_a_missing_path(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("# A page\n\n## Its `second` section\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](real.md) and [fine too](real.md#its-second-section) and [here](#page)\n"
        "[gone](missing.md)\n"
        "[wrong anchor](real.md#no-such-heading)\n"
        "`docs/real.md` exists, `docs/nowhere.md` does not\n"
        "```\n[inside a fence](not-checked.md)\n```\n"
        "`[inside code](not-checked.md)` and [the web](https://example.org/x.md)\n"
    )
    links = broken_links(page, root=tmp_path)
    assert links == ["docs/page.md:4: missing.md (no such file)",
                     "docs/page.md:5: real.md#no-such-heading (no heading with that anchor in real.md)"]
    assert missing_paths(page, root=tmp_path) == ["docs/page.md:6: docs/nowhere.md"]


@pytest.mark.parametrize("heading, slug", [
    ("Running on a cluster", "running-on-a-cluster"),
    ("Round 5 (2026-11-24): faster bf16 steps, MLM weight 2", "round-5-2026-11-24-faster-bf16-steps-mlm-weight-2"),
    ("Attention on CPU (`attention_cpu.py`)", "attention-on-cpu-attention_cpupy"),
    ("Train V2: `ray.train.report` waits for the poll", "train-v2-raytrainreport-waits-for-the-poll"),
])
def test_anchors_follow_githubs_slug_rule(heading, slug):
    assert github_slug(heading) == slug
