"""Tests for the long-sequence data of chapter 4: ListOps, bracket tasks, char corpus, fetchers.

Fetchers are tested offline on the tiny archives in ``tests/fixtures`` (made by
``tests/fixtures/make_fixtures.py``) through ``file://`` URLs; the unreachable-server case
uses a closed port on the loopback interface, never an outside address.
"""

from __future__ import annotations

import re
import shutil
import statistics
from pathlib import Path

import pytest
import torch

from data_scripts import fetch, listops, long_range
from data_scripts.char_corpus import (
    UNKNOWN_CHAR,
    CharVocab,
    build_vocab,
    char_corpus_info,
    load_char_corpus,
    lm_blocks,
    normalise_text,
    random_lm_batch,
    split_text,
)
from data_scripts.fetch import (
    ChecksumError,
    DatasetUnavailableError,
    UnsafeArchiveError,
    cache_dir,
    download,
    extract,
    sha256sum,
)
from data_scripts.listops import (
    LISTOPS_VOCAB,
    PAD_ID,
    decode_listops,
    encode_listops,
    evaluate_listops,
    generate_listops,
    read_listops_tsv,
    to_lra_source,
    write_listops_tsv,
)
from data_scripts.long_range import (
    BRACKET_VOCAB,
    CLOSE_ID,
    OPEN_ID,
    QUERY_ID,
    bracket_heights,
    generate_bracket_balance,
    generate_bracket_query,
    height_at_query,
    is_balanced,
    vocab_size,
)
from data_scripts.lra import find_lra_folder, load_lra_listops
from data_scripts.wikitext import load_wikitext103_chars

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LRA_FIXTURE = FIXTURES / "lra_release_tiny.gz"
WIKI_FIXTURE = FIXTURES / "wikitext-103-raw-v1_tiny.zip"
CLOSED_PORT_URL = "http://127.0.0.1:9/lra_release.gz"  # discard port: nothing listens there


# ============================================================================ ListOps
@pytest.mark.parametrize(
    "expression, value",
    [
        ("[MAX 2 9 ]", 9),
        ("[MIN 4 7 ]", 4),
        ("[MIN 4 7 [MAX 1 3 ] ]", 3),
        ("[MED 3 1 2 ]", 2),  # odd count: the middle value
        ("[MED 1 8 2 9 ]", 5),  # even count: (2 + 8) / 2
        ("[MED 5 6 ]", 5),  # 5.5 floored, like int(np.median)
        ("[MED 0 9 9 0 ]", 4),  # 4.5 floored
        ("[SM 7 8 ]", 5),  # 15 mod 10
        ("[SM 7 8 [SM 9 9 ] ]", 3),  # 7 + 8 + 8 = 23
        ("[MAX 2 [MIN 4 7 ] 0 ]", 4),
        ("[SM [MAX 1 [MED 2 3 4 ] ] [MIN 9 [SM 5 5 ] 7 ] 6 ]", 9),  # 3 + 0 + 6
        ("7", 7),
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # LRA's parenthesised form
    ],
)
def test_evaluator_on_hand_written_expressions(expression, value):
    assert evaluate_listops(expression) == value


