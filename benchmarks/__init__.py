"""The speed benchmarks, a package run from the repository root: ``python -m
benchmarks.bench_fwht`` (``make bench`` runs them all; ``benchmarks/README.md``). The scripts
import their shared helpers as ``benchmarks._harness``; none edits ``sys.path``."""
