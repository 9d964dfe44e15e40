"""Inference speed of SNNK layers and of bundled SNNK blocks against dense layers.

Chapters 2 and 3 (``chapters/02_random_features.ipynb``, ``chapters/03_bundling.ipynb``)
can read the results file.

    python -m benchmarks.bench_snnk          # full run: results/bench_snnk.{json,md}
    python -m benchmarks.bench_snnk --quick  # fewer shapes and repeats, no files

What is measured (float32, CPU, ``torch.no_grad()``, one process, torch's default thread
count unless ``--threads``; each comparison timed interleaved with
:func:`_harness.time_interleaved`, median of the repeats, warm-up call excluded):

(a) ``layer``: an :class:`~kernels.snnk.SNNKLinear` ``d -> d`` (ReLU-SNNK and sine URF)
    against ``nn.Linear(d, d)`` followed by the activation, on a batch of 256 inputs, for
    ``d`` in {512, 1024, 2048} and ``m`` in {16, 64} random features. The SNNK layer
    costs O(n m d) (features) + O(n M d) (output), the dense layer O(n d^2).
(b) ``bundled``: the FFN block of a transformer (Sec. 4.4 / App. J.4), ``GELU(x W1^T +
    b1) W2^T + b2`` with ``d = 384 -> 1536 -> 384`` (MiniLM's sizes) and ``d = 768 ->
    3072 -> 768`` (BERT-base's), against the same block with its first layer replaced by
    a ReLU-SNNK layer with ``m`` in {8, 16} features, unbundled (``W2(SNNK(x)) + b2``)
    and bundled (``Phi(x) (W2 Omega)^T + b2``, :func:`kernels.snnk.bundle`), on 64 x 128
    tokens. Speedups are ratios against the dense block in the same run; in the same rounds
    the dense block also runs on oneDNN's inner product with the GELU fused
    (``_harness.onednn_dense_ffn``, a private torch op, about twice torch's OpenBLAS block
    here), the fastest dense FFN we found on this CPU: ``speedup_vs_onednn``.

The load average is recorded at the start and at the end: the machine is shared, so the
ratios (not the absolute times) are what to read.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch import nn

from benchmarks._harness import machine_info, onednn_dense_ffn, time_interleaved, write_results

from kernels.snnk import SNNKLinear, bundle


def layer_rows(dims: list[int], ms: list[int], repeats: int, batch: int = 256) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for d in dims:
        # inputs of norm ~1, the regime where URF features are well conditioned
        x = torch.randn(batch, d, generator=gen) / d**0.5
        dense = nn.Linear(d, d)
        for act in ("relu", "sin"):
            f = torch.relu if act == "relu" else torch.sin
            fns = {"dense": lambda: f(dense(x))}
            snnks = {m: SNNKLinear(d, d, m, act, generator=gen) for m in ms}
            for m, layer in snnks.items():
                fns[f"snnk{m}"] = (lambda layer=layer: layer(x))
            with torch.no_grad():
                times = time_interleaved(fns, repeats)
            for m, layer in snnks.items():
                ours, ref = times[f"snnk{m}"]["median_s"], times["dense"]["median_s"]
                p_ours = sum(p.numel() for p in layer.parameters())
                rows.append({
                    "case": f"layer_{act}", "activation": act, "d": d, "m": m,
                    "shape": f"x ({batch}, {d})",
                    "ours": f"SNNKLinear {act}, m={m} (M={layer.feature_map.out_features}, {p_ours} params)",
                    "ours_s": ours,
                    "ours_iqr_s": times[f"snnk{m}"]["iqr_s"],
                    "ref": f"nn.Linear({d}, {d}) + {act} ({d * d + d} params)",
                    "ref_s": ref,
                    "ref_iqr_s": times["dense"]["iqr_s"],
                    "speedup": ref / ours,
                    "params_ours": p_ours,
                    "params_ref": d * d + d,
                })
    return rows


def bundled_rows(shapes: list[tuple[int, int]], ms: list[int], repeats: int,
                 tokens: tuple[int, int] = (64, 128)) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(1)
    for d, hidden in shapes:
        x = torch.randn(tokens[0] * tokens[1], d, generator=gen) / d**0.5
        up, down = nn.Linear(d, hidden), nn.Linear(hidden, d)
        fns = {"dense": lambda: down(torch.nn.functional.gelu(up(x)))}
        anchor = onednn_dense_ffn(up.weight, up.bias, down.weight, down.bias, x)
        if anchor is not None:
            fns["dense_onednn"] = anchor
        variants = {}
        for m in ms:
            snnk = SNNKLinear(d, hidden, m, "relu", generator=gen)
            net = bundle([snnk, down])
            variants[m] = (snnk, net)
            fns[f"unbundled{m}"] = (lambda snnk=snnk: down(snnk(x)))
            fns[f"bundled{m}"] = (lambda net=net: net(x))
        with torch.no_grad():
            times = time_interleaved(fns, repeats)
        ref = times["dense"]["median_s"]
        for m, (snnk, net) in variants.items():
            for kind in ("unbundled", "bundled"):
                ours = times[f"{kind}{m}"]["median_s"]
                params = (sum(p.numel() for p in snnk.parameters()) + sum(p.numel() for p in down.parameters())
                          if kind == "unbundled" else net.parameter_count())
                p_ref = sum(p.numel() for p in up.parameters()) + sum(p.numel() for p in down.parameters())
                rows.append({
                    "case": f"ffn_{kind}", "activation": "relu", "d": d, "m": m,
                    "shape": f"x ({tokens[0]}x{tokens[1]}, {d}), FFN {d}->{hidden}->{d}",
                    "ours": f"ReLU-SNNK m={m} + down-projection, {kind} ({params} params)",
                    "ours_s": ours,
                    "ref": f"dense FFN, GELU ({p_ref} params)",
                    "ref_s": ref,
                    "speedup": ref / ours,
                    "params_ours": params,
                    "params_ref": p_ref,
                    **({} if anchor is None else {
                        "onednn_s": times["dense_onednn"]["median_s"],
                        "speedup_vs_onednn": times["dense_onednn"]["median_s"] / ours}),
                })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats; no files")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    machine = machine_info(load_average_1_5_15min=load)
    if args.quick:
        rows = layer_rows([512], [16], 5) + bundled_rows([(384, 1536)], [8], 3)
    else:
        rows = layer_rows([512, 1024, 2048], [16, 64], 20) + bundled_rows([(384, 1536), (768, 3072)], [8, 16], 10)
    if hasattr(os, "getloadavg"):
        machine["load_average_at_end"] = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    if args.quick:
        from benchmarks._harness import markdown_table
        print(markdown_table(rows))
        return
    notes = (
        "Speedup = median time of the dense reference / median time of ours, measured in the same "
        "run, interleaved. Parameters: trainable tensors of the layer or block (for the bundled "
        "block: the stored matrix W2 Omega and the bias; the random projections are regenerated "
        "from a seed). See the module docstring of benchmarks/bench_snnk.py for the setup."
        + "".join(f" {r['shape']}, {r['ours']}: {r['speedup_vs_onednn']:.2f}x the dense FFN on oneDNN "
                  f"({1e3 * r['onednn_s']:.1f} ms, a private torch op, GELU fused; torch's block {1e3 * r['ref_s']:.1f} ms)."
                  for r in rows if "onednn_s" in r)
    )
    json_path, md_path = write_results("snnk", machine, rows, notes)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
