"""The reliability cases: real CLI processes, real signals, real files.

Shared by ``tests/test_reliability.py`` (one test per case) and
``bench/reliability.py`` (runs every case and writes the table).

How a case is judged
--------------------
Each case runs the real CLI (``python -m a3c_core ARGS``) in a subprocess in
its own temp dir, in a new session (``start_new_session=True``), with a
timeout. Its outcome is one of

* ``ok`` - an expected success: the rc the case names (0, or 130 for SIGINT,
  143 for SIGTERM), the words it must print, and no traceback;
* ``clear error`` - rc 2 (bad input) or 1 (failure), exactly one
  ``a3c <cmd>: error: ...`` line, that line (with its indented continuation
  lines, if any) contains every word the case lists (e.g. the field name;
  ``a|b`` means either, case-insensitive), and no traceback;
* ``traceback`` - ``Traceback (most recent call last)`` anywhere in the output;
* ``accepted silently`` - rc 0 where an error was expected;
* ``unclear error`` - any other failure where an error was expected (no
  error line, several, or one that does not name the problem);
* ``unexpected`` - an expected success that ended otherwise;
* ``hang`` - the timeout passed (the process group is then SIGKILLed).

Case directories and files have neutral names (``a3c-reli-*/file.npz``), so a
word can only match what the message says, not the path it quotes. Children
start with SIGINT at its default disposition, as at a terminal (a test runner
started in the background would otherwise pass SIGINT on as ignored).

Independently of the outcome, every case counts

* orphans: descendants of the CLI process (sampled every 0.2 s while it runs
  with :func:`proc_util.children_of`) still alive 10 s after it ended, plus
  any process carrying the case's marker environment variable
  (``A3C_RELI_CASE=<token>``, inherited by every descendant, ViZDoom engines
  in their own session included) still alive then; they are SIGKILLed after
  being counted;
* data lost: every ``.npz`` checkpoint named on the command line, or inside a
  run directory named on it, must have the same bytes after a case that does
  not mean to write it, and must still load if it loaded before; after a
  kill, the run's last checkpoint must load (the case's own check).

A case passes when its outcome is the expected one and it has no orphan, no
lost data and no failed check.

Faults (group ``fault``: a full disk, a second Ctrl-C while stopping, a bad
``done`` mask, a ViZDoom engine killed or stopped mid-run) also get a *fault outcome*, the case's ``fault`` naming the
one it must have:

* ``survived`` - the run went on through the fault and finished (rc 0), its
  checkpoint loading, as the case's check confirms;
* ``clean stop`` - it stopped as designed: the expected rc (130 for SIGINT)
  or one clear error line, and no data lost;
* ``lost`` - anything else: a traceback, a hang, an end by a signal (rc < 0),
  an unclear error, or data lost.

A file-size limit (``fsize``) is set with ``RLIMIT_FSIZE`` in the child, with
SIGXFSZ ignored, so a write past it fails with EFBIG as on a full file system.
"""
from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from proc_util import alive, children_of, wait_gone

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)
TRACEBACK = "Traceback (most recent call last)"
ERROR_LINE = re.compile(r"^a3c [a-z]+: error: .*$", re.M)
# an error message may go on over indented lines (e.g. a list of files tried)
ERROR_BLOCK = re.compile(r"^a3c [a-z]+: error: .*(?:\n[ \t]+\S.*)*", re.M)
MARKER_VAR = "A3C_RELI_CASE"
ORPHAN_GRACE_S = 10.0

# A short CartPole run: every invalid flag is appended to it, so a value that is
# wrongly accepted shows up as rc 0 after ~300 steps instead of a long run.
CART = ["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "300",
        "--no-tensorboard", "--quiet", "--run-dir", "{tmp}/run"]
DOOM = ["train", "--env", "doom:basic", "--workers", "1", "--total-steps", "300",
        "--no-tensorboard", "--quiet", "--run-dir", "{tmp}/run"]
# Runs that only a signal ends.
CART_LONG = ["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "0",
             "--total-seconds", "120", "--no-tensorboard", "--checkpoint-interval", "1",
             "--log-interval", "0.5", "--run-dir", "{tmp}/run"]
DOOM_LONG = ["train", "--env", "doom:basic", "--workers", "1", "--total-steps", "0",
             "--total-seconds", "120", "--no-tensorboard", "--checkpoint-interval", "1",
             "--log-interval", "0.5", "--run-dir", "{tmp}/run"]


# -- shared runs ----------------------------------------------------------------
@dataclass
class Shared:
    """Trained run directories shared by the cases (never written by a case)."""

    root: str
    cart: Optional[str] = None
    doom: Optional[str] = None

    def paths(self) -> dict:
        out = {}
        for name in ("cart", "doom"):
            run = getattr(self, name)
            if run:
                out[name] = run
                out[f"{name}_latest"] = os.path.join(run, "checkpoints", "latest.npz")
        return out


def have_vizdoom() -> bool:
    try:
        import vizdoom  # noqa: F401
    except ImportError:
        return False
    return True


