"""Per-configuration results that survive interruption, computed here or on a Dask cluster.

A long experiment is many independent configurations: a (method, width, seed) triple, a
training length, a split. :func:`sweep` computes each configuration with a function of
that configuration alone and stores every result as soon as it exists, atomically, under a
key that hashes

* the configuration (canonical JSON), and
* the code that computes it: the function's own source, every code cell the notebook
  executed before the call (IPython keeps them; a parameter injected by the runner is one
  of them), and the sources of ``kernels``, ``data_scripts`` and ``nnk_book``.

A configuration whose key is already stored is read back instead of computed. So a
``record`` or ``paper`` run that was killed (Ctrl-C, a closed laptop, a lost machine, a
time limit) and is started again skips what it had finished and ends with the same
results, bit for bit, as a run that was never interrupted, provided the function is a pure
function of its configuration (its seed is part of the configuration, it reads no global
random state). Any edit to the code above the call, or to the package, gives new keys:
a stored result is never reused for code that could compute something else.

Where: ``$NN_KERNELS_RESULTS`` or, by default, ``_build/results/`` in the repository
(``~/.cache/nn-kernels-book/results`` for an installation outside one). One folder per
experiment name, one pickle file per configuration. Clean it with
``python -m nnk_book.store clean [NAME ...]`` (or ``make clean-results``); ``make clean``
leaves it alone, since it may hold hours of work.

On a cluster: with ``client=`` (a ``distributed.Client``) or ``$NN_KERNELS_DASK_SCHEDULER``
(a scheduler address, which ``run_chapters.py --scheduler`` sets for the chapters it
sends out), the configurations that are not stored are submitted to the cluster's workers
and each result is stored here, on the submitting machine, as it comes back. A worker that
dies mid-task loses nothing: the scheduler runs the task again on another worker (Dask
allows three such failures per task before it gives up with ``KilledWorker``). Without a
scheduler everything runs in this process and Dask is never imported.

The executed-notebook cache of ``run_chapters.py`` is the coarse level of the same idea:
it skips a whole chapter whose code, parameters and package sources are unchanged; this
store skips single configurations inside a chapter that does run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from nnk_book.files import atomic_write_bytes

#: Environment variable naming the store's folder.
STORE_ENV = "NN_KERNELS_RESULTS"
#: Environment variable naming a Dask scheduler for :func:`sweep`.
SCHEDULER_ENV = "NN_KERNELS_DASK_SCHEDULER"

_PACKAGE_ROOT = Path(__file__).resolve().parent
_SOURCE_SUFFIXES = {".py", ".cpp", ".h", ".cu"}


def _repo_root() -> Path | None:
    root = _PACKAGE_ROOT.parents[1]
    return root if (root / "pyproject.toml").exists() and (root / "kernels").is_dir() else None


def default_location() -> Path:
    """The store's folder: ``$NN_KERNELS_RESULTS``, else ``_build/results`` of the repository."""
    env = os.environ.get(STORE_ENV)
    if env:
        return Path(env).expanduser()
    root = _repo_root()
    if root is not None:
        return root / "_build" / "results"
    return Path.home() / ".cache" / "nn-kernels-book" / "results"


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "-_." for ch in name) \
            or name.startswith("."):
        raise ValueError(f"name must be a non-empty string of letters, digits, '-', '_' and '.', "
                         f"not starting with '.'; got {name!r}")
    return name


def canonical_config(config: Any) -> str:
    """The configuration as canonical JSON (sorted keys): what its key hashes.

    Raises ``TypeError`` naming ``config`` for values JSON cannot hold exactly (a tensor,
    a set, NaN), since two different values must never share a key.
    """
    def check(value: Any, where: str) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise TypeError(f"config{where} is {value!r}: configurations must hold finite numbers")
        if isinstance(value, Mapping):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(f"config{where} has a key {k!r} that is not a string")
                check(v, f"{where}[{k!r}]")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                check(v, f"{where}[{i}]")
        elif not (value is None or isinstance(value, (bool, int, float, str))):
            raise TypeError(f"config{where} is a {type(value).__name__}; configurations hold only "
                            "dicts, lists, strings, numbers, booleans and None")

    check(config, "")
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


_SOURCES_DIGEST: str | None = None


