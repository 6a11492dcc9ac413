"""Run every reliability case and print/write the table as markdown; or
measure a long run's resident memory (``memory``).

    python bench/reliability.py --out docs/reliability.md [-k NAME] [-v]
    python bench/reliability.py memory --minutes 60 --out-dir DIR -- TRAIN_ARGS

The cases and how each is judged are in ``tests/reliability_cases.py`` (its
docstring): each case runs the real CLI (``python -m a3c_core ...``) in a
subprocess in its own temp dir and new session, with a timeout, and is
classed as ok / clear error / traceback / accepted silently / unclear error /
unexpected / hang; orphan processes (descendants or processes carrying the
case's marker environment variable still alive 10 s after the end) and lost
data (checkpoint bytes changed by a refused command, or a checkpoint that no
longer loads) are counted for every case. The summary table gives cases
tried, clear errors, tracebacks (target 0), accepted silently (target 0),
unclear errors (target 0), orphan processes (target 0) and data lost
(target 0); the case table lists every case with its error line.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from proc_util import children_of  # noqa: E402
from reliability_cases import CASES, markdown, remove_shared, run_case, train_shared  # noqa: E402


MEMORY_DOC = """Resident memory of a training run's processes over a long run.

    python bench/reliability.py memory --minutes 60 --out-dir DIR -- \\
        --env doom:my_way_home --seed 0

