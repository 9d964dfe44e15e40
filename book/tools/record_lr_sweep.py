"""Record chapter 4's learning-rate sweep.

    python book/tools/record_lr_sweep.py

Runs chapters/04_toeplitz.ipynb once with ``lr_sweep_out`` set: besides its own runs, the
accuracy section then trains every candidate learning rate of ``lr_candidates`` (ListOps and
the bracket query, TNN, SKI-TNN and FD-TNN) and of ``lm_lr_candidates`` (the causal TNN and
FD-TNN character models), for the chapter's ``train_seeds`` seeds and its other settings,
and writes every run's test accuracy (or validation bits per character), final validation
loss and convergence measure (the change of the mean validation loss between the last two
fifths of training). The runs at the chapter's own rates are the chapter's runs: a seed's
initialisation and batch order do not depend on the learning rate, so the candidates are
compared paired by seed. Writes ``book/runs/sweeps/04_toeplitz.learning_rates.json``
(atomically) with the date, commit, machine, run time and the chapter's settings; the
chapter reads it in its training section, applies its rule (among the candidates at which
every run of a family converged, the best mean result) and checks that its rates are the
ones the rule picks. About 4 CPU-minutes at one thread (ci settings; 218 CPU-s measured).
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

CHAPTER = "04_toeplitz"
OUT = ROOT / "book" / "runs" / "sweeps" / f"{CHAPTER}.learning_rates.json"
#: the settings recorded with the sweep (the chapter checks that they are its own, the seed aside)
SETTINGS = ("use_real_data", "model_dim", "model_layers", "batch_size", "rpe_width", "rpe_depth", "tno_decay",
            "ski_rank", "ski_filter", "validation_size", "convergence_tol", "train_seeds", "brackets_length",
            "brackets_train", "brackets_steps", "listops_length", "listops_min_length", "listops_train",
            "listops_steps", "lm_context", "lm_dim", "lm_layers", "lm_steps", "lm_eval_chars", "lr_candidates",
            "lm_lr_candidates", "learning_rate", "fd_learning_rate", "lm_learning_rate")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="the chapter's seed parameter")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    params = chapter_parameters(CHAPTER)
    with tempfile.TemporaryDirectory() as tmp:
        runs_path = Path(tmp) / "runs.json"
        overrides = {"seed": args.seed, "lr_sweep_out": str(runs_path)}
        profiles = Path(tmp) / "profiles.yaml"
        profiles.write_text(json.dumps({"sweep": {CHAPTER: {"budget_s": 21600, "parameters": overrides}}}))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "book" / "tools" / "run_chapters.py"), "--profile", "sweep",
                        "--profiles", str(profiles), "--out", str(Path(tmp) / "run"), "--jobs", "1",
                        "--no-cache", CHAPTER], check=True)
        seconds = time.perf_counter() - t0
        runs = json.loads(runs_path.read_text())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {
        "chapter": CHAPTER,
        "what": "every candidate peak learning rate x mixer x task x seed of the accuracy section, one chapter run",
        "recorded": dt.date.today().isoformat(),
        "commit": commit,
        "seconds": round(seconds, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "logical_cores": os.cpu_count(),
                    "threads": int(os.environ.get("NN_KERNELS_THREADS", "0") or 0) or None},
        "parameters": {**{k: params[k] for k in SETTINGS}, "seed": args.seed},
        "runs": runs,
    }
    write_record_json(args.out, record)
    print(f"wrote {args.out}: {len(runs)} runs in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