def sources_digest() -> str:
    """SHA-256 over the sources of ``kernels``, ``data_scripts`` and ``nnk_book`` (cached per process)."""
    global _SOURCES_DIGEST
    if _SOURCES_DIGEST is None:
        import kernels
        import data_scripts

        h = hashlib.sha256()
        for pkg in (Path(kernels.__file__).parent, Path(data_scripts.__file__).parent, _PACKAGE_ROOT):
            for path in sorted(pkg.rglob("*")):
                if path.is_file() and path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts:
                    h.update(f"{pkg.name}/{path.relative_to(pkg)}".encode())
                    h.update(b"\0" + hashlib.sha256(path.read_bytes()).digest())
        _SOURCES_DIGEST = h.hexdigest()
    return _SOURCES_DIGEST


def _notebook_code() -> str:
    """The code cells this IPython kernel has executed so far ('' outside IPython)."""
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821
    except NameError:
        return ""
    cells = ip.user_ns.get("In") or []
    return "\0".join(str(c) for c in cells)


def code_digest(fn: Callable[..., Any], depends: Iterable[Any] = ()) -> str:
    """Hash of the code behind ``fn``: its source, ``depends`` (more functions or strings),
    the notebook's executed cells and the package sources."""
    import inspect

    h = hashlib.sha256()
    for part in (fn, *depends):
        if isinstance(part, str):
            text = part
        else:
            try:
                text = inspect.getsource(part)
            except (OSError, TypeError):
                text = f"{getattr(part, '__module__', '')}.{getattr(part, '__qualname__', repr(part))}"
        h.update(text.encode() + b"\0")
    h.update(_notebook_code().encode() + b"\0")
    h.update(sources_digest().encode())
    return h.hexdigest()


class ResultStore:
    """A folder of results, one file per (experiment name, key); writes are atomic."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_location()

    def _path(self, name: str, key: str) -> Path:
        return self.root / _check_name(name) / f"{key}.pkl"

    def key(self, name: str, config: Any, code: str) -> str:
        """The key of ``config`` of experiment ``name`` computed by code with digest ``code``."""
        h = hashlib.sha256(f"{_check_name(name)}\0{code}\0".encode())
        h.update(canonical_config(config).encode())
        return h.hexdigest()[:32]

    def get(self, name: str, key: str) -> tuple[bool, Any]:
        """``(True, value)`` when stored, else ``(False, None)``; an unreadable file counts as absent."""
        path = self._path(name, key)
        try:
            with open(path, "rb") as fh:
                record = pickle.load(fh)
            return True, record["value"]
        except FileNotFoundError:
            return False, None
        except Exception:  # noqa: BLE001 - a damaged entry is recomputed and overwritten
            return False, None

    def put(self, name: str, key: str, config: Any, value: Any, seconds: float) -> Path:
        """Store ``value`` atomically (a crash leaves the old entry or none, never half a file)."""
        record = {"config": config, "value": value, "seconds": round(float(seconds), 3),
                  "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        return atomic_write_bytes(self._path(name, key), pickle.dumps(record, protocol=5))

    def names(self) -> list[str]:
        """The experiments with stored results."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def count(self, name: str) -> int:
        folder = self.root / _check_name(name)
        return sum(1 for _ in folder.glob("*.pkl")) if folder.is_dir() else 0

    def clear(self, names: Sequence[str] = ()) -> list[str]:
        """Remove the named experiments' results (all when ``names`` is empty); returns what went."""
        gone = []
        for name in (names or self.names()):
            folder = self.root / _check_name(name)
            if folder.is_dir():
                shutil.rmtree(folder)
                gone.append(name)
        return gone


def _client_from_env() -> Any:
    address = os.environ.get(SCHEDULER_ENV, "").strip()
    if not address:
        return None
    from distributed import Client

    return Client(address)


