"""Why the SNNK-SIREN differs from the paper's Fig. 3: one factor at a time.

    python book/tools/record_siren_study.py                       # the default grid, ~10 CPU-minutes
    python book/tools/record_siren_study.py --widths 24 48 --sizes 48 --steps 600 1200

At teaching scale chapter 2's SIREN (three sine layers of width 24, a 48 x 72 photograph) is
several dB *ahead* of the SNNK-SIREN whose middle layer is a sine SNNK with m = width / 4
features (the paper's ratio 2m = width / 2); the paper (Sehanobish et al. 2024, Fig. 3) says
the SNNK network matches the SIREN. Hypotheses this study measures, each by varying one
factor from the teaching setting and keeping the others:

* **steps**: the runs are not converged, the gap shrinks with training. Every run is trained
  for the longest length of ``--steps``; Adam runs at a constant learning rate on the full
  batch, so the first ``S`` steps of that run *are* an ``S``-step run, and the PSNR after
  ``S`` steps is read off its loss curve (the loss is the mean squared error of the image);
* **width** (the networks' capacity against the image's pixels): the gap closes once the
  networks have more parameters than the image has pixels (the paper's width-256 SIREN on a
  256 x 256 image has ~3 parameters per pixel; the teaching run has ~0.4);
* **image size** (data): the same, from the other side.

Each configuration runs chapter 2's own code: its imports, helpers and SIREN cells (found by
cell id) execute in an IPython shell after its parameters cell and a cell that sets
``siren_hidden``, ``siren_size``, ``siren_steps``, ``siren_features`` and ``siren_seeds``, as
papermill would inject them. The fits go through the chapter's ``nnk_book.sweep`` (experiment
``rf_siren``), so a study stopped by Ctrl-C resumes where it was. Writes
``book/runs/sweeps/02_random_features.siren_study.json`` (atomically) with the date, commit,
machine, parameters, per-seed PSNRs at every step count, the paired gap (SIREN - SNNK-SIREN,
mean and 95 % interval), the convergence flag of the chapter's criterion and the verdict.
Chapter 2 reads it in its SIREN section.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
from nnk_book.files import write_record_json  # noqa: E402
from nnk_book.records import chapter_parameters  # noqa: E402
from nnk_book.stats import mean_interval, verdict  # noqa: E402

CHAPTER = "02_random_features"
OUT = ROOT / "book" / "runs" / "sweeps" / f"{CHAPTER}.siren_study.json"
#: the chapter's cells the study executes, in order (imports, helpers, the SIREN fits)
CELLS = ("9fe81282", "aec11cee", "c5ea6d3e")
#: the chapter settings recorded with the study (the chapter checks they match its own)
SIREN_KEYS = ("siren_size", "siren_hidden", "siren_features", "siren_steps", "siren_lr", "snnk_lr", "siren_seeds")


def configurations(widths: Sequence[int], sizes: Sequence[int], base_width: int, base_size: int) -> list[dict]:
    """One factor at a time: every width at ``base_size``, every size at ``base_width``
    (the teaching setting once); the SNNK layer has m = width / 4 features."""
    for name, values in (("widths", widths), ("sizes", sizes)):
        if not values or any((not isinstance(v, int)) or v < 4 for v in values):
            raise ValueError(f"{name} must be integers >= 4, got {list(values)}")
    out = [{"width": w, "size": base_size} for w in widths]
    out += [{"width": base_width, "size": s} for s in sizes if s != base_size or base_width not in widths]
    seen, unique = set(), []
    for c in out:
        key = (c["width"], c["size"])
        if key not in seen:
            seen.add(key)
            unique.append({**c, "m": max(1, c["width"] // 4)})
    return unique


def check_steps(steps: Sequence[int]) -> list[int]:
    """Step counts, positive and strictly increasing."""
    steps = list(steps)
    if not steps or any(s < 10 for s in steps) or any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"--steps must be >= 10 and increasing, got {steps}")
    return steps


def psnr_after(losses: Sequence[float], steps: int, final_psnr: float) -> float:
    """PSNR (dB, images in [-1, 1]) of the run stopped after ``steps`` Adam steps.

    ``losses[t]`` is the mean squared error before update ``t + 1``, so the network after
    ``steps`` updates has loss ``losses[steps]``; after the last update only the final PSNR
    (computed by the chapter from the network) is known."""
    if steps == len(losses):
        return float(final_psnr)
    if not 1 <= steps < len(losses):
        raise ValueError(f"steps must be in 1..{len(losses)}, got {steps}")
    return float(10 * math.log10(4.0 / losses[steps]))


def gain_last_fifth(losses: Sequence[float]) -> float:
    """The chapter's convergence measure: dB gained over the last fifth (last tenth against the tenth before)."""
    k = max(1, len(losses) // 10)
    a = sum(losses[-2 * k:-k]) / k
    b = sum(losses[-k:]) / k
    return float(10 * math.log10(a / b))


def summarise(runs: dict[str, list[dict]], steps: Sequence[int], criterion_db: float) -> list[dict]:
    """Per step count: per-seed PSNRs, the paired gap SIREN - SNNK-SIREN (mean, 95 % half-width),
    the verdict (SIREN against the SNNK-SIREN, unpaired as in the chapter) and convergence."""
    (siren_name, siren_runs), (snnk_name, snnk_runs) = list(runs.items())[:2]
    rows = []
    for s in steps:
        a = [psnr_after(r["losses"], s, r["psnr"]) for r in siren_runs]
        b = [psnr_after(r["losses"], s, r["psnr"]) for r in snnk_runs]
        gaps = [x - y for x, y in zip(a, b)]
        mean, half = mean_interval(gaps)
        converged = all(gain_last_fifth(r["losses"][:s]) < criterion_db for r in siren_runs + snnk_runs)
        rows.append({"steps": s, "siren_psnr": a, "snnk_psnr": b, "gap": [mean, half],
                     "verdict": verdict(a, b), "converged": converged,
                     "max_gain_db": max(gain_last_fifth(r["losses"][:s]) for r in siren_runs + snnk_runs)})
    return rows


def run_configuration(shell: Any, cells: dict[str, str], params: dict, config: dict, steps: int, seeds: int) -> dict:
    """Chapter 2's SIREN cells at one (width, size), in a fresh IPython session."""
    shell.reset(new_session=True)
    overrides = {"siren_hidden": config["width"], "siren_size": config["size"], "siren_steps": steps,
                 "siren_features": [config["m"]], "siren_seeds": seeds}
    for source in [cells["parameters"], "\n".join(f"{k} = {v!r}" for k, v in overrides.items())] + [cells[c] for c in CELLS]:
        result = shell.run_cell(source, store_history=True, silent=False)
        if not result.success:
            raise RuntimeError(f"chapter cell failed at {config}: {result.error_in_exec or result.error_before_exec}")
    ns = shell.user_ns
    runs = {name: [{"psnr": r["psnr"], "losses": r["losses"], "seconds": r["seconds"]} for r in rs]
            for name, rs in ns["siren_runs"].items()}
    first = {name: rs[0] for name, rs in ns["siren_runs"].items()}
    return {"runs": runs, "pixels": int(ns["h_px"] * ns["w_px"]),
            "params": {name: r["params"] for name, r in first.items()}}


def chapter_cells() -> dict[str, str]:
    import nbformat

    nb = nbformat.read(str(ROOT / "chapters" / f"{CHAPTER}.ipynb"), as_version=4)
    by_id = {c.get("id"): c.source for c in nb.cells if c.cell_type == "code"}
    missing = [c for c in CELLS if c not in by_id]
    if missing:
        raise SystemExit(f"chapter {CHAPTER} has no code cells with ids {missing}: update CELLS")
    params = [c.source for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return {**{c: by_id[c] for c in CELLS}, "parameters": params[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[24, 48, 96], help="widths at the teaching image size")
    ap.add_argument("--sizes", type=int, nargs="+", default=[24, 48, 96], help="image heights at the teaching width")
    ap.add_argument("--steps", type=int, nargs="+", default=[1200, 2400, 4800],
                    help="step counts, increasing (one run of the longest; shorter ones read off its loss curve)")
    ap.add_argument("--seeds", type=int, default=3, help="initialisations per network (>= 3 for a verdict)")
    ap.add_argument("--seed", type=int, default=0, help="the chapter's seed parameter")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    params = chapter_parameters(CHAPTER)
    try:
        steps = check_steps(args.steps)
        configs = configurations(args.widths, args.sizes, params["siren_hidden"], params["siren_size"])
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if args.seeds < 2:
        raise SystemExit(f"--seeds must be at least 2, got {args.seeds}")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("NN_KERNELS_THREADS", "1"))
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    cells = chapter_cells()
    cells["parameters"] = cells["parameters"] + f"\nseed = {args.seed}"
    results, t0, cpu0 = [], time.perf_counter(), time.process_time()
    for i, config in enumerate(configs):
        print(f"[siren-study] {i + 1}/{len(configs)}: width {config['width']}, image height {config['size']}, "
              f"m = {config['m']}, {steps[-1]} steps, {args.seeds} seeds", file=sys.stderr, flush=True)
        got = run_configuration(shell, cells, params, config, steps[-1], args.seeds)
        rows = summarise(got["runs"], steps, criterion_db=0.5)
        params_siren = next(iter(got["params"].values()))
        results.append({**config, "pixels": got["pixels"], "params": got["params"],
                        "params_per_pixel": params_siren / got["pixels"], "by_steps": rows,
                        "curves_every": max(1, steps[-1] // 100),
                        "curves": {name: [r["losses"][::max(1, steps[-1] // 100)] for r in rs]
                                   for name, rs in got["runs"].items()}})
        last = rows[-1]
        print(f"[siren-study]   gap after {last['steps']} steps {last['gap'][0]:.1f} +- {last['gap'][1]:.1f} dB "
              f"({last['verdict']}, converged {last['converged']})", file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {
        "chapter": CHAPTER,
        "what": ("PSNR (dB) per seed of the SIREN and the SNNK-SIREN (m = width / 4) at each step count, one factor "
                 "(width, image height) varied at a time from the teaching setting; gap = SIREN - SNNK-SIREN, paired "
                 "by seed index, mean and 95 % half-width"),
        "recorded": dt.date.today().isoformat(),
        "commit": commit,
        "seconds": round(time.perf_counter() - t0, 1),
        "cpu_seconds": round(time.process_time() - cpu0, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "logical_cores": os.cpu_count(),
                    "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or None},
        "parameters": {**{k: params[k] for k in SIREN_KEYS}, "seed": args.seed},
        "steps": steps,
        "seeds": args.seeds,
        "criterion_db": 0.5,
        "configurations": results,
    }
    write_record_json(args.out, record)
    print(f"wrote {args.out}: {len(results)} configurations in {record['cpu_seconds']:.0f} CPU-s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: the finished fits are stored (nnk_book.sweep); run again to resume", file=sys.stderr)
        sys.exit(130)
