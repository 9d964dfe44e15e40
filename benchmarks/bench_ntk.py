"""Speed of ``kernels.ntk`` against neural-tangents on the same machine, in the same run.

    python -m benchmarks.bench_ntk          # full sizes -> benchmarks/results/bench_ntk.{json,md}
    python -m benchmarks.bench_ntk --quick   # small sizes, prints only (``--out DIR`` to write)

Cases (chapter 1, chapters/01_ntk.ipynb, reads the results file):

(a) ``empirical_ntk`` of an MLP with 3 hidden ReLU layers of width 512 (NTK
    parametrization, scalar output) on 256 inputs of dimension 64, float32 on both
    sides, ``x2=None``. Ours: each method (``gram`` is what ``method="auto"`` picks for
    this network). Reference: ``neural_tangents.empirical_ntk_fn`` under ``jax.jit``,
    implementations 1 (Jacobian contraction) and 2 (NTK-vector products); 3 and AUTO
    are broken with the pinned versions. ``gram`` is compared with the faster of 1 and
    2; ``jacobian`` and ``jvp`` with the neural-tangents implementation of the same
    algorithm (1 and 2 respectively).
(b) ``fc_kernel`` (NNGP and NTK, depth 3, ReLU) on 2000 inputs of dimension 64 against
    ``stax`` ``kernel_fn(x, None, ("nngp", "ntk"))`` under ``jax.jit``: once with float32
    inputs and outputs (neural-tangents computes in float32, ``fc_kernel`` always in
    float64), once in float64 on both sides (jax x64).
(c) The empirical NTK of a transformer FFN block with MiniLM's shapes (chapter 6): 16
    sentences of 24 tokens, hidden size 384, FFN 384 -> 1536 -> 384 with GELU, a residual
    connection and a frozen LayerNorm, mean pooling over tokens and a fixed readout
    vector; only the FFN's two ``nn.Linear`` layers train (1.18 M parameters), float32.
    Ours: ``linear_gram_ntk`` (the per-layer Gram trick through forward hooks).
    Reference: ``torch.func`` Jacobian contraction (``vmap(jacrev)`` over the sentences,
    then one contraction per parameter tensor: ``kernels.ntk._func_jacobian_ntk``, the
    generic part of ``empirical_ntk(method="jacobian")``, which takes every parameter
    here). Also timed, not a goal: ``empirical_ntk(method="jacobian")`` itself, whose
    per-layer path forms these two layers' Jacobian rows from hooks (``jacobian``); the
    part of ``linear_gram_ntk`` before its Gram products, the forward pass and the
    backward pass to the layers' outputs with the model's linear layers on oneDNN
    (``passes``); torch's own forward and backward pass with the weights' gradients
    (``fwd_bwd``).

(d) The GEMM floor of the ``jacobian`` method: :math:`J J^\\top` for a random float32
    ``J`` of the MLP's Jacobian shape (256 x 559,105), and for one column block of the
    per-layer path (256 x 8,192), by ``torch.mm`` (MKL here), by oneDNN
    (``kernels.ntk._gemm_nt``, what ``empirical_ntk`` uses for float32 on the CPU) and
    by ``jnp.dot`` under ``jax.jit``. Not a goal: it says which GEMM each side runs on.

Every timing worker also reports the process CPU time of ``min(3, repeats)`` more calls
per implementation (median): on a machine shared with other jobs the wall-clock time
of a one-thread call includes waits for the core, its CPU time does not.

Threads: every worker runs torch with ``--threads`` threads (default 1) and XLA with
its Eigen pool off and ``intra_op_parallelism_threads`` set to the same number
(``XLA_FLAGS``), so both sides get the same cores. When neural-tangents (or jax) is
not installed, its rows are reported as "not installed" and skipped.

Timing and memory conventions are those of ``benchmarks/_harness.py``: medians of
interleaved repeats after a warm-up call; the warm-up (jit compilation for
neural-tangents) is reported separately; peak memory is the extra resident memory of
one steady-state call, measured in a fresh process per implementation. Each timing
group also checks that ours and the reference agree on the benchmark inputs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve()

from benchmarks._harness import (
    RESULTS_DIR,
    limit_cpus,
    machine_info,
    markdown_table,
    peak_memory_of_call,
    run_worker,
    time_interleaved,
    write_results,
)

SIZES = {
    "full": dict(n=256, d=64, width=512, depth=3, n_kernel=2000, repeats=9,
                 ffn_n=16, ffn_tokens=24, ffn_p=384, ffn_inner=1536),
    "quick": dict(n=64, d=16, width=128, depth=3, n_kernel=300, repeats=3,
                  ffn_n=8, ffn_tokens=12, ffn_p=96, ffn_inner=384),
}

#: Idle seconds before each timed call (see ``_harness.time_interleaved``).
PAUSE_S = 0.25

#: Implementations per timing group; "nt*" ones need neural-tangents.
GROUPS = {
    "empirical": ["gram", "jacobian", "jvp", "nt1", "nt2"],
    "kernel32": ["fc_kernel", "nt_kernel_fn"],
    "kernel64": ["fc_kernel", "nt_kernel_fn"],
    "ffn": ["linear_gram", "funcjac", "jacobian", "passes", "fwd_bwd"],
    "gemm": ["torch_full", "onednn_full", "nt_xla_full", "torch_block", "onednn_block",
             "nt_xla_block"],
}
#: Columns of the "block" GEMM shape of case (d): one 8 MiB block of 256 rows.
GEMM_BLOCK_COLS = 8192
#: Groups that are only timed (no peak memory, no agreement check).
TIMING_ONLY = ("gemm",)


def _nt_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("jax", "neural_tangents"))


def _groups() -> dict[str, list[str]]:
    """``GROUPS`` without the neural-tangents implementations when it is not installed."""
    if _nt_installed():
        return GROUPS
    out = {g: [i for i in impls if not i.startswith("nt")] for g, impls in GROUPS.items()}
    return {g: impls for g, impls in out.items() if len(impls) > 1}


def _thread_env(threads: int) -> dict[str, str]:
    return {
        "OMP_NUM_THREADS": str(threads),
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={threads}",
    }


def _ffn_model(size: dict[str, int]):
    """The chapter-6 FFN block (see case (c)) and its inputs, float32."""
    import torch
    from torch import nn

    p, inner = size["ffn_p"], size["ffn_inner"]
    gen = torch.Generator().manual_seed(0)

    class FFNBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear1, self.linear2 = nn.Linear(p, inner), nn.Linear(inner, p)
            self.norm = nn.LayerNorm(p)
            self.register_buffer("readout", torch.randn(p, generator=gen) / p**0.5)
            with torch.no_grad():  # the same weights in every worker
                for lin in (self.linear1, self.linear2):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / lin.in_features**0.5)
                    lin.bias.copy_(0.1 * torch.randn(lin.bias.shape, generator=gen))
            for prm in self.norm.parameters():
                prm.requires_grad_(False)

        def forward(self, h):  # (n, T, p) -> (n,)
            h = self.norm(h + self.linear2(nn.functional.gelu(self.linear1(h))))
            return h.mean(1) @ self.readout

    model = FFNBlock()
    x = torch.randn(size["ffn_n"], size["ffn_tokens"], p, generator=gen)
    return model, x


def _inputs(n: int, d: int, seed: int, dtype: str):
    import numpy as np

    return np.random.RandomState(seed).standard_normal((n, d)).astype(dtype)


def build(group: str, impl: str, size: dict[str, int]) -> Callable[[], Any]:
    """A zero-argument callable that runs ``impl`` once and blocks on its result."""
    import torch

    from kernels.ntk import empirical_ntk, fc_kernel, fc_network

    if group == "ffn":
        from kernels.ntk import linear_gram_ntk

        model, x = _ffn_model(size)
        if impl == "linear_gram":
            return lambda: linear_gram_ntk(model, x)
        if impl == "fwd_bwd":  # torch's own forward and backward pass, with the weights' gradients
            trainable = [prm for prm in model.parameters() if prm.requires_grad]
            return lambda: torch.autograd.grad(model(x).sum(), trainable)
        if impl == "passes":  # the part of linear_gram_ntk before its Gram products
            from kernels.ntk import _call_model, _linear_gram_owners, _linear_records

            layers = _linear_gram_owners(model)
            return lambda: _linear_records(model, layers, _call_model, x)

        class Flat(torch.nn.Module):  # empirical_ntk takes (n, d) inputs
            def __init__(self):
                super().__init__()
                self.inner = model

            def forward(self, flat):
                return self.inner(flat.reshape(flat.shape[0], *x.shape[1:]))

        flat_model, flat_x = Flat(), x.reshape(x.shape[0], -1)
        if impl == "jacobian":
            return lambda: empirical_ntk(flat_model, flat_x, method="jacobian")
        from kernels.ntk import _func_jacobian_ntk

        trainable = {n: prm for n, prm in flat_model.named_parameters() if prm.requires_grad}
        return lambda: _func_jacobian_ntk(flat_model, trainable, flat_x, None, (), None)

    if group == "gemm":
        import numpy as np

        cols = _mlp_param_count(size) if impl.endswith("_full") else GEMM_BLOCK_COLS
        j_np = np.random.RandomState(2).standard_normal((size["n"], cols)).astype("float32")
        if impl.startswith("nt_xla"):
            import jax

            dot = jax.jit(lambda a: a @ a.T)
            jj = jax.numpy.asarray(j_np)
            return lambda: dot(jj).block_until_ready()
        j = torch.from_numpy(j_np)
        if impl.startswith("onednn"):
            from kernels.ntk import _gemm_nt

            return lambda: _gemm_nt(j, j)
        return lambda: torch.mm(j, j.T)

    if group == "empirical":
        x_np = _inputs(size["n"], size["d"], 0, "float32")
        net = fc_network(
            size["d"], size["width"], size["depth"], 1,
            generator=torch.Generator().manual_seed(0), dtype=torch.float32,
        )
        if impl in ("gram", "jacobian", "jvp"):
            x = torch.from_numpy(x_np)
            return lambda: empirical_ntk(net, x, method=impl)
        import jax
        import neural_tangents as nt

        apply_fn, params = _nt_mlp(net, size)
        kernel_fn = jax.jit(
            nt.empirical_ntk_fn(apply_fn, vmap_axes=0, implementation=int(impl[-1]))
        )
        xj = jax.numpy.asarray(x_np)
        return lambda: kernel_fn(xj, None, params).block_until_ready()

    dtype = "float32" if group == "kernel32" else "float64"
    x_np = _inputs(size["n_kernel"], size["d"], 1, dtype)
    if impl == "fc_kernel":
        x = torch.from_numpy(x_np)
        return lambda: fc_kernel(x, depth=size["depth"])
    import jax
    from neural_tangents import stax

    if dtype == "float64" and not jax.config.jax_enable_x64:
        raise RuntimeError("kernel64 needs JAX_ENABLE_X64=1")
    layers = []
    for _ in range(size["depth"]):
        layers += [stax.Dense(size["width"]), stax.Relu()]
    layers.append(stax.Dense(1))
    kernel_fn = jax.jit(stax.serial(*layers)[2], static_argnames="get")
    xj = jax.numpy.asarray(x_np)

    def run():
        out = kernel_fn(xj, None, ("nngp", "ntk"))
        out.ntk.block_until_ready()
        return out

    return run


def _mlp_param_count(size: dict[str, int]) -> int:
    """Parameters of case (a)'s MLP: the column count of its Jacobian."""
    d, w, depth = size["d"], size["width"], size["depth"]
    return (d + 1) * w + (depth - 1) * (w + 1) * w + (w + 1)


