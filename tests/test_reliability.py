"""Reliability suite: every case of ``reliability_cases.CASES`` runs the real CLI
in a subprocess (real signals where a signal is involved) and must end as the
case expects, with no traceback, no orphan process and no lost checkpoint.

Cases that fail today because of a library bug are strict xfails whose reason
names the bug. ``python bench/reliability.py --out docs/reliability.md``
runs the same cases and writes the table.
"""
import sys

import pytest

from reliability_cases import CASES, remove_shared, run_case, skip_reason, train_shared

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


@pytest.fixture(scope="module")
def shared():
    """One trained CartPole run and one doom:basic run (300 steps each), shared by every case."""
    pytest.importorskip("gymnasium")
    runs = train_shared()
    yield runs
    remove_shared(runs)


def _param(case):
    marks = [pytest.mark.xfail(strict=True, reason=case.bug)] if case.bug else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case(case, shared):
    reason = skip_reason(case, shared)
    if reason:
        pytest.skip(reason)
    res = run_case(case, shared)
    assert res.passed, res.report()


def test_judging_rejects_bad_outcomes():
    """The judge itself: each failure class is recognised (a suite that cannot fail is a defect)."""
    from reliability_cases import Case, classify

    err = Case("x", "g", [], words=("lr",))
    assert classify(err, 2, "a3c train: error: config field 'lr' = -1.0: bad\n", False)[0] == "clear error"
    assert classify(err, 0, "done\n", False)[0] == "accepted silently"
    assert classify(err, 2, "a3c train: error: something is wrong\n", False)[0] == "unclear error"
    assert classify(err, 2, "a3c train: error: lr\na3c train: error: lr\n", False)[0] == "unclear error"
    assert classify(err, 1, "Traceback (most recent call last):\n  ...\nValueError: lr\n", False)[0] \
        == "traceback"
    assert classify(err, 2, "", True)[0] == "hang"
    ok = Case("y", "g", [], expect="ok", rc=(130,), contains=("interrupted",))
    assert classify(ok, 130, "interrupted: 10 steps\n", False)[0] == "ok"
    assert classify(ok, 1, "interrupted\n", False)[0] == "unexpected"
    assert classify(ok, 130, "stopped\n", False)[0] == "unexpected"


def test_fault_outcomes_are_judged():
    """survived / clean stop / lost, and a fault case fails unless it has the one it names."""
    from reliability_cases import Result, fault_outcome

    def res(outcome, rc, **kw):
        r = Result("x", "fault", "ok", outcome=outcome, rc=rc, fault="clean stop", **kw)
        r.fault_outcome = fault_outcome(r)
        return r

    assert res("ok", 0).fault_outcome == "survived"
    assert res("ok", 130).fault_outcome == "clean stop"
    assert res("clear error", 1).fault_outcome == "clean stop"
    assert res("unexpected", -2).fault_outcome == "lost"          # ended by the signal
    assert res("traceback", 1).fault_outcome == "lost"
    assert res("hang", None).fault_outcome == "lost"
    assert res("ok", 130, data_lost=["latest.npz was changed"]).fault_outcome == "lost"
    assert res("ok", 0, problems=["no summary.json"]).fault_outcome == "lost"
    assert res("ok", 130).passed and not res("ok", 0).passed       # survived, not a clean stop


def _reliability_tool():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "bench", "reliability.py")
    spec = importlib.util.spec_from_file_location("bench_reliability", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rewriting_the_table_keeps_the_memory_section(tmp_path):
    """bench/reliability.py --out rewrites the generated table and keeps the
    memory section another command measured, from its heading to the end."""
    tool = _reliability_tool()
    out = tmp_path / "reliability.md"
    assert tool.kept_sections(str(out)) == ""
    out.write_text("# Reliability\n\nold table\n\n## Memory over a long run\n\nfigures\n")
    assert tool.kept_sections(str(out)) == "\n## Memory over a long run\n\nfigures\n"
    out.write_text("# Reliability\n\nold table, no memory section\n")
    assert tool.kept_sections(str(out)) == ""
    # the runner's write: the new table, then the old file's memory section
    out.write_text("# Reliability\n\nold table\n\n## Memory over a long run\n\nfigures\n")
    tool.write_table(str(out), "# Reliability\n\nnew table\n")
    assert out.read_text() == ("# Reliability\n\nnew table\n\n"
                               "## Memory over a long run\n\nfigures\n")
    tool.write_table(str(tmp_path / "fresh.md"), "# Reliability\n\nnew table\n")
    assert (tmp_path / "fresh.md").read_text() == "# Reliability\n\nnew table\n"


@pytest.mark.slow
def test_memory_tool_samples_the_whole_process_tree(tmp_path):
    """``reliability.py memory`` samples a real run's trainer and its worker
    processes (RSS and Pss from /proc) into memory.csv and reports the growth."""
    import csv
    import os
    import subprocess

    pytest.importorskip("gymnasium")
    path = os.path.join(os.path.dirname(__file__), "..", "bench", "reliability.py")
    r = subprocess.run([sys.executable, path, "memory", "--minutes", "0.25", "--every", "2",
                        "--from-minute", "0", "--out-dir", str(tmp_path), "--",
                        "--env", "CartPole-v1", "--workers", "2", "--worker-processes", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(tmp_path / "memory.csv") as fh:
        rows = list(csv.DictReader(fh))
    kinds = {row["kind"] for row in rows}
    assert {"trainer", "worker", "all"} <= kinds
    trainer = [row for row in rows if row["kind"] == "trainer"]
    assert len(trainer) >= 3 and all(float(row["rss_mb"]) > 20 for row in trainer)
    workers = [row for row in rows if row["kind"] == "worker"]
    assert max(int(row["processes"]) for row in workers) >= 2
    every = [row for row in rows if row["kind"] == "all"]
    for row in every:       # the sum over the kinds of the same sample
        same = [x for x in rows if x["minute"] == row["minute"] and x["kind"] != "all"]
        assert abs(float(row["rss_mb"]) - sum(float(x["rss_mb"]) for x in same)) < 0.5
    assert "rss of all processes" in r.stdout
