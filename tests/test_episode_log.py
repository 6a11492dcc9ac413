"""One worker with a fixed seed plays the same episodes, and ends with the same
parameters, as the tree before the run-assembly redesign (f1741f7)."""
import json
import os

import pytest

from episode_log import episode_log

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.mark.parametrize("name", ["episode_log_doom_basic.json", "episode_log_cartpole.json"])
def test_one_worker_plays_the_stored_episodes(name):
    if "doom" in name:
        pytest.importorskip("vizdoom")
    else:
        pytest.importorskip("gymnasium")
    with open(os.path.join(DATA, name)) as fh:
        want = json.load(fh)
    got = episode_log(want["env"], want["steps"], want["seed"])
    assert len(got["episodes"]) == len(want["episodes"])
    assert got["episodes"] == want["episodes"]
    assert got["params_sha256"] == want["params_sha256"]
