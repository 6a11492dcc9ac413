"""One worker with a fixed seed plays the same episodes as the tree before the
run-assembly redesign (f1741f7), and ends with the same parameters up to the
last bits that differ between CPUs (``episode_log.PARAMS_RTOL``): the paper's
worker (``--envs-per-worker 1``), and the batched worker of doom:basic's
default (8 envs in lockstep, stored when it became the default)."""
import json
import os

import pytest

from episode_log import episode_log, same_params

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.mark.parametrize("name", ["episode_log_doom_basic.json", "episode_log_doom_basic_batched.json",
                                  "episode_log_cartpole.json"])
def test_one_worker_plays_the_stored_episodes(name):
    if "doom" in name:
        pytest.importorskip("vizdoom")
    else:
        pytest.importorskip("gymnasium")
    with open(os.path.join(DATA, name)) as fh:
        want = json.load(fh)
    got = episode_log(want["env"], want["steps"], want["seed"], want.get("extra", ()))
    assert len(got["episodes"]) == len(want["episodes"])
    assert got["episodes"] == want["episodes"]
    assert same_params(got, want), (got["params_norm"], want["params_norm"])
