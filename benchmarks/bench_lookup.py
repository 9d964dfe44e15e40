"""Speed of the FWHT and of LookupFFN inference on this CPU (chapter 5, Table 5/6 at our scale).

Chapter 5 (``chapters/05_lookupffn.ipynb``, section "CPU latency") reads the results file.

    python benchmarks/bench_lookup.py          # full run: results/bench_lookup.{json,md}
    python benchmarks/bench_lookup.py --quick  # 4096 tokens, three settings, prints only

What is measured (float32, CPU, torch's thread count -- every comparison timed
interleaved with :func:`_harness.time_interleaved`, medians of the repeats, warm-up call
excluded; the load average is recorded at the start and the end):

(0) the machine: cache sizes (``/sys/devices/system/cpu/cpu0/cache``) and a STREAM-like
    read bandwidth (the best pass of ``torch.sum``, ``torch.amax`` and ``torch.dot`` over a
    float32 buffer, see :func:`read_bandwidth`) at
    working sets from L2 size to 512 MiB, plus a triad ``a = b + s c`` at 512 MiB;
(a) ``fwht`` (compiled) against the dense Hadamard product ``x @ H`` (``H`` prebuilt,
    only the matmul timed) and the pure-torch FWHT (``fwht_torch``, ``log2 d`` butterfly
    passes), ``x`` of shape (4096, d) for d in {1024, 4096};
(b) the FFN isolated at the paper's shapes (d = 512, hidden 2048, 32 768 tokens = batch
    64 x sequence 512): VanillaFFN (``torch.addmm`` + GELU + ``torch.addmm``, oneDNN/MKL
    GEMMs) against LookupFFN (BH4 hash, eq. 20) at the paper's (h, tau, block) settings
    of Tables 1 and 3, as

    * ``torch``: the pure-torch path (BH4 by einsum + FWHT, codes, ``embedding_bag``) --
      the training forward, no custom kernel;
    * ``fused``: the fully fused C++ kernel (hash and gather per tile of 8 tokens);
    * the Table 6 breakdown: ``hash`` = the BH4 projection alone (compiled, same tiles),
      ``gather`` = the weighted gather-accumulate alone (codes and weights given, into a
      preallocated output: no first-touch page faults),
      ``other`` = fused - hash - gather (codes, weights, loop overhead; can be < 0 when
      fusion saves more than it costs).

    The gather's bandwidth roofline: it must read ``tokens x h x d_out x 4`` bytes of
    table rows; at the read bandwidth (0) measured for a buffer as large as the tables
    (``h 2^tau d_out x 4`` bytes, so from where they live: L2, L3 or DRAM; beyond the L3
    size at least the triad's) that takes ``bytes / bandwidth``; the fraction reached is
    that time over the measured gather time. (A probe timed in the same interleaved rounds
    as the gather was tried and dropped: many short parallel reductions on a loaded
    two-core machine measure thread stalls, not bandwidth.)

Goals (issue 5): ``fwht`` >= 10x faster than the dense Hadamard matmul at d = 4096,
batch 4096; LookupFFN inference >= 2.5x faster than VanillaFFN at the paper setting
where it is strongest; the gather at >= 70 % of its bandwidth roofline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import RESULTS_DIR, machine_info, time_interleaved  # noqa: E402

from kernels.hadamard import bh_project_fused, fwht, fwht_torch, hadamard_matrix  # noqa: E402
from kernels.lookup import (  # noqa: E402
    LookupFFN,
    VanillaFFN,
    gather_fused,
    hash_codes,
    lookup_ffn_flops,
    lookup_weights,
    table_bytes,
    vanilla_ffn_flops,
)

D_MODEL, HIDDEN = 512, 2048
#: (h, tau, BH4 block): Table 1 (256/128, 8), Table 3 (h sweep at tau 8; fixed h tau),
#: and block 16 (Table 3 top, Fig. 6's "hash-opt2").
SETTINGS = [(256, 8, 64), (128, 8, 64), (64, 8, 64), (32, 8, 64), (32, 8, 16), (64, 4, 64), (20, 13, 64)]
QUICK_SETTINGS = [(128, 8, 64), (32, 8, 16), (64, 4, 64)]
FWHT_DS = (1024, 4096)
FWHT_BATCH = 4096


def cache_sizes() -> dict[str, str]:
    """``{"L1d": "32K", "L2": "1024K", "L3": "32768K"}`` from sysfs (per core / shared)."""
    out: dict[str, str] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        out[f"L{level}{'d' if kind == 'Data' else ''}"] = size
    return out


def read_bandwidth(nbytes: int, passes: int = 15) -> float:
    """GB/s of a streaming read of a float32 buffer of ``nbytes``: the best pass of three
    reductions (``torch.sum``, ``torch.amax``, ``torch.dot(b, b)``), whichever is fastest.

    On a shared machine a parallel reduction is often held up by a descheduled thread,
    and torch's reductions differ in how well they stream at a given size, so the best
    of several passes and kernels is the machine's figure; small buffers are read
    repeatedly so that one timing covers >= 50 MB.
    """
    buf = torch.rand(max(nbytes // 4, 1024))
    inner = max(1, int(5e7 // max(nbytes, 1)))
    best = float("inf")
    for fn in (torch.sum, torch.amax, lambda b: torch.dot(b, b)):
        fn(buf)
        for _ in range(passes):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn(buf)
            best = min(best, (time.perf_counter() - t0) / inner)
    return buf.numel() * 4 / best / 1e9


def triad_bandwidth(nbytes: int = 512 << 20, passes: int = 5) -> float:
    """GB/s of ``a = b + 3 c`` (STREAM triad: two reads, one write) over ``nbytes`` arrays."""
    n = nbytes // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * nbytes / best / 1e9


def bench_memory(quick: bool) -> dict[str, Any]:
    sizes = [512 << 10, 4 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20, 512 << 20]
    if quick:
        sizes = [512 << 10, 16 << 20, 128 << 20]
    read = {str(s): read_bandwidth(s) for s in sizes}
    return {"read_gbps_by_bytes": read, "triad_gbps": triad_bandwidth(128 << 20 if quick else 512 << 20)}


def bandwidth_at(memory: dict[str, Any], nbytes: int) -> float:
    """The roofline bandwidth for tables of ``nbytes``: the read bandwidth measured for the
    smallest working set >= ``nbytes``; beyond 32 MiB (this machine's L3) at least the
    triad's, since the reductions do not always saturate memory on their own."""
    table = sorted((int(k), v) for k, v in memory["read_gbps_by_bytes"].items())
    gbps = table[-1][1]
    for size, value in table:
        if size >= nbytes:
            gbps = value
            break
    if nbytes > 32 << 20:
        gbps = max(gbps, memory["triad_gbps"])
    return gbps


def bench_fwht(repeats: int) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for d in FWHT_DS:
        x = torch.randn(FWHT_BATCH, d, generator=gen)
        h = hadamard_matrix(d, dtype=torch.float32)
        err = float((fwht(x) - x @ h).abs().max() / (x @ h).abs().max())
        times = time_interleaved(
            {
                "compiled": lambda: fwht(x),
                "dense": lambda: x @ h,
                "torch": lambda: fwht_torch(x),
            },
            repeats,
        )
        rows.append(
            {
                "case": "fwht",
                "d": d,
                "shape": f"x ({FWHT_BATCH}, {d}) float32",
                "compiled_s": times["compiled"]["median_s"],
                "dense_s": times["dense"]["median_s"],
                "torch_s": times["torch"]["median_s"],
                "speedup_vs_dense": times["dense"]["median_s"] / times["compiled"]["median_s"],
                "speedup_vs_torch": times["torch"]["median_s"] / times["compiled"]["median_s"],
                "torch_vs_dense": times["dense"]["median_s"] / times["torch"]["median_s"],
                "max_rel_err": err,
                "goal": ">= 10x faster than the dense Hadamard matmul" if d == 4096 else None,
                "goal_met": (times["dense"]["median_s"] / times["compiled"]["median_s"] >= 10)
                if d == 4096 else None,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_ffn(tokens: int, settings: list, repeats: int, memory: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, D_MODEL, generator=gen)
    vanilla = VanillaFFN(D_MODEL, HIDDEN, generator=gen)
    for h, tau, block in settings:
        layer = LookupFFN(D_MODEL, h, tau, block=block, generator=gen)
        tables = layer.tables.detach()
        with torch.no_grad():
            z = layer.projection(x).contiguous()
            codes = hash_codes(z, tau).contiguous()
            weights = lookup_weights(z, tau, True).contiguous()
            gather_out = torch.empty(tokens, D_MODEL)
            ref = layer(x, backend="torch")
            got = layer(x, backend="fused")
        err = float((got - ref).abs().max() / ref.abs().max())
        del z, ref, got

        def run_torch() -> Any:
            with torch.no_grad():
                return layer(x, backend="torch")

        def run_fused() -> Any:
            with torch.no_grad():
                return layer(x, backend="fused")

        def run_vanilla() -> Any:
            with torch.no_grad():
                return vanilla(x)

        times = time_interleaved(
            {
                "vanilla": run_vanilla,
                "torch": run_torch,
                "fused": run_fused,
                "hash": lambda: bh_project_fused(x, layer.projection),
                "gather": lambda: gather_fused(codes, weights, tables, gather_out),
            },
            repeats,
        )
        med = {k: v["median_s"] for k, v in times.items()}
        flops = lookup_ffn_flops(D_MODEL, h, tau, block=block)
        nbytes = table_bytes(h, tau, D_MODEL)
        gathered = tokens * h * D_MODEL * 4
        bw = bandwidth_at(memory, nbytes)
        roofline_s = gathered / (bw * 1e9)
        row = {
            "case": "lookup_ffn",
            "h": h,
            "tau": tau,
            "block": block,
            "tokens": tokens,
            "shape": f"x ({tokens}, {D_MODEL}), tables ({h}, {2**tau}, {D_MODEL})",
            "mflop_lookup": flops["total"] / 1e6,
            "mflop_hash": flops["hash"] / 1e6,
            "mflop_gather": flops["gather"] / 1e6,
            "mflop_vanilla": vanilla_ffn_flops(D_MODEL, HIDDEN) / 1e6,
            "table_mib": nbytes / 2**20,
            "vanilla_s": med["vanilla"],
            "torch_s": med["torch"],
            "fused_s": med["fused"],
            "hash_s": med["hash"],
            "gather_s": med["gather"],
            "other_s": med["fused"] - med["hash"] - med["gather"],
            "speedup_fused": med["vanilla"] / med["fused"],
            "speedup_torch": med["vanilla"] / med["torch"],
            "vanilla_gflops": vanilla_ffn_flops(D_MODEL, HIDDEN) * tokens / med["vanilla"] / 1e9,
            "hash_gflops": flops["hash"] * tokens / med["hash"] / 1e9,
            "gather_gbps": gathered / med["gather"] / 1e9,
            "roofline_gbps": bw,
            "gather_roofline_fraction": roofline_s / med["gather"],
            "max_rel_err_fused_vs_torch": err,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(machine: dict[str, Any], memory: dict[str, Any], fwht_rows, ffn_rows, goals) -> str:
    lines = [
        "# Benchmark `lookup`",
        "",
        "Machine: " + ", ".join(f"{k}: {v}" for k, v in machine.items()),
        "",
        "Read bandwidth (best pass of sum / amax / dot): "
        + ", ".join(f"{int(k) / 2**20:g} MiB: {v:.1f} GB/s" for k, v in memory["read_gbps_by_bytes"].items())
        + f"; triad: {memory['triad_gbps']:.1f} GB/s.",
        "",
        "## FWHT, batch 4096, float32",
        "",
        "| d | compiled | dense x @ H | torch FWHT | vs dense | vs torch FWHT | torch FWHT vs dense | goal | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fwht_rows:
        lines.append(
            f"| {r['d']} | {r['compiled_s'] * 1e3:.1f} ms | {r['dense_s'] * 1e3:.1f} ms | {r['torch_s'] * 1e3:.1f} ms "
            f"| {r['speedup_vs_dense']:.1f}x | {r['speedup_vs_torch']:.1f}x | {r['torch_vs_dense']:.2f}x "
            f"| {r['goal'] or ''} | {'' if r['goal_met'] is None else ('yes' if r['goal_met'] else '**NO**')} |"
        )
    tokens = ffn_rows[0]["tokens"] if ffn_rows else 0
    lines += [
        "",
        f"## FFN inference, d = {D_MODEL}, hidden {HIDDEN}, {tokens} tokens, float32",
        "",
        "| h | tau | block | MFLOP | tables MiB | vanilla | LookupFFN torch | LookupFFN fused | speedup fused | speedup torch "
        "| hash | gather | other | gather GB/s | roofline GB/s | roofline fraction |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ffn_rows:
        lines.append(
            f"| {r['h']} | {r['tau']} | {r['block']} | {r['mflop_lookup']:.2f} | {r['table_mib']:.0f} "
            f"| {r['vanilla_s'] * 1e3:.0f} ms | {r['torch_s'] * 1e3:.0f} ms | {r['fused_s'] * 1e3:.0f} ms "
            f"| {r['speedup_fused']:.2f}x | {r['speedup_torch']:.2f}x | {r['hash_s'] * 1e3:.0f} ms "
            f"| {r['gather_s'] * 1e3:.0f} ms | {r['other_s'] * 1e3:.0f} ms | {r['gather_gbps']:.1f} "
            f"| {r['roofline_gbps']:.1f} | {r['gather_roofline_fraction']:.0%} |"
        )
    lines += ["", "## Goals", ""] + [f"- {g['goal']}: {g['value']} -- {'met' if g['met'] else 'NOT met'}" for g in goals]
    lines += [
        "",
        "Times are medians of interleaved repeats after one warm-up call, float32, one process. "
        "Vanilla MFLOP = 4.19 per token. The roofline of the gather is the time to read the gathered "
        "rows (tokens x h x 512 x 4 bytes) at the read bandwidth measured for a buffer as large as the "
        "tables (best pass of sum / amax / dot at the start of the run; beyond 32 MiB at least the triad). "
        "'other' = fused - hash - gather.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, no files unless --out")
    parser.add_argument("--out", type=Path, default=None, help="directory for the results files")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    quick = args.quick
    repeats = args.repeats or (3 if quick else 5)
    load_start = os.getloadavg()
    memory = bench_memory(quick)
    print(json.dumps(memory), flush=True)
    fwht_rows = bench_fwht(repeats)
    ffn_rows = bench_ffn(4096 if quick else 32768, QUICK_SETTINGS if quick else SETTINGS, repeats, memory)
    load_end = os.getloadavg()
    best = max(ffn_rows, key=lambda r: r["speedup_fused"])
    f4096 = [r for r in fwht_rows if r["d"] == 4096][0]
    goals = [
        {"goal": "fwht >= 10x faster than the dense Hadamard matmul at d = 4096, batch 4096",
         "value": f"{f4096['speedup_vs_dense']:.1f}x", "met": f4096["speedup_vs_dense"] >= 10},
        {"goal": "LookupFFN inference >= 2.5x faster than VanillaFFN at its strongest paper setting",
         "value": f"{best['speedup_fused']:.2f}x at (h, tau, block) = ({best['h']}, {best['tau']}, {best['block']})",
         "met": best["speedup_fused"] >= 2.5},
    ]
    for r in ffn_rows:
        goals.append({"goal": f"gather >= 70 % of its bandwidth roofline at (h, tau, block) = ({r['h']}, {r['tau']}, {r['block']})",
                      "value": f"{r['gather_roofline_fraction']:.0%}", "met": r["gather_roofline_fraction"] >= 0.7})
        goals.append({"goal": f"LookupFFN >= 2.5x faster than VanillaFFN at (h, tau, block) = ({r['h']}, {r['tau']}, {r['block']})",
                      "value": f"{r['speedup_fused']:.2f}x", "met": r["speedup_fused"] >= 2.5})
    machine = machine_info(
        caches=", ".join(f"{k} {v}" for k, v in cache_sizes().items()),
        load_average_1_5_15min=" / ".join(f"{v:.2f}" for v in load_start),
        load_average_at_end=" / ".join(f"{v:.2f}" for v in load_end),
    )
    payload = {"benchmark": "lookup", "machine": machine, "memory": memory, "fwht": fwht_rows,
               "rows": ffn_rows, "goals": goals}
    out_dir = args.out if args.out is not None else (None if quick else RESULTS_DIR)
    md = markdown(machine, memory, fwht_rows, ffn_rows, goals)
    print(md)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench_lookup.json").write_text(json.dumps(payload, indent=2) + "\n")
        (out_dir / "bench_lookup.md").write_text(md)
        print(f"wrote {out_dir / 'bench_lookup.json'} and {out_dir / 'bench_lookup.md'}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
