"""MetricsLogger: every episode in the CSV files; TensorBoard's per-episode
points written at flush, at most tb_episodes_per_flush of them per flush."""
import csv
import os

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