Starts ``python -m a3c_core train TRAIN_ARGS --total-steps 0 --total-seconds
<minutes*60> --run-dir DIR/run`` and, every ``--every`` seconds, reads the
resident set (VmRSS) and the proportional set (Pss, /proc/PID/smaps_rollup)
of the run's whole process tree: the trainer, its worker processes and their
env engines. The RSS sum counts a shared page (the shared weights, the
libraries) once per process that maps it; Pss splits it between them, and is
swayed by any other process that maps the same libraries. It writes
DIR/memory.csv (one row per sample and process kind) and prints the growth of
each sum from minute ``--from-minute`` (default 5) to the last sample. Linux
only (it reads /proc).
"""


def _tree(root):
    """``root`` and its live descendants."""
    return [root, *children_of(root)]


def _read_kb(path, key):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _kind(pid, root):
    if pid == root:
        return "trainer"
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return None
    return "engine" if "vizdoom" in comm.lower() else "worker"


def sample(root):
    """{kind: (n, rss_kb, pss_kb)} over the process tree under ``root``."""
    out = {}
    for pid in _tree(root):
        kind = _kind(pid, root)
        rss = _read_kb(f"/proc/{pid}/status", "VmRSS:")
        pss = _read_kb(f"/proc/{pid}/smaps_rollup", "Pss:")
        if kind is None or rss is None:
            continue
        n, r, p = out.get(kind, (0, 0, 0))
        out[kind] = (n + 1, r + rss, p + (pss or 0))
    return out


def memory_main(argv):
    """``reliability.py memory ...``: see the module docstring."""
    train_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="reliability.py memory", description=MEMORY_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0, help="the run's --total-seconds, in minutes")
    p.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--from-minute", type=float, default=5.0,
                   help="the sample growth is measured from")
    p.add_argument("--out-dir", required=True, help="memory.csv, train.log and the run dir go here")
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "a3c_core", "train", *train_args, "--total-steps", "0",
           "--total-seconds", str(int(args.minutes * 60)),
           "--run-dir", os.path.join(args.out_dir, "run")]
    print(" ".join(cmd), flush=True)
    with open(os.path.join(args.out_dir, "train.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    rows = []
    path = os.path.join(args.out_dir, "memory.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["minute", "kind", "processes", "rss_mb", "pss_mb"])
        while proc.poll() is None:
            time.sleep(args.every)
            if proc.poll() is not None:
                break
            minute = (time.monotonic() - t0) / 60.0
            snap = sample(proc.pid)
            total = [0, 0, 0]
            for kind in ("trainer", "worker", "engine"):
                n, r, s = snap.get(kind, (0, 0, 0))
                total = [total[0] + n, total[1] + r, total[2] + s]
                w.writerow([f"{minute:.2f}", kind, n, f"{r / 1024:.1f}", f"{s / 1024:.1f}"])
            w.writerow([f"{minute:.2f}", "all", total[0], f"{total[1] / 1024:.1f}",
                        f"{total[2] / 1024:.1f}"])
            f.flush()
            rows.append((minute, snap, total))
            print(f"min {minute:5.1f}  processes {total[0]}  rss {total[1] / 1024:7.1f} MB  "
                  f"pss {total[2] / 1024:7.1f} MB  "
                  + "  ".join(f"{k} {v[2] / 1024:.1f}" for k, v in sorted(snap.items())),
                  flush=True)
    rc = proc.wait()
    print(f"train exited {rc}; samples in {path}")
    base = [r for r in rows if r[0] >= args.from_minute]
    if len(base) >= 2:
        (m0, s0, t_0), (m1, s1, t_1) = base[0], base[-1]
        for label, i in (("rss", 1), ("pss", 2)):
            print(f"{label} of all processes: {t_0[i] / 1024:.1f} MB at minute {m0:.1f} -> "
                  f"{t_1[i] / 1024:.1f} MB at minute {m1:.1f} "
                  f"({100.0 * (t_1[i] - t_0[i]) / t_0[i]:+.2f} %)")
        for kind in sorted(s1):
            a, b = s0.get(kind, (0, 0, 0)), s1[kind]
            print(f"  {kind}: pss {a[2] / 1024:.1f} -> {b[2] / 1024:.1f} MB ({a[0]} -> {b[0]} processes)")
    return rc


#: sections of the output file that this runner does not generate (measured
#: by another tool, which names its command there): kept when it rewrites the file
KEPT_SECTIONS = ("## Memory over a long run",)


def kept_sections(path):
    """The text of ``path`` from the first of :data:`KEPT_SECTIONS` to its end
    ("" if the file or the section does not exist), led by a blank line."""
    try:
        with open(path) as fh:
            old = fh.read()
    except OSError:
        return ""
    starts = [i for i in (old.find("\n" + h + "\n") for h in KEPT_SECTIONS) if i >= 0]
    return "\n" + old[min(starts) + 1:] if starts else ""


def write_table(path, text):
    """Write the generated ``text`` to ``path``, followed by the sections of
    the old file that this runner does not generate (:func:`kept_sections`)."""
    kept = kept_sections(path)          # read before "w" empties the file
    with open(path, "w") as fh:
        fh.write(text + kept)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["memory"]:
        return memory_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the markdown table to this file")
    p.add_argument("-k", dest="select", help="only cases whose name contains this")
    p.add_argument("--no-doom", action="store_true", help="skip the cases that need ViZDoom")
    p.add_argument("-v", "--verbose", action="store_true", help="print the full report of failed cases")
    args = p.parse_args(argv)

    cases = [c for c in CASES if not args.select or args.select in c.name]
    t0 = time.monotonic()
    print("training the shared runs ...", flush=True)
    shared = train_shared(doom=not args.no_doom)
    results = []
    try:
        for i, case in enumerate(cases, 1):
            res = run_case(case, shared)
            results.append(res)
            flag = "skip" if res.skipped else ("pass" if res.passed else "FAIL")
            print(f"[{i:2d}/{len(cases)}] {flag} {case.name}: {res.outcome} (rc {res.rc}, "
                  f"{res.seconds:.1f}s)", flush=True)
            if args.verbose and not res.passed and not res.skipped:
                print(res.report(), flush=True)
    finally:
        remove_shared(shared)
    took = time.monotonic() - t0
    header = (f"# Reliability\n\nGenerated by `python bench/reliability.py --out docs/reliability.md` "
              f"on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (Python "
              f"{platform.python_version()}, {os.cpu_count()} CPUs, {took:.0f} s). How each case is "
              "judged: `tests/reliability_cases.py`; the same cases run as `pytest "
              "tests/test_reliability.py`. A case marked **(fail)** is a library bug, named in its note.\n")
    text = markdown(results, header)
    print("\n" + text)
    if args.out:
        write_table(args.out, text)
    return 0 if all(r.passed or r.skipped for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
