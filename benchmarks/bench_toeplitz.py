"""Speed and peak memory of the FFT Toeplitz product and of the TNO, SKI-TNO and FD-TNO mixers.

Chapter 4 (``chapters/04_toeplitz.ipynb``, section "Speed") reads the results file.

    python -m benchmarks.bench_toeplitz              # full run: results/bench_toeplitz.{json,md}
    python -m benchmarks.bench_toeplitz --quick      # small n, few repeats, no memory, no files
    python -m benchmarks.bench_toeplitz --threads 2  # torch and scipy thread count (default 1)

What is measured (float32, CPU, ``--threads`` threads for torch and for scipy's
``workers``; one process for the times, every comparison interleaved in a new random
order every round, one warm-up call not counted; median and interquartile range of the
repeats; with one thread the clock is the CPU time of the calling thread, which leaves out
the time spent waiting for a core held by other jobs, see ``--clock``):

(a) ``matvec``: ``toeplitz_matvec(coeffs, x)`` against the dense per-channel product
    ``T @ x`` for ``n`` in {512, 1024, 2048, 4096}; ``x`` is ``(batch 8, n, channels 16)``
    (the TNN layout: one Toeplitz matrix per channel, shared by the batch). Ours is the
    full public call (argument checks, circulant build, FFT of the coefficients, FFTs of
    ``x``). The dense reference gets its best case for time: the ``(16, n, n)`` matrices
    are built before timing, ``x`` is laid out as ``(16, n, 8)``; only ``torch.matmul``
    is timed.
(b) ``matvec_causal``: the causal product (``causal=True``, lags 0..n-1) for ``n`` in
    {512, 2048, 8192} against the strongest convolution a user could install,
    ``scipy.signal.fftconvolve`` and ``oaconvolve`` (pocketfft; forward only, numpy,
    ``x`` pre-laid out as ``(8, 16, n)`` so that the transform runs over contiguous rows,
    ``mode="full"`` then the first ``n`` outputs; the faster of the two is the
    reference).
(c) token mixers on ``x`` of shape ``(batch 4, n, d = 64)`` for ``n`` in {512, 1024,
    2048, 4096, 8192}: forward + backward (gradients with respect to the input and every
    parameter, as inside a network) of TNO (RPE MLP width 32, 3 hidden layers with layer
    norm and ReLU, decay 0.99), SKI-TNO (r = 64 inducing points, band m = 32, the
    paper's LRA setting; sparse and dense W A W^T), FD-TNO (same RPE MLP), causal and
    bidirectional; and the forward pass alone (``torch.no_grad``) of TNO and FD-TNO.
    The forward rows of FD-TNO carry the scipy anchor of (b) applied to the FD-TNO's own
    kernel (its coefficients computed before timing: the anchor gets the convolution
    only, not the RPE). All sixteen callables of one ``n`` are interleaved.
(d) where the time goes (``limits`` in the JSON): in the same interleaved set, the
    product with ``x`` alone (a fixed spectrum, forward + backward, the part every FFT
    mixer shares) and the RPE MLP alone; "best possible FD-TNO / TNO" is the TNO time
    divided by (product + RPE), the speedup a causal FD-TNO would have if its Hilbert
    projection cost nothing.

Peak memory (full runs): each method in a fresh process (``_harness.run_worker`` with
``for_memory=True``), the extra peak resident set size of one call over the resident
inputs (``/proc/self/status`` VmHWM after a reset, :func:`_harness.peak_memory_of_call`),
in MiB. For the dense product the measured call builds the ``(16, n, n)`` matrices from
the coefficients and multiplies (the memory the method needs); for the mixers it is
one forward + backward.

Goals: FFT matvec >= 20x faster than dense at n = 4096; SKI-TNO >= 2x faster
than TNO (fwd+bwd) at n = 4096; bidirectional FD-TNO faster than TNO at n = 2048;
causal FD-TNO >= 1.1x the causal TNO (fwd+bwd) at n = 2048.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from benchmarks._harness import (
    RESULTS_DIR, _atomic_write, machine_info, markdown_table, peak_memory_of_call, run_worker,
    summarize,
)

from kernels.toeplitz import (
    FDTNO, SKITNO, TNO, _apply_spectrum, _frequency_features, fft_length, toeplitz_dense,
    toeplitz_matvec,
)

try:  # the anchor; a missing scipy skips its column, never fails the run
    import numpy as np
    import scipy
    import scipy.fft
    import scipy.signal

    SCIPY = scipy.__version__
except ImportError:  # pragma: no cover - scipy is a dependency of the book
    SCIPY = None

NS_MATVEC = (512, 1024, 2048, 4096)
NS_CAUSAL = (512, 2048, 8192)
NS_MIXERS = (512, 1024, 2048, 4096, 8192)
MATVEC_BATCH, MATVEC_CHANNELS = 8, 16
MIXER_BATCH, MIXER_CHANNELS = 4, 64
SKI_RANK, SKI_FILTER = 64, 32
THIS = Path(__file__).resolve()


def _goal(case: str, n: int) -> tuple[Optional[str], Optional[float]]:
    """(goal text, minimal speedup) for the rows that carry a goal."""
    if case == "matvec" and n == 4096:
        return ">= 20x faster than dense at n = 4096", 20.0
    if case == "ski_bidirectional" and n == 4096:
        return ">= 2x faster than TNO (fwd+bwd) at n = 4096", 2.0
    if case == "fd_bidirectional" and n == 2048:
        return "faster than TNO (fwd+bwd) at n = 2048 (paper: 10-15 %)", 1.0
    if case == "fd_causal" and n == 2048:
        return ">= 1.1x the causal TNO (fwd+bwd) at n = 2048", 1.1
    return None, None


def _row(
    case: str, n: int, shape: str, ours: str, ours_t: dict[str, float], ref: str,
    ref_t: dict[str, float], anchor: Optional[tuple[str, dict[str, float]]] = None,
) -> dict[str, Any]:
    """One results row; times are medians (``*_iqr_s``: interquartile range, ``*_min_s``:
    fastest repeat). ``anchor``: (name, times) of the third-party column, if any."""
    goal, need = _goal(case, n)
    speedup = ref_t["median_s"] / ours_t["median_s"]
    row = {
        "case": case,
        "n": n,
        "shape": shape,
        "ours": ours,
        "ours_s": ours_t["median_s"],
        "ours_iqr_s": ours_t["iqr_s"],
        "ref": ref,
        "ref_s": ref_t["median_s"],
        "ref_iqr_s": ref_t["iqr_s"],
        "speedup": speedup,
        "goal": goal,
        "goal_met": None if need is None else bool(speedup >= need if need > 1 else speedup > need),
        "ours_min_s": ours_t["min_s"],
        "ref_min_s": ref_t["min_s"],
        "ours_wall_s": ours_t["wall_median_s"],
        "ref_wall_s": ref_t["wall_median_s"],
        "clock": CLOCK["name"],
        "speedup_of_min": ref_t["min_s"] / ours_t["min_s"],
        "anchor": None,
        "anchor_s": None,
        "anchor_iqr_s": None,
        "speedup_vs_anchor": None,
    }
    if anchor is not None:
        name, times = anchor
        row.update(anchor=name, anchor_s=times["median_s"], anchor_iqr_s=times["iqr_s"],
                   speedup_vs_anchor=times["median_s"] / ours_t["median_s"])
    return row


#: The clock of the medians: ``"cpu"`` (CPU time of the calling thread, the default with
#: one thread) or ``"wall"``; set by :func:`main`.
CLOCK = {"name": "cpu"}


def _time_shuffled(
    fns: dict[str, Callable[[], Any]], repeats: int, seed: int
) -> dict[str, dict[str, float]]:
    """Like :func:`_harness.time_interleaved`, with the order shuffled every round.

    On a shared machine a call's time depends on what ran just before it (allocator and
    cache state); a fixed order would give some methods a systematic handicap. One
    warm-up call each (``first_s``), then ``repeats`` rounds in a seeded random order.
    With one thread all the work runs in the calling thread, and its CPU time
    (``time.thread_time``) leaves out the time the thread waits for a core that other
    jobs hold -- on a 2-core machine shared by several jobs, most of the wall time. The
    summary is of that clock (``CLOCK``); ``wall_median_s`` is the wall-clock median.
    """
    use_cpu = CLOCK["name"] == "cpu"
    out: dict[str, dict[str, float]] = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        out[name] = {"first_s": time.perf_counter() - t0}
    rng = random.Random(seed)
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        rng.shuffle(names)
        for name in names:
            c0, t0 = time.thread_time(), time.perf_counter()
            fns[name]()
            t1, c1 = time.perf_counter(), time.thread_time()
            samples[name].append(c1 - c0 if use_cpu else t1 - t0)
            wall[name].append(t1 - t0)
    for name, values in samples.items():
        out[name].update(summarize(values))
        out[name]["wall_median_s"] = summarize(wall[name])["median_s"]
    return out


# --------------------------------------------------------------------------------------
# The scipy anchor
# --------------------------------------------------------------------------------------


def _scipy_conv(fn_name: str, rows: Any, kernel: Any, n: int, threads: int) -> Any:
    """``y[..., :n]`` of the full convolution of ``rows (.., c, n)`` with ``kernel (1, c, k)``
    along the last axis, for ``kernel`` holding the causal lags 0..k-1."""
    fn = getattr(scipy.signal, fn_name)
    with scipy.fft.set_workers(threads):
        return fn(rows, kernel, mode="full", axes=-1)[..., :n]


def _scipy_anchor(
    coeffs: torch.Tensor, x: torch.Tensor, threads: int
) -> dict[str, Callable[[], Any]]:
    """fftconvolve and oaconvolve on the causal ``coeffs (c, n)`` and ``x (b, n, c)``,
    checked against ours; inputs laid out before timing (the anchor's best case)."""
    n = x.shape[-2]
    rows = np.ascontiguousarray(x.detach().transpose(-1, -2).numpy())
    kernel = np.ascontiguousarray(coeffs.detach().numpy()[None])
    want = toeplitz_matvec(coeffs.detach(), x.detach(), causal=True).transpose(-1, -2).numpy()
    fns = {}
    for name in ("fftconvolve", "oaconvolve"):
        got = _scipy_conv(name, rows, kernel, n, threads)
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        if err > 1e-4:
            raise AssertionError(f"scipy.signal.{name} and ours disagree at n = {n}: {err:.2e}")
        fns[name] = lambda name=name: _scipy_conv(name, rows, kernel, n, threads)
    return fns


def _best_anchor(times: dict[str, dict[str, float]]) -> tuple[str, dict[str, float]]:
    name = min(("fftconvolve", "oaconvolve"), key=lambda k: times[k]["median_s"])
    return f"scipy.signal.{name} (forward)", times[name]


# --------------------------------------------------------------------------------------
# The measured workloads (shared by the timing run and the memory workers)
# --------------------------------------------------------------------------------------


def _matvec_inputs(n: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n + (1 if causal else 0))
    coeffs = torch.randn(MATVEC_CHANNELS, n if causal else 2 * n - 1, generator=gen)
    x = torch.randn(MATVEC_BATCH, n, MATVEC_CHANNELS, generator=gen)
    return coeffs, x


def _mixers(n: int) -> dict[str, torch.nn.Module]:
    d = MIXER_CHANNELS
    gen = torch.Generator().manual_seed(n)
    return {
        "tno": TNO(d, generator=gen),
        "tno_causal": TNO(d, causal=True, generator=gen),
        "ski": SKITNO(d, rank=SKI_RANK, filter_size=SKI_FILTER, generator=gen),
        "ski_dense": SKITNO(d, rank=SKI_RANK, filter_size=SKI_FILTER, low_rank="dense",
                            generator=gen),
        "fd": FDTNO(d, generator=gen),
        "fd_causal": FDTNO(d, causal=True, generator=gen),
    }


def _mixer_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n + 7)
    x = torch.randn(MIXER_BATCH, n, MIXER_CHANNELS, generator=gen).requires_grad_()
    grad = torch.randn(MIXER_BATCH, n, MIXER_CHANNELS, generator=gen)
    return x, grad


