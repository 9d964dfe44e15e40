"""Fetcher and loader of BERT-base (``bert-base-uncased``, Devlin et al. 2019): the
paper-scale encoder of chapter 7's full profile.

Chapter 7 (``chapters/07_ffn_replacements.ipynb``) compares every FFN replacement on the
offline all-MiniLM-L6-v2 at teaching scale (:func:`data_scripts.sentences.load_minilm`,
FFN 384 -> 1536 -> 384). Its ``full`` profile runs the same experiment on BERT-base, whose
FFNs are 768 -> 3072 -> 768 as in the MLP-fusion paper's BERT/RoBERTa experiments, with
``model_name = "bert-base"``. Those weights (420 MiB) do not ship with any package, so
this module downloads them once:

* ``model.safetensors`` of ``google-bert/bert-base-uncased`` on the Hugging Face hub at the
  pinned revision ``86b5e09`` (:data:`BERT_BASE`); size and SHA-256 are those of the
  file's Git LFS pointer at that revision, checked after download and on every load.
* ``vocab.txt`` (the 30 522-token uncased WordPiece vocabulary) from the same revision,
  also pinned. all-MiniLM-L6-v2 was distilled with the same vocabulary, so when the
  download is not possible and the installed MiniLM package holds a byte-identical
  ``vocab.txt`` (same SHA-256), that copy is used.
* ``config.json`` is not downloaded: BERT-base's architecture is
  :data:`BERT_BASE_CONFIG` (12 layers, hidden 768, 12 heads, FFN 3072, GELU), written into
  the cache folder for reference.

Files land in ``<cache>/bert-base-uncased/`` (:func:`data_scripts.fetch.cache_dir`),
written atomically by :func:`data_scripts.fetch.download` with a byte progress bar.
Offline, :func:`fetch_bert_base` raises
:class:`~data_scripts.fetch.DatasetUnavailableError` naming the URL and the path where the
file can be placed by hand; a file placed there is verified like a download.

The loader builds ``transformers.BertModel`` from :data:`BERT_BASE_CONFIG` and copies the
checkpoint's tensors in by name (the checkpoint is a ``BertForPreTraining`` one: its
``bert.`` prefix is dropped, the legacy LayerNorm names ``gamma``/``beta`` become
``weight``/``bias``, the pre-training heads ``cls.*`` are ignored); a missing or
unexpected encoder tensor is an error that names it. Tests use tiny checkpoints of the
same layout (``tests/test_data_bert.py``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from data_scripts.fetch import ChecksumError, cache_dir, download, sha256sum

__all__ = [
    "BERT_BASE",
    "BERT_BASE_CONFIG",
    "BERT_VOCAB",
    "bert_from_safetensors",
    "fetch_bert_base",
    "load_bert_base",
]

PathLike = Union[str, os.PathLike]

_REPO = "google-bert/bert-base-uncased"
_REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"
_BASE_URL = f"https://huggingface.co/{_REPO}/resolve/{_REVISION}"

#: The weights: URL at the pinned hub revision, size in bytes and SHA-256 (the Git LFS
#: pointer of ``model.safetensors`` at that revision).
BERT_BASE = {
    "url": f"{_BASE_URL}/model.safetensors",
    "filename": "model.safetensors",
    "size": 440449768,
    "sha256": "68d45e234eb4a928074dfd868cead0219ab85354cc53d20e772753c6bb9169d3",
    "dataset": "BERT-base (bert-base-uncased weights)",
    "folder": "bert-base-uncased",
}

#: The uncased WordPiece vocabulary of the same revision.
BERT_VOCAB = {
    "url": f"{_BASE_URL}/vocab.txt",
    "filename": "vocab.txt",
    "size": 231508,
    "sha256": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "dataset": "BERT-base (bert-base-uncased vocabulary)",
}

#: ``transformers.BertConfig`` arguments of bert-base-uncased (Devlin et al. 2019, Table 1's
#: BERT_BASE: L = 12, H = 768, A = 12; FFN size 4H).
BERT_BASE_CONFIG: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}

_TOKENIZER_CONFIG = {"do_lower_case": True, "model_max_length": 512}


def _write_json_atomic(path: Path, obj: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _minilm_vocab() -> Optional[Path]:
    """The installed MiniLM package's ``vocab.txt`` when it is byte-identical to BERT's."""
    try:
        from data_scripts.sentences import ModelUnavailableError, minilm_folder

        path = minilm_folder() / "vocab.txt"
    except (ImportError, ModelUnavailableError):
        return None
    if path.is_file() and path.stat().st_size == BERT_VOCAB["size"] and sha256sum(path) == BERT_VOCAB["sha256"]:
        return path
    return None


def _fetch_vocab(folder: Path, timeout: float, progress: bool) -> Path:
    dest = folder / BERT_VOCAB["filename"]
    if not dest.exists():
        local = _minilm_vocab()
        if local is not None:  # the same bytes are installed already: no download needed
            tmp = dest.with_name(f".{dest.name}.tmp")
            shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
    return download(BERT_VOCAB["url"], dest, sha256=BERT_VOCAB["sha256"], size=BERT_VOCAB["size"],
                    timeout=timeout, dataset=BERT_VOCAB["dataset"], progress=progress)


def fetch_bert_base(
    *,
    root: Optional[PathLike] = None,
    url: Optional[str] = None,
    sha256: Optional[str] = None,
    size: Optional[int] = None,
    timeout: float = 60.0,
    progress: bool = True,
) -> Path:
    """Download BERT-base's weights and vocabulary into ``<root>/bert-base-uncased/`` once;
    return that folder (``model.safetensors``, ``vocab.txt``, ``tokenizer_config.json``,
    ``config.json``).

    Args:
        root: cache folder (default ``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``).
        url: override of the weights' address (tests pass a ``file://`` checkpoint).
        sha256, size: expected digest and size of the weights. None: the pinned ones
            (:data:`BERT_BASE`) when ``url`` is the default address, no check otherwise.
        timeout: seconds to wait for the connection and for each read.
        progress: show a byte progress bar on stderr.

    Raises:
        DatasetUnavailableError: offline or the server fails (the message names the URL and
            the file to place by hand); ChecksumError: a file with another size or digest;
            ValueError / TypeError naming a bad argument (see :func:`data_scripts.fetch.download`).
    """
    folder = cache_dir(root) / BERT_BASE["folder"]
    folder.mkdir(parents=True, exist_ok=True)
    pinned = url in (None, BERT_BASE["url"])
    download(
        url or BERT_BASE["url"], folder / BERT_BASE["filename"],
        sha256=BERT_BASE["sha256"] if pinned and sha256 is None else sha256,
        size=BERT_BASE["size"] if pinned and size is None else size,
        timeout=timeout, dataset=BERT_BASE["dataset"], progress=progress,
    )
    _fetch_vocab(folder, timeout, progress)
    _write_json_atomic(folder / "tokenizer_config.json", _TOKENIZER_CONFIG)
    _write_json_atomic(folder / "config.json", {"model_type": "bert", "architectures": ["BertModel"],
                                                **BERT_BASE_CONFIG})
    return folder


def _encoder_key(name: str) -> Optional[str]:
    """The ``BertModel`` name of a checkpoint tensor, or None for a pre-training head."""
    if name.startswith("cls."):
        return None
    if name.startswith("bert."):
        name = name[len("bert."):]
    if name.endswith(".gamma"):
        name = name[: -len(".gamma")] + ".weight"
    elif name.endswith(".beta"):
        name = name[: -len(".beta")] + ".bias"
    return name


def bert_from_safetensors(path: PathLike, config: Optional[Mapping[str, Any]] = None):
    """A ``transformers.BertModel`` with ``config`` (default :data:`BERT_BASE_CONFIG`) and
    the encoder tensors of the ``BertForPreTraining``/``BertModel`` checkpoint at ``path``,
    in evaluation mode.

    Raises:
        FileNotFoundError: no file at ``path``; ValueError: the checkpoint lacks an encoder
        tensor, has an unexpected one, or one of another shape (the message names them).
    """
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    model = BertModel(BertConfig(**dict(BERT_BASE_CONFIG if config is None else config)), add_pooling_layer=True)
    expected = model.state_dict()
    state = {}
    for name, tensor in load_file(str(path)).items():
        key = _encoder_key(name)
        if key is None or (key not in expected and key.endswith("position_ids")):
            continue  # pre-training heads; the position ids are a buffer the model builds itself
        state[key] = tensor
    missing = sorted(k for k in expected if k not in state and not k.endswith("position_ids"))
    unexpected = sorted(k for k in state if k not in expected)
    wrong = sorted(k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or wrong:
        raise ValueError(
            f"checkpoint {path} does not match BertModel({dict(BERT_BASE_CONFIG if config is None else config)}): "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}, "
            f"wrong shape {wrong[:5]}"
        )
    model.load_state_dict(state, strict=False)
    model.eval()
    return model


def load_bert_base(
    *,
    root: Optional[PathLike] = None,
    url: Optional[str] = None,
    sha256: Optional[str] = None,
    size: Optional[int] = None,
    download: bool = True,
    progress: bool = True,
    config: Optional[Mapping[str, Any]] = None,
):
    """``(tokenizer, model)``: bert-base-uncased (a 12-layer ``BertModel``, FFN
    768 -> 3072 -> 768 with GELU) from the cache, fetched first when ``download``.
    The tokenizer is the uncased WordPiece ``BertTokenizer`` of ``vocab.txt``.

    Args:
        root, url, sha256, size, progress: as :func:`fetch_bert_base`.
        download: fetch what is missing; ``False`` only reads the cache (and still
            verifies the weights' size and digest).
        config: ``BertConfig`` arguments (default :data:`BERT_BASE_CONFIG`; tests pass a
            tiny one).

    Raises:
        FileNotFoundError: ``download=False`` and the files are not in the cache;
        DatasetUnavailableError / ChecksumError: as :func:`fetch_bert_base`.
    """
    if not isinstance(download, bool):
        raise TypeError(f"download must be a bool, got {download!r}")
    if download:
        folder = fetch_bert_base(root=root, url=url, sha256=sha256, size=size, progress=progress)
    else:
        folder = cache_dir(root) / BERT_BASE["folder"]
        files = [BERT_BASE["filename"], BERT_VOCAB["filename"], "tokenizer_config.json"]
        absent = [f for f in files if not (folder / f).is_file()]
        if absent:
            raise FileNotFoundError(
                f"BERT-base is not in the cache ({folder} lacks {absent}); call fetch_bert_base() "
                "or load_bert_base(download=True) first"
            )
        pinned = url in (None, BERT_BASE["url"])
        expected_sha = BERT_BASE["sha256"] if pinned and sha256 is None else sha256
        weights = folder / BERT_BASE["filename"]
        if expected_sha is not None and sha256sum(weights) != expected_sha:
            raise ChecksumError(f"{weights} has another SHA-256 than {expected_sha}; delete it and fetch again")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = bert_from_safetensors(folder / BERT_BASE["filename"], config)
    return tokenizer, model