def train_shared(root=None, doom=True, timeout=300) -> Shared:
    """Train the shared CartPole (and doom:basic) runs, 300 steps each, under ``root``
    (default: a new neutral temp dir; :func:`remove_shared` deletes it)."""
    root = root or tempfile.mkdtemp(prefix="a3c-reli-")
    os.makedirs(root, exist_ok=True)
    shared = Shared(root)
    todo = [("cart", CART)] + ([("doom", DOOM)] if doom and have_vizdoom() else [])
    for name, argv in todo:
        run = os.path.join(root, name)
        args = [a.replace("{tmp}/run", run) for a in argv]
        p = subprocess.run([sys.executable, "-m", "a3c_core", *args], cwd=root, env=_child_env(""),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        if p.returncode != 0 or not os.path.exists(os.path.join(run, "checkpoints", "latest.npz")):
            raise RuntimeError(f"could not train the shared {name} run (rc {p.returncode}):\n{p.stdout}")
        setattr(shared, name, run)
    return shared


def remove_shared(shared):
    shutil.rmtree(shared.root, ignore_errors=True)


# -- the case model ---------------------------------------------------------------
@dataclass
class Then:
    """A follow-up command of the same case (e.g. ``--resume`` after a kill)."""

    argv: list
    rc: tuple = (0,)
    contains: tuple = ()


@dataclass
class Case:
    """One reliability case (see the module docstring for how it is judged).

    ``argv`` may use ``{tmp}`` (the case's own dir), ``{cart}``/``{doom}`` (the
    shared run dirs), ``{cart_latest}``/``{doom_latest}`` and any key the
    ``setup(ctx) -> dict`` returns. ``expect`` is ``"ok"`` (rc in ``rc``) or
    ``"error"`` (a clear error whose line holds every word of ``words``).
    ``drive(run, ctx)`` sends signals while the process runs; ``check(ctx)``
    returns a list of problems found after it ended. ``bug``: the library bug
    that makes this case fail today (the test is then a strict xfail).
    ``fault``: the fault outcome it must have (see the module docstring);
    ``fsize``: an RLIMIT_FSIZE in bytes for the process; ``module``: what
    ``python -m`` runs (a probe of the Python API instead of the CLI).
    """

    name: str
    group: str
    argv: list
    expect: str = "error"
    words: tuple = ()
    rc: tuple = (0,)
    contains: tuple = ()
    absent: tuple = ()
    setup: Optional[Callable] = None
    drive: Optional[Callable] = None
    check: Optional[Callable] = None
    then: Optional[Then] = None
    needs: tuple = ()
    writes: bool = False
    timeout: float = 180.0
    repeat: int = 1  # racy windows: run up to this many times, judge the first failing run
    env: dict = field(default_factory=dict)  # extra environment variables (values formatted like argv)
    bug: str = ""
    fault: str = ""       # "survived" or "clean stop"
    fsize: int = 0        # RLIMIT_FSIZE (bytes) of the process; 0: none
    module: str = "a3c_core"


@dataclass
class Result:
    name: str
    group: str
    expect: str
    outcome: str = ""
    rc: Optional[int] = None
    seconds: float = 0.0
    orphans: list = field(default_factory=list)
    data_lost: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    error_line: str = ""
    output: str = ""
    argv: list = field(default_factory=list)
    bug: str = ""
    skipped: str = ""
    notes: list = field(default_factory=list)
    fault: str = ""             # the fault outcome expected ("" for a case that is no fault)
    fault_outcome: str = ""     # survived / clean stop / lost
    module: str = "a3c_core"

    @property
    def expected_outcome(self) -> str:
        return "ok" if self.expect == "ok" else "clear error"

    @property
    def passed(self) -> bool:
        return (not self.skipped and self.outcome == self.expected_outcome and not self.orphans
                and not self.data_lost and not self.problems
                and self.fault_outcome == self.fault)

    def report(self) -> str:
        """A readable account of the case (assertion message, script --verbose)."""
        lines = [f"case {self.name}: outcome {self.outcome!r} (expected {self.expected_outcome!r}), "
                 f"rc {self.rc}, {self.seconds:.1f}s",
                 f"command: python -m {self.module} " + " ".join(self.argv)]
        lines += [f"orphan: {o}" for o in self.orphans]
        lines += [f"data lost: {d}" for d in self.data_lost]
        lines += [f"problem: {p}" for p in self.problems]
        tail = self.output if len(self.output) < 6000 else "...\n" + self.output[-6000:]
        lines.append("output:\n" + tail)
        return "\n".join(lines)


class Ctx:
    """What a case's setup/drive/check functions see."""

    def __init__(self, tmp, shared, token):
        self.tmp = tmp
        self.shared = shared
        self.token = token
        self.paths = {"tmp": tmp, **shared.paths()}
        self.output = ""
        self.rc = None
        self.notes = []

    def fmt(self, argv):
        return [a.format(**self.paths) for a in argv]


# -- running one process ------------------------------------------------------------
def _child_env(token):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if token:
        env[MARKER_VAR] = token
    return env


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _child_setup(fsize=0):
    """The child's preexec_fn: SIGINT at its default; with ``fsize``, a file-size
    limit (a write past it fails with EFBIG, SIGXFSZ being ignored)."""
    def setup():
        _default_sigint()
        if fsize:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return setup


class Proc:
    """A running CLI process: output collected by a thread, descendants sampled."""

    def __init__(self, argv, cwd, token, extra_env=None, fsize=0, module="a3c_core"):
        env = _child_env(token)
        env.update(extra_env or {})
        self.argv = argv
        self.p = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=cwd, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True, preexec_fn=_child_setup(fsize))
        self.pid = self.p.pid
        self.t0 = time.monotonic()
        self.lines = []
        self.kids = set()
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._reader.start()
        self._sampler.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)
        self.p.stdout.close()

    def _sample(self):
        while not self._done.is_set() and self.p.poll() is None:
            self.kids |= children_of(self.pid)
            time.sleep(0.2)

    @property
    def output(self):
        return "".join(self.lines)

    def running(self):
        return self.p.poll() is None

    def wait_until(self, pred, timeout=120.0, poll=0.05):
        """Poll ``pred()`` until true; False if the process ended or time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            if not self.running():
                return bool(pred())
            time.sleep(poll)
        return False

    def killpg(self, sig):
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def finish(self, timeout):
        """Wait for the end; returns False on timeout (the whole group is SIGKILLed)."""
        remaining = max(1.0, timeout - (time.monotonic() - self.t0))
        hung = False
        try:
            self.p.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            hung = True
            self.kids |= children_of(self.pid)
            self.killpg(signal.SIGKILL)
            self.p.wait(timeout=30)
        self._done.set()
        self._reader.join(timeout=10)
        self._sampler.join(timeout=10)
        self.seconds = time.monotonic() - self.t0
        return not hung


def marked_pids(token):
    """Live processes whose environment carries ``A3C_RELI_CASE=token``."""
    needle = f"{MARKER_VAR}={token}".encode()
    out = set()
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.add(int(d))
    return alive(out)


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _collect_orphans(kids, token):
    """Descendants or marked processes still alive ORPHAN_GRACE_S after the end; killed."""
    left = wait_gone(set(kids) | marked_pids(token), timeout=ORPHAN_GRACE_S)
    left |= marked_pids(token)
    found = [f"pid {p}: {_cmdline(p)}" for p in sorted(left)]
    for p in left:  # never leave our own processes behind
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return found


# -- data checks ------------------------------------------------------------------
def _protected_files(argv):
    """``.npz`` files named in ``argv`` or inside a run dir named in it."""
    files = []
    for a in argv:
        if os.path.isfile(a) and a.endswith(".npz"):
            files.append(os.path.abspath(a))
        elif os.path.isdir(os.path.join(a, "checkpoints")):
            ck = os.path.join(a, "checkpoints")
            files += [os.path.join(ck, f) for f in sorted(os.listdir(ck)) if f.endswith(".npz")]
    return files


def _loads(path):
    from a3c_core.checkpoint import CheckpointError, load_checkpoint

    try:
        load_checkpoint(path)
        return True
    except CheckpointError:
        return False


def _fingerprint(files):
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            out[f] = (hashlib.sha256(fh.read()).hexdigest(), _loads(f))
    return out


def _data_lost(before):
    lost = []
    for f, (digest, loaded) in before.items():
        if not os.path.exists(f):
            lost.append(f"{f} was removed")
            continue
        with open(f, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() != digest:
                lost.append(f"{f} was changed by a command that should not write it")
                continue
        if loaded and not _loads(f):
            lost.append(f"{f} no longer loads")
    return lost


# -- judging ------------------------------------------------------------------------
def _word_in(word, line):
    return any(w.lower() in line.lower() for w in word.split("|"))


def classify(case, rc, output, hung):
    """(outcome, error line, problems) for one finished command of ``case``."""
    errors = ERROR_BLOCK.findall(output)
    line = errors[0] if errors else ""
    problems = []
    if hung:
        return "hang", line, problems
    if TRACEBACK in output:
        return "traceback", line, problems
    if case.expect == "error":
        if rc == 0:
            return "accepted silently", line, problems
        if rc in (1, 2) and len(errors) == 1 and all(_word_in(w, line) for w in case.words):
            return "clear error", line, problems
        if rc not in (1, 2):
            problems.append(f"rc {rc}, expected 1 or 2")
        if len(errors) != 1:
            problems.append(f"{len(errors)} 'a3c <cmd>: error:' lines, expected 1")
        missing = [w for w in case.words if not _word_in(w, line)]
        if errors and missing:
            problems.append(f"the error line does not name {missing}")
        return "unclear error", line, problems
    if rc not in case.rc:
        problems.append(f"rc {rc}, expected {' or '.join(map(str, case.rc))}")
    problems += [f"output lacks {w!r}" for w in case.contains if not _word_in(w, output)]
    problems += [f"output has {w!r}" for w in case.absent if w.lower() in output.lower()]
    return ("unexpected" if problems else "ok"), line, problems


def skip_reason(case, shared) -> str:
    if "doom" in case.needs and not have_vizdoom():
        return "vizdoom is not installed"
    uses = " ".join(case.argv) + (" {cart}" if case.setup else "")  # setups copy the cart run
    for name in ("cart", "doom"):
        if "{" + name in uses and not getattr(shared, name):
            return f"no shared {name} run"
    return ""


def run_case(case: Case, shared: Shared, keep: str = "") -> Result:
    """Run ``case`` in a fresh neutral temp dir and judge it.

    The dir is removed afterwards unless ``keep`` names a directory to move it into.
    """
    res = Result(case.name, case.group, case.expect, bug=case.bug, fault=case.fault,
                 module=case.module)
    reason = skip_reason(case, shared)
    if reason:
        res.skipped = reason
        res.outcome = "skipped"
        return res
    seconds = 0.0
    for attempt in range(case.repeat):
        tmp = tempfile.mkdtemp(prefix="a3c-reli-")
        try:
            res = _run_case(case, shared, tmp, Result(case.name, case.group, case.expect,
                                                      bug=case.bug, fault=case.fault,
                                                      module=case.module))
        finally:
            if keep:
                shutil.move(tmp, keep)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        seconds += res.seconds
        if not res.passed:
            break
    if case.repeat > 1:
        res.seconds = seconds
        if not res.passed:
            res.problems.append(f"attempt {attempt + 1} of {case.repeat}")
    return res


def _run_case(case, shared, tmp, res):
    token = uuid.uuid4().hex
    ctx = Ctx(tmp, shared, token)
    if case.setup:
        ctx.paths.update(case.setup(ctx) or {})
    argv = ctx.fmt(case.argv)
    res.argv = argv
    before = {} if case.writes else _fingerprint(_protected_files(argv))
    extra_env = {"CRASH_ENVS_MARKER": os.path.join(tmp, "env-started"),
                 **{k: v.format(**ctx.paths) for k, v in case.env.items()}}

    proc = Proc(argv, tmp, token, extra_env, fsize=case.fsize, module=case.module)
    try:
        if case.drive:
            case.drive(proc, ctx)
    finally:
        finished = proc.finish(case.timeout)
    res.rc, res.seconds = proc.p.returncode, proc.seconds
    ctx.output, ctx.rc = proc.output, res.rc
    res.output = proc.output
    res.outcome, res.error_line, res.problems = classify(case, res.rc, proc.output, not finished)
    res.orphans = _collect_orphans(proc.kids, token)

    if case.check and res.outcome != "hang":
        res.problems += case.check(ctx)
    res.notes = ctx.notes
    if case.then and res.outcome not in ("hang", "traceback"):
        then_argv = ctx.fmt(case.then.argv)
        nxt = Proc(then_argv, tmp, token)
        ok = nxt.finish(case.timeout)
        res.seconds += nxt.seconds
        res.argv = argv + ["&&", "python", "-m", "a3c_core"] + then_argv
        out = nxt.output
        res.output += f"\n--- then: {' '.join(then_argv)} (rc {nxt.p.returncode}) ---\n{out}"
        if not ok:
            res.outcome = "hang"
        elif TRACEBACK in out:
            res.outcome = "traceback"
        else:
            if nxt.p.returncode not in case.then.rc:
                res.problems.append(f"follow-up rc {nxt.p.returncode}, expected {case.then.rc}")
            res.problems += [f"follow-up output lacks {w!r}" for w in case.then.contains
                             if not _word_in(w, out)]
            if res.problems and res.outcome == "ok":
                res.outcome = "unexpected"
        res.orphans += _collect_orphans(nxt.kids, token)
    res.data_lost = _data_lost(before)
    # checks report lost data as "data: ..." problems
    res.data_lost += [p[5:].strip() for p in res.problems if p.startswith("data:")]
    res.problems = [p for p in res.problems if not p.startswith("data:")]
    if case.fault:
        res.fault_outcome = fault_outcome(res)
    return res


def fault_outcome(res) -> str:
    """survived / clean stop / lost (see the module docstring)."""
    if res.data_lost or res.outcome not in ("ok", "clear error") or res.problems:
        return "lost"
    return "survived" if res.rc == 0 else "clean stop"


# -- setup helpers ------------------------------------------------------------------
def _write(ctx, name, data):
    path = os.path.join(ctx.tmp, name)
    with open(path, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)
    return path


def copy_run(ctx, src, name="run"):
    """Copy a shared run dir into the case's dir (cases that write get a copy)."""
    dst = os.path.join(ctx.tmp, name)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("vizdoom", "tb", "events.*"))
    return dst