def _fwd_bwd(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], Any]:
    params = list(module.parameters())

    def run() -> Any:
        return torch.autograd.grad(module(x), [x] + params, grad)

    return run


def _forward(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], Any]:
    def run() -> Any:
        with torch.no_grad():
            return module(x)

    return run


# --------------------------------------------------------------------------------------
# (a), (b), (c)
# --------------------------------------------------------------------------------------


def bench_matvec(n: int, repeats: int) -> dict[str, Any]:
    coeffs, x = _matvec_inputs(n, causal=False)
    dense = toeplitz_dense(coeffs)  # (c, n, n), built once: not timed
    x_dense = x.permute(2, 1, 0).contiguous()  # (c, n, b): the layout matmul wants
    ours = toeplitz_matvec(coeffs, x)
    ref = torch.matmul(dense, x_dense).permute(2, 1, 0)
    err = float((ours - ref).abs().max() / ref.abs().max())
    if err > 1e-4:
        raise AssertionError(f"FFT and dense products disagree at n = {n}: relative error {err:.2e}")
    times = _time_shuffled(
        {"fft": lambda: toeplitz_matvec(coeffs, x), "dense": lambda: torch.matmul(dense, x_dense)},
        repeats, seed=n,
    )
    del dense
    b, c = MATVEC_BATCH, MATVEC_CHANNELS
    return _row(
        "matvec", n, f"coeffs ({c}, {2 * n - 1}), x ({b}, {n}, {c})",
        "toeplitz_matvec (rFFT, circulant embedding)", times["fft"],
        "dense per-channel T @ x (T prebuilt)", times["dense"],
    )


