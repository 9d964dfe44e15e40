"""Fetcher and reader of two GLUE tasks: SST-2 (sentiment) and MNLI (entailment).

Chapter 6 (``chapters/06_mlp_fusion.ipynb``) reproduces the MLP-fusion paper's
fine-tuning on these tasks in its full profile (``use_real_data = True``); the ci
profile uses the offline docstring task of :mod:`data_scripts.sentences` instead and
never calls this module.

* SST-2 (Socher et al. 2013): movie-review sentences, label 0 (negative) / 1 (positive);
  ``train.tsv`` (67k) and ``dev.tsv`` (872) with the header ``sentence<TAB>label``.
* MNLI (Williams et al. 2018): premise/hypothesis pairs labelled ``entailment``,
  ``neutral`` or ``contradiction``; ``train.tsv`` (393k), ``dev_matched.tsv`` and
  ``dev_mismatched.tsv`` (about 10k each) with named columns ``sentence1``,
  ``sentence2`` and ``gold_label``. The paper reports mismatched accuracy.

The archives are the GLUE release zips (one folder per task, ``SST-2/`` and ``MNLI/``)
downloaded with :mod:`data_scripts.fetch` into ``<cache>/glue/<task>/``. Offline, the
fetch fails with :class:`~data_scripts.fetch.DatasetUnavailableError`, which says where to
put the zip by hand. Tests use tiny zips of the same layout (``tests/fixtures``).
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path
from typing import Optional, Union

import numpy as np

from data_scripts._checks import check_int
from data_scripts.fetch import cache_dir, download_and_extract
from data_scripts.sentences import SentenceTask

__all__ = ["GLUE_TASKS", "fetch_glue", "find_glue_dir", "load_glue"]

PathLike = Union[str, os.PathLike]

#: task -> download URL, pinned size and SHA-256 of the zip, archive name, folder in the
#: zip, split files, label names. The sizes and digests are those Hugging Face ``datasets``
#: records for these URLs (``download_checksums`` in ``datasets/glue/dataset_infos.json``
#: of github.com/huggingface/datasets); torchtext pins the same SST-2 zip by MD5
#: (9f81648d4199384278b86e315dac217c).
GLUE_TASKS = {
    "sst2": {
        "url": "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip",
        "size": 7439277,
        "sha256": "d67e16fb55739c1b32cdce9877596db1c127dc322d93c082281f64057c16deaa",
        "archive": "SST-2.zip",
        "folder": "SST-2",
        "splits": {"train": "train.tsv", "dev": "dev.tsv"},
        "labels": ("negative", "positive"),
        "dataset": "GLUE SST-2",
    },
    "mnli": {
        "url": "https://dl.fbaipublicfiles.com/glue/data/MNLI.zip",
        "size": 312783507,
        "sha256": "e7c1d896d26ed6caf700110645df426cc2d8ebf02a5ab743d5a5c68ac1c83633",
        "archive": "MNLI.zip",
        "folder": "MNLI",
        "splits": {
            "train": "train.tsv",
            "dev_matched": "dev_matched.tsv",
            "dev_mismatched": "dev_mismatched.tsv",
        },
        "labels": ("entailment", "neutral", "contradiction"),
        "dataset": "GLUE MNLI",
    },
}


def _task(task: object) -> dict:
    if task not in GLUE_TASKS:
        raise ValueError(f"task must be one of {sorted(GLUE_TASKS)}, got {task!r}")
    return GLUE_TASKS[task]


def fetch_glue(
    task: str,
    *,
    root: Optional[PathLike] = None,
    url: Optional[str] = None,
    sha256: Optional[str] = None,
    timeout: float = 60.0,
    progress: bool = True,
) -> Path:
    """Download and unpack one GLUE task's zip into ``<root>/glue/<task>/`` once; return
    the unpacked folder (``.../extracted``).

    Args:
        task: ``"sst2"`` or ``"mnli"``.
        root: cache folder (default ``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``).
        url: override of the download address (tests pass a ``file://`` fixture).
        sha256: expected SHA-256 of the zip. None: the pinned size and digest of the
            published zip (``GLUE_TASKS[task]``) when ``url`` is the default address, no
            check for another ``url``.

    Raises:
        ValueError for an unknown task; DatasetUnavailableError offline (naming the URL
        and where to place the zip by hand); see :mod:`data_scripts.fetch`.
    """
    spec = _task(task)
    folder = cache_dir(root) / "glue" / task
    pinned = url in (None, spec["url"]) and sha256 is None
    return download_and_extract(
        url or spec["url"], folder, filename=spec["archive"],
        sha256=spec["sha256"] if pinned else sha256, size=spec["size"] if pinned else None,
        timeout=timeout, dataset=spec["dataset"], progress=progress,
    )


def find_glue_dir(task: str, path: PathLike) -> Path:
    """The folder at or below ``path`` that holds ``task``'s split files.

    Raises:
        FileNotFoundError naming ``path`` and the files looked for.
    """
    spec = _task(task)
    path = Path(path)
    names = list(spec["splits"].values())
    candidates = [path, path / spec["folder"]]
    if path.is_dir():
        candidates += sorted(p.parent for p in path.rglob(names[0]))
    for folder in candidates:
        if all((folder / n).is_file() for n in names):
            return folder
    raise FileNotFoundError(f"no folder with {', '.join(names)} found at or below {path}")


def load_glue(
    task: str,
    split: str,
    *,
    root: Optional[PathLike] = None,
    url: Optional[str] = None,
    download: bool = True,
    max_examples: Optional[int] = None,
    seed: int = 0,
) -> SentenceTask:
    """One split of SST-2 or MNLI as a :class:`~data_scripts.sentences.SentenceTask`
    (MNLI: ``texts`` are premises, ``texts_b`` hypotheses).

    Args:
        task: ``"sst2"`` or ``"mnli"``.
        split: ``"train"``, ``"dev"`` (SST-2) or ``"dev_matched"``/``"dev_mismatched"`` (MNLI).
        root, url: as :func:`fetch_glue`.
        download: fetch if not in the cache; ``False`` only reads ``<root>/glue/<task>/extracted``.
        max_examples: keep a random subset of this size (drawn with ``seed``); None: all.

    Raises:
        ValueError: unknown task/split, a row with an unknown label; FileNotFoundError when
        ``download=False`` and the data are not in the cache; DatasetUnavailableError offline.
    """
    spec = _task(task)
    if split not in spec["splits"]:
        raise ValueError(f"split must be one of {sorted(spec['splits'])} for {task}, got {split!r}")
    if download:
        base = fetch_glue(task, root=root, url=url, progress=False)
    else:
        base = cache_dir(root) / "glue" / task / "extracted"
        if not base.is_dir():
            raise FileNotFoundError(
                f"{spec['dataset']} is not in the cache ({base}); call fetch_glue({task!r}) "
                "or load_glue(..., download=True) first"
            )
    folder = find_glue_dir(task, base)
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    texts, texts_b, labels = [], [], []
    with open(folder / spec["splits"][split], encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            if task == "sst2":
                text, label = row["sentence"], row["label"]
                try:
                    y = int(label)
                except (TypeError, ValueError):
                    y = -1
                if y not in (0, 1):
                    raise ValueError(f"SST-2 row with label {label!r}; expected 0 or 1")
                texts.append(text.strip())
            else:
                gold = row["gold_label"]
                if gold not in spec["labels"]:
                    continue  # MNLI marks pairs without annotator agreement with "-"
                y = spec["labels"].index(gold)
                texts.append(row["sentence1"].strip())
                texts_b.append(row["sentence2"].strip())
            labels.append(y)
    order = np.arange(len(texts))
    if max_examples is not None:
        max_examples = check_int("max_examples", max_examples, low=1)
        if max_examples < len(texts):
            order = np.sort(np.random.default_rng(seed).choice(len(texts), max_examples, replace=False))
    return SentenceTask(
        texts=tuple(texts[i] for i in order),
        labels=np.asarray(labels, dtype=np.int64)[order],
        label_names=tuple(spec["labels"]),
        texts_b=tuple(texts_b[i] for i in order) if texts_b else None,
    )
