"""The prose states no ordering and no result that the page did not compute.

Two static checks on every chapter's Markdown cells, sentence by sentence (code spans, display
maths, code fences and directive options are removed first; inline maths is kept):

1. **Orderings and ties are glued verdicts.** A sentence that uses a comparison word of
   :data:`LEXICON` must be *backed*:

   * ``verdict`` words (ahead, behind, tied, outperforms, better than, ...) by a glued name
     that is a computed verdict: one whose check in ``tests/expected/<chapter>.yaml`` has
     ``equals:`` (a verdict word from ``nnk_book.verdict`` or a computed boolean), or whose
     name says it is one (``*_verdict``, ``*_verdicts``, ``*_word``: a sentence or word built from
     ``nnk_book.verdict`` / an interval rule by the chapter's code);
   * ``measured`` words (faster than, reproduces, matches, ...) by any glued name that has a
     check in the expected file (a speed ratio with a ``min:``, an agreement with a ``max:``);
   * either kind by a ``{cite}`` in the same sentence (the paper's own claim, quoted as such);
   * or by an entry of ``tests/prose_allowlist.yaml`` (chapter, a unique fragment of the
     sentence, and the reason: a mathematical statement, a definition, a question to the
     reader).

2. **No typed result.** A number with a decimal point, or a ``±``, in a sentence must be
   inside a ``{glue:...}`` role, or the sentence must carry a ``{cite}`` (a paper's value),
   or the number must be a reference (Section 3.2, Table 1, eq. 4.1, a version), or the
   sentence must be allow-listed with a reason (a constant of a derivation, a setting).

Sentences in chapters that other engineers are fixing in this round are listed under
``pending:`` in the allowlist (reason "owned by the ch2/ch5/ch6-7 fix"); they are expected to
fail and are reported as xfail until the lead reconciles them. The rule itself is never
relaxed for them.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

import run_chapters

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = ROOT / "tests" / "expected"
ALLOWLIST = ROOT / "tests" / "prose_allowlist.yaml"
NOTEBOOKS = sorted(run_chapters.CHAPTERS.glob("*.ipynb"))

#: Comparison words: (kind, pattern). "verdict" words assert an ordering or a tie between
#: methods; "measured" words assert a measured relation (speed, agreement, reproduction).
LEXICON: list[tuple[str, str]] = [
    ("verdict", r"\bahead\b"),
    ("verdict", r"\bbehind\b"),
    ("verdict", r"\btied\b"),
    ("verdict", r"\bties\b"),
    ("verdict", r"\btie\b"),
    ("verdict", r"\bseparate(s)?\b[^.]{0,30}\b(more|less)\b"),  # "methods separate more before fine-tuning than after"
    ("verdict", r"\boutperform(s|ed|ing)?\b"),
    ("verdict", r"\bbeats?\b"),
    ("verdict", r"\bbetter than\b"),
    ("verdict", r"\bworse than\b"),
    ("verdict", r"\bat least as (good|well|accurate)\b"),
    ("verdict", r"\bcloser than\b"),
    ("verdict", r"\blower (error|loss|perplexity)\b"),
    ("verdict", r"\bhigher (accuracy|score)\b"),
    ("verdict", r"\bmore accurate than\b"),
    ("verdict", r"\bless accurate than\b"),
    ("measured", r"\bfaster than\b"),
    ("measured", r"\bslower than\b"),
    ("measured", r"\breproduc(es|ed)\b"),
    ("measured", r"\bmatch(es|ed)\b"),
]

GLUE = re.compile(r"\{glue(?::text|:md|:figure|:math)?\}`([A-Za-z0-9_]+)(?::[^`]*)?`")
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`")
DECIMAL = re.compile(r"(?<![\w.])[-−+]?\d+\.\d+(?![\w.])|(?<=\d)\s*±|±(?!\s*95\s*%)(?=\s*\d)")  # "mean ± 95 % interval" names a format
# A number that names a place or a version rather than a result.
REFERENCE = re.compile(
    r"(Sec(tion)?s?\.?|Table|Tab\.|Fig(ure)?\.?|[Ee]q(uation)?s?\.?|Appendix|Theorem|Remark|Proposition|"
    r"Lemma|Algorithm|Definition|Corollary|Assumption|version|v)\s*\(?$")


def expected_checks(chapter: str) -> dict:
    path = EXPECTED / f"{chapter}.yaml"
    return (yaml.safe_load(path.read_text()) or {}).get("checks") or {} if path.exists() else {}


def prose(markdown: str) -> str:
    """The Markdown of a cell without what is not prose: code fences, display maths, directive
    options, labels, HTML comments and code spans."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S) if markdown.count("```") % 2 == 0 else markdown
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"^:[a-z-]+:.*$", " ", text, flags=re.M)  # directive options
    text = re.sub(r"^\([\w-]+\)=\s*$", " ", text, flags=re.M)  # labels
    roles: list[str] = []

    def keep(m: re.Match) -> str:
        roles.append(m.group())
        return f"\x00{len(roles) - 1}\x00"

    text = re.sub(r"\{[\w:-]+\}`[^`]*`", keep, text)  # roles ({glue:text}`name`, {cite}`key`) are kept
    text = re.sub(r"`[^`]*`", "``", text)  # code spans are not prose
    return re.sub(r"\x00(\d+)\x00", lambda m: roles[int(m.group(1))], text)


def sentences(text: str) -> list[str]:
    """Split prose into sentences (and list items): at '.', '!', '?' or ':' followed by white space
    and a capital or an opening role/bracket, and at blank lines and list bullets."""
    out = []
    for block in re.split(r"\n\s*\n|\n\s*[*-] |\n\s*\d+\. ", text):
        block = " ".join(block.split())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*({\[])", block) if s.strip()]
    return out


def load_allowlist() -> tuple[list[dict], list[dict]]:
    data = yaml.safe_load(ALLOWLIST.read_text()) or {}
    return data.get("allow") or [], data.get("pending") or []


def _allowed(entries: list[dict], chapter: str, rule: str, sentence: str) -> dict | None:
    for e in entries:
        if e["chapter"] == chapter and e["rule"] in (rule, "both") and e["fragment"] in sentence:
            return e
    return None


def is_verdict_glue(name: str, checks: dict) -> bool:
    spec = checks.get(name) or {}
    return "equals" in spec or name.endswith(("_verdict", "_verdicts", "_word"))


def ordering_problems(chapter: str, markdown_cells: list[str], checks: dict) -> list[str]:
    """Sentences that use a comparison word without a glued verdict, a citation or a checked glue."""
    problems = []
    for source in markdown_cells:
        for sentence in sentences(prose(source)):
            bare = GLUE.sub(" ", sentence)  # a comparison word inside a glue format string does not count
            kinds = {kind for kind, pattern in LEXICON if re.search(pattern, bare, re.I)}
            if not kinds or CITE.search(sentence):
                continue
            glued = GLUE.findall(sentence)
            if "verdict" in kinds and not any(is_verdict_glue(n, checks) for n in glued):
                problems.append(sentence)
            elif kinds == {"measured"} and not any(n in checks for n in glued):
                problems.append(sentence)
    return problems


def typed_number_problems(chapter: str, markdown_cells: list[str]) -> list[str]:
    """Sentences with a decimal number or a ± outside a glue role, without a citation."""
    problems = []
    for source in markdown_cells:
        for sentence in sentences(prose(source)):
            if CITE.search(sentence):
                continue
            bare = GLUE.sub("<glued>", sentence)
            for m in DECIMAL.finditer(bare):
                if m.group() != "±" and REFERENCE.search(bare[: m.start()].rstrip()[-14:] + ""):
                    continue
                if "±" in m.group() and "<glued>" in bare[max(0, m.start() - 12): m.end() + 12]:
                    continue  # "{glue} ± {glue}": a glued interval
                problems.append(sentence)
                break
    return problems


def _markdown(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "markdown"]


def _check(rule: str, path: Path) -> None:
    chapter = path.stem
    allow, pending = load_allowlist()
    cells = _markdown(path)
    found = (ordering_problems(chapter, cells, expected_checks(chapter)) if rule == "ordering"
             else typed_number_problems(chapter, cells))
    failing, pending_hits = [], []
    for sentence in found:
        if _allowed(allow, chapter, rule, sentence):
            continue
        (pending_hits if _allowed(pending, chapter, rule, sentence) else failing).append(sentence)
    assert not failing, (
        f"{path.name}: {len(failing)} sentence(s) break the {rule} rule (glue a computed verdict or result, "
        f"cite the paper, or allow-list with a reason in tests/prose_allowlist.yaml):\n  - "
        + "\n  - ".join(s[:300] for s in failing))
    if pending_hits:
        pytest.xfail(f"{len(pending_hits)} sentence(s) pending: owned by the ch2/ch5/ch6-7 fix")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_orderings_in_prose_are_glued_verdicts(path: Path) -> None:
    _check("ordering", path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_typed_results_in_prose(path: Path) -> None:
    _check("typed", path)


def test_allowlist_entries_are_reasoned_and_still_needed() -> None:
    allow, pending = load_allowlist()
    for e in allow + pending:
        assert set(e) == {"chapter", "rule", "fragment", "reason"}, e
        assert e["rule"] in ("ordering", "typed", "both"), e
        assert len(e["reason"]) > 10, f"{e}: say why the sentence may stand"
    for e in pending:
        assert e["reason"].startswith("owned by the ch2/ch5/ch6-7 fix"), e
    # every entry still matches exactly one flagged sentence (no stale or ambiguous entries)
    flagged = {}
    for path in NOTEBOOKS:
        cells = _markdown(path)
        flagged[(path.stem, "ordering")] = ordering_problems(path.stem, cells, expected_checks(path.stem))
        flagged[(path.stem, "typed")] = typed_number_problems(path.stem, cells)
    for e in allow + pending:
        rules = ("ordering", "typed") if e["rule"] == "both" else (e["rule"],)
        hits = [s for r in rules for s in flagged.get((e["chapter"], r), []) if e["fragment"] in s]
        assert hits, f"allowlist entry matches no flagged sentence (stale): {e}"


# --- the rules themselves, on hand-made prose ------------------------------------------------

CHECKS = {"x_word": {"equals": "tied"}, "x_speedup": {"min": 1.5}, "x_acc": {"min": 0.5}}


@pytest.mark.parametrize("text,flagged", [
    ("Method A is ahead of method B.", True),
    ("Method A ({glue:text}`x_acc:.3f`) is ahead of method B.", True),  # a glued number is no verdict
    ("Method A and method B are {glue:text}`x_word`.", False),
    ("Method A is tied with B: {glue:text}`x_word`.", False),
    ("The paper finds A ahead of B {cite}`paper2024`.", False),
    ("It is 3x faster than the dense layer.", True),
    ("It is {glue:text}`x_speedup:.1f` times faster than the dense layer.", False),
    ("Its error falls with m, and the ratio converges.", False),
    ("A sentence without any comparison. Then LookupFFN beats VanillaFFN.", True),
    ("So many methods tie here.", True),
    ("The methods separate much more before fine-tuning than after it.", True),
    ("The methods separate {glue:text}`x_word` before fine-tuning than after it.", False),
    ("The two intervals separate at m = 8.", False),
])
def test_ordering_rule_on_examples(text: str, flagged: bool) -> None:
    assert bool(ordering_problems("x", [text], CHECKS)) == flagged


@pytest.mark.parametrize("text,flagged", [
    ("The error is 0.303 at m = 250.", True),
    ("The error is {glue:text}`x_acc:.3f` at m = 250.", False),
    ("The accuracy is {glue:text}`x_acc:.3f` ± {glue:text}`x_acc:.3f`.", False),
    ("The accuracy is 0.84 ± 0.02 here.", True),
    ("The accuracy is 84 ± 2 % here.", True),
    ("What the numbers say (mean ± 95 % interval over seeds).", False),
    ("The paper reports 24.67 {cite}`moreno2023ski`.", False),
    ("Section 3.2.2 derives it, and Table 1 lists it (Sec. 3.2).", False),
    ("We use `lr = 0.03` in code.", False),
    ("It dips to about $-0.06$ of its peak.", True),
    ("$$x = 0.5$$ is display maths.", False),
])
def test_typed_number_rule_on_examples(text: str, flagged: bool) -> None:
    assert bool(typed_number_problems("x", [text])) == flagged
