"""Every shell command in README.md and docs/*.md runs (or, where it cannot
here, is checked).

Commands are taken from ```bash, ```sh and ```console fences (a
``$ `` prompt is stripped, backslash continuations are joined). Each fence
runs in order, in the repository root, with paths under ``/tmp/`` moved
into a temporary directory:

- ``a3c ...`` / ``python -m a3c_core ...``: ``--help`` runs as written;
  ``a3c train`` runs with a tiny budget (``--total-steps 200
  --total-seconds 20``, its run directory in the temporary directory);
  ``a3c plot`` runs as written with ``-o`` moved to the temporary directory;
  the commands that need a long run or a device (bench, compile, eval,
  gradcheck) run ``--help``.
- ``a3c export ...``: runs as written (after the fence's ``a3c train``,
  whose run directory it reads).
- ``python examples/X.py ...``: runs as written with ``--ticks 3``.
- ``python bench/X.py ...``: runs ``--help`` (as written for the quick
  ones in ``QUICK_SCRIPTS``).
- ``bash bench/X.sh ...``: the script exists and is valid bash; ``--help``
  runs.
- installs (``pip install``, ``python3 -m venv``): valid bash, and every
  extra they name is declared in pyproject.toml.
- ``pytest ...``: every path exists and every ``-m`` marker is registered.

A command of another kind fails the test, so a new kind of command needs a
rule here.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```(bash|sh|console)\s*\n(.*?)^```", re.S | re.M)
QUICK_SCRIPTS = {"bench/blas_kernels.py"}
LONG_A3C = {"bench", "compile", "eval", "gradcheck"}
BUDGET = ["--total-steps", "200", "--total-seconds", "20"]


def _doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _fences():
    """(id, [commands]) per shell fence of every doc."""
    out = []
    for path in _doc_files():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for m in FENCE.finditer(text):
            line = text[:m.start()].count("\n") + 1
            cmds, cur = [], ""
            for raw in m.group(2).splitlines():
                s = raw.rstrip()
                if m.group(1) == "console":
                    if not s.startswith("$ ") and not cur:
                        continue                    # output lines
                    s = s[2:] if s.startswith("$ ") else s
                if s.endswith("\\"):
                    cur += s[:-1] + " "
                    continue
                s = (cur + s).strip()
                cur = ""
                if s and not s.startswith("#"):
                    cmds.append(s)
            out.append((f"{os.path.relpath(path, ROOT)}:{line}", cmds))
    return out


FENCES = _fences()


def _params():
    # the fences that train (a CartPole run of 200 steps) take ~9 s in all: not the slow tier
    return [pytest.param(cmds, id=fid) for fid, cmds in FENCES]


def _a3c_args(cmd):
    toks = shlex.split(cmd, comments=True)
    if toks[:1] == ["a3c"]:
        return toks[1:]
    if toks[:3] in (["python", "-m", "a3c_core"], ["python3", "-m", "a3c_core"]):
        return toks[3:]
    return None


def _run(argv, tmp, timeout=300):
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "MPLBACKEND": "Agg"})
    assert r.returncode == 0, f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


def _extras():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return set(tomllib.load(fh)["project"].get("optional-dependencies", {}))


def _markers():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        lines = tomllib.load(fh)["tool"]["pytest"]["ini_options"].get("markers", [])
    return {m.split(":")[0].strip() for m in lines}


def _check(cmd, tmp):
    moved = re.sub(r"(?<![\w.])/tmp/([\w./-]+)", lambda m: os.path.join(tmp, m.group(1)), cmd)
    if "pip install" in cmd or "-m venv" in cmd:
        assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0, cmd
        for extras in re.findall(r"\[([\w,\s-]+)\]", cmd):
            missing = {e.strip() for e in extras.split(",")} - _extras()
            assert not missing, f"{cmd}: extras {missing} are not in pyproject.toml"
        return
    toks = shlex.split(moved, comments=True)
    args = _a3c_args(moved)
    if args is not None:
        if "--help" in args or "-h" in args or not args:
            _run([sys.executable, "-m", "a3c_core", *args], tmp)
        elif args[0] == "train":
            out, skip = [], False
            for i, t in enumerate(args):
                if skip:
                    skip = False
                    continue
                if t in ("--total-steps", "--total-seconds", "--run-dir"):
                    skip = True
                    if t == "--run-dir" and args[i + 1].startswith(tmp):
                        out += [t, args[i + 1]]
                    continue
                out.append(t)
            if "--run-dir" not in out:
                out += ["--run-dir", os.path.join(tmp, "run")]
            _run([sys.executable, "-m", "a3c_core", *out, *BUDGET, "--quiet"], tmp)
        elif args[0] == "plot":
            pytest.importorskip("matplotlib")
            if "-o" in args:
                args[args.index("-o") + 1] = os.path.join(tmp, "plot.png")
            elif "--out" in args:
                args[args.index("--out") + 1] = os.path.join(tmp, "plot.png")
            else:
                args += ["-o", os.path.join(tmp, "plot.png")]
            _run([sys.executable, "-m", "a3c_core", *args], tmp)
            assert os.path.getsize(os.path.join(tmp, "plot.png")) > 1000
        elif args[0] == "export":
            _run([sys.executable, "-m", "a3c_core", *args], tmp)
        elif args[0] in LONG_A3C:
            _run([sys.executable, "-m", "a3c_core", args[0], "--help"], tmp)
        else:
            pytest.fail(f"no rule for the a3c command: {cmd}")
    elif toks[:1] in (["python"], ["python3"]) and len(toks) > 1 and toks[1].startswith("bench/"):
        assert os.path.exists(os.path.join(ROOT, toks[1])), f"{cmd}: {toks[1]} does not exist"
        rest = toks[2:] if toks[1] in QUICK_SCRIPTS or "--help" in toks else ["--help"]
        _run([sys.executable, toks[1], *rest], tmp)
    elif toks[:1] in (["python"], ["python3"]) and len(toks) > 1 \
            and toks[1].startswith("examples/"):
        assert os.path.exists(os.path.join(ROOT, toks[1])), f"{cmd}: {toks[1]} does not exist"
        _run([sys.executable, *toks[1:], "--ticks", "3"], tmp)
    elif toks[:1] == ["bash"] and len(toks) > 1:
        path = os.path.join(ROOT, toks[1])
        assert os.path.exists(path), f"{cmd}: {toks[1]} does not exist"
        assert subprocess.run(["bash", "-n", path]).returncode == 0, f"{toks[1]} is not valid bash"
        _run(["bash", path, "--help"], tmp)
    elif toks[:1] == ["pytest"]:
        args = toks[1:]
        for i, t in enumerate(args):
            if t == "-m":
                assert set(re.findall(r"\w+", args[i + 1])) - {"not", "and", "or"} <= _markers(), cmd
            elif not t.startswith("-") and (i == 0 or args[i - 1] != "-m"):
                assert os.path.exists(os.path.join(ROOT, t.split("::")[0])), f"{cmd}: {t} does not exist"
    else:
        pytest.fail(f"no rule for this documented command: {cmd}")


def test_the_docs_have_commands():
    assert sum(len(c) for _, c in FENCES) >= 10, FENCES


@pytest.mark.parametrize("cmds", _params())
def test_documented_commands_run(cmds, tmp_path):
    for cmd in cmds:
        _check(cmd, str(tmp_path))


def test_relative_links_resolve():
    """Every relative link of README.md and docs/*.md names a file that exists
    and, with a #fragment into a markdown file, a heading there."""
    def anchors(path):
        with open(path, encoding="utf-8") as fh:
            heads = re.findall(r"^#{1,6}\s+(.*)$", fh.read(), re.M)
        return {re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", h.strip().lower())) for h in heads}

    bad = []
    for doc in _doc_files():
        with open(doc, encoding="utf-8") as fh:
            text = fh.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://|mailto:", target):
                continue
            path, _, frag = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(full):
                bad.append(f"{os.path.relpath(doc, ROOT)}: {target} (no such file)")
            elif frag and full.endswith(".md") and frag not in anchors(full):
                bad.append(f"{os.path.relpath(doc, ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


#: a token that names a repository file: ends in .py, .md, .toml or .pyx, not
#: preceded by a path or word character (so not the tail of a URL or of
#: another path)
_PATH_TOKEN = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)*[\w.-]+\.(?:py|md|toml|pyx))\b")
#: names that are not repository files: where a run or a tool writes
_NOT_REPO_PATHS = {
    "results.md",           # bench/scenarios.py writes it into its --out directory
}
_NOT_REPO_PREFIXES = ("runs/", "RUN/", "RUN_DIR/", "tmp/", "../")     # ../: beside the repository
#: a file named near one of these words is gone on purpose (its record says so)
_GONE_MARKERS = ("removed", "git history", "git log", "git show")


def _named_path_files():
    out = [os.path.join(ROOT, "README.md")]
    for top in ("a3c_core", "bench", "docs"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__")) and d != "out"]
            out += [os.path.join(dirpath, f) for f in filenames if f.endswith((".py", ".md"))]
    return sorted(out)


def test_named_repository_files_exist():
    """A repository path a source or doc names (``bench/X.py``,
    ``docs/X.md``, ``a3c_core/.../X.py``, a top-level ``X.md``) exists,
    relative to the repository root (or, in markdown, to the doc).  Names
    of files removed on purpose pass where the text says so ("removed",
    "git history", ...; or under a markdown heading that says "removed")."""
    bad = []
    for path in _named_path_files():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        heading_gone = []       # (offset, whether the heading there says "removed")
        if path.endswith(".md"):
            heading_gone = [(m.start(), "removed" in m.group(0).lower())
                            for m in re.finditer(r"^#{1,6} .*$", text, re.M)]
        for m in _PATH_TOKEN.finditer(text):
            tok = m.group(1)
            if "/" not in tok and not tok.endswith(".md"):
                continue                # a module's own file name (setup.py, config.toml)
            if tok in _NOT_REPO_PATHS or tok.startswith(_NOT_REPO_PREFIXES):
                continue
            here = [os.path.join(ROOT, tok)]
            if path.endswith(".md"):
                here.append(os.path.join(os.path.dirname(path), tok))
            if any(os.path.exists(p) for p in here):
                continue
            near = text[max(0, m.start() - 100):m.end() + 60].lower()
            if any(w in near for w in _GONE_MARKERS):
                continue
            under = [gone for at, gone in heading_gone if at < m.start()]
            if under and under[-1]:
                continue
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{os.path.relpath(path, ROOT)}:{line}: {tok}")
    assert not bad, "names of files that do not exist:\n" + "\n".join(bad)
