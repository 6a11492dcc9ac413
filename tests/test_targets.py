"""A rollout's targets in one compiled call (``core.targets``) and the
normalizers' compiled merge (``normalize.merge_stats``): bit for bit the
separate calls and the Python merges they replace."""
import math
import threading

import numpy as np
import pytest

from a3c_core.core import SharedState, gae, make_optimizer
from a3c_core.core.normalize import (AdvantageNormalizer, ReturnNormalizer, _moments,
                                     merge_stats)
from a3c_core.core.targets import gae_into
from a3c_core.obs import ObsPipeline
from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker
from test_actor import FrameEnv, _net


class _PyMerge:
    """The Python merges of the normalizers before merge_stats (their twin):
    Chan et al.'s update of (count, mean, m2), or the EMA of mean(A^2)."""

    def __init__(self, kind, eps=1e-8, min_count=2, horizon=None):
        self.kind, self.eps, self.min_count = kind, eps, min_count
        self.horizon = horizon
        self.count, self.mean, self.m2, self.scale, self.mean_sq = 0, 0.0, 0.0, 1.0, 0.0

    def update(self, x):
        x = np.asarray(x, np.float64)
        mean_b, m2_b, sq, _ = _moments(x)
        n_b = x.size
        if self.kind == "ema":
            ms_b = sq / n_b
            keep = (1.0 - 1.0 / self.horizon) ** n_b
            self.mean_sq = ms_b if self.count == 0 else keep * self.mean_sq + (1.0 - keep) * ms_b
            self.count += n_b
            if self.count >= self.min_count:
                self.scale = 1.0 / math.sqrt(self.mean_sq + self.eps)
            return self.scale
        n_a = self.count
        n = n_a + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * n_a * n_b / n
        self.count = n
        if n >= self.min_count:
            if self.kind == "return":
                self.scale = 1.0 / math.sqrt(self.m2 / n + self.eps)
            else:
                self.scale = 1.0 / math.sqrt(self.m2 / n + self.mean ** 2 + self.eps)
        return self.scale


@pytest.mark.parametrize("kind", ["return", "rms", "ema"])
def test_merge_stats_is_the_python_merge_bit_for_bit(kind):
    if kind == "return":
        norm, twin = ReturnNormalizer(0.99), _PyMerge("return")
    elif kind == "rms":
        norm, twin = AdvantageNormalizer(), _PyMerge("rms")
    else:
        norm = AdvantageNormalizer(horizon=37.0)
        twin = _PyMerge("ema", horizon=37.0)
    rng = np.random.default_rng(1)
    for i in range(300):
        # batches of 1..20, their spread shrinking
        x = rng.normal(0.3, 5.0 / (1 + i / 10), rng.integers(1, 21))
        assert norm.update(x) == twin.update(x)
        assert (norm.count, norm.scale) == (twin.count, twin.scale)
        assert (norm.mean, norm.m2) == (twin.mean, twin.m2)
        assert norm.stats[4] == twin.mean_sq


def test_merge_stats_refuses_non_finite_batches_and_leaves_the_stats():
    norm = AdvantageNormalizer(horizon=10.0)
    norm.update([1.0, 2.0])
    before = norm.stats.copy()
    for bad in ([1.0, np.nan], [np.inf]):
        with pytest.raises(ValueError, match="advantages contain NaN or inf"):
            norm.update(bad)
        assert merge_stats(norm.stats, norm.params, np.array(bad)) == -1.0
    np.testing.assert_array_equal(norm.stats, before)


def test_merges_from_many_threads_lose_no_batch():
    norm = ReturnNormalizer(0.99)
    x = np.arange(1.0, 6.0)

    def run():
        for _ in range(3000):
            norm.update(x)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert norm.count == 4 * 3000 * 5
    assert norm.mean == pytest.approx(3.0, rel=1e-12)
    assert norm.var == pytest.approx(2.0, rel=1e-9)


