"""The trainer's warm-up compiles the update's kernels in a helper process
(a3c_core.warmup.warm_up_network) while it compiles the step: the helper's
kernels must then load from the cache here, and the helper must not outlive
its parent."""
import json
import os
import signal
import subprocess
import sys

import pytest
from proc_util import REPO, alive, wait_gone

# records, in the child, whether each helper start launched a process
SPY = r"""
from a3c_core import warmup
started = []
orig = warmup.CompileHelper.start
def start(self):
    orig(self)
    started.append(self.proc is not None)
warmup.CompileHelper.start = start
"""

PARENT = SPY + r"""
import json, sys
import numpy as np
from a3c_core.nn.network import build_network

warmup.HELPER_DELAY_S = 0.0      # start the helper at once (a first run waits a few seconds)
net = build_network(SPEC, SHAPE, 3)
warmup.warm_up_network(net, parallel=True)
from a3c_core.nn import kernels as K
from a3c_core.sampling import sample_categorical
def counts(d):
    return sum(d.stats.cache_hits.values()), sum(d.stats.cache_misses.values())
print(json.dumps({"started": started, "heads_loss": counts(K.heads_loss),
                  "sampler": counts(sample_categorical)}))
"""


def _env(cache):
    return dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=REPO)


@pytest.mark.slow
def test_update_kernels_compiled_by_the_helper_load_from_the_cache(tmp_path):
    code = PARENT.replace("SPEC", repr("mlp")).replace("SHAPE", repr((4,)))
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path / "cache"),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["started"] == [True]
    # the heads' loss kernel runs only in the update: compiled by the helper
    # into the empty cache, loaded here (a hit, no compile)
    assert res["heads_loss"] == [1, 0]
    # the sampler runs only here, after the step: compiled here (the control)
    assert res["sampler"] == [0, 1]


@pytest.mark.slow
def test_no_helper_with_a_warm_cache_or_when_not_parallel(tmp_path):
    code = PARENT.replace("SPEC", repr("mlp")).replace("SHAPE", repr((4,))).replace(
        "warmup.HELPER_DELAY_S = 0.0", "pass").replace("parallel=True", "parallel=False")
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path / "cache"),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["started"] == [] and res["heads_loss"] == [0, 1]


KILLED = r"""
import sys, time
from a3c_core import warmup
h = warmup.CompileHelper({"name": "doom-lstm", "obs_shape": [1, 84, 84], "n_actions": 3,
                          "kwargs": {}, "dtype": "float32"})
h.start()
print(h.proc.pid, flush=True)
time.sleep(600)
"""


def test_helper_exits_when_its_parent_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", KILLED], env=_env(tmp_path / "cache"),
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive([child]) == {child}
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        # the helper polls its parent every 0.2 s, even while it compiles
        assert wait_gone([child], timeout=10) == set()
    finally:
        if parent.poll() is None:
            parent.kill()


COMPILE = SPY + r"""
import json, sys
from a3c_core import compile as comp

warmup.CompileHelper.arm = warmup.CompileHelper.start      # at once, not after its delay
comp.warm_up(specs=["mlp", "mlp-lstm"], parallel=True)
n, hits, misses, dirs, compiled, unsaved = comp.cache_stats()
print(json.dumps({"started": started, "hits": hits, "misses": misses}))
"""


@pytest.mark.slow
def test_compile_with_a_helper_leaves_a_complete_cache(tmp_path):
    env = _env(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["started"] == [True] and res["misses"] > 0
    # the parent's and the helper's kernels together: nothing left to compile
    check = subprocess.run([sys.executable, "-m", "a3c_core", "compile", "--check", "--spec", "mlp",
                            "--spec", "mlp-lstm"], env=env, capture_output=True, text=True,
                           timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert ", 0 compiled" in check.stdout


def test_helper_allowed_follows_the_environment(monkeypatch):
    from a3c_core import warmup

    monkeypatch.setattr(warmup, "_usable_cpus", lambda: 2)
    monkeypatch.delenv("A3C_COMPILE_HELPER", raising=False)
    assert warmup.helper_allowed()
    for off in ("0", "false", "OFF"):
        monkeypatch.setenv("A3C_COMPILE_HELPER", off)
        assert not warmup.helper_allowed()
    monkeypatch.setenv("A3C_COMPILE_HELPER", "1")
    monkeypatch.setattr(warmup, "_usable_cpus", lambda: 1)
    assert not warmup.helper_allowed()
    monkeypatch.setattr(warmup, "_usable_cpus", lambda: 2)
    monkeypatch.setattr(warmup.sys, "frozen", True, raising=False)
    assert not warmup.helper_allowed()


def test_helper_imports_this_process_a3c_core(tmp_path):
    """A helper started from a directory that holds another a3c_core (an A/B
    copy, a checkout beside an installed package) still imports this one,
    submodules and compiled extensions included: its kernels must land in
    the cache under this tree's paths."""
    import a3c_core
    from a3c_core import warmup

    other = tmp_path / "a3c_core"
    other.mkdir()
    (other / "__init__.py").write_text("raise ImportError('the other tree was imported')\n")
    code = ("import a3c_core, a3c_core.warmup as w, a3c_core._hogwild as h; "
            "print(a3c_core.__file__); print(w.__file__); print(h.__file__)")
    out = subprocess.run([sys.executable, "-c", warmup._HELPER_IMPORTS + code],
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pkg, mod, ext = out.stdout.split()
    assert os.path.samefile(pkg, a3c_core.__file__)
    assert os.path.samefile(mod, warmup.__file__)
    assert os.path.dirname(os.path.abspath(ext)) == os.path.dirname(os.path.abspath(a3c_core.__file__))
    # without it the other tree is found first (so the check above can fail)
    plain = subprocess.run([sys.executable, "-c", "import a3c_core"], cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=60)
    assert "the other tree was imported" in plain.stderr
