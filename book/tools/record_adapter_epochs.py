"""Record chapter 2's adapter comparison over training lengths.

    python book/tools/record_adapter_epochs.py --epochs 240

Runs chapters/02_random_features.ipynb once with ``adapter_epochs = --epochs`` (the other
sections at a token size: they do not share random streams with the adapters, so the
adapter runs are exactly the teaching run's, only longer) and collects every adapter run's
test accuracy after each epoch. Because the batch order of epoch ``e`` does not depend on
the total length, the first ``E`` epochs of this run *are* an ``E``-epoch run, so one run
gives the verdict (``nnk_book.stats.verdict``, 95 % intervals over the seeds) at every
training length up to ``--epochs``. The length where the verdict settles is the smallest
``E`` with the same verdict at every length from ``E`` to the end; the record also holds how
much longer than ``E`` the sweep ran (``end_over_settled``: the evidence that it stays). Writes ``book/runs/sweeps/02_random_features.adapter_epochs.json`` (atomically) with the
date, commit and machine; the chapter reads it in its adapter section.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from nnk_book.files import write_record_json  # noqa: E402
from nnk_book.records import chapter_parameters  # noqa: E402
from nnk_book.stats import mean_interval, verdict  # noqa: E402

CHAPTER = "02_random_features"
OUT = ROOT / "book" / "runs" / "sweeps" / f"{CHAPTER}.adapter_epochs.json"
#: the other sections at a token size (the adapters do not depend on them)
SMALL = {"softmax_draws": 2000, "fig2_instantiations": 2, "fig2_features": [8, 16], "arccos_draws": 2000,
         "siren_steps": 20, "mlp_epochs": 2}
#: the adapter settings recorded with the sweep (the chapter checks they match its own)
ADAPTER_KEYS = ("adapter_layers", "adapter_features", "adapter_bottleneck", "adapter_train_per_class",
                "adapter_test_per_class", "adapter_lr", "adapter_seeds")


def settled_length(verdicts: list[str]) -> int:
    """Smallest length E (1-based) whose verdict holds at every length up to the end."""
    if not verdicts:
        raise ValueError("verdicts must not be empty")
    e = len(verdicts)
    while e > 1 and verdicts[e - 2] == verdicts[-1]:
        e -= 1
    return e


def by_epoch(curves: dict[str, list[list[float]]]) -> list[dict]:
    rows = []
    for e in range(len(curves["snnk"][0])):
        at = {k: [run[e] for run in c] for k, c in curves.items()}
        rows.append({"epochs": e + 1, "verdict": verdict(at["snnk"], at["bottleneck"]),
                     **{k: list(mean_interval(v)) for k, v in at.items()}})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=240, help="longest training length (epochs)")
    ap.add_argument("--seed", type=int, default=0, help="the chapter's seed parameter")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.epochs < 2:
        raise SystemExit(f"--epochs must be at least 2, got {args.epochs}")
    params = chapter_parameters(CHAPTER)
    with tempfile.TemporaryDirectory() as tmp:
        curves_path = Path(tmp) / "curves.json"
        overrides = {**SMALL, "seed": args.seed, "adapter_epochs": args.epochs, "adapter_curves_out": str(curves_path)}
        profiles = Path(tmp) / "profiles.yaml"
        profiles.write_text(json.dumps({"sweep": {CHAPTER: {"budget_s": 21600, "parameters": overrides}}}))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "book" / "tools" / "run_chapters.py"), "--profile", "sweep",
                        "--profiles", str(profiles), "--out", str(Path(tmp) / "run"), "--jobs", "1",
                        "--no-cache", CHAPTER], check=True)
        seconds = time.perf_counter() - t0
        curves = json.loads(curves_path.read_text())
    rows = by_epoch(curves)
    settled = settled_length([r["verdict"] for r in rows])
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {
        "chapter": CHAPTER,
        "what": "adapter test accuracy after every epoch, 3 adapters x adapter_seeds runs, one run of --epochs",
        "recorded": dt.date.today().isoformat(),
        "commit": commit,
        "seconds": round(seconds, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "logical_cores": os.cpu_count(),
                    "threads": int(os.environ.get("NN_KERNELS_THREADS", "0") or 0) or None},
        "parameters": {**{k: params[k] for k in ADAPTER_KEYS}, "seed": args.seed},
        "epochs_max": args.epochs,
        "settled_epochs": settled,
        "end_over_settled": args.epochs / settled,
        "by_epoch": rows,
        "curves": curves,
    }
    write_record_json(args.out, record)
    print(f"wrote {args.out}: verdict {rows[-1]['verdict']} from {settled} epochs to the end ({args.epochs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