def test_gae_into_is_the_cython_gae_bit_for_bit():
    rng = np.random.default_rng(2)
    for n in (1, 5, 20, 64):
        r = rng.normal(0, 3, n).astype(np.float32)
        v = rng.normal(0, 3, n).astype(np.float32)
        for gamma, lam, boot in ((0.99, 1.0, 0.7), (0.9, 0.95, -2.5), (1.0, 0.0, 0.0)):
            ret, adv = np.empty(n, np.float32), np.empty(n, np.float32)
            gae_into(r, v, boot, gamma, lam, ret, adv)
            want_ret, want_adv = gae(r, v, boot, gamma, lam)
            np.testing.assert_array_equal(ret, want_ret)
            np.testing.assert_array_equal(adv, want_adv)


def _train(fused, settings, adv_norm, reward_norm=True, rollouts=40):
    env = FrameEnv(trunc_every=3)
    pipe = ObsPipeline(env.preprocess_spec, env.obs_shape)
    net = _net(seed=7)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params, lr=1e-3))
    episodes = []
    rn = ReturnNormalizer(0.99) if reward_norm else None
    store = ThreadStore(shared, rn, lambda w, r, n, i, **_: episodes.append((r, n)), adv_norm)
    w = Worker(0, env, net, pipe, store, settings, np.random.default_rng(11),
               fused_targets=fused)
    assert (w.targets.stats is not None) == fused
    lengths = [w.rollout()[0] for _ in range(rollouts)]
    stats = [x.stats.copy() for x in (rn, adv_norm) if x is not None]
    return (shared.params.copy(), lengths, episodes, stats, w.targets.rewards.copy(),
            w.targets.ret_acc)


@pytest.mark.parametrize("settings,adv,reward_norm", [
    (RolloutSettings(t_max=10, normalize_advantages=True), "rms", True),
    (RolloutSettings(t_max=10, normalize_advantages=True, truncation_bootstrap=False,
                     reward_clip=0.7, gae_lambda=0.95), "ema", True),
    # rollouts across episodes: merge_below's switch on from the first episode
    (RolloutSettings(t_max=10, merge_below=1e9, merge_window=1, normalize_advantages=True),
     "ema", True),
    (RolloutSettings(t_max=10, merge_below=1e9, merge_window=1), None, True),
    (RolloutSettings(t_max=10, reward_scale=0.25, reward_clip=0.7, merge_below=1e9,
                     merge_window=1, normalize_advantages=True), "rms", False),
    (RolloutSettings(t_max=10, reward_scale=0.5), None, False),
], ids=["paper-rms", "clip-gae-ema", "merge-ema", "merge", "fixed-merge", "fixed"])
def test_worker_with_one_targets_call_trains_bit_for_bit_as_the_separate_calls(
        settings, adv, reward_norm):
    def norm():
        return {None: None, "rms": AdvantageNormalizer(),
                "ema": AdvantageNormalizer(horizon=50.0)}[adv]

    new = _train(True, settings, norm(), reward_norm)
    old = _train(False, settings, norm(), reward_norm)
    assert new[1] == old[1] and new[2] == old[2] and len(new[2]) > 3
    np.testing.assert_array_equal(new[0], old[0])
    for a, b in zip(new[3], old[3], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(new[4], old[4])
    assert new[5] == old[5]


def test_worker_targets_refuse_non_finite_rewards_naming_them():
    env = FrameEnv()
    env.step = lambda a: (env._frame(), float("nan"), False, False)
    pipe = ObsPipeline(env.preprocess_spec, env.obs_shape)
    net = _net(seed=7)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params, lr=1e-3))
    rn = ReturnNormalizer(0.99)
    w = Worker(0, env, net, pipe, ThreadStore(shared, rn), RolloutSettings(t_max=5),
               np.random.default_rng(0))
    before = shared.params.copy()
    with pytest.raises(ValueError, match="returns contain NaN or inf"):
        w.rollout()
    assert rn.count == 0
    np.testing.assert_array_equal(shared.params, before)


def test_warm_up_compiles_the_signature_a_worker_calls():
    from a3c_core.core.targets import rollout_targets, warm_up

    warm_up()
    before = list(rollout_targets.signatures)
    for settings, adv, rn in ((RolloutSettings(t_max=10, normalize_advantages=True), "rms", True),
                              (RolloutSettings(t_max=10, reward_scale=0.5, merge_below=1e9,
                                               merge_window=1), None, False)):
        _train(True, settings, AdvantageNormalizer() if adv else None, rn, rollouts=6)
    assert list(rollout_targets.signatures) == before and len(before) == 1
