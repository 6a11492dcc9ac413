"""MetricsLogger: every episode in the CSV files; TensorBoard's per-episode
points written at flush, at most tb_episodes_per_flush of them per flush."""
import csv
import os

import pytest

from a3c_core.train.logger import MetricsLogger


class FakeWriter:
    def __init__(self):
        self.points = []

    def add_scalar(self, tag, value, step):
        self.points.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        pass


def _logger(tmp_path, cap):
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    log._tb = FakeWriter()
    log.tb_episodes_per_flush = cap
    return log


def test_episode_points_wait_for_flush_and_are_thinned_evenly(tmp_path):
    log = _logger(tmp_path, 4)
    for i in range(10):
        log.episode(i, 0.1 * i, 10 * i, 0, float(i), 5 + i)
    assert log._tb.points == []               # nothing written by the worker's call
    log.flush()
    ret = [(v, s) for t, v, s in log._tb.points if t == "charts/episodic_return"]
    length = [(v, s) for t, v, s in log._tb.points if t == "charts/episodic_length"]
    assert ret == [(0.0, 0), (2.0, 20), (5.0, 50), (7.0, 70)]    # i * 10 // 4
    assert length == [(5.0, 0), (7.0, 20), (10.0, 50), (12.0, 70)]
    log._tb.points.clear()
    log.episode(10, 1.0, 100, 1, 3.5, 2)
    log.close()                               # close flushes what is left
    assert ("charts/episodic_return", 3.5, 100) in log._tb.points
    with open(os.path.join(tmp_path, "episodes.csv")) as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["episode"]) for r in rows] == list(range(11))    # every episode
    with open(os.path.join(tmp_path, "metrics.csv")) as fh:
        names = [r["name"] for r in csv.DictReader(fh)]
    assert names.count("charts/episodic_return") == 11


def test_few_episodes_are_all_points(tmp_path):
    log = _logger(tmp_path, 100)
    for i in range(3):
        log.episode(i, 0.0, i, 0, 1.0 + i, 4)
    log.flush()
    assert [s for t, _, s in log._tb.points if t == "charts/episodic_return"] == [0, 1, 2]
    log.close()


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def test_episode_rows_carry_how_the_episode_ended(tmp_path):
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    log.episode(1, 0.5, 30, 0, 95.0, 30, "ended alive")
    log.episode(2, 0.9, 55, 1, -4.0, 25, "died")
    log.episode(3, 1.2, 80, 0, 1.0, 25)            # an env that does not tell
    log.close()
    rows = _rows(tmp_path / "episodes.csv")
    assert rows[0] == ["episode", "wall_time", "step", "worker", "return", "length", "end"]
    assert [r[-1] for r in rows[1:]] == ["ended alive", "died", ""]


def _old_episodes_file(path, n):
    """An episodes.csv as runs wrote it before the end column, the last line torn."""
    lines = ["episode,wall_time,step,worker,return,length"]
    lines += [f"{i},{0.1 * i:.3f},{10 * i},{i % 2},{float(i)},10" for i in range(1, n + 1)]
    path.write_text("\n".join(lines) + "\n7,0.7,70,")


def test_resume_of_a_run_written_before_the_end_column_keeps_its_episodes(tmp_path):
    _old_episodes_file(tmp_path / "episodes.csv", 6)
    log = MetricsLogger(str(tmp_path), tensorboard=False, resume_at=(40, 4))
    log.episode(5, 0.5, 50, 0, 5.0, 10, "timed out")
    log.close()
    rows = _rows(tmp_path / "episodes.csv")
    assert rows[0][-1] == "end"
    # the checkpoint's 4 episodes kept (their end unknown), then the resumed run's
    assert [r[0] for r in rows[1:]] == ["1", "2", "3", "4", "5"]
    assert rows[1] == ["1", "0.100", "10", "1", "1.0", "10", ""]
    assert rows[-1][-1] == "timed out"


def test_an_older_episodes_file_opened_without_resume_is_upgraded_not_garbled(tmp_path):
    _old_episodes_file(tmp_path / "episodes.csv", 3)
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    log.episode(4, 0.4, 40, 0, 4.0, 10, "died")
    log.close()
    rows = _rows(tmp_path / "episodes.csv")
    assert all(len(r) == 7 for r in rows)
    assert [r[0] for r in rows[1:]] == ["1", "2", "3", "4"]


def test_an_episodes_file_with_a_foreign_header_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "episodes.csv"
    path.write_text("time,score\n1.0,5\n")
    with pytest.raises(ValueError, match=r"episodes\.csv: its header time,score"):
        MetricsLogger(str(tmp_path), tensorboard=False)
    assert path.read_text() == "time,score\n1.0,5\n"
