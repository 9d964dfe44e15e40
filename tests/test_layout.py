"""The house of ``kernels``: no import circle, no private name across modules,
surgery below the methods and the catalogue above them, modules of one idea, and a frozen
list of the public API so that an accidental removal fails."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kernels"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package (``__init__`` files as their package), by dotted name."""
    return {module_name(p, root): p for p in sorted(package.rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` for every import of ``path`` that reaches a module in
    ``known``: at the top, inside functions, under ``if``/``try``. Relative imports are
    resolved; ``from pkg import sub`` counts as importing ``pkg.sub`` when that is a module."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.append((alias.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            if target in known:
                found.append((target, [n for n in names if f"{target}.{n}" not in known], node.lineno))
            found += [(s, [], node.lineno) for s in subs]
    return found


def import_graph(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, set[str]]:
    """Who imports whom inside the package. Importing ``a.b.c`` also runs ``a.b``'s
    ``__init__``: an edge to each enclosing package the importer is not itself inside (a
    module inside a package imports its ``__init__`` only by taking names from it)."""
    mods = modules(package, root)
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for target, names, _ in imports_of(path, name, known):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep not in known or dep == name:
                    continue
                # A module inside ``dep`` runs it only by taking names from its __init__.
                if name.startswith(dep + ".") and not (dep == target and names):
                    continue
                graph[name].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or ``[]``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = 2
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# ------------------------------------------------------------------------------ circles
def test_the_cycle_finder_finds_circles_through_function_imports(tmp_path: Path) -> None:
    # A circle in miniature: the catalogue imports a method inside a
    # function, the method imports the catalogue at its top; and a circle through a third.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ffn.py").write_text("def f():\n    from pkg.fusion import g\n")
    (pkg / "fusion.py").write_text("from pkg.ffn import f\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import x\n")
    (pkg / "sub" / "a.py").write_text("from . import b\nx = 1\n")
    (pkg / "sub" / "b.py").write_text("try:\n    from pkg import lower\nexcept ImportError:\n    pass\n")
    (pkg / "lower.py").write_text("import pkg.top\n")
    (pkg / "top.py").write_text("if True:\n    from pkg.sub import b\n")
    graph = import_graph(pkg, tmp_path)
    assert graph["pkg.ffn"] == {"pkg.fusion"} and graph["pkg.fusion"] == {"pkg.ffn"}
    assert graph["pkg.sub.a"] == {"pkg.sub.b"}  # relative import; its own package is no edge
    assert graph["pkg.top"] == {"pkg.sub", "pkg.sub.b"}  # importing pkg.sub.b runs pkg.sub
    assert set(find_cycle(graph)) == {"pkg.ffn", "pkg.fusion"}
    (pkg / "fusion.py").write_text("")
    cycle = find_cycle(import_graph(pkg, tmp_path))
    assert cycle[0] == cycle[-1] and {"pkg.sub.b", "pkg.lower", "pkg.top"} <= set(cycle)
    (pkg / "lower.py").write_text("")
    assert find_cycle(import_graph(pkg, tmp_path)) == []


def test_no_module_of_kernels_imports_one_that_imports_it_back() -> None:
    graph = import_graph()
    assert "kernels.ffn" in graph and "kernels.ntk.gram" in graph  # the graph saw the package
    assert {"kernels.snnk", "kernels.fusion", "kernels.lookup", "kernels.surgery"} <= graph["kernels.ffn"]
    cycle = find_cycle(graph)
    assert not cycle, "import circle: " + " -> ".join(cycle)


def test_surgery_stands_below_the_methods_and_the_catalogue_above_them() -> None:
    graph = import_graph()
    # FFN surgery imports nothing above it: only the compressed layers and the plumbing.
    assert reachable(graph, "kernels.surgery") <= {"kernels.linear", "kernels._checks", "kernels.device"}
    for method in ("kernels.snnk", "kernels.fusion", "kernels.lookup"):
        assert "kernels.ffn" not in reachable(graph, method), method
    assert {"kernels.snnk", "kernels.fusion", "kernels.lookup"} <= reachable(graph, "kernels.ffn")


def test_no_private_name_is_imported_across_modules() -> None:
    """A name another module needs is public. Inside one subpackage (kernels.fusion,
    kernels.lookup, kernels.ntk, kernels.toeplitz: one chapter's module split by idea) the parts share private helpers;
    ``_checks`` and ``_ext`` are the package's private plumbing modules, imported whole or
    by their public names."""
    mods = modules()
    known = set(mods)
    crossing = []
    for name, path in mods.items():
        for target, names, line in imports_of(path, name, known):
            private = [n for n in names if n.startswith("_")]
            if not private:
                continue
            package = target.rpartition(".")[0]
            same_subpackage = package != "kernels" and (name == package or name.startswith(package + "."))
            if not same_subpackage:
                crossing.append(f"{path.relative_to(ROOT)}:{line}: {', '.join(private)} from {target}")
    assert not crossing, crossing


# ------------------------------------------------------------------------- one idea each
#: A module longer than this says in its docstring which one idea needs more, and why.
MAX_LINES = 1000
#: The phrase that docstring carries.
ONE_IDEA = "One idea, more than 1,000 lines:"


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_hold_one_idea(name: str) -> None:
    path = modules()[name]
    n_lines = len(path.read_text().splitlines())
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert doc, f"{name} has no module docstring"
    if n_lines > MAX_LINES:
        assert ONE_IDEA in doc, f"{name} has {n_lines} lines and its docstring does not say why ({ONE_IDEA!r})"


# ------------------------------------------------------------------- tests mirror kernels
TESTS = ROOT / "tests"
#: Top-level test modules that import ``kernels`` without mirroring one module, and why.
CROSS_CUTTING = {
    "test_properties": "property-based checks of every public function and module of the package",
    "test_cuda": "every CUDA path of the package, skipped without a GPU",
    "test_ext_build": "building kernels._ext: locks, timeouts, the error probe",
    "test_package": "installing and importing the package as a distribution",
    "test_layout": "the import graph and public API of the whole package",
    "test_nnk_book": "the book's helpers (nnk_book), which call kernels",
}


def _imports_kernels(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kernels":
            return True
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "kernels" for a in node.names):
            return True
    return False


def _mirrors(stem: str, folder: Path) -> bool:
    """``test_<m>`` or ``test_<m>_<aspect>`` for a module ``<m>.py`` of ``folder``."""
    name = stem[len("test_"):]
    parts = name.split("_")
    return any((folder / ("_".join(parts[:i]) + ".py")).is_file() for i in range(1, len(parts) + 1))


def test_kernels_tests_mirror_the_package() -> None:
    """``tests/<pkg>/test_<module>.py`` for ``kernels/<pkg>/<module>.py`` (``test_<pkg>.py``
    for what spans the package's modules; ``test_<module>_<aspect>.py`` for a second file
    of one module), ``tests/test_<module>.py`` for a top-level ``kernels/<module>.py``; a
    split package has its tests in its folder only, and a folder's tests import helpers
    from their own folder, not another package's."""
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert {"fusion", "lookup", "ntk", "toeplitz"} <= set(packages)
    wrong = []
    for pkg in packages:
        folder = TESTS / pkg
        tests = sorted(folder.glob("test_*.py"))
        if not tests:
            wrong.append(f"kernels/{pkg}/ has no tests/{pkg}/")
        for path in tests:
            if path.stem != f"test_{pkg}" and not _mirrors(path.stem, PACKAGE / pkg):
                wrong.append(f"{path.relative_to(ROOT)} mirrors no module of kernels/{pkg}/")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_helpers"):
                    if node.module != f"{pkg}_helpers":
                        wrong.append(f"{path.relative_to(ROOT)} imports {node.module}")
        if (TESTS / f"test_{pkg}.py").exists():
            wrong.append(f"tests/test_{pkg}.py: kernels.{pkg} is a package, its tests live in tests/{pkg}/")
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and list(p.glob("test_*.py"))):
        if folder.name not in packages:
            wrong.append(f"tests/{folder.name}/ mirrors no package of kernels/")
    for path in sorted(TESTS.glob("test_*.py")):
        if _imports_kernels(path) and path.stem not in CROSS_CUTTING and not _mirrors(path.stem, PACKAGE):
            wrong.append(f"{path.relative_to(ROOT)} imports kernels but mirrors no module of kernels/ "
                         "(or add it to CROSS_CUTTING with a reason)")
    assert not wrong, wrong


def test_test_basenames_are_unique() -> None:
    """tests/ has no __init__.py: pytest imports each test module by its file name, so two
    folders must not hold the same one."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "conftest.py" or "fixtures" in path.parts:
            continue
        if path.name in seen:
            clashes.append(f"{path.relative_to(ROOT)} and {seen[path.name].relative_to(ROOT)}")
        seen[path.name] = path
    assert not clashes, clashes


# ---------------------------------------------------------------------------- public API
#: Every module's ``__all__``, frozen. A public name may be added (add it
#: here too); removing or renaming one breaks chapters, tests or readers and fails here.
PUBLIC_API = {
    "kernels": [
        "IS_NN_KERNELS_BOOK", "OTHER_DISTRIBUTION", "PACKAGE_DIR", "PackageCollisionWarning",
        "__version__", "collision_advice",
    ],
    "kernels._checks": [
        "check_choice", "check_nonempty", "check_nonnegative_float", "check_positive_float",
        "check_positive_int", "check_same_dtype", "check_same_feature_dim", "check_tensor",
        "check_dtype_kind", "check_float_dtype", "check_index_tensor", "check_module",
        "check_real", "check_times", "check_generator", "check_callable", "check_input",
        "call_user_code",
    ],
    "kernels._ext": [
        "DEBUG_ENV_VAR", "DEFAULT_TIMEOUT_S", "HEADERS", "SOURCE", "SOURCES", "TIMEOUT_ENV_VAR", "build",
        "build_directory", "build_timeout", "cpp_errors_propagate", "extension_available",
        "load_extension",
    ],
    "kernels.device": [
        "SUPPORTED_DEVICE_TYPES", "check_tensor_device", "cupy_available", "default_device",
        "resolve_device",
    ],
    "kernels.features": [
        "FeatureOverflowWarning", "ReLUMap", "Spectrum", "URFMap", "activation_spectrum",
        "arccos_features", "arccos_kernel", "cos_spectrum", "gaussian_projections", "optimal_a",
        "sin_spectrum", "softmax_features", "softmax_kernel", "spectrum_from_fourier",
        "spectrum_from_name",
    ],
    "kernels.ffn": [
        "FFN", "FFNSite", "REPLACEMENTS", "bert_snnk_counts", "budget_for_hidden",
        "capture_ffn_io", "distill", "find_ffn_sites", "multiply_adds", "parameter_count",
        "replace_block_diagonal", "replace_bundled_snnk", "replace_ffn", "replace_ffns",
        "replace_fusion", "replace_fusion_tuned", "replace_lookup", "replace_moe_top1",
        "replace_original", "replace_prune", "replace_random", "replace_snnk", "replace_svd",
    ],
    "kernels.fusion": [
        "CompressedLinear", "KMeansResult", "LowRankLinear", "METHODS", "MMDSupport",
        "averaging_matrix", "clustering_matrix", "compress_mlp", "compress_model",
        "compress_sequential", "ffn_output_error", "find_ffn_blocks", "fuse_mlp", "kernel_cosine",
        "kernel_error", "kmeans", "layerwise_tuning", "mlp_gradients", "mlp_parameter_count",
        "mmd2", "mmd_support", "scaled_kernel_error", "scaling_matrix", "sgd_kernel", "sign_kernel",
        "sub_mlp_embeddings", "svd_rank_for_budget",
    ],
    "kernels.fusion.blocks": [
        "compress_model", "compress_sequential", "find_ffn_blocks",
        "mlp_parameter_count",
    ],
    "kernels.fusion.clustering": [
        "KMeansResult", "averaging_matrix", "clustering_matrix", "kmeans", "scaling_matrix",
        "sub_mlp_embeddings",
    ],
    "kernels.fusion.compress": [
        "CompressedLinear", "LowRankLinear", "METHODS", "MMDSupport", "compress_mlp", "fuse_mlp",
        "mmd2", "mmd_support", "svd_rank_for_budget",
    ],
    "kernels.fusion.measures": [
        "ffn_output_error", "kernel_cosine", "kernel_error", "mlp_gradients",
        "scaled_kernel_error", "sgd_kernel", "sign_kernel",
    ],
    "kernels.fusion.tuning": [
        "layerwise_tuning",
    ],
    "kernels.hadamard": [
        "ACDCProjection", "BH4", "BHProjection", "DenseProjection", "FWHT_BACKENDS",
        "PROJECTION_KINDS", "bh_project_fused", "check_fused_array", "check_fused_projection",
        "dct_matrix", "fwht", "fwht_backend", "fwht_torch", "hadamard_matrix", "is_power_of_two",
        "next_power_of_two", "projection_flops", "projection_params",
    ],
    "kernels.linear": [
        "CompressedLinear", "LowRankLinear",
    ],
    "kernels.lookup": [
        "BlockDiagonalFFN", "DEFAULT_MAX_TABLE_BYTES", "LOOKUP_BACKENDS", "LSHSparseFFN",
        "LookupFFN", "LookupGatherFunction", "MAX_TAU", "TABLE_DTYPES", "Top1MoEFFN", "VanillaFFN",
        "block_diagonal_ffn_flops", "dequantize_tables", "gather_fused", "hash_codes",
        "lookup_bh_forward_fused", "lookup_bh_hash_fused", "lookup_ffn_flops",
        "lookup_forward_fused", "lookup_gather", "lookup_gather_naive", "lookup_softmax",
        "lookup_weights", "lsh_active_mask", "lsh_ffn_flops", "moe_ffn_flops", "quantize_tables",
        "sign_matrix", "simhash_codes", "table_bytes", "vanilla_ffn_flops",
    ],
    "kernels.lookup.baselines": [
        "BlockDiagonalFFN", "LSHSparseFFN", "Top1MoEFFN", "VanillaFFN", "block_diagonal_ffn_flops",
        "lsh_active_mask", "lsh_ffn_flops", "moe_ffn_flops", "simhash_codes", "vanilla_ffn_flops",
    ],
    "kernels.lookup.gather": [
        "LookupGatherFunction", "MAX_TAU", "TABLE_DTYPES", "dequantize_tables", "gather_fused",
        "hash_codes", "lookup_bh_forward_fused", "lookup_bh_hash_fused", "lookup_forward_fused",
        "lookup_gather", "lookup_gather_naive", "lookup_softmax", "lookup_weights",
        "quantize_tables", "sign_matrix", "table_bytes",
    ],
    "kernels.lookup.layer": [
        "DEFAULT_MAX_TABLE_BYTES", "LOOKUP_BACKENDS", "LookupFFN", "lookup_ffn_flops",
    ],
    "kernels.ntk": [
        "ACTIVATIONS", "EMPIRICAL_NTK_METHODS", "Erf", "GaussianPrediction", "LinearizedModel",
        "NTKLinear", "NTKResult", "PARAMETERIZATIONS", "empirical_ntk", "fc_kernel", "fc_network",
        "gd_mse_ensemble", "gd_mse_predictor", "linear_gram_ntk", "linearize", "mse_loss_curve",
    ],
    "kernels.ntk.analytic": [
        "NTKResult", "fc_kernel",
    ],
    "kernels.ntk.dynamics": [
        "GaussianPrediction", "LinearizedModel", "gd_mse_ensemble", "gd_mse_predictor", "linearize",
        "mse_loss_curve",
    ],
    "kernels.ntk.empirical": [
        "EMPIRICAL_NTK_METHODS", "empirical_ntk",
    ],
    "kernels.ntk.gram": [
        "linear_gram_ntk",
    ],
    "kernels.ntk.network": [
        "ACTIVATIONS", "Erf", "NTKLinear", "PARAMETERIZATIONS", "fc_network",
    ],
    "kernels.ntk.onednn": [
    ],
    "kernels.snnk": [
        "BottleneckAdapter", "BundledNetwork", "BundlingBiasWarning", "FeatureTower", "FeedForward",
        "SNNKAdapter", "SNNKLinear", "balanced_input_scale", "bert_snnk_counts", "bundle",
        "count_trainable", "least_squares", "make_feature_map", "ridge_cv", "with_bundled_ffn",
    ],
    "kernels.surgery": [
        "FFN", "FFNSite", "bert_layers", "capture_ffn_io", "find_ffn_sites",
        "is_linear", "linear_multiply_adds", "replace_ffn", "replace_ffns", "set_submodule",
    ],
    "kernels.toeplitz": [
        "DecayCurve", "FDTNO", "GLU", "GTU", "PiecewiseLinearRPE", "RPE_ACTIVATIONS",
        "RPE_FEATURES", "SKITNO", "SKI_INTERPOLATIONS", "SKI_METHODS", "TNNBlock", "TNNEncoder",
        "TNO", "TNO_KINDS", "causal_kernel_from_real_response", "cubic_interpolation_weights",
        "discrete_hilbert", "fft_length", "frequency_response_decay", "inducing_points",
        "interpolation_weights", "inverse_time_warp", "linear_interpolation_weights", "make_tno",
        "rpe_mlp", "ski_matvec", "toeplitz_dense", "toeplitz_matvec",
    ],
    "kernels.toeplitz.encoder": [
        "GLU", "GTU", "TNNBlock", "TNNEncoder", "TNO_KINDS", "make_tno",
    ],
    "kernels.toeplitz.fd": [
        "DecayCurve", "FDTNO", "RPE_FEATURES", "causal_kernel_from_real_response",
        "discrete_hilbert", "frequency_response_decay",
    ],
    "kernels.toeplitz.helpers": [
    ],
    "kernels.toeplitz.product": [
        "fft_length", "toeplitz_dense", "toeplitz_matvec",
    ],
    "kernels.toeplitz.ski": [
        "PiecewiseLinearRPE", "SKITNO", "SKI_INTERPOLATIONS", "SKI_METHODS",
        "cubic_interpolation_weights", "inducing_points", "interpolation_weights",
        "inverse_time_warp", "linear_interpolation_weights", "ski_matvec",
    ],
    "kernels.toeplitz.tno": [
        "RPE_ACTIVATIONS", "TNO", "rpe_mlp",
    ],
}

#: Private names that tests and ``benchmarks/`` import from a package path; they stay
#: importable there (defined in the package's parts).
KEPT_PRIVATE = {
    "kernels.ntk": ["_OneDNNLinearMode", "_call_model", "_func_jacobian_ntk", "_gemm_nt",
                    "_linear_gram_owners", "_linear_records", "_onednn_linear_available"],
    "kernels.toeplitz": ["_apply_spectrum", "_frequency_features"],
}


def test_every_module_is_in_the_frozen_list() -> None:
    assert sorted(modules()) == sorted(PUBLIC_API), "a module was added or removed: update PUBLIC_API"


@pytest.mark.parametrize("name", sorted(PUBLIC_API))
def test_public_api_is_unchanged(name: str) -> None:
    module = importlib.import_module(name)
    exported = sorted(getattr(module, "__all__", []))
    assert len(exported) == len(set(exported)), f"{name}.__all__ names something twice"
    missing = sorted(set(PUBLIC_API[name]) - set(exported))
    added = sorted(set(exported) - set(PUBLIC_API[name]))
    assert not missing, f"{name} no longer exports {missing}"
    assert not added, f"{name} exports new names {added}: add them to PUBLIC_API"
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr}, which is not there"


@pytest.mark.parametrize("package", ["kernels.fusion", "kernels.lookup", "kernels.ntk", "kernels.toeplitz"])
def test_split_packages_export_every_name_of_their_parts(package: str) -> None:
    pkg = importlib.import_module(package)
    parts = [n for n in PUBLIC_API if n.startswith(package + ".")]
    assert len(parts) >= 3
    from_parts = set()
    for part in parts:
        module = importlib.import_module(part)
        for attr in module.__all__:
            assert getattr(pkg, attr) is getattr(module, attr), f"{package}.{attr} is not {part}.{attr}"
            from_parts.add(attr)
    assert from_parts == set(pkg.__all__)
    for attr in KEPT_PRIVATE.get(package, []):
        assert callable(getattr(pkg, attr)), f"{package}.{attr} is gone (tests/benchmarks import it)"


def test_surgery_and_compressed_layers_are_the_same_objects_everywhere() -> None:
    from kernels import ffn, fusion, linear, snnk, surgery

    for attr in ("FFN", "FFNSite", "find_ffn_sites", "capture_ffn_io", "replace_ffn", "replace_ffns"):
        assert getattr(ffn, attr) is getattr(surgery, attr)
    assert fusion.CompressedLinear is linear.CompressedLinear and fusion.LowRankLinear is linear.LowRankLinear
    assert ffn.bert_snnk_counts is snnk.bert_snnk_counts


def test_guide_maps_every_module_bottom_to_top() -> None:
    """The book's guide page, "The package, bottom to top": one line per module, each after
    every module it imports (a package's ``__init__`` stands for its parts)."""
    text = (ROOT / "book" / "guide.md").read_text()
    section = text.split("## The package, bottom to top", 1)[1].split("\n## ", 1)[0]
    listed = [module_name(ROOT / line[3:].split("`", 1)[0]) for line in section.splitlines()
              if line.startswith("- `kernels/")]
    graph = import_graph()
    packages = {n for n, p in modules().items() if p.name == "__init__.py"}
    assert len(listed) == len(set(listed))
    assert set(listed) == set(graph) - packages, "the guide's map and kernels/ differ"
    for i, name in enumerate(listed):
        deps = set()
        for dep in graph[name]:
            deps |= {m for m in graph if m.startswith(dep + ".")} if dep in packages else {dep}
        late = sorted(deps - set(listed[:i]))
        assert not late, f"the guide lists {name} before what it imports: {late}"


# ------------------------------------------------------------------------ the input rules
#: The book's page that lists the input rules of kernels._checks.
API_PAGE = ROOT / "book" / "api.md"
RULES_START, RULES_END = "<!-- input-rules:start -->", "<!-- input-rules:end -->"


def input_rules_markdown() -> str:
    """The bullet list of ``kernels._checks``'s module docstring, as Markdown: the text of
    the book's "Input rules" page between its two markers."""
    import re

    import kernels._checks as checks

    doc = checks.__doc__ or ""
    block = doc[doc.index("* **Tensors**"):].strip()
    block = re.sub(r":(?:func|mod|class|meth):`~?([^`]+)`", r"``\1``", block)
    return block.replace("``", "`")


def write_input_rules() -> None:
    """Rewrite the block between the markers of ``book/api.md`` from ``kernels/_checks.py``
    (``python tests/test_layout.py --write-input-rules``), atomically."""
    import os
    import tempfile

    text = API_PAGE.read_text()
    head, rest = text.split(RULES_START, 1)
    _, tail = rest.split(RULES_END, 1)
    new = f"{head}{RULES_START}\n{input_rules_markdown()}\n{RULES_END}{tail}"
    fd, tmp = tempfile.mkstemp(dir=API_PAGE.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(new)
    os.replace(tmp, API_PAGE)


def test_the_api_page_lists_the_input_rules_of_checks() -> None:
    """book/api.md holds the rules of kernels/_checks.py word for word (and is in the
    book's table of contents), so the two cannot drift apart."""
    text = API_PAGE.read_text()
    assert RULES_START in text and RULES_END in text, f"{API_PAGE} lost its rule markers"
    block = text.split(RULES_START, 1)[1].split(RULES_END, 1)[0].strip()
    assert block == input_rules_markdown(), (
        "book/api.md and the rules in kernels/_checks.py differ: run "
        "`.venv/bin/python tests/test_layout.py --write-input-rules`")
    assert "softmax_features" in block and "complex" in block  # the documented exception
    toc = (ROOT / "_toc.yml").read_text()
    assert "file: book/api" in toc, "book/api.md is not in _toc.yml"


if __name__ == "__main__":  # pragma: no cover
    import sys

    if sys.argv[1:] == ["--write-input-rules"]:
        write_input_rules()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