@pytest.mark.parametrize(
    "expression, message",
    [
        ("", "empty"),
        ("[MAX 2 9", "open"),
        ("[MAX 2 9 ] ]", "never opened"),
        ("[MAX ]", "no arguments"),
        ("[MAX 2 ] 3", "more than one top-level value"),
        ("[MAX 2 ] [MIN 3 ]", "continues after"),
        ("[MAX 2 12 ]", "unknown token '12'"),
        ("[FIRST 2 3 ]", "unknown token"),
    ],
)
def test_evaluator_rejects_malformed_expressions(expression, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        evaluate_listops(expression)


def test_lra_source_format_round_trip():
    # Format of LRA's lra_benchmarks/data/listops.py: one "( ... )" per application.
    assert to_lra_source("[MAX 2 9 ]") == "( ( ( [MAX 2 ) 9 ) ] )"
    assert to_lra_source("[MAX 2 [MIN 4 7 ] 0 ]") == (
        "( ( ( ( [MAX 2 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )"
    )
    expr = "[SM [MAX 1 [MED 2 3 4 ] ] [MIN 9 [SM 5 5 ] 7 ] 6 ]"
    src = to_lra_source(expr)
    assert src.count("(") == src.count(")")
    assert " ".join(listops.tokenize_listops(src)) == expr
    assert evaluate_listops(src) == evaluate_listops(expr)
    ids = encode_listops(src)
    assert decode_listops(ids) == expr
    assert LISTOPS_VOCAB[PAD_ID] == "<pad>" and len(LISTOPS_VOCAB) == 16


def test_generator_is_deterministic_and_labels_are_values():
    kwargs = dict(min_length=40, max_length=120, max_depth=6, max_args=5, seed=3)
    tokens, lengths, labels, strings = generate_listops(200, return_strings=True, **kwargs)
    tokens2, lengths2, labels2 = generate_listops(200, **kwargs)
    assert torch.equal(tokens, tokens2) and torch.equal(lengths, lengths2)
    assert torch.equal(labels, labels2)
    other, _, _ = generate_listops(200, **{**kwargs, "seed": 4})
    assert not torch.equal(tokens, other)

    assert tokens.shape == (200, 120) and tokens.dtype == torch.int64
    assert lengths.dtype == torch.int64 and labels.dtype == torch.int64
    assert int(lengths.min()) >= 40 and int(lengths.max()) <= 120
    assert len(set(strings)) == 200  # distinct expressions
    for row, n, label, s in zip(tokens, lengths.tolist(), labels.tolist(), strings):
        assert (row[n:] == PAD_ID).all() and (row[:n] != PAD_ID).all()
        assert decode_listops(row) == s
        assert evaluate_listops(s) == label
        assert s.startswith("[")  # the root is an operator
        # max_depth bounds the nesting of brackets.
        depth = max_depth = 0
        for tok in s.split():
            depth += tok.startswith("[") - (tok == "]")
            max_depth = max(max_depth, depth)
        assert max_depth <= 6


def test_generator_label_distribution_is_not_degenerate():
    _, _, labels = generate_listops(600, min_length=100, max_length=300, seed=0)
    counts = torch.bincount(labels, minlength=10)
    assert int((counts > 0).sum()) == 10
    assert int(counts.max()) < 0.3 * 600


def test_generator_bad_arguments_name_the_argument():
    ok = dict(min_length=10, max_length=50, seed=0)
    for kwargs, exc, name in [
        ({"n_samples": 0}, ValueError, "n_samples"),
        ({"n_samples": 2.0}, TypeError, "n_samples"),
        ({"min_length": 60}, ValueError, "min_length"),
        ({"max_length": 3}, ValueError, "max_length"),
        ({"max_depth": 1}, ValueError, "max_depth"),
        ({"max_args": 1}, ValueError, "max_args"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": True}, TypeError, "seed"),
        ({"return_strings": 1}, TypeError, "return_strings"),
    ]:
        args = {"n_samples": 4, **ok, **kwargs}
        with pytest.raises(exc, match=name):
            generate_listops(args.pop("n_samples"), **args)
    with pytest.raises(RuntimeError, match="widen the length window"):
        generate_listops(5, min_length=1000, max_length=1100, max_depth=3, max_args=3, seed=0,
                         max_attempts=200)


def test_read_lra_tsv_fixture():
    tokens, lengths, labels = read_listops_tsv(FIXTURES / "listops_sample.tsv", check_labels=True)
    assert tokens.shape == (6, int(lengths.max()))
    assert labels.tolist() == [9, 3, 5, 5, 3, 4]
    assert decode_listops(tokens[0]) == "[MAX 2 9 ]"
    assert decode_listops(tokens[1]) == "[MIN 4 7 [MAX 1 3 ] ]"
    padded, _, _ = read_listops_tsv(FIXTURES / "listops_sample.tsv", max_length=64, limit=2)
    assert padded.shape == (2, 64)
    with pytest.raises(ValueError, match="max_length=5"):
        read_listops_tsv(FIXTURES / "listops_sample.tsv", max_length=5)


def test_read_tsv_round_trips_generated_data_and_reports_bad_lines(tmp_path):
    _, _, labels, strings = generate_listops(20, min_length=10, max_length=60, max_depth=5, seed=1,
                                             return_strings=True)
    path = tmp_path / "basic_test.tsv"
    write_listops_tsv(path, strings)
    tokens, lengths, read_labels = read_listops_tsv(path, max_length=60, check_labels=True)
    assert torch.equal(read_labels, labels)
    assert [decode_listops(t) for t in tokens] == strings

    bad = tmp_path / "bad.tsv"
    bad.write_text("Source\tTarget\n( ( [MAX 2 ) ] )\t2\n( ( [MAX 2 ) ] )\t7\n")
    with pytest.raises(ValueError, match="line 3: Target is 7 but the expression evaluates to 2"):
        read_listops_tsv(bad, check_labels=True)
    bad.write_text("Source\tTarget\n( ( [MAX 2 ) x ] )\t2\n")
    with pytest.raises(ValueError, match="line 2: .*unknown token 'x'"):
        read_listops_tsv(bad)
    bad.write_text("src\ttgt\n")
    with pytest.raises(ValueError, match="header"):
        read_listops_tsv(bad)
    with pytest.raises(FileNotFoundError):
        read_listops_tsv(tmp_path / "missing.tsv")


# ====================================================================== bracket tasks
def _height_before_marker(tokens: torch.Tensor) -> int:
    """Independent count: walk the decoded string up to the '?'."""
    text = long_range.decode_brackets(tokens)
    prefix = text[: text.index("?")]
    return prefix.count("(") - prefix.count(")")


@pytest.mark.parametrize("filler_fraction", [0.0, 0.3])
def test_bracket_query_labels_match_an_independent_count(filler_fraction):
    tokens, labels = generate_bracket_query(150, length=256, seed=7,
                                            filler_fraction=filler_fraction)
    assert tokens.shape == (150, 256)
    assert tokens.dtype == torch.int64 and labels.dtype == torch.int64
    assert int(labels.sum()) == 75  # exactly balanced classes
    assert torch.equal((tokens == QUERY_ID).sum(1), torch.ones(150, dtype=torch.int64))
    heights = [_height_before_marker(row) for row in tokens]
    assert all(h != 0 for h in heights)
    assert [int(h > 0) for h in heights] == labels.tolist()
    assert torch.equal(height_at_query(tokens), torch.tensor(heights))
    assert int(tokens.min()) >= 1 and int(tokens.max()) < vocab_size(8)
    if filler_fraction == 0.0:  # only a leftover slot or two can be a filler
        assert int((tokens >= 4).sum(1).max()) <= 2


def test_bracket_query_is_long_range():
    tokens, labels = generate_bracket_query(400, length=512, seed=0, filler_fraction=0.25)
    # Same number of "(" and ")" in every sequence: counts over the whole sequence say nothing.
    assert torch.equal((tokens == OPEN_ID).sum(1), (tokens == CLOSE_ID).sum(1))
    marker = (tokens == QUERY_ID).long().argmax(1)
    assert int(marker.min()) >= 128 and int(marker.max()) < 384  # the middle half
    # A count over only the last 32 tokens before the marker is a poor predictor...
    window = [int((row[m - 32 : m] == OPEN_ID).sum() - (row[m - 32 : m] == CLOSE_ID).sum())
              for row, m in zip(tokens, marker.tolist())]
    decided = [(w > 0) == bool(y) for w, y in zip(window, labels.tolist()) if w != 0]
    local_acc = sum(decided) / len(decided)
    assert 0.5 < local_acc < 0.7
    # ...while the marker position alone carries no information about the label.
    assert abs(marker[labels == 1].float().mean() - marker[labels == 0].float().mean()) < 20


def test_bracket_query_is_deterministic_and_validates():
    a = generate_bracket_query(30, length=64, seed=2, filler_fraction=0.3, n_fillers=4)
    b = generate_bracket_query(30, length=64, seed=2, filler_fraction=0.3, n_fillers=4)
    c = generate_bracket_query(30, length=64, seed=3, filler_fraction=0.3, n_fillers=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    assert int(a[0].max()) < vocab_size(4)
    for kwargs, exc, name in [
        ({"n_samples": 1}, ValueError, "n_samples"),
        ({"length": 7}, ValueError, "length"),
        ({"length": 64.0}, TypeError, "length"),
        ({"seed": -1}, ValueError, "seed"),
        ({"filler_fraction": -0.1}, ValueError, "filler_fraction"),
        ({"n_fillers": 30}, ValueError, "n_fillers"),
    ]:
        args = {"n_samples": 4, "length": 64, "seed": 0, **kwargs}
        with pytest.raises(exc, match=name):
            generate_bracket_query(args.pop("n_samples"), **args)
    with pytest.raises(ValueError, match="query marker"):
        height_at_query(torch.tensor([[1, 2, 1]]))


def _balanced_by_reduction(tokens: torch.Tensor) -> bool:
    """Independent check: delete "()" pairs until none is left; balanced iff nothing remains."""
    s = "".join(BRACKET_VOCAB[i] for i in tokens.tolist() if i in (OPEN_ID, CLOSE_ID))
    while "()" in s:
        s = s.replace("()", "")
    return s == ""


@pytest.mark.parametrize("filler_fraction", [0.0, 0.4])
def test_bracket_balance_labels_match_an_independent_check(filler_fraction):
    tokens, labels = generate_bracket_balance(120, length=256, seed=5,
                                              filler_fraction=filler_fraction)
    assert tokens.shape == (120, 256)
    assert tokens.dtype == torch.int64 and labels.dtype == torch.int64
    assert int(labels.sum()) == 60  # exactly balanced classes
    for row, label in zip(tokens, labels.tolist()):
        assert _balanced_by_reduction(row) == bool(label)
    assert torch.equal(is_balanced(tokens).long(), labels)
    assert int(tokens.min()) >= 1 and int(tokens.max()) < vocab_size(8)  # no padding
    assert not (tokens == QUERY_ID).any()
    if filler_fraction == 0.0:  # at most the one leftover slot of an odd length is a filler
        assert int((tokens >= 4).sum(1).max()) <= 1


def test_bracket_balance_negatives_are_long_range_and_minimal():
    tokens, labels = generate_bracket_balance(200, length=512, seed=0, filler_fraction=0.25)
    opens = (tokens == OPEN_ID).sum(1)
    closes = (tokens == CLOSE_ID).sum(1)
    assert torch.equal(opens, closes)  # both classes: equal counts, so counting alone fails
    h = bracket_heights(tokens)
    neg = labels == 0
    assert (h[neg].min(1).values < 0).all() and (h[~neg].min(1).values >= 0).all()
    # The first negative height comes after the first quarter of the brackets.
    for row, hr in zip(tokens[neg], h[neg]):
        brackets = torch.nonzero((row == OPEN_ID) | (row == CLOSE_ID)).flatten()
        first_negative = int(torch.nonzero(hr < 0)[0])
        assert first_negative >= int(brackets[len(brackets) // 4])
    # Positive and negative bracket counts have the same distribution (same generator).
    assert abs(statistics.mean(opens[neg].tolist()) - statistics.mean(opens[~neg].tolist())) < 10


def test_bracket_balance_is_deterministic_and_validates():
    a = generate_bracket_balance(30, length=128, seed=2, filler_fraction=0.3, n_fillers=4)
    b = generate_bracket_balance(30, length=128, seed=2, filler_fraction=0.3, n_fillers=4)
    c = generate_bracket_balance(30, length=128, seed=3, filler_fraction=0.3, n_fillers=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    assert int(a[0].max()) < vocab_size(4)
    assert long_range.decode_brackets(torch.tensor([1, 4, 2, 3])) == "(a)?"
    for kwargs, exc, name in [
        ({"n_samples": 1}, ValueError, "n_samples"),
        ({"length": 8}, ValueError, "length"),
        ({"seed": -3}, ValueError, "seed"),
        ({"filler_fraction": 0.95}, ValueError, "filler_fraction"),
        ({"filler_fraction": "0.2"}, TypeError, "filler_fraction"),
        ({"n_fillers": 0}, ValueError, "n_fillers"),
        ({"n_fillers": 27}, ValueError, "n_fillers"),
    ]:
        args = {"n_samples": 4, "length": 64, "seed": 0, **kwargs}
        with pytest.raises(exc, match=name):
            generate_bracket_balance(args.pop("n_samples"), **args)


# ======================================================================== char corpus
def test_char_corpus_split_sizes_and_determinism():
    train, valid, test, vocab = load_char_corpus()
    info = char_corpus_info()
    total = len(train) + len(valid) + len(test)
    assert total == info["n_chars"] > 300_000
    assert len(valid) == round(0.05 * total) and len(test) == round(0.05 * total)
    assert all(t.dtype == torch.int64 and t.dim() == 1 for t in (train, valid, test))
    assert len(vocab) == info["vocab_size"] and 60 < len(vocab) < 128
    assert max(int(t.max()) for t in (train, valid, test)) < len(vocab)
    assert vocab.decode(train[:22]) == 'The "assert" statement'
    again = load_char_corpus()
    assert all(torch.equal(x, y) for x, y in zip((train, valid, test), again[:3]))
    assert again[3] == vocab
    small = load_char_corpus(valid_fraction=0.1, test_fraction=0.2)
    assert len(small[1]) == round(0.1 * total) and len(small[2]) == round(0.2 * total)
    with pytest.raises(ValueError, match="valid_fraction"):
        load_char_corpus(valid_fraction=0.0)
    with pytest.raises(ValueError, match="test_fraction"):
        split_text("abc", test_fraction=0.7)


def test_normalisation_and_vocab():
    assert normalise_text("caf\u00e9 \u2014 \u201cquote\u2019s\u201d\r\n\tx \u6771") == (
        'cafe -- "quote\'s"\n    x ' + UNKNOWN_CHAR
    )
    vocab = build_vocab("ba\n")
    assert vocab.chars == "\nab" + UNKNOWN_CHAR
    assert vocab.encode("abz").tolist() == [1, 2, vocab.unknown_id]
    assert vocab.decode(vocab.encode("ab\n")) == "ab\n"
    with pytest.raises(ValueError, match="chars"):
        CharVocab("ab")


def test_lm_batching_helpers():
    ids = torch.arange(23, dtype=torch.int64)
    x, y = lm_blocks(ids, 5)
    assert x.shape == y.shape == (4, 5)
    assert torch.equal(x.flatten(), ids[:20]) and torch.equal(y.flatten(), ids[1:21])
    g = torch.Generator().manual_seed(0)
    xb, yb = random_lm_batch(ids, 6, 8, generator=g)
    assert xb.shape == yb.shape == (8, 6)
    assert torch.equal(yb[:, :-1], xb[:, 1:]) and torch.equal(yb[:, -1], xb[:, -1] + 1)
    xb2, _ = random_lm_batch(ids, 6, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(xb, xb2)
    with pytest.raises(ValueError, match="context_length"):
        lm_blocks(ids, 23)
    with pytest.raises(ValueError, match="context_length"):
        random_lm_batch(ids, 0, 2, generator=g)
    with pytest.raises(ValueError, match="batch_size"):
        random_lm_batch(ids, 4, 0, generator=g)
    with pytest.raises(TypeError, match="generator"):
        random_lm_batch(ids, 4, 2, generator=0)
    with pytest.raises(TypeError, match="ids"):
        lm_blocks(ids.float(), 4)


# ============================================================================ fetchers
def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv(fetch.DATA_ENV_VAR, str(tmp_path / "env"))
    assert cache_dir() == tmp_path / "env"
    assert cache_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv(fetch.DATA_ENV_VAR)
    assert cache_dir() == Path("~/.cache/nn-kernels-book").expanduser()


def test_download_checksum_and_atomicity(tmp_path):
    digest = sha256sum(LRA_FIXTURE)
    dest = download(LRA_FIXTURE.as_uri(), tmp_path / "a" / "lra.gz", sha256=digest, progress=False)
    assert dest.read_bytes() == LRA_FIXTURE.read_bytes()
    # A local absolute path works as well as a file:// URL.
    assert download(str(LRA_FIXTURE), tmp_path / "b" / "lra.gz", progress=False).is_file()
    # Present file: reused, but still verified.
    assert download(CLOSED_PORT_URL, dest, sha256=digest, progress=False) == dest
    with pytest.raises(ChecksumError, match="SHA-256"):
        download(CLOSED_PORT_URL, dest, sha256="0" * 64, progress=False)
    # Fresh download with the wrong digest: error, and nothing left behind.
    with pytest.raises(ChecksumError, match="it was deleted"):
        download(LRA_FIXTURE.as_uri(), tmp_path / "c" / "lra.gz", sha256="f" * 64, progress=False)
    assert list((tmp_path / "c").iterdir()) == []


def test_unreachable_url_raises_dataset_unavailable(tmp_path):
    dest = tmp_path / "lra" / "lra_release.gz"
    with pytest.raises(DatasetUnavailableError) as info:
        download(CLOSED_PORT_URL, dest, dataset="LRA", timeout=5, progress=False)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    for part in ("LRA", CLOSED_PORT_URL, "offline", str(dest), "copy the file"):
        assert part in message
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
    with pytest.raises(DatasetUnavailableError, match="does not exist"):
        download((tmp_path / "missing.gz").as_uri(), tmp_path / "x.gz", progress=False)


def test_download_bad_arguments_name_the_argument(tmp_path):
    url = LRA_FIXTURE.as_uri()
    with pytest.raises(ValueError, match="url"):
        download("ftp://example.invalid/x.gz", tmp_path / "x")
    with pytest.raises(ValueError, match="url"):
        download("relative/path.gz", tmp_path / "x")
    with pytest.raises(ValueError, match="sha256"):
        download(url, tmp_path / "x", sha256="abc")
    with pytest.raises(ValueError, match="timeout"):
        download(url, tmp_path / "x", timeout=0)
    with pytest.raises(TypeError, match="timeout"):
        download(url, tmp_path / "x", timeout="10")
    with pytest.raises(TypeError, match="dest"):
        download(url, 3)


def test_extract_is_safe(tmp_path):
    out = extract(WIKI_FIXTURE, tmp_path / "wiki")
    assert (out / "wikitext-103-raw" / "wiki.train.raw").is_file()
    with pytest.raises(FileExistsError, match="dest"):
        extract(WIKI_FIXTURE, tmp_path / "wiki")
    for name in ("unsafe_traversal.tar.gz", "unsafe_traversal.zip", "unsafe_symlink.tar.gz"):
        dest = tmp_path / name.replace(".", "_")
        with pytest.raises(UnsafeArchiveError, match="refusing"):
            extract(FIXTURES / name, dest)
        assert not dest.exists()
    assert not (tmp_path / "escaped.txt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
    with pytest.raises(ValueError, match="zip or tar"):
        extract(FIXTURES / "listops_sample.tsv", tmp_path / "tsv")


def test_lra_fetch_extract_load_from_fixture(tmp_path):
    url = LRA_FIXTURE.as_uri()
    train, valid, test = load_lra_listops(root=tmp_path, url=url, sha256=sha256sum(LRA_FIXTURE),
                                          max_length=64)
    assert (tmp_path / "lra" / "lra_release.gz").is_file()
    assert [s[0].shape for s in (train, valid, test)] == [(6, 64), (3, 64), (3, 64)]
    for tokens, lengths, labels in (train, valid, test):
        for row, n, label in zip(tokens, lengths.tolist(), labels.tolist()):
            assert evaluate_listops(decode_listops(row[:n])) == label
    # Second call: from the cache, without touching the (now unreachable) URL.
    again = load_lra_listops(root=tmp_path, url=CLOSED_PORT_URL, download=False, max_length=64,
                             limit=2)
    assert torch.equal(again[0][0], train[0][:2])
    assert find_lra_folder("listops-1000", tmp_path / "lra" / "extracted").name == "listops-1000"


def test_lra_archive_placed_by_hand_is_used_offline(tmp_path):
    (tmp_path / "lra").mkdir()
    shutil.copy(LRA_FIXTURE, tmp_path / "lra" / "lra_release.gz")
    train, _, _ = load_lra_listops(root=tmp_path, url=CLOSED_PORT_URL, download=False,
                                   max_length=64)
    assert train[0].shape == (6, 64)
    # With download=True too: the file is there, so the unreachable URL is never contacted.
    shutil.rmtree(tmp_path / "lra" / "extracted")
    train, _, _ = load_lra_listops(root=tmp_path, url=CLOSED_PORT_URL, max_length=64)
    assert train[0].shape == (6, 64)


def test_lra_offline_message(tmp_path):
    with pytest.raises(DatasetUnavailableError) as info:
        load_lra_listops(root=tmp_path, url=CLOSED_PORT_URL, timeout=5)
    message = str(info.value)
    assert "Long Range Arena" in message and CLOSED_PORT_URL in message and "offline" in message
    assert str(tmp_path / "lra" / "lra_release.gz") in message
    with pytest.raises(DatasetUnavailableError, match="download=False"):
        load_lra_listops(root=tmp_path, download=False)


def test_wikitext_fetch_extract_load_from_fixture(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.DATA_ENV_VAR, str(tmp_path))  # root from the environment
    train, valid, test, vocab = load_wikitext103_chars(url=WIKI_FIXTURE.as_uri())
    extracted = tmp_path / "wikitext-103" / "extracted"
    assert (extracted / "wikitext-103-raw" / "wiki.valid.raw").is_file()
    text = vocab.decode(train)
    assert text.startswith(" = Fixture Article = \n")
    assert "cafe , naive , an em dash -- and the city of " + UNKNOWN_CHAR * 2 in text
    assert "curly quote ' and a tab    inside" in vocab.decode(valid)
    assert vocab.decode(test).count(UNKNOWN_CHAR) == 1  # the euro sign is not in the vocabulary
    head = load_wikitext103_chars(url=CLOSED_PORT_URL, download=False, max_chars=20)
    assert [len(t) for t in head[:3]] == [20, 20, 20]
    with pytest.raises(ValueError, match="max_chars"):
        load_wikitext103_chars(download=False, max_chars=0)


def test_wikitext_offline_message(tmp_path):
    with pytest.raises(DatasetUnavailableError) as info:
        load_wikitext103_chars(root=tmp_path, url=CLOSED_PORT_URL, timeout=5)
    message = str(info.value)
    assert "WikiText-103" in message and "offline" in message
    assert str(tmp_path / "wikitext-103" / "wikitext-103-raw-v1.zip") in message


def test_fixtures_are_small():
    for p in FIXTURES.iterdir():
        assert p.stat().st_size < 16_000, p