def _read_npz(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: np.array(z[k]) for k in z.files}


def _meta(arrays):
    return json.loads(bytes(arrays["meta"]).decode())


def _with_meta(arrays, meta):
    out = dict(arrays)
    out["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    return out


def _save_npz(path, arrays):
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


class PickleProbe:
    """Unpickling this creates the file ``path`` (proof that a loader unpickled)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def setup_random_bytes(ctx):
    rng = np.random.default_rng(1)
    return {"f": _write(ctx, "file.npz", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())}


def setup_empty(ctx):
    return {"f": _write(ctx, "file.npz", b"")}


def setup_truncated(ctx):
    data = open(ctx.paths["cart_latest"], "rb").read()
    return {"f": _write(ctx, "file.npz", data[: len(data) // 2])}


def setup_corrupt(ctx):
    data = bytearray(open(ctx.paths["cart_latest"], "rb").read())
    mid = len(data) // 3
    data[mid:mid + 64] = bytes((b ^ 0x5A) for b in data[mid:mid + 64])
    return {"f": _write(ctx, "file.npz", bytes(data))}


def setup_foreign(ctx):
    return {"f": _save_npz(os.path.join(ctx.tmp, "file.npz"),
                           {"x": np.arange(10.0), "y": np.ones((3, 3), np.float32)})}


def setup_pickled(ctx):
    probe = os.path.join(ctx.tmp, "probe-created")
    ctx.paths["probe"] = probe
    obj = np.empty(1, dtype=object)
    obj[0] = PickleProbe(probe)
    path = os.path.join(ctx.tmp, "file.npz")
    with open(path, "wb") as fh:
        np.savez(fh, params=obj, meta=obj.copy())
    return {"f": path}


def check_not_unpickled(ctx):
    return ([f"the loader unpickled an object: {ctx.paths['probe']} was created"]
            if os.path.exists(ctx.paths["probe"]) else [])


def _nan_arrays(ctx, src):
    arrays = _read_npz(src)
    arrays["params"] = np.full_like(arrays["params"], np.nan)
    return arrays


def setup_nan_params(ctx):
    return {"f": _save_npz(os.path.join(ctx.tmp, "file.npz"), _nan_arrays(ctx, ctx.paths["cart_latest"]))}


def setup_newer_format(ctx):
    arrays = _read_npz(ctx.paths["cart_latest"])
    meta = _meta(arrays)
    meta["format_version"] = 99
    return {"f": _save_npz(os.path.join(ctx.tmp, "file.npz"), _with_meta(arrays, meta))}


def setup_missing_wad(ctx):
    cfg = ("doom_scenario_path = no_such_map.wad\n"
           "doom_map = map01\n"
           "available_buttons = { MOVE_LEFT MOVE_RIGHT ATTACK }\n"
           "episode_timeout = 300\n")
    return {"cfg": _write(ctx, "scenario.cfg", cfg)}


def _toml(text):
    def setup(ctx):
        return {"toml": _write(ctx, "bad.toml", text)}
    return setup


def setup_best_only(ctx):
    run = copy_run(ctx, ctx.shared.cart)
    ck = os.path.join(run, "checkpoints")
    shutil.copyfile(os.path.join(ck, "latest.npz"), os.path.join(ck, "best.npz"))
    os.remove(os.path.join(ck, "latest.npz"))
    return {"run": run}


def setup_corrupt_latest_valid_best(ctx):
    run = copy_run(ctx, ctx.shared.cart)
    ck = os.path.join(run, "checkpoints")
    latest = os.path.join(ck, "latest.npz")
    shutil.copyfile(latest, os.path.join(ck, "best.npz"))
    data = open(latest, "rb").read()
    with open(latest, "wb") as fh:
        fh.write(data[: len(data) // 2])
    return {"run": run}


def setup_truncated_only(ctx):
    run = copy_run(ctx, ctx.shared.cart)
    latest = os.path.join(run, "checkpoints", "latest.npz")
    data = open(latest, "rb").read()
    for f in os.listdir(os.path.join(run, "checkpoints")):
        os.remove(os.path.join(run, "checkpoints", f))
    with open(latest, "wb") as fh:
        fh.write(data[: len(data) // 2])
    return {"run": run}


def setup_nan_run(ctx):
    run = copy_run(ctx, ctx.shared.cart)
    ck = os.path.join(run, "checkpoints")
    for f in os.listdir(ck):
        _save_npz(os.path.join(ck, f), _nan_arrays(ctx, os.path.join(ck, f)))
    return {"run": run}


def setup_pickled_run(ctx):
    run = copy_run(ctx, ctx.shared.cart)
    ck = os.path.join(run, "checkpoints")
    for f in os.listdir(ck):
        os.remove(os.path.join(ck, f))
    shutil.move(setup_pickled(ctx)["f"], os.path.join(ck, "latest.npz"))
    return {"run": run}


def setup_empty_run(ctx):
    run = os.path.join(ctx.tmp, "run")
    os.makedirs(os.path.join(run, "checkpoints"))
    return {"run": run}


def setup_no_best(ctx):
    run = copy_run(ctx, ctx.shared.cart)
    best = os.path.join(run, "checkpoints", "best.npz")
    if os.path.exists(best):
        os.remove(best)
    return {"run": run}


def check_latest_loads(ctx, run_key="tmp", sub="run"):
    run = os.path.join(ctx.paths[run_key], sub) if sub else ctx.paths[run_key]
    latest = os.path.join(run, "checkpoints", "latest.npz")
    if not os.path.exists(latest):
        return [f"data: no checkpoint at {latest}"]
    return [] if _loads(latest) else [f"data: {latest} does not load"]



def check_resumed_run(ctx):
    return check_latest_loads(ctx, "run", "")



def check_interrupted(ctx):
    problems = check_latest_loads(ctx)
    summary = os.path.join(ctx.tmp, "run", "summary.json")
    if not os.path.exists(summary):
        return problems + ["no summary.json after the signal"]
    d = json.load(open(summary))
    if d.get("status") != "interrupted":
        problems.append(f"summary.json status {d.get('status')!r}, expected 'interrupted'")
    return problems



def check_worker_failure(ctx):
    """A crashed worker leaves a loadable checkpoint if the run wrote one."""
    latest = os.path.join(ctx.tmp, "run", "checkpoints", "latest.npz")
    if os.path.exists(latest) and not _loads(latest):
        return [f"data: {latest} does not load after the worker failed"]
    return []



def check_mid_write(ctx):
    problems = check_latest_loads(ctx)
    if not ctx.notes:
        problems.append("the kill did not land during a checkpoint write")
    return problems



# -- write faults (a file-size limit: EFBIG, as a full disk's ENOSPC) -----------------
#: a file-size limit under the default CartPole checkpoint (~460 KB: 37,955
#: parameters and Adam's two moments) and above its logs (the issue's ``ulimit -f 400``)
FSIZE_CHECKPOINT = 400 * 1024
#: above a 14 KB checkpoint (--hidden 8 --lstm-size 8), under 20,000 steps of CSV rows
FSIZE_LOGS = 24 * 1024


def _summary(ctx):
    path = os.path.join(ctx.tmp, "run", "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def _whole_rows(path):
    """Problems of a CSV file a write fault may have torn: a last line without
    its newline, rows of another width than the header."""
    with open(path, newline="") as fh:
        text = fh.read()
    if text and not text.endswith("\n"):
        return [f"{os.path.basename(path)} ends with a torn row"]
    widths = {len(r) for r in csv.reader(text.splitlines())}
    return [f"{os.path.basename(path)} has rows of {sorted(widths)} fields"] if len(widths) > 1 else []


def setup_fault_resume(ctx):
    """A copy of the shared CartPole run; its latest.npz's bytes are kept to compare."""
    run = copy_run(ctx, ctx.shared.cart)
    with open(os.path.join(run, "checkpoints", "latest.npz"), "rb") as fh:
        ctx.digest = hashlib.sha256(fh.read()).hexdigest()
    return {"run": run}


def check_checkpoint_fault_fresh(ctx):
    """No checkpoint fits: one warning for the periodic writes, no temporary
    file left, summary.json says how many writes failed."""
    problems = []
    ck = os.path.join(ctx.tmp, "run", "checkpoints")
    left = os.listdir(ck) if os.path.isdir(ck) else []
    if left:
        problems.append(f"files left in checkpoints/: {left}")
    if ctx.output.count("warning: cannot write checkpoint") < 1:
        problems.append("no warning for the periodic checkpoint writes")
    if ctx.output.count(f"cannot write checkpoint {ck}/latest.npz") > 1:
        problems.append("more than one warning line for latest.npz")
    d = _summary(ctx)
    if d is None:
        problems.append("no summary.json")
    else:
        if d.get("status") != "failed":
            problems.append(f"summary.json status {d.get('status')!r}, expected 'failed'")
        if d.get("steps", 0) < 20000:
            problems.append(f"the run stopped at step {d.get('steps')}, not going on after "
                            "the refused writes")
        ctx.notes.append(f"{d.get('checkpoint_write_failures')} checkpoint writes refused, "
                         f"training went on to step {d.get('steps'):,}; none on disk")
    return problems


def check_checkpoint_fault_resume(ctx):
    """The resumed run's latest.npz is the one it started from, byte for byte."""
    latest = os.path.join(ctx.paths["run"], "checkpoints", "latest.npz")
    if not os.path.exists(latest):
        return [f"data: {latest} was removed"]
    with open(latest, "rb") as fh:
        if hashlib.sha256(fh.read()).hexdigest() != ctx.digest:
            return [f"data: {latest} changed although no checkpoint could be written"]
    with open(os.path.join(ctx.paths["run"], "summary.json")) as fh:
        d = json.load(fh)
    problems = [] if _loads(latest) else [f"data: {latest} no longer loads"]
    if d.get("steps", 0) < 20000:
        problems.append(f"the run stopped at step {d.get('steps')}, not going on after the "
                        "refused writes")
    ctx.notes.append(f"{d.get('checkpoint_write_failures')} checkpoint writes refused, training "
                     f"went on to step {d.get('steps'):,}; latest.npz intact, resumed from it "
                     "once the limit was gone")
    return problems


def check_log_fault(ctx):
    """Checkpoints fit, the logs do not: the run finished, the lost rows are
    counted, no row is torn, the checkpoint loads."""
    problems = check_latest_loads(ctx)
    d = _summary(ctx)
    if d is None:
        return problems + ["no summary.json"]
    lost = d.get("unwritten_rows") or {}
    if not lost:
        problems.append("summary.json unwritten_rows is empty: the limit did not bite")
    for name in ("metrics.csv", "episodes.csv"):
        problems += _whole_rows(os.path.join(ctx.tmp, "run", name))
    ctx.notes.append("rows not written: " + ", ".join(f"{n} of {k}" for k, n in lost.items()))
    return problems


def _latest(ctx):
    return os.path.join(ctx.tmp, "run", "checkpoints", "latest.npz")


def _after_first_checkpoint(sig, group, settle=1.0):
    def drive(proc, ctx):
        if proc.wait_until(lambda: os.path.exists(_latest(ctx)), timeout=150):
            time.sleep(settle)  # training, not start-up
            if group:
                proc.killpg(sig)  # a terminal's Ctrl-C: the whole foreground group
            else:
                os.kill(proc.pid, sig)
    return drive


def _maps_have(pid, needle):
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return needle in fh.read()
    except OSError:
        return False


def drive_sigint_during_imports(proc, ctx):
    """Ctrl-C while Python is still importing numpy (its C core is mapped, the CLI not yet running)."""
    if proc.wait_until(lambda: _maps_have(proc.pid, "_multiarray_umath"), timeout=60, poll=0.002):
        proc.killpg(signal.SIGINT)


def drive_sigint_before_first_checkpoint(proc, ctx):
    """Ctrl-C right after the trainer announced its run dir, while its Numba kernels compile
    (the case gives it an empty cache): nothing is trained or saved yet."""
    if proc.wait_until(lambda: "run directory:" in proc.output, timeout=120, poll=0.01):
        proc.killpg(signal.SIGINT)


_COMPILE_DELAYS = itertools.cycle((0.4, 1.0, 1.8))


def drive_sigint_while_compiling(proc, ctx):
    """Ctrl-C 0.4, 1.0 or 1.8 s (one per attempt) after the run dir line, with an
    empty cache: inside Numba's compiler, where an exception raised at any line
    was lost in a ctypes callback (training went on) or broke the next cache
    write (a traceback) in ~1 start of 10 before the signal was deferred to a
    safe point."""
    if proc.wait_until(lambda: "run directory:" in proc.output, timeout=120, poll=0.01):
        time.sleep(next(_COMPILE_DELAYS))
        proc.killpg(signal.SIGINT)


def drive_sigint_in_compile_command(proc, ctx):
    """Ctrl-C 1.5 or 3 s (one per attempt) into ``a3c compile`` on an empty cache."""
    time.sleep(max(0.0, next(_COMMAND_DELAYS) - (time.monotonic() - proc.t0)))
    proc.killpg(signal.SIGINT)


_COMMAND_DELAYS = itertools.cycle((1.5, 3.0))


def drive_sigint_in_eval_compile(proc, ctx):
    """Ctrl-C 0.5 s after eval loaded its checkpoint: its first step compiles."""
    if proc.wait_until(lambda: "loaded" in proc.output, timeout=120, poll=0.01):
        time.sleep(0.5)
        proc.killpg(signal.SIGINT)


def drive_sigint_in_env_init(proc, ctx):
    marker = os.path.join(ctx.tmp, "env-started")
    if proc.wait_until(lambda: os.path.exists(marker), timeout=120):
        proc.killpg(signal.SIGINT)


def _session_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def drive_sigint_at_engine_start(proc, ctx):
    """Ctrl-C while the ViZDoom engine is being launched: as soon as the trainer has a
    child that is still in its session (the launcher, or the engine guard before its
    ``setsid``), as a terminal's Ctrl-C would find it."""
    def launching():
        for pid in children_of(proc.pid):
            if _session_of(pid) == proc.pid:
                proc.kids.add(pid)
                return True
        return False

    if proc.wait_until(launching, timeout=120, poll=0.0):
        proc.killpg(signal.SIGINT)


_SECOND_SIGINT_DELAYS = itertools.cycle((0.0, 0.01, 0.03, 0.1, 0.3))


def drive_double_sigint(proc, ctx):
    """Ctrl-C, then a second Ctrl-C 0 to 0.3 s later (one delay per attempt):
    while the final checkpoint is written or the process shuts down. Before
    issue 73 a second one in the interpreter's shutdown ended the process by
    the signal (rc -2) in ~1 run of 3."""
    if proc.wait_until(lambda: os.path.exists(_latest(ctx)), timeout=150):
        time.sleep(1.0)
        proc.killpg(signal.SIGINT)
        time.sleep(next(_SECOND_SIGINT_DELAYS))
        proc.killpg(signal.SIGINT)
        ctx.notes.append("the second SIGINT 0, 10, 30, 100 or 300 ms after the first "
                         "(one per attempt)")


def drive_kill_mid_write(proc, ctx):
    """SIGKILL the trainer while a 'latest' checkpoint is being written (its temp file exists)."""
    ck = os.path.join(ctx.tmp, "run", "checkpoints")
    if not proc.wait_until(lambda: os.path.exists(_latest(ctx)), timeout=150):
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.running():
        try:
            writing = any(n.startswith(".tmp-latest") for n in os.listdir(ck))
        except OSError:
            writing = False
        if writing:
            proc.kids |= children_of(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            proc.p.wait(timeout=30)
            left = [n for n in os.listdir(ck) if n.startswith(".tmp-")]
            if left:  # the partial file proves the kill landed mid-write
                ctx.notes.append(f"killed mid-write; partial file left: {left[0]}")
            return
        time.sleep(0.002)
    proc.killpg(signal.SIGKILL)


# -- engine faults (a crashed or hung ViZDoom engine) ----------------------------------
#: a doom:basic run that ends by its budget (the engine faults come 1 s after
#: its first checkpoint)
DOOM_FAULT = ["train", "--env", "doom:basic", "--workers", "1", "--total-steps", "0",
              "--total-seconds", "10", "--no-tensorboard", "--checkpoint-interval", "1",
              "--log-interval", "0.5", "--run-dir", "{tmp}/run"]


def _cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def engine_pid(trainer_pid):
    """The pid of the ViZDoom engine a trainer started (a direct child whose
    command line is the engine's, not its guard's), or None."""
    for pid in children_of(trainer_pid):
        cmd = _cmdline_of(pid)
        if _parent_of(pid) == trainer_pid and b"vizdoom" in cmd and b"_engine_guard" not in cmd:
            return pid
    return None


def _parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _engine_fault(sig, then_sigterm_after=None):
    """Send ``sig`` to the run's engine 1 s after its first checkpoint; with
    ``then_sigterm_after``, SIGTERM the trainer that many seconds later and
    time its exit."""
    def drive(proc, ctx):
        if not proc.wait_until(lambda: os.path.exists(_latest(ctx)), timeout=150):
            return
        time.sleep(1.0)
        pid = engine_pid(proc.pid)
        proc.kids |= children_of(proc.pid)
        if pid is None:
            ctx.notes.append("no engine process found")
            return
        os.kill(pid, sig)
        ctx.notes.append(f"engine {signal.Signals(sig).name} 1 s after the first checkpoint")
        if then_sigterm_after is not None:
            time.sleep(then_sigterm_after)
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            ctx.exit_seconds = time.monotonic() - t0
            ctx.notes.append(f"SIGTERM {then_sigterm_after:g} s later: exited in "
                             f"{ctx.exit_seconds:.1f} s")
    return drive


def check_engine_restarted(ctx):
    """The run went on to its budget: one env restart in summary.json and
    errors.log, a loadable checkpoint."""
    problems = check_latest_loads(ctx)
    d = _summary(ctx)
    if d is None:
        return problems + ["no summary.json"]
    if d.get("env_restarts") != 1:
        problems.append(f"summary.json env_restarts {d.get('env_restarts')!r}, expected 1")
    log = os.path.join(ctx.tmp, "run", "errors.log")
    if not os.path.exists(log) or "restarted" not in open(log).read():
        problems.append("no restart in errors.log")
    hung = re.search(r"an env call had taken ([\d.]+) s", ctx.output)
    if hung:
        ctx.notes.append(f"the step watchdog killed it after {hung.group(1)} s")
    if d.get("status") == "done":
        ctx.notes.append(f"rebuilt; the run went on to {d.get('seconds', 0):.0f} s, "
                         f"{d.get('steps', 0):,} steps")
    return problems


# a killed worker process (issue 73 item 4): 2 worker processes, each env in an env process
WORKER_FAULT_STEPS = 30000
WORKER_FAULT = ["train", "--env", "CartPole-v1", "--workers", "2", "--worker-processes",
                "--env-process", "--total-steps", str(WORKER_FAULT_STEPS), "--no-tensorboard",
                "--checkpoint-interval", "1", "--log-interval", "0.5", "--run-dir", "{tmp}/run"]


def drive_kill_worker_process(proc, ctx):
    """SIGKILL one of the run's worker processes (a direct child of the
    trainer) 0.5 s after the first checkpoint."""
    if not proc.wait_until(lambda: os.path.exists(_latest(ctx)), timeout=150):
        return
    time.sleep(0.5)
    proc.kids |= children_of(proc.pid)
    workers = sorted(p for p in children_of(proc.pid) if _parent_of(p) == proc.pid)
    if not workers:
        ctx.notes.append("no worker process found")
        return
    os.kill(workers[0], signal.SIGKILL)
    ctx.notes.append("worker process SIGKILL 0.5 s after the first checkpoint")


def check_worker_restarted(ctx):
    """The run went on to its total steps: one worker restart in
    summary.json and errors.log, a loadable checkpoint with finite parameters."""
    problems = check_latest_loads(ctx)
    d = _summary(ctx)
    if d is None:
        return problems + ["no summary.json"]
    if d.get("worker_restarts") != 1:
        problems.append(f"summary.json worker_restarts {d.get('worker_restarts')!r}, expected 1")
    if d.get("status") != "done" or d.get("steps", 0) < WORKER_FAULT_STEPS:
        problems.append(f"summary.json status {d.get('status')!r}, steps {d.get('steps')!r}")
    log = os.path.join(ctx.tmp, "run", "errors.log")
    if not os.path.exists(log) or "worker process" not in open(log).read():
        problems.append("no worker restart in errors.log")
    if d.get("status") == "done":
        ctx.notes.append(f"restarted; the run went on to its {d.get('steps', 0):,} steps "
                         f"in {d.get('seconds', 0):.0f} s")
    return problems


def check_stopped_within_10s(ctx):
    problems = check_interrupted(ctx)
    took = getattr(ctx, "exit_seconds", None)
    if took is None or took > 10.0:
        problems.append(f"exited {took} s after SIGTERM, not within 10 s")
    return problems


# -- the cases ------------------------------------------------------------------------
def _flag(name, flags, words, base=CART, bug="", needs=(), group="config flag"):
    return Case(name, group, base + list(flags), words=tuple(words), bug=bug, needs=needs)


def _toml_case(name, text, words, bug=""):
    return Case(name, "config TOML", ["train", "--config", "{toml}", "--run-dir", "{tmp}/run",
                                      "--total-steps", "300", "--quiet", "--no-tensorboard"],
                words=tuple(words), setup=_toml(text), bug=bug)


def _eval(name, argv, words=(), expect="error", setup=None, check=None, bug="", needs=(), contains=()):
    return Case(name, "eval", ["eval", *argv], expect=expect, words=tuple(words), setup=setup,
                check=check, bug=bug, needs=needs, contains=tuple(contains))


CASES = [
    # -- invalid config values through flags (rc 2, the field named) --
    _flag("flag-reward-scale-inf", ["--reward-scale", "inf"], ["reward_scale"]),
    _flag("flag-entropy-beta-inf", ["--entropy-beta", "inf"], ["entropy_beta"]),
    # an env option the env's family does not take (env_options: the family record's list)
    _flag("flag-view-on-a-gym-env", ["--view", "band"], ["env_options.view", "doom envs only"]),
    _flag("flag-frame-size-100000-doom", ["--frame-size", "100000"], ["frame_size"], base=DOOM,
          needs=("doom",)),
    _flag("flag-t-max-1e8", ["--t-max", "1e8"], ["t-max|t_max"]),
    _flag("flag-workers-1000", ["--workers", "1000"], ["workers"]),
    _flag("flag-log-interval-inf", ["--log-interval", "inf"], ["log_interval"]),
    _flag("flag-lr-negative", ["--lr=-1"], ["lr"]),
    _flag("flag-lr-nan", ["--lr", "nan"], ["lr"]),
    _flag("flag-gamma-1.5", ["--gamma", "1.5"], ["gamma"]),
    _flag("flag-gae-lambda-negative", ["--gae-lambda=-0.1"], ["gae_lambda"]),
    _flag("flag-optimizer-removed", ["--optimizer", "rmsprop"], ["--optimizer was removed"]),
    _flag("flag-spec-unknown", ["--spec", "resnet50"], ["spec"]),
    _flag("flag-hidden-zero", ["--hidden", "0,64"], ["hidden"]),
    _flag("flag-hidden-text", ["--hidden", "wide"], ["hidden"]),
    _flag("flag-t-max-0", ["--t-max", "0"], ["t_max"]),
    _flag("flag-max-grad-norm-negative", ["--max-grad-norm=-1"], ["max_grad_norm"]),
    # a removed knob: rc 2, named with why it went (a3c_core.train.config.REMOVED_FIELDS)
    _flag("flag-adam-beta2-1", ["--adam-beta2", "1.0"], ["--adam-beta2 was removed"]),
    _flag("flag-seed-negative", ["--seed=-5"], ["seed"]),
    _flag("flag-total-steps-negative", ["--total-steps=-1"], ["total_steps"]),
    _flag("flag-total-seconds-inf", ["--total-seconds", "inf"], ["total_seconds"]),
    _flag("flag-frame-skip-0", ["--frame-skip", "0"], ["frame_skip"]),
    _flag("flag-lstm-size-0", ["--lstm-size", "0"], ["lstm_size"]),
    _flag("flag-checkpoint-interval-negative", ["--checkpoint-interval=-1"], ["checkpoint_interval"]),
    _flag("flag-reward-clip-nan", ["--reward-clip", "nan"], ["reward_clip"]),
    _flag("flag-lr-anneal-without-total", ["--lr-anneal", "--lr-anneal-steps", "0", "--total-steps", "0"], ["lr_anneal"]),
    _flag("flag-health-reward-negative-doom", ["--health-reward=-1"], ["env_options.health_reward"],
          base=DOOM, needs=("doom",)),
    _flag("flag-hidden-on-doom-spec", ["--hidden", "64"], ["hidden"], base=DOOM, needs=("doom",)),
    # -- invalid config values through TOML --
    _toml_case("toml-lr-string", 'env = "CartPole-v1"\nlr = "fast"\n', ["lr"]),
    _toml_case("toml-unknown-field", 'env = "CartPole-v1"\nlearning_rate = 0.1\n', ["learning_rate"]),
    _toml_case("toml-syntax-error", 'env = "CartPole-v1"\nlr = = 1\n', ["toml"]),
    _toml_case("toml-workers-float", 'env = "CartPole-v1"\nworkers = 1.5\n', ["workers"]),
    _toml_case("toml-gamma-inf", 'env = "CartPole-v1"\ngamma = inf\n', ["gamma"]),
    _toml_case("toml-bool-as-string", 'env = "CartPole-v1"\ntensorboard = "yes"\n', ["tensorboard"]),
    _toml_case("toml-empty-env", 'env = ""\n', ["env"]),
    _toml_case("toml-a3c-table-t-max", '[a3c]\nenv = "CartPole-v1"\nt_max = -3\n', ["t_max"]),
    Case("toml-file-missing", "config TOML", ["train", "--config", "{tmp}/nope.toml", "--run-dir",
                                              "{tmp}/run"], words=("nope.toml",)),
    # -- envs --
    _flag("env-unknown-id", ["--env", "NoSuchEnv-v9"], ["NoSuchEnv-v9"], group="env"),
    _flag("env-prefix-typo", ["--env", "dom:basic"], ["dom:basic"], group="env"),
    _flag("env-doom-unknown-scenario", ["--env", "doom:no_such_scenario"], ["no_such_scenario"],
          needs=("doom",), group="env"),
    _flag("env-doom-missing-cfg", ["--env", "doom:{tmp}/missing.cfg"], ["missing.cfg"], needs=("doom",), group="env"),
    Case("env-doom-cfg-missing-wad", "env", DOOM + ["--env", "doom:{cfg}"],
         words=("no_such_map.wad",), setup=setup_missing_wad, needs=("doom",)),
    _flag("env-module-not-importable", ["--env", "no_such_module:Env-v0"], ["no_such_module"], group="env"),
    _flag("env-module-id-unregistered", ["--env", "crash_envs:Missing-v0"], ["Missing-v0"], group="env"),
    _flag("env-box-action-space", ["--env", "crash_envs:BoxAction-v0"], ["Discrete", "Box"], group="env"),
    Case("env-module-form-trains", "env", CART + ["--env", "crash_envs:Tiny-v0"], expect="ok",
         contains=("done",)),
    Case("env-worker-exception", "env", CART + ["--env", "crash_envs:RaiseInStep-v0"],
         words=("worker", "step failed on purpose"), check=check_worker_failure),
    Case("env-nan-observation", "env", CART + ["--env", "crash_envs:NaNObs-v0"],
         words=("nan|non-finite",), check=check_worker_failure),
    # -- eval: checkpoints good, bad and foreign --
    _eval("eval-ok-cartpole", ["{cart}", "--episodes", "2"], expect="ok", contains=("mean raw reward",)),
    _eval("eval-ok-doom", ["{doom}", "--episodes", "1"], expect="ok", contains=("mean raw reward",),
          needs=("doom",)),
    _eval("eval-module-form-env", ["{cart}", "--env", "crash_envs:Tiny-v0", "--episodes", "1"],
          expect="ok", contains=("mean raw reward",)),
    _eval("eval-random-bytes", ["{f}"], ["not an .npz checkpoint"], setup=setup_random_bytes),
    _eval("eval-config-toml", ["{cart}/config.toml"], ["not an .npz checkpoint"]),
    _eval("eval-empty-file", ["{f}"], ["not an .npz checkpoint|empty"], setup=setup_empty),
    _eval("eval-truncated-npz", ["{f}"], ["truncated|corrupt"], setup=setup_truncated),
    _eval("eval-corrupt-npz", ["{f}"], ["corrupt"], setup=setup_corrupt),
    _eval("eval-foreign-npz", ["{f}"], ["not an a3c_core checkpoint"], setup=setup_foreign),
    _eval("eval-pickled-object-npz", ["{f}"], ["pickle|object"], setup=setup_pickled,
          check=check_not_unpickled),
    _eval("eval-nan-params", ["{f}"], ["not finite"], setup=setup_nan_params),
    _eval("eval-newer-format", ["{f}"], ["newer"], setup=setup_newer_format),
    _eval("eval-missing-file", ["{tmp}/nope.npz"], ["nope.npz"]),
    # documented fallback (Policy.load): a missing best.npz means latest.npz, and the loaded file is named
    _eval("eval-which-best-falls-back", ["{run}", "--which", "best", "--episodes", "1"], expect="ok",
          contains=("loaded", "latest.npz"), setup=setup_no_best),
    _eval("eval-doom-checkpoint-on-mountaincar", ["{doom}", "--env", "MountainCar-v0"],
          ["MountainCar-v0"], needs=("doom",)),
    _eval("eval-cartpole-checkpoint-on-doom", ["{cart}", "--env", "doom:basic"], ["doom:basic"],
          needs=("doom",)),
    _eval("eval-cartpole-checkpoint-on-acrobot", ["{cart}", "--env", "Acrobot-v1"], ["Acrobot-v1"]),
    _eval("eval-episodes-0", ["{cart}", "--episodes", "0"], ["--episodes"]),
    # -- resume --
    Case("resume-best-only", "resume", ["train", "--resume", "{run}", "--total-steps", "600", "--quiet"],
         expect="ok", contains=("best.npz",), setup=setup_best_only, writes=True,
         check=check_resumed_run),
    Case("resume-corrupt-latest-valid-best", "resume",
         ["train", "--resume", "{run}", "--total-steps", "600", "--quiet"], expect="ok",
         contains=("best.npz",), setup=setup_corrupt_latest_valid_best, writes=True,
         check=check_resumed_run),
    Case("resume-truncated-only", "resume", ["train", "--resume", "{run}"],
         words=("truncated|corrupt",), setup=setup_truncated_only),
    Case("resume-nan-params", "resume", ["train", "--resume", "{run}"], words=("not finite",),
         setup=setup_nan_run),
    Case("resume-pickled-object-npz", "resume", ["train", "--resume", "{run}"], words=("pickle|object",),
         setup=setup_pickled_run, check=check_not_unpickled),
    Case("resume-no-checkpoint", "resume", ["train", "--resume", "{run}"], words=("checkpoint",),
         setup=setup_empty_run),
    Case("resume-missing-dir", "resume", ["train", "--resume", "{tmp}/nope"], words=("nope",)),
    Case("resume-other-env", "resume", ["train", "--resume", "{cart}", "--env", "Acrobot-v1"],
         words=("env|Acrobot",)),
    Case("resume-other-spec", "resume", ["train", "--resume", "{cart}", "--spec", "mlp"],
         words=("spec|mlp",)),
    Case("resume-doom-run-with-cartpole", "resume", ["train", "--resume", "{doom}", "--env",
                                                     "CartPole-v1"], words=("env|CartPole",),
         needs=("doom",)),
    Case("train-into-existing-run-dir", "resume", ["train", "--env", "CartPole-v1", "--run-dir", "{cart}"],
         words=("run_dir", "--resume")),
    # -- signals --
    Case("sigint-group-during-training", "signal", CART_LONG, expect="ok", rc=(130,),
         contains=("interrupted",), absent=("worker 0 failed", "a3c train: error"),
         drive=_after_first_checkpoint(signal.SIGINT, group=True), check=check_interrupted),
    Case("sigterm-during-training", "signal", CART_LONG, expect="ok", rc=(143,),
         contains=("interrupted:",), absent=("failed",),
         drive=_after_first_checkpoint(signal.SIGTERM, group=False), check=check_interrupted),
    Case("sigint-group-doom-training", "signal", DOOM_LONG, expect="ok", rc=(130,),
         contains=("interrupted",), absent=("failed",), needs=("doom",),
         drive=_after_first_checkpoint(signal.SIGINT, group=True), check=check_interrupted),
    Case("sigkill-doom-then-resume", "signal", DOOM_LONG, expect="ok", rc=(-signal.SIGKILL,),
         needs=("doom",), writes=True, drive=_after_first_checkpoint(signal.SIGKILL, group=False),
         check=check_latest_loads,
         then=Then(["train", "--resume", "{tmp}/run", "--total-seconds", "3", "--quiet"],
                   contains=("resuming from",))),
    Case("sigkill-mid-checkpoint-write", "signal",
         ["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "0", "--total-seconds",
          "120", "--no-tensorboard", "--quiet", "--hidden", "512,512", "--lstm-size", "512",
          "--checkpoint-interval", "0.05", "--run-dir", "{tmp}/run"],
         expect="ok", rc=(-signal.SIGKILL,), writes=True, drive=drive_kill_mid_write,
         check=check_mid_write,
         then=Then(["train", "--resume", "{tmp}/run", "--total-seconds", "2", "--quiet",
                    "--checkpoint-interval", "0"], contains=("resuming from",))),
    Case("sigint-during-imports", "signal", CART, expect="ok", rc=(130,),
         drive=drive_sigint_during_imports),
    Case("sigint-before-first-checkpoint", "signal", CART_LONG, expect="ok", rc=(130,),
         contains=("interrupted",), absent=("None", "a3c train: error"),
         drive=drive_sigint_before_first_checkpoint,
         env={"NUMBA_CACHE_DIR": "{tmp}/numba-cache"}),  # a first run: kernels compile during warm-up
    Case("sigint-while-compiling", "signal", CART_LONG, expect="ok", rc=(130,),
         contains=("interrupted",), absent=("Traceback", "Exception ignored", "a3c train: error"),
         drive=drive_sigint_while_compiling, repeat=3, timeout=60.0,
         env={"NUMBA_CACHE_DIR": "{tmp}/numba-cache"}),
    Case("sigint-during-a3c-compile", "signal", ["compile"], expect="ok", rc=(130,),
         contains=("interrupted",), absent=("Traceback", "Exception ignored"),
         drive=drive_sigint_in_compile_command, repeat=2, timeout=60.0,
         env={"NUMBA_CACHE_DIR": "{tmp}/numba-cache"}),
    Case("sigint-during-eval-compile", "signal", ["eval", "{cart}", "--episodes", "3"], expect="ok",
         rc=(130,), contains=("interrupted",), absent=("Traceback", "Exception ignored"),
         drive=drive_sigint_in_eval_compile, timeout=60.0,
         env={"NUMBA_CACHE_DIR": "{tmp}/numba-cache"}),
    Case("sigint-during-env-start", "signal", CART + ["--env", "crash_envs:SlowInit-v0"], expect="ok",
         rc=(130,), contains=("interrupted",), drive=drive_sigint_in_env_init),
    Case("sigint-during-doom-engine-start", "signal", DOOM, expect="ok", rc=(130,), needs=("doom",),
         drive=drive_sigint_at_engine_start, repeat=5),  # before 7599667: SIGSEGV in ~1 start of 3
    # -- faults a long run meets (issue 73): a full disk, a second Ctrl-C, a bad done mask --
    # the command under `ulimit -f 400`: no checkpoint fits; warned, then rc 1
    Case("disk-full-no-checkpoint-fits", "fault",
         ["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "20000",
          "--checkpoint-interval", "1", "--run-dir", "{tmp}/run"],
         words=("final checkpoint", "File too large", "no valid checkpoint"),
         fsize=FSIZE_CHECKPOINT, fault="clean stop", check=check_checkpoint_fault_fresh),
    # a resumed run on a full disk: every write refused, its latest.npz kept; resumed later
    Case("disk-full-resumed-run-keeps-its-checkpoint", "fault",
         ["train", "--resume", "{run}", "--total-steps", "20000", "--checkpoint-interval", "1"],
         words=("final checkpoint", "File too large", "newest valid", "latest.npz"),
         setup=setup_fault_resume, writes=True, fsize=FSIZE_CHECKPOINT, fault="clean stop",
         check=check_checkpoint_fault_resume,
         then=Then(["train", "--resume", "{run}", "--total-steps", "600", "--quiet"],
                   contains=("resuming from",))),
    # checkpoints fit, metrics.csv / episodes.csv / TensorBoard do not: the run finishes
    Case("disk-full-logs-only", "fault",
         ["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "20000",
          "--hidden", "8", "--lstm-size", "8", "--checkpoint-interval", "1",
          "--run-dir", "{tmp}/run"], expect="ok",
         contains=("warning: cannot write", "rows not written", "done:"),
         fsize=FSIZE_LOGS, fault="survived", check=check_log_fault),
    Case("sigint-twice-while-stopping", "fault", CART_LONG, expect="ok", rc=(130,),
         contains=("interrupted",), absent=("a3c train: error",),
         drive=drive_double_sigint, check=check_interrupted, repeat=5, fault="clean stop"),
    # a crashed engine is rebuilt in place; a hung one is killed by the step watchdog;
    # a signal stops the run within 10 s whatever its worker is stuck in (issue 73)
    Case("doom-engine-killed", "fault", DOOM_FAULT, expect="ok", rc=(0,),
         contains=("failed and was rebuilt", "done:"), needs=("doom",),
         drive=_engine_fault(signal.SIGKILL), check=check_engine_restarted, fault="survived"),
    Case("doom-engine-hung-watchdog", "fault", DOOM_FAULT + ["--env-step-timeout", "3"],
         expect="ok", rc=(0,), contains=("watchdog killed its engine", "done:"),
         needs=("doom",), drive=_engine_fault(signal.SIGSTOP), check=check_engine_restarted,
         fault="survived"),
    Case("doom-engine-hung-then-sigterm", "fault", DOOM_LONG, expect="ok", rc=(143,),
         contains=("interrupted:",), needs=("doom",),
         drive=_engine_fault(signal.SIGSTOP, then_sigterm_after=4.0),
         check=check_stopped_within_10s, fault="clean stop"),
    # a worker process killed mid-run is forked again from the shared parameters (issue 73)
    Case("worker-process-killed", "fault", WORKER_FAULT, expect="ok", rc=(0,),
         contains=("killed by SIGKILL; restarted", "done:"), drive=drive_kill_worker_process,
         check=check_worker_restarted, fault="survived"),
    Case("act-batch-float-done-mask", "fault", ["act-batch", "{cart}", "--done", "0.5"],
         words=("done",), module="reliability_probe", fault="clean stop"),
]


def case_by_name(name) -> Case:
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(name)


# -- the table ---------------------------------------------------------------------------
def summarize(results) -> dict:
    ran = [r for r in results if not r.skipped]
    errors = [r for r in ran if r.expect == "error"]
    return {
        "cases tried": len(ran),
        "skipped": len(results) - len(ran),
        "passed": sum(r.passed for r in ran),
        "expected errors": len(errors),
        "clear errors": sum(r.outcome == "clear error" for r in errors),
        "unclear errors": sum(r.outcome == "unclear error" for r in errors),
        "accepted silently": sum(r.outcome == "accepted silently" for r in ran),
        "expected successes ended otherwise": sum(r.outcome == "unexpected" for r in ran),
        "tracebacks": sum(r.outcome == "traceback" for r in ran),
        "hangs": sum(r.outcome == "hang" for r in ran),
        "orphan processes": sum(len(r.orphans) for r in ran),
        "data lost": sum(len(r.data_lost) for r in ran),
        "other failed checks": sum(bool(r.problems) and r.outcome in ("ok", "clear error") for r in ran),
        **({} if not any(r.fault for r in ran) else {
            "faults survived": sum(r.fault_outcome == "survived" for r in ran),
            "faults stopped cleanly": sum(r.fault_outcome == "clean stop" for r in ran),
            "faults lost": sum(r.fault_outcome == "lost" for r in ran)}),
    }


def markdown(results, header="") -> str:
    s = summarize(results)
    out = [header] if header else []
    out += ["| measure | count | target |", "|---|---:|---:|"]
    targets = {"tracebacks": 0, "accepted silently": 0, "unclear errors": 0, "orphan processes": 0,
               "data lost": 0, "hangs": 0, "expected successes ended otherwise": 0, "faults lost": 0}
    for k, v in s.items():
        t = targets.get(k, "")
        if k == "clear errors":
            t = s["expected errors"]
        if k == "passed":
            t = s["cases tried"]
        out.append(f"| {k} | {v} | {t} |")
    faults = [r for r in results if r.fault]
    if faults:
        out += ["", "Faults (group `fault`): survived = the run went on and finished; clean stop "
                "= it stopped as designed (its rc, one clear error line), nothing lost; lost = "
                "anything else.", "",
                "| fault | expected | outcome | rc | s | note |", "|---|---|---|---:|---:|---|"]
        for r in faults:
            if r.skipped:
                out.append(f"| {r.name} | {r.fault} | skipped | | | {r.skipped} |")
                continue
            got = r.fault_outcome + ("" if r.passed else " **(fail)**")
            note = "; ".join(r.notes + r.problems).replace("|", "\\|").replace("\n", " ")
            out.append(f"| {r.name} | {r.fault} | {got} | {r.rc} | {r.seconds:.1f} | {note} |")
    out += ["", "| case | group | expected | outcome | rc | orphans | data lost | s | note |",
            "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in results:
        if r.skipped:
            out.append(f"| {r.name} | {r.group} | {r.expected_outcome} | skipped | | | | | {r.skipped} |")
            continue
        note = r.error_line if r.outcome == "clear error" else "; ".join(r.notes + r.problems)
        if r.outcome == "traceback":
            last = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith(" ")]
            note = "; ".join(filter(None, [note, last[-1] if last else ""]))
        elif r.outcome == "unclear error" and r.error_line:
            note = f"{note}: {r.error_line}"
        if r.bug and not r.passed:
            note = r.bug + (f" ({note})" if note else "")
        note = note.replace("|", "\\|").replace("\n", " ")
        if len(note) > 160:
            note = note[:157] + "..."
        mark = "" if r.passed else " **(fail)**"
        out.append(f"| {r.name} | {r.group} | {r.expected_outcome} | {r.outcome}{mark} | {r.rc} | "
                   f"{len(r.orphans)} | {len(r.data_lost)} | {r.seconds:.1f} | {note} |")
    return "\n".join(out) + "\n"