def _nt_mlp(net, size):
    """neural-tangents twin of ``net`` with the same weights (NT Dense: W (in, out))."""
    import jax.numpy as jnp
    from neural_tangents import stax

    from kernels.ntk import NTKLinear

    layers = []
    for _ in range(size["depth"]):
        layers += [stax.Dense(size["width"], 1.0, 0.0), stax.Relu()]
    layers.append(stax.Dense(1, 1.0, 0.0))
    _, apply_fn, _ = stax.serial(*layers)
    params = []
    for layer in net:
        if isinstance(layer, NTKLinear):
            params.append(
                (
                    jnp.asarray(layer.weight.detach().numpy().T),
                    jnp.asarray(layer.bias.detach().numpy()[None, :]),
                )
            )
        else:
            params.append(())
    return apply_fn, params


def _agreement(group: str, fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Max relative difference of each implementation from the first reference one."""
    import numpy as np

    def as_np(value):
        if hasattr(value, "ntk"):  # kernel results: compare the NTK
            value = value.ntk
        if hasattr(value, "detach"):
            value = value.detach().numpy()
        return np.asarray(value, dtype=np.float64)

    outs = {name: as_np(fn()) for name, fn in fns.items() if name not in ("fwd_bwd", "passes")}
    ref_name = {"empirical": "nt1", "ffn": "funcjac"}.get(group, "nt_kernel_fn")
    if ref_name not in outs:  # neural-tangents not installed: compare with "jacobian"
        ref_name = "jacobian"
    ref = outs[ref_name]
    return {
        name: float(np.abs(v.reshape(ref.shape) - ref).max() / np.abs(ref).max())
        for name, v in outs.items()
        if name != ref_name
    }


def worker_time(group: str, size: dict[str, int], repeats: int) -> dict[str, Any]:
    import statistics
    import time

    fns = {impl: build(group, impl, size) for impl in _groups()[group]}
    timings = time_interleaved(fns, repeats, pause_s=PAUSE_S)
    cpu: dict[str, list[float]] = {impl: [] for impl in fns}
    for _ in range(min(3, repeats)):
        for impl, fn in fns.items():
            time.sleep(PAUSE_S)
            t0 = time.process_time()
            fn()
            cpu[impl].append(time.process_time() - t0)
    for impl, values in cpu.items():
        timings[impl]["cpu_s"] = statistics.median(values)
    agreement = {} if group in TIMING_ONLY else _agreement(group, fns)
    return {"timings": timings, "agreement": agreement}


def _threads_used_note(timings: dict[str, Any], threads: int) -> str:
    """What the CPU time says about the threads each implementation really used: a process
    CPU time above 1.2x the wall time means more than one busy thread."""
    busy = sorted(
        f"{impl} ({tt['cpu_s'] / tt['median_s']:.1f}x)"
        for res in timings.values()
        for impl, tt in res["timings"].items()
        if tt.get("cpu_s") and tt["median_s"] > 0 and tt["cpu_s"] > 1.2 * threads * tt["median_s"]
    )
    if not busy:
        return f"Measured: every implementation's CPU time stayed within 1.2x of {threads} x its wall time."
    return (
        "Measured: process CPU time above the wall time for " + ", ".join(busy)
        + " (CPU / wall): these used more threads than set, so their wall times, and the speedups "
        "against them, favour them."
    )


def worker_memory(group: str, impl: str, size: dict[str, int]) -> dict[str, Any]:
    return {"peak_mb": peak_memory_of_call(build(group, impl, size))}


def _versions() -> dict[str, str]:
    import jax
    import neural_tangents

    return {"jax": jax.__version__, "neural_tangents": neural_tangents.__version__}


def _limits_line(timings: dict[str, Any], size: dict[str, int], nt_ok: bool) -> str:
    """The ``jacobian``/``jvp`` comparison with NT and the GEMM rates behind it."""
    if "gemm" not in timings:
        return "limits: no GEMM timings"
    g = timings["gemm"]["timings"]
    n, p = size["n"], _mlp_param_count(size)

    def rate(impl: str, cols: int) -> str:
        if impl not in g:
            return f"{impl} not run"
        t = g[impl]["median_s"]
        return f"{impl} {1e3 * t:.1f} ms = {2 * n * n * cols / t / 1e9:.0f} GFLOP/s"

    parts = [
        f"limits: GEMM J J^T (float32, one thread, medians): full ({n} x {p}): "
        + "; ".join(rate(i, p) for i in ("torch_full", "onednn_full", "nt_xla_full"))
        + f"; block ({n} x {GEMM_BLOCK_COLS}): "
        + "; ".join(rate(i, GEMM_BLOCK_COLS) for i in ("torch_block", "onednn_block", "nt_xla_block"))
        + "."
    ]
    if "onednn_block" in g:
        floor = 5 / 8 * p / GEMM_BLOCK_COLS * g["onednn_block"]["min_s"]
        parts.append(
            f" The 'jacobian' method contracts 5/8 of J J^T (row blocks on and above the "
            f"diagonal) in blocks of about {n} x {GEMM_BLOCK_COLS}: at the fastest oneDNN block "
            f"time (min, the uncontended cost) that alone takes {1e3 * floor:.0f} ms; NT "
            f"implementation 1 contracts all of it with XLA's GEMM."
        )
    emp = timings.get("empirical", {}).get("timings", {})
    if nt_ok and emp:
        for ours, ref in (("jacobian", "nt1"), ("jvp", "nt2")):
            o, r = emp[ours], emp[ref]
            parts.append(
                f" {ours}: {1e3 * o['median_s']:.0f} ms wall / {1e3 * o['cpu_s']:.0f} ms CPU vs "
                f"NT implementation {ref[-1]} {1e3 * r['median_s']:.0f} / {1e3 * r['cpu_s']:.0f} ms "
                f"({r['median_s'] / o['median_s']:.2f}x wall, {r['cpu_s'] / o['cpu_s']:.2f}x CPU)."
            )
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per case")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--threads", type=int, default=1, help="torch and XLA threads (default 1)")
    parser.add_argument("--worker", choices=["time", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--group", choices=sorted(GROUPS), help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = SIZES["quick" if args.quick else "full"]
    repeats = args.repeats or size["repeats"]
    cpus = limit_cpus(args.threads)  # inherited by every worker process

    if args.worker is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.worker == "time":
        print(json.dumps(worker_time(args.group, size, repeats)))
        return 0
    if args.worker == "memory":
        print(json.dumps(worker_memory(args.group, args.impl, size)))
        return 0

    import torch

    torch.set_num_threads(args.threads)  # as in the workers (machine_info reports it)
    common = (["--quick"] if args.quick else []) + ["--threads", str(args.threads)]
    threads_env = _thread_env(args.threads)
    x64 = {**threads_env, "JAX_ENABLE_X64": "1"}
    groups = _groups()
    nt_ok = _nt_installed()
    print(f"torch {torch.__version__}, {args.threads} thread(s) for torch and XLA in every worker, "
          f"{os.cpu_count()} logical cores")
    print(f"(a) empirical_ntk: MLP {size['d']}-" + "-".join([str(size["width"])] * size["depth"])
          + f"-1, n={size['n']}, float32")
    print(f"(b) fc_kernel: {size['n_kernel']} x {size['d']} inputs, depth {size['depth']}, relu")
    print(f"(c) FFN block NTK: {size['ffn_n']} x {size['ffn_tokens']} tokens, "
          f"{size['ffn_p']} -> {size['ffn_inner']} -> {size['ffn_p']}, float32")
    if not nt_ok:
        print("neural-tangents: not installed; its columns are skipped")

    load_start = os.getloadavg()
    timings: dict[str, Any] = {}
    for group in groups:
        env = x64 if group == "kernel64" else threads_env
        print(f"timing {group} ({repeats} interleaved repeats) ...", flush=True)
        timings[group] = run_worker(
            HERE, ["--worker", "time", "--group", group, "--repeats", str(repeats), *common], env
        )
    peaks: dict[tuple[str, str], Any] = {}
    for group, impls in groups.items():
        if group in TIMING_ONLY:
            continue
        env = x64 if group == "kernel64" else threads_env
        for impl in impls:
            print(f"peak memory {group}/{impl} ...", flush=True)
            peaks[group, impl] = run_worker(
                HERE, ["--worker", "memory", "--group", group, "--impl", impl, *common], env,
                for_memory=True,
            )["peak_mb"]

    load_end = os.getloadavg()
    rows = []
    emp = timings["empirical"]["timings"]
    mlp = (
        f"MLP {size['d']}-" + "-".join([str(size["width"])] * size["depth"])
        + f"-1 (ReLU, NTK param.), {size['n']} inputs, x2=None, float32, {args.threads} thread(s)"
    )
    nt_name = "neural_tangents.empirical_ntk_fn (jit, implementation={})"
    if nt_ok:
        best_nt = min(("nt1", "nt2"), key=lambda k: emp[k]["median_s"])
        for method, ref_impl, goal, threshold in [
            ("gram", best_nt, "speedup >= 3 vs the faster of NT implementations 1 and 2 "
             "(method='auto' picks 'gram' here)", 3.0),
            ("jacobian", "nt1", "speedup >= 1 vs NT's same algorithm (Jacobian contraction)", 1.0),
            ("jvp", "nt2", "speedup >= 1 vs NT's same algorithm (NTK-vector products)", 1.0),
        ]:
            ours_s = emp[method]["median_s"]
            ref_s = emp[ref_impl]["median_s"]
            rows.append({
                "case": "empirical_ntk",
                "shape": mlp,
                "ours": method,
                "ours_s": ours_s,
                "ours_iqr_s": emp[method].get("iqr_s"),
                "ref": nt_name.format(ref_impl[-1]),
                "ref_s": ref_s,
                "ref_iqr_s": emp[ref_impl].get("iqr_s"),
                "speedup": ref_s / ours_s,
                "ours_peak_mb": peaks["empirical", method],
                "ref_peak_mb": peaks["empirical", ref_impl],
                "goal": goal,
                "goal_met": bool(ref_s / ours_s >= threshold),
            })
        for group, label in [("kernel32", "float32"), ("kernel64", "float64")]:
            t = timings[group]["timings"]
            ours_s, ref_s = t["fc_kernel"]["median_s"], t["nt_kernel_fn"]["median_s"]
            math_note = "ours computes in float64" if label == "float32" else "both float64"
            rows.append({
                "case": "fc_kernel",
                "shape": f"{size['n_kernel']} x {size['d']} inputs, x2=None, depth {size['depth']}, "
                         f"ReLU, nngp+ntk, {label} in/out ({math_note}), {args.threads} thread(s)",
                "ours": "fc_kernel",
                "ours_s": ours_s,
                "ours_iqr_s": t["fc_kernel"].get("iqr_s"),
                "ref": f"neural_tangents.stax kernel_fn (jit, {label})",
                "ref_s": ref_s,
                "ref_iqr_s": t["nt_kernel_fn"].get("iqr_s"),
                "speedup": ref_s / ours_s,
                "ours_peak_mb": peaks[group, "fc_kernel"],
                "ref_peak_mb": peaks[group, "nt_kernel_fn"],
                "goal": "no slower than kernel_fn (speedup >= 1)",
                "goal_met": bool(ref_s / ours_s >= 1.0),
            })
    t = timings["ffn"]["timings"]
    ours_s, ref_s = t["linear_gram"]["median_s"], t["funcjac"]["median_s"]
    rows.append({
        "case": "FFN-block NTK",
        "shape": f"{size['ffn_n']} sentences x {size['ffn_tokens']} tokens, FFN {size['ffn_p']}-"
                 f"{size['ffn_inner']}-{size['ffn_p']} GELU + residual + frozen LayerNorm, mean pool, "
                 f"fixed readout; FFN trainable; float32, {args.threads} thread(s)",
        "ours": "linear_gram_ntk",
        "ours_s": ours_s,
        "ours_iqr_s": t["linear_gram"].get("iqr_s"),
        "ref": "torch.func Jacobian contraction (vmap(jacrev), one contraction per parameter tensor)",
        "ref_s": ref_s,
        "ref_iqr_s": t["funcjac"].get("iqr_s"),
        "speedup": ref_s / ours_s,
        "ours_peak_mb": peaks["ffn", "linear_gram"],
        "ref_peak_mb": peaks["ffn", "funcjac"],
        "goal": "speedup >= 5 vs torch.func Jacobian contraction",
        "goal_met": bool(ref_s / ours_s >= 5.0),
    })
    passes_s, torch_pass_s = t["passes"]["median_s"], t["fwd_bwd"]["median_s"]
    ffn_note = (
        f"FFN block: linear_gram_ntk takes {1e3 * ours_s:.1f} ms, of which {1e3 * passes_s:.1f} ms are the "
        "forward pass and the backward pass to the trainable layers' outputs that every NTK method needs "
        "(no weight gradients: the Gram trick uses each layer's inputs and output gradients; the model's "
        "nn.Linear layers run on oneDNN's GEMM, about twice torch's own float32 GEMM here, see case (d)) "
        f"and the rest the token-pair Gram products (T^2 (d_in + d_out) multiply-adds per sentence pair "
        "and layer, only the blocks on and above the diagonal for x2=None). For comparison, torch's own "
        f"forward and backward pass of the block with the weights' gradients takes {1e3 * torch_pass_s:.1f} ms, "
        "and the torch.func reference forms and contracts per-sentence weight gradients on top of it. "
        f"empirical_ntk(method='jacobian') itself, whose per-layer path forms the two layers' "
        f"per-sentence Jacobian rows from hooks, takes {1e3 * t['jacobian']['median_s']:.1f} ms."
    )

    compile_lines = []
    for group, res in timings.items():
        for impl, tt in res["timings"].items():
            compile_lines.append(
                f"| {group} | {impl} | {tt['first_s']:.3f} | {tt['median_s']:.4f} "
                f"| {tt['min_s']:.4f} | {tt['cpu_s']:.4f} |"
            )
    limits = _limits_line(timings, size, nt_ok)
    agree_lines = [
        f"| {group} | {impl} | {err:.1e} |"
        for group, res in timings.items()
        for impl, err in res["agreement"].items()
    ]
    notes = "\n".join([
        "Times are medians of interleaved repeats after one warm-up call "
        f"({repeats} repeats, {PAUSE_S} s idle before each call; `benchmarks/_harness.py`). "
        "Peak MiB: extra resident memory "
        "(peak RSS minus RSS before) of one steady-state call, measured in a fresh "
        "process per implementation, output included.",
        "",
        f"1-minute load average of the machine at the start / end of the run: "
        f"{load_start[0]:.1f} / {load_end[0]:.1f} on {os.cpu_count()} logical cores. On a "
        "shared, busy machine short torch ops suffer most (OpenMP threads wait for each "
        "other at every op), so the fast paths' medians are pessimistic there; the "
        "minima below show the uncontended cost.",
        "",
        limits,
        "",
        "First call (warm-up; jit compilation for neural-tangents) and steady state, seconds "
        "(wall clock; CPU: median process CPU time of further calls):",
        "",
        "| group | implementation | first call | median | min | CPU |",
        "|---|---|---|---|---|---|",
        *compile_lines,
        "",
        "Agreement on the benchmark inputs (max relative difference from neural-tangents "
        "implementation 1, resp. `kernel_fn`):",
        "",
        "| group | implementation | max rel. diff. |",
        "|---|---|---|",
        *agree_lines,
        "",
        ffn_note,
        "",
        "Threads: torch and XLA were both set to "
        f"{args.threads} thread(s) (torch.set_num_threads; XLA_FLAGS with the Eigen pool off), "
        f"every process {cpus}. "
        + _threads_used_note(timings, args.threads) + " "
        "The float32 `fc_kernel` difference is neural-tangents' float32 rounding, amplified "
        "by arccos near the diagonal (ours computes in float64; in float64 both agree to "
        "the digits shown).",
    ])
    print()
    print(markdown_table(rows))
    print()
    print(notes)
    print()
    print(limits)

    out_dir = args.out if args.out is not None else (None if args.quick else RESULTS_DIR)
    if out_dir is None:
        print("\nquick run: results not written (pass --out DIR to write them)")
        return 0
    machine = machine_info(**(_versions() if nt_ok else {"neural_tangents": "not installed"}))
    json_path, md_path = write_results("ntk", machine, rows, notes, out_dir)
    print(f"\nwrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
