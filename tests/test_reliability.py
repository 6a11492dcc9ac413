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