def bench_matvec_causal(n: int, repeats: int, threads: int) -> Optional[dict[str, Any]]:
    if SCIPY is None:
        print(f"  matvec_causal n={n}: scipy not installed, row skipped")
        return None
    coeffs, x = _matvec_inputs(n, causal=True)
    fns = {"fft": lambda: toeplitz_matvec(coeffs, x, causal=True)}
    fns.update(_scipy_anchor(coeffs, x, threads))
    times = _time_shuffled(fns, repeats, seed=n)
    name, best = _best_anchor(times)
    b, c = MATVEC_BATCH, MATVEC_CHANNELS
    row = _row(
        "matvec_causal", n, f"coeffs ({c}, {n}), x ({b}, {n}, {c}), forward",
        "toeplitz_matvec causal (rFFT)", times["fft"], name, best,
    )
    row["scipy_fftconvolve_s"] = times["fftconvolve"]["median_s"]
    row["scipy_oaconvolve_s"] = times["oaconvolve"]["median_s"]
    return row


def bench_mixers(n: int, repeats: int, threads: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    d, b = MIXER_CHANNELS, MIXER_BATCH
    x, grad = _mixer_inputs(n)
    mods = _mixers(n)
    fns: dict[str, Callable[[], Any]] = {k: _fwd_bwd(m, x, grad) for k, m in mods.items()}
    for k in ("tno", "tno_causal", "fd", "fd_causal"):
        fns[k + "_fwd"] = _forward(mods[k], x)
    # (d): the shared product alone, and the RPE MLP alone (forward + backward)
    length = fft_length(n)
    gen = torch.Generator().manual_seed(n + 11)
    spectrum = torch.randn(d, length // 2 + 1, dtype=torch.complex64, generator=gen)
    spectrum.requires_grad_()
    fns["product"] = lambda: torch.autograd.grad(
        _apply_spectrum(spectrum, x, length), [x, spectrum], grad)
    rpe = mods["fd_causal"].rpe
    feats = _frequency_features(n, "omega", torch.float32, torch.device("cpu"))
    rpe_grad = torch.randn(n + 1, d, generator=gen)
    fns["rpe"] = lambda: torch.autograd.grad(rpe(feats), list(rpe.parameters()), rpe_grad)
    anchors: dict[str, tuple[str, str]] = {}
    if SCIPY is not None:
        for k in ("fd_causal",):
            with torch.no_grad():
                coeffs = mods[k].toeplitz_coeffs(n)
            for name, fn in _scipy_anchor(coeffs, x, threads).items():
                fns[f"{k}_{name}"] = fn
    t = _time_shuffled(fns, repeats, seed=n)
    shape = f"x ({b}, {n}, {d}), fwd+bwd"
    fwd_shape = f"x ({b}, {n}, {d}), forward"
    ski = f"SKI-TNO r={SKI_RANK} m={SKI_FILTER}"
    causal_anchor = None
    if SCIPY is not None:
        causal_anchor = _best_anchor({name: t[f"fd_causal_{name}"]
                                      for name in ("fftconvolve", "oaconvolve")})
        causal_anchor = (causal_anchor[0] + " of the FD-TNO kernel", causal_anchor[1])
    rows = [
        _row("ski_bidirectional", n, shape, f"{ski} (sparse W)", t["ski"], "TNO bidirectional",
             t["tno"]),
        _row("ski_dense_bidirectional", n, shape, f"{ski} (dense W)", t["ski_dense"],
             "TNO bidirectional", t["tno"]),
        _row("fd_bidirectional", n, shape, "FD-TNO bidirectional", t["fd"], "TNO bidirectional",
             t["tno"]),
        _row("fd_causal", n, shape, "FD-TNO causal", t["fd_causal"], "TNO causal",
             t["tno_causal"]),
        _row("fd_bidirectional_forward", n, fwd_shape, "FD-TNO bidirectional", t["fd_fwd"],
             "TNO bidirectional", t["tno_fwd"]),
        _row("fd_causal_forward", n, fwd_shape, "FD-TNO causal", t["fd_causal_fwd"],
             "TNO causal", t["tno_causal_fwd"], anchor=causal_anchor),
    ]
    product, rpe_s = t["product"]["median_s"], t["rpe"]["median_s"]
    tno_s, fd_s = t["tno_causal"]["median_s"], t["fd_causal"]["median_s"]
    limit = {
        "n": n,
        "tno_causal_s": tno_s,
        "fd_causal_s": fd_s,
        "product_s": product,
        "rpe_s": rpe_s,
        "tno_causal_kernel_side_s": tno_s - product,
        "fd_causal_kernel_side_s": fd_s - product,
        # beyond the RPE: the TNO's kernel FFT (+ decay bias), the FD-TNO's Hilbert projection
        "tno_kernel_transform_s": tno_s - product - rpe_s,
        "fd_projection_s": fd_s - product - rpe_s,
        # what the projection may cost for FD-TNO >= 1.1x TNO, the rest unchanged
        "fd_projection_budget_for_1_1x_s": tno_s / 1.1 - product - rpe_s,
        "best_possible_fd_causal_speedup": tno_s / (product + rpe_s),
    }
    return rows, limit


# --------------------------------------------------------------------------------------
# Peak memory, one fresh process per method
# --------------------------------------------------------------------------------------


def _memory_call(kind: str, n: int, threads: int) -> Callable[[], Any]:
    """The call whose extra peak memory a worker measures (inputs built outside it)."""
    if kind in ("matvec_fft", "matvec_dense"):
        coeffs, x = _matvec_inputs(n, causal=False)
        if kind == "matvec_fft":
            return lambda: toeplitz_matvec(coeffs, x)
        return lambda: torch.matmul(toeplitz_dense(coeffs), x.permute(2, 1, 0))
    if kind in ("causal_fft", "causal_fftconvolve", "causal_oaconvolve"):
        coeffs, x = _matvec_inputs(n, causal=True)
        if kind == "causal_fft":
            return lambda: toeplitz_matvec(coeffs, x, causal=True)
        return _scipy_anchor(coeffs, x, threads)[kind.split("_")[1]]
    mixer = kind.removeprefix("mixer_")
    x, grad = _mixer_inputs(n)
    return _fwd_bwd(_mixers(n)[mixer], x, grad)


def _memory_worker(kind: str, n: int, threads: int) -> None:
    torch.set_num_threads(threads)
    print(json.dumps({"peak_mb": peak_memory_of_call(_memory_call(kind, n, threads))}))


def _peak_mb(kind: str, n: int, threads: int) -> Optional[float]:
    out = run_worker(THIS, ["--memory-worker", kind, str(n), "--threads", str(threads)],
                     for_memory=True)
    return out["peak_mb"]


def add_memory(rows: list[dict[str, Any]], threads: int) -> None:
    """``ours_peak_mb`` and ``ref_peak_mb`` of every row (and ``anchor_peak_mb``)."""
    mixer_of = {"ski_bidirectional": ("ski", "tno"), "ski_dense_bidirectional": ("ski_dense", "tno"),
                "fd_bidirectional": ("fd", "tno"), "fd_causal": ("fd_causal", "tno_causal")}
    cache: dict[tuple[str, int], Optional[float]] = {}

    def peak(kind: str, n: int) -> Optional[float]:
        if (kind, n) not in cache:
            cache[kind, n] = _peak_mb(kind, n, threads)
        return cache[kind, n]

    for row in rows:
        case, n = row["case"], row["n"]
        if case == "matvec":
            row["ours_peak_mb"], row["ref_peak_mb"] = peak("matvec_fft", n), peak("matvec_dense", n)
        elif case == "matvec_causal":
            anchor = "causal_" + row["ref"].split(".")[-1].split(" ")[0]
            row["ours_peak_mb"], row["ref_peak_mb"] = peak("causal_fft", n), peak(anchor, n)
        elif case in mixer_of:
            ours, ref = mixer_of[case]
            row["ours_peak_mb"] = peak("mixer_" + ours, n)
            row["ref_peak_mb"] = peak("mixer_" + ref, n)
        print(f"  memory {case} n={n}: ours {row.get('ours_peak_mb')} MiB, "
              f"ref {row.get('ref_peak_mb')} MiB", flush=True)


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _fmt_s(v: Optional[float], iqr: Optional[float] = None) -> str:
    if v is None:
        return "—"
    text = f"{v * 1e3:.2f} ms"
    return text if iqr is None else text + f" (IQR {iqr * 1e3:.2f})"


def anchor_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | n | ours | ours time | anchor | anchor time | anchor / ours |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("anchor") is None and r["case"] != "matvec_causal":
            continue
        name, a_s, a_iqr = ((r["anchor"], r["anchor_s"], r["anchor_iqr_s"]) if r.get("anchor")
                            else (r["ref"], r["ref_s"], r["ref_iqr_s"]))
        lines.append(f"| {r['case']} | {r['n']} | {r['ours']} | {_fmt_s(r['ours_s'], r['ours_iqr_s'])} "
                     f"| {name} | {_fmt_s(a_s, a_iqr)} | {a_s / r['ours_s']:.2f}x |")
    return "\n".join(lines)


def limits_table(limits: list[dict[str, Any]]) -> str:
    lines = ["| n | TNO causal | FD-TNO causal | product with x (shared) | RPE MLP | "
             "TNO kernel FFT | FD-TNO Hilbert projection | projection budget for 1.1x | "
             "best possible FD/TNO |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in limits:
        lines.append(
            f"| {m['n']} | {_fmt_s(m['tno_causal_s'])} | {_fmt_s(m['fd_causal_s'])} | "
            f"{_fmt_s(m['product_s'])} | {_fmt_s(m['rpe_s'])} | "
            f"{_fmt_s(m['tno_kernel_transform_s'])} | {_fmt_s(m['fd_projection_s'])} | "
            f"{_fmt_s(m['fd_projection_budget_for_1_1x_s'])} | "
            f"{m['best_possible_fd_causal_speedup']:.2f}x |")
    return "\n".join(lines)


NOTES = """
Times are medians (IQR in parentheses), on the clock named under Machine (one thread:
the CPU time of the thread, since other jobs share the two cores; the wall-clock medians
are in the JSON as `*_wall_s`), of interleaved repeats in a new random order every
round, after one warm-up call, float32, one process. matvec: ours is the full
`toeplitz_matvec` call; the dense matrices (16 x n x n) are built before timing and x is
pre-permuted for `torch.matmul`. matvec_causal and the forward rows of FD-TNO: the anchor
is the faster of `scipy.signal.fftconvolve` and `oaconvolve` (forward only, x pre-laid
out as (batch, channels, n)); for FD-TNO it convolves with the layer's kernel computed
before timing, so it omits the RPE MLP that ours includes. Token mixers: forward plus
gradients with respect to the input and all parameters (fwd+bwd) or the forward pass
under `torch.no_grad` (forward); batch 4, d = 64 channels; TNO and FD-TNO use the same
RPE MLP (width 32, 3 hidden layers, layer norm, ReLU); SKI-TNO r = 64, m = 32.
speedup = reference time / our time (> 1: ours is faster). Peak MiB: extra peak RSS of
one call over the resident inputs, each method in a fresh process (malloc's mmap
threshold at 1 MiB so that freed buffers leave the RSS); for dense, the call builds the
matrices.

Where the time goes (table "limits"): every FFT mixer shares the product with x (an rFFT
and an irFFT of the batch forward, two more backward). The causal TNO and the causal
FD-TNO both evaluate the same RPE MLP at about n points; beyond that the TNO takes one
FFT of the d kernels (and its adjoint backward), the FD-TNO an inverse and a forward FFT
for the Hilbert projection (and two backward). "TNO kernel FFT" and "FD-TNO Hilbert
projection" are each layer's time minus the product and the RPE (both timed alone in
the same interleaved run; differences of noisy medians, so small ones can even come out
negative); "projection budget for 1.1x" is what the projection may cost for the FD-TNO
to be 1.1 times as fast as the TNO; "best possible" is the speedup of a free projection.
The projection transforms real, even data at the same lengths as the TNO's kernel FFT,
twice each way: its FFT work is at least that of the TNO's kernel FFT, so a budget far
below the "TNO kernel FFT" column rules the goal out on this machine.
"""


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="n in {512, 1024} (causal: 512), 3 repeats, no memory, no files")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads and scipy workers (default 1)")
    parser.add_argument("--memory-worker", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--clock", choices=("cpu", "wall"), default=None,
                        help="clock of the medians: CPU time of the thread (default with "
                        "--threads 1) or wall time (default otherwise)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    CLOCK["name"] = args.clock or ("cpu" if args.threads == 1 else "wall")
    if CLOCK["name"] == "cpu" and args.threads > 1:
        parser.error("--clock cpu needs --threads 1 (it counts the calling thread only)")
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        _memory_worker(args.memory_worker[0], int(args.memory_worker[1]), args.threads)
        return 0
    ns_matvec = NS_MATVEC[:2] if args.quick else NS_MATVEC
    ns_causal = NS_CAUSAL[:1] if args.quick else NS_CAUSAL
    ns_mixers = NS_MIXERS[:2] if args.quick else NS_MIXERS
    repeats = 3 if args.quick else 31
    torch.manual_seed(0)  # nothing below uses it; fixes any library-internal randomness
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    machine = machine_info(load_average_1_5_15min=load, scipy=SCIPY or "not installed")
    machine["torch_threads"] = torch.get_num_threads()
    machine["clock"] = ("CPU time of the calling thread (time.thread_time)" if CLOCK["name"] == "cpu"
                        else "wall time (time.perf_counter)")
    print(f"torch {machine['torch']}, threads {machine['torch_threads']}, {machine['cpu']}, "
          f"scipy {machine['scipy']}")
    if SCIPY is None:
        print("scipy not installed: the anchor column and the matvec_causal rows are skipped")
    rows: list[dict[str, Any]] = []
    for n in ns_matvec:
        row = bench_matvec(n, repeats)
        rows.append(row)
        print(f"  matvec n={n}: fft {_fmt_s(row['ours_s'])}, dense {_fmt_s(row['ref_s'])}, "
              f"{row['speedup']:.1f}x", flush=True)
    for n in ns_causal:
        row = bench_matvec_causal(n, repeats, args.threads)
        if row is not None:
            rows.append(row)
            print(f"  matvec_causal n={n}: fft {_fmt_s(row['ours_s'])}, {row['ref']} "
                  f"{_fmt_s(row['ref_s'])}, {row['speedup']:.2f}x", flush=True)
    limits = []
    for n in ns_mixers:
        mixer_rows, limit = bench_mixers(n, repeats, args.threads)
        limits.append(limit)
        for row in mixer_rows:
            rows.append(row)
            print(f"  {row['case']} n={n}: {row['ours']} {_fmt_s(row['ours_s'])}, {row['ref']} "
                  f"{_fmt_s(row['ref_s'])}, {row['speedup']:.2f}x", flush=True)
    if not args.quick:
        add_memory(rows, args.threads)
    table = markdown_table(rows, size_key="n", fastest=True, memory=not args.quick, ms_decimals=2)
    anchors = anchor_table(rows)
    limit_md = limits_table(limits)
    print(table, anchors, limit_md, sep="\n\n")
    for r in rows:
        if r["goal_met"] is False:
            print(f"GOAL NOT MET: {r['case']} n={r['n']}: {r['goal']} (speedup {r['speedup']:.2f}x)")
    if args.quick:
        return 0
    if hasattr(os, "getloadavg"):
        machine["load_average_at_end"] = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "toeplitz", "machine": machine, "rows": rows, "limits": limits}
    _atomic_write(RESULTS_DIR / "bench_toeplitz.json", json.dumps(payload, indent=2) + "\n")
    info = ", ".join(f"{k}: {v}" for k, v in machine.items())
    verdict = "\n".join(
        f"- goal {'met' if r['goal_met'] else 'NOT met'}: {r['case']} at n = {r['n']}, "
        f"{r['goal']}: {r['speedup']:.2f}x"
        for r in rows
        if r["goal_met"] is not None
    )
    _atomic_write(
        RESULTS_DIR / "bench_toeplitz.md",
        f"# Benchmark `toeplitz`\n\nMachine: {info}\n\n{table}\n\n{verdict}\n\n"
        f"## Against the strongest third-party convolution (scipy)\n\n{anchors}\n\n"
        f"## Limits: where the causal mixers' time goes (fwd+bwd)\n\n{limit_md}\n\n"
        f"{NOTES.strip()}\n",
    )
    print(f"wrote {RESULTS_DIR / 'bench_toeplitz.json'} and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
