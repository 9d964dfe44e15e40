"""Record chapter 5's language-model comparison at longer training lengths, and its
learning-rate sweep.

    python book/tools/record_lm_lengths.py                       # lengths 1200, 2400, 4800
    python book/tools/record_lm_lengths.py --steps 1200 2400 --lrs 0.01 0.03 0.1
    python book/tools/record_lm_lengths.py --keep --steps 9600       # add a length to the record

Runs chapters/05_lookupffn.ipynb once at its teaching values with

* ``lm_long_steps = --steps``: VanillaFFN and the first LookupFFN of the main table (same
  size, seeds, batches and learning rates as the teaching run) trained for each length in
  turn (a fresh run per length: the cosine schedule depends on the length), stopping at the
  first length whose doubling moved each model's mean validation loss by less than the
  chapter's ``lm_long_tol``;
* ``lm_lr_sweep = --lrs``: both families (dense, lookup) trained at the teaching length with
  every peak learning rate and every seed of ``lm_seeds``;

and collects the per-seed validation losses the chapter writes to ``lm_sweep_out``. Every
training run goes through the chapter's ``nnk_book.sweep`` (experiments ``lk_lm_long`` and
``lk_lm_lr``), so a run stopped by Ctrl-C resumes where it was when started again. Writes
``book/runs/sweeps/05_lookupffn.lm_lengths.json`` (atomically) with the date, commit,
machine and the chapter parameters the values depend on; the chapter reads it in its
language-model section, computes the verdict at every length (paired by seed) and says
whether the last length met the criterion. About 9 CPU-minutes at one thread for the
default lengths (the teaching run's own ~2 minutes included).

With ``--keep`` the tool extends the existing record instead: it trains only the lengths of
``--steps`` (each longer than the record's longest), runs no learning-rate sweep, and writes
the record's lengths and sweep followed by the new lengths, provided the record was made with
the chapter's current settings (``parameters``) for the same pair. What was kept, and from
which commit and date, is written under ``kept``. Every run is a pure function of its
configuration and seed, so a kept length is what a fresh run of it computes (the tool
checks nothing here; compare a teaching-length value of the run with the record to confirm).
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
from nnk_book.files import atomic_write_text, write_record_json  # noqa: E402
from nnk_book.records import chapter_parameters  # noqa: E402

CHAPTER = "05_lookupffn"
OUT = ROOT / "book" / "runs" / "sweeps" / f"{CHAPTER}.lm_lengths.json"
#: the chapter settings the recorded values depend on (the chapter checks they match its own)
LM_KEYS = ("seed", "lm_dim", "lm_layers", "lm_heads", "lm_hidden", "lm_context", "lm_batch", "lm_steps", "lm_lr",
           "lm_lookup_lr", "lm_seeds", "lm_eval_chars", "lm_lookup", "lm_block", "lm_long_tol", "lm_converge_tol")


def check_lengths(steps: list[int]) -> list[int]:
    """The training lengths, strictly increasing and at least 2 of them."""
    if len(steps) < 2:
        raise ValueError(f"--steps needs at least two lengths, got {steps}")
    if any(s < 1 for s in steps) or any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"--steps must be positive and increasing, got {steps}")
    return steps


def check_new_lengths(steps: list[int], recorded: list[int]) -> list[int]:
    """The lengths added by ``--keep``: positive, increasing, each longer than every recorded one."""
    if not steps or any(s < 1 for s in steps) or any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"--steps must be positive and increasing, got {steps}")
    if recorded and steps[0] <= max(recorded):
        raise ValueError(f"--steps with --keep must be longer than the recorded lengths {recorded}, got {steps}")
    return steps


def kept_record(path: Path, params: dict) -> dict:
    """The existing record at ``path``, checked to be one of these settings (LM_KEYS) with lengths."""
    if not path.exists():
        raise ValueError(f"--keep: there is no record at {path} to extend")
    rec = json.loads(path.read_text())
    differ = [k for k in LM_KEYS if rec.get("parameters", {}).get(k) != params[k]]
    if differ:
        raise ValueError(f"--keep: the record at {path} was made with other settings ({', '.join(differ)})")
    if not rec.get("lengths") or not rec.get("lr_sweep"):
        raise ValueError(f"--keep: the record at {path} has no lengths or no learning-rate sweep to keep")
    return rec


def merge_kept(rec: dict, values: dict) -> dict:
    """The record's lengths and sweep followed by this run's lengths (same pair), with where they came from."""
    if values["pair"] != rec["pair"]:
        raise ValueError(f"--keep: this run compares {values['pair']}, the record {rec['pair']}")
    kept = {"steps": [L["steps"] for L in rec["lengths"]], "commit": rec["commit"], "recorded": rec["recorded"],
            "seconds": rec["seconds"], **({"note": rec["note"]} if "note" in rec else {})}
    return {"pair": rec["pair"], "lengths": rec["lengths"] + values["lengths"], "lr_sweep": rec["lr_sweep"],
            "kept": [*rec.get("kept", []), kept]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[1200, 2400, 4800],
                    help="training lengths, increasing (the chapter stops at the first that meets its criterion)")
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.03, 0.1], help="peak learning rates of the sweep")
    ap.add_argument("--seed", type=int, default=0, help="the chapter's seed parameter")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep", action="store_true",
                    help="extend the record at --out: keep its lengths and sweep, train only the longer --steps")
    ap.add_argument("--notebook", type=Path, default=None, help="also keep the executed notebook here")
    args = ap.parse_args(argv)
    params = {**chapter_parameters(CHAPTER), "seed": args.seed}
    try:
        if args.keep:
            rec = kept_record(args.out, params)
            steps = check_new_lengths(args.steps, [L["steps"] for L in rec["lengths"]])
        else:
            steps = check_lengths(args.steps)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    with tempfile.TemporaryDirectory() as tmp:
        values_path = Path(tmp) / "lm_sweep.json"
        overrides = {"seed": args.seed, "lm_long_steps": steps, "lm_lr_sweep": [] if args.keep else args.lrs,
                     "lm_sweep_out": str(values_path)}
        profiles = Path(tmp) / "profiles.yaml"
        profiles.write_text(json.dumps({"sweep": {CHAPTER: {"budget_s": 21600, "parameters": overrides}}}))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "book" / "tools" / "run_chapters.py"), "--profile", "sweep",
                        "--profiles", str(profiles), "--out", str(Path(tmp) / "run"), "--jobs", "1",
                        "--no-cache", CHAPTER], check=True)
        seconds = time.perf_counter() - t0
        values = json.loads(values_path.read_text())
        if args.notebook:
            args.notebook.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.notebook, (Path(tmp) / "run" / "sweep" / f"{CHAPTER}.ipynb").read_text())
    if args.keep:
        values = merge_kept(rec, values)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {
        "chapter": CHAPTER,
        "what": ("validation loss (nats per character) per seed of VanillaFFN and the first LookupFFN at each "
                 "training length, and of both families at every peak learning rate of the sweep (teaching length)"),
        "recorded": dt.date.today().isoformat(),
        "commit": commit,
        "seconds": round(seconds, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "logical_cores": os.cpu_count(),
                    "threads": int(os.environ.get("NN_KERNELS_THREADS", "0") or 0) or None},
        "parameters": {k: params[k] for k in LM_KEYS},
        "steps_asked": steps,
        **({"note": ("lengths " + ", ".join(str(s) for s in values["kept"][-1]["steps"])
                     + " and the learning-rate sweep are kept from the record of commit "
                     + values["kept"][-1]["commit"] + "; this run trained " + ", ".join(str(s) for s in steps)
                     + " steps")} if args.keep else {}),
        **values,
    }
    write_record_json(args.out, record)
    lengths = values["lengths"]
    moved = (max(abs(sum(lengths[-1][n]["valids"]) / len(lengths[-1][n]["valids"])
                     - sum(lengths[-2][n]["valids"]) / len(lengths[-2][n]["valids"])) for n in values["pair"])
             if len(lengths) >= 2 else float("nan"))
    print(f"wrote {args.out}: lengths {[L['steps'] for L in lengths]}; the last doubling moved a mean by {moved:.3f} "
          f"nats (criterion: < {params['lm_long_tol']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
