"""Packaging facts that CI's sdist/wheel build relies on (the build itself runs in .ci/run only)."""
import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _manifest_rules():
    rules = []
    with open(os.path.join(ROOT, "MANIFEST.in")) as fh:
        for line in fh:
            words = line.split("#")[0].split()
            if words:
                rules.append(words)
    return rules


def _shipped(rel, rules):
    """Whether MANIFEST.in's include/recursive-include rules (last match wins) ship ``rel``."""
    keep = False
    for cmd, *args in rules:
        if cmd == "include" and any(fnmatch.fnmatch(rel, a) for a in args):
            keep = True
        elif cmd == "exclude" and any(fnmatch.fnmatch(rel, a) for a in args):
            keep = False
        elif cmd in ("recursive-include", "recursive-exclude"):
            d, pats = args[0], args[1:]
            if rel.startswith(d.rstrip("/") + "/") and any(fnmatch.fnmatch(os.path.basename(rel), p) for p in pats):
                keep = cmd == "recursive-include"
    return keep


def test_manifest_ships_sources_configs_conftest_license():
    rules = _manifest_rules()
    must = (glob.glob("ext/*.pyx", root_dir=ROOT) + glob.glob("ext/*.pxd", root_dir=ROOT)
            + glob.glob("configs/*.toml", root_dir=ROOT) + ["tests/conftest.py", "LICENSE"])
    assert any(p.endswith(".pyx") for p in must) and "ext/_arrays.pxd" in must
    missing = [p for p in must if not _shipped(p, rules)]
    assert missing == [], f"MANIFEST.in does not ship {missing}"
    # every file in ext/ that is not generated C ships (a new .pxi or .h must be added)
    for p in glob.glob("ext/*", root_dir=ROOT):
        if not p.endswith((".c", ".html", ".so")):
            assert _shipped(p, rules), f"MANIFEST.in does not ship {p}"
    assert not _shipped("ext/_hogwild.c", rules)


def test_pyproject_metadata():
    import a3c_core

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        meta = tomllib.load(fh)
    proj = meta["project"]
    assert proj["license"] == "MIT" and proj["license-files"] == ["LICENSE"]
    assert "version" in proj["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "a3c_core.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", a3c_core.__version__)
    extras = proj["optional-dependencies"]
    assert extras["atari"] == ["ale-py>=0.10", "gymnasium>=0.29"]
    assert extras["ray"] == ["ray>=2.9"] and extras["plot"] == ["matplotlib>=3.6"]
    test_self = [r for r in extras["test"] if r.startswith("a3c_core[")]
    assert test_self and {"atari", "ray", "plot"} <= set(test_self[0][9:-1].split(","))
    with open(os.path.join(ROOT, "LICENSE")) as fh:
        text = fh.read()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the a3c_core developers" in text


def test_ci_runs_the_readme_test_command():
    with open(os.path.join(ROOT, "README.md")) as fh:
        readme = fh.read()
    cmd = re.search(r"Run the tests:\s*```bash\n(.+?)\n```", readme).group(1)
    with open(os.path.join(ROOT, ".ci", "run")) as fh:
        ci = fh.read().splitlines()
    assert cmd in ci, f"CI must run the README test command verbatim: {cmd}"
    assert any("smoke.py" in line for line in ci)
    # issue 41: first the main job (its command verbatim, with a small budget
    # appended) in the same clone, then a reinstall, then the test command,
    # then the slow tier
    main = re.search(r"the main job\):\s*```bash\n(.+?)\n```", readme).group(1)
    at_main = [i for i, line in enumerate(ci) if line.startswith(main + " --total-steps ")]
    at_reinstall = [i for i, line in enumerate(ci) if "--force-reinstall" in line and not line.startswith("#")]
    assert at_main and at_reinstall, "CI must run the README main job (short) and a --force-reinstall"
    assert at_main[0] < at_reinstall[0] < ci.index(cmd) < ci.index("pytest -m slow")
    assert not any(line.startswith("rm -rf .venv") for line in ci[at_main[0]:]), \
        "the test command must run in the clone the main job used"


def test_build_without_cython_sources_fails_loudly(tmp_path):
    shutil.copy(os.path.join(ROOT, "setup.py"), tmp_path / "setup.py")
    out = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert "no Cython sources (ext/*.pyx)" in out.stderr