def _timed_call(fn: Callable[[Any], Any], config: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn(config)
    return value, time.perf_counter() - start


def sweep(
    fn: Callable[[Any], Any],
    configs: Iterable[Any],
    *,
    name: str,
    store: ResultStore | str | os.PathLike | None = None,
    depends: Iterable[Any] = (),
    client: Any = None,
    progress: Callable[[str], None] | None = print,
) -> list[Any]:
    """``[fn(c) for c in configs]``, each result stored as it is computed and reused when stored.

    ``fn`` takes one configuration (a dict, list, string or number: see
    :func:`canonical_config`) and returns a picklable result; it must depend on nothing but
    its configuration (put the seed in it). ``name`` names the experiment (its folder).
    ``depends`` lists further functions (or strings) whose code the results depend on when
    they are not defined in the notebook's cells above the call (see :func:`code_digest`).
    ``client`` is a ``distributed.Client`` to compute the missing configurations on (default:
    ``$NN_KERNELS_DASK_SCHEDULER`` if set, else this process). ``progress`` gets a line
    when the sweep starts and one per configuration finished (``None`` for silence).

    Returns the results in the order of ``configs``. Ctrl-C stops it; what was stored stays.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _check_name(name)
    configs = list(configs)
    store = store if isinstance(store, ResultStore) else ResultStore(store)
    say = progress or (lambda line: None)
    code = code_digest(fn, depends)
    keys = [store.key(name, c, code) for c in configs]
    results: list[Any] = [None] * len(configs)
    todo: dict[str, list[int]] = {}  # key -> indices (a configuration listed twice runs once)
    for i, key in enumerate(keys):
        found, value = store.get(name, key)
        if found:
            results[i] = value
        else:
            todo.setdefault(key, []).append(i)
    stored = len(configs) - sum(len(v) for v in todo.values())
    own_client = client is None
    client = _client_from_env() if client is None else client
    where = "here" if client is None else f"on the cluster at {_address(client)}"
    why = _unpicklable(fn) if client is not None and todo else None
    if why:  # e.g. a notebook function that reads a global model holding a ContextVar
        where = f"here: fn cannot be sent to the cluster ({why})"
        if own_client:
            client.close()
        client, own_client = None, False
    say(f"[{name}] {len(configs)} configurations: {stored} stored, {len(todo)} to compute {where}"
        + (f" (store: {store.root})" if todo else ""))
    done = 0

    def landed(key: str, value: Any, seconds: float) -> None:
        nonlocal done
        store.put(name, key, configs[todo[key][0]], value, seconds)
        for i in todo[key]:
            results[i] = value
        done += 1
        say(f"[{name}] {stored + done}/{len(configs)} done ({done} computed, {stored} stored, "
            f"{len(todo) - done} left; last {seconds:.1f} s)")

    try:
        if client is None:
            for key, idx in todo.items():
                value, seconds = _timed_call(fn, configs[idx[0]])
                landed(key, value, seconds)
        elif todo:
            from distributed import as_completed

            futures = {client.submit(_timed_call, fn, configs[idx[0]], pure=False,
                                     key=f"{name}-{key}-{time.monotonic_ns()}"): key
                       for key, idx in todo.items()}
            try:
                for future in as_completed(futures):
                    value, seconds = future.result()
                    landed(futures[future], value, seconds)
            except BaseException:
                client.cancel(list(futures))
                raise
    finally:
        if own_client and client is not None:
            client.close()
    return results


def _global_names(code: Any) -> set[str]:
    """The global names a code object (and the functions, lambdas and comprehensions inside it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


def _unpicklable(fn: Callable[[Any], Any]) -> str | None:
    """Why ``fn`` cannot be sent to a Dask worker, or ``None`` when it can.

    Dask pickles a task's function with cloudpickle: a function defined in a notebook goes by
    value, with every global it reads. One unpicklable global (a loaded model holding a
    ``ContextVar``, a lock, an open file) makes the whole submission fail; the reason names it.
    """
    import cloudpickle

    try:
        cloudpickle.dumps(fn)
        return None
    except Exception as err:  # noqa: BLE001 - any failure to pickle means: compute here
        code, env = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
        bad = []
        for n in sorted(_global_names(code)) if code is not None else []:
            if n in env:
                try:
                    cloudpickle.dumps(env[n])
                except Exception:  # noqa: BLE001
                    bad.append(n)
        return f"{type(err).__name__}: {str(err)[:200]}" + (f"; global(s) {', '.join(bad)}" if bad else "")


def _address(client: Any) -> str:
    try:
        return str(client.scheduler.address)
    except Exception:  # noqa: BLE001
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nnk_book.store",
                                 description="List or clean the per-configuration result store.")
    ap.add_argument("command", choices=["list", "clean"])
    ap.add_argument("names", nargs="*", help="experiments to clean (default: all)")
    ap.add_argument("--store", default=None, help=f"the store's folder (default: ${STORE_ENV} or "
                                                  "_build/results)")
    args = ap.parse_args(argv)
    store = ResultStore(args.store)
    if args.command == "list":
        for name in store.names():
            print(f"{name}: {store.count(name)} results")
        print(f"store: {store.root}")
        return 0
    gone = store.clear(args.names)
    print(f"removed {len(gone)} experiment(s) from {store.root}" + (f": {', '.join(gone)}" if gone else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
