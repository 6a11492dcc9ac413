"""The package's import structure: the layers declared in pyproject.toml
(``[tool.importlinter]``, checked by import-linter) and no import cycles.

Function-level imports count as imports here, as they do for import-linter:
an import moved into a function still ties the two modules together.
"""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "a3c_core")

#: cycles allowed for now (none): a cycle that has to stay a while is listed
#: here as ``frozenset({module, module})``, with an ``ignore_imports`` line in
#: pyproject.toml's acyclic contract; the test fails on a listed cycle that
#: no longer exists
KNOWN_CYCLES = set()


def test_lint_imports_keeps_the_contracts():
    """``lint-imports``: the layers contract and the acyclic contract are kept."""
    pytest.importorskip("importlinter", reason="import-linter is in the 'test' extra")
    code = ("import sys\n"
            "from importlinter import api  # noqa: F401  (configures import-linter)\n"
            "from importlinter.application.use_cases import lint_imports\n"
            "sys.exit(0 if lint_imports(cache_dir=None, no_logo=True) else 1)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout, r.stdout


def _modules():
    """``{module name: path}`` of every .py file under a3c_core/."""
    mods = {}
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    return mods


def _import_graph(mods):
    """``{module: set of a3c_core modules it imports}``, at any depth of its code."""
    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges = {}
    for m, path in mods.items():
        package = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        with open(path) as fh:
            tree = ast.parse(fh.read())
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                t = resolve(n) if n.split(".")[0] == "a3c_core" else None
                # a module's own package (its __init__) is imported with it: not an edge
                if t and t != m and not m.startswith(t + "."):
                    out.add(t)
        edges[m] = out
    return edges


def _cycles(edges):
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_cycle_finder_finds_a_loop():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [frozenset("abc")]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """No two modules of a3c_core import each other, directly or round a loop
    (without import-linter: the same check by reading the source)."""
    mods = _modules()
    assert "a3c_core.nn.network" in mods and "a3c_core.cli" in mods
    cycles = set(_cycles(_import_graph(mods)))
    new = [" <-> ".join(sorted(c)) for c in cycles - KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    gone = [" <-> ".join(sorted(c)) for c in KNOWN_CYCLES - cycles]
    assert not gone, f"gone, delete from KNOWN_CYCLES (and its ignore_imports line): {gone}"


def test_nothing_but_the_cli_imports_bench():
    """``a3c_core.bench`` (a package) is the ``a3c bench`` command: the
    package's own modules take their timing helpers from ``a3c_core.timing``,
    and nothing outside it imports one of its modules."""
    def in_bench(name):
        return name == "a3c_core.bench" or name.startswith("a3c_core.bench.")

    edges = _import_graph(_modules())
    users = sorted(m for m, targets in edges.items()
                   if not in_bench(m) and any(in_bench(t) for t in targets))
    assert users == ["a3c_core.cli"], users
