"""A worker with several envs (``envs_per_worker``): each rollout plays each
env in turn from its own LSTM state and episode, and one update covers all
the parts.  Checked against single-env workers playing the same envs with the
same uniforms: the same actions, values, episodes and states, and the update
is the sum of theirs."""
import numpy as np
import pytest

from a3c_core.core import SharedState, make_optimizer
from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
from a3c_core.obs import ObsPipeline
from a3c_core.train.config import Config, ConfigError
from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker
from test_actor import FrameEnv, _net
from test_worker import RecordingStore

LENGTHS = [(7, 25, 3, 12), (4, 30, 9), (26, 2, 5, 11, 8)]


class _Env(FrameEnv):
    """FrameEnv that keeps its own running discounted return (gamma 0.9,
    restarting after each episode): what the worker's running return for
    the normalizer must be after every rollout."""

    def __init__(self, k):
        super().__init__(lengths=LENGTHS[k], trunc_every=2 + k)
        self.rng = np.random.default_rng(100 + k)
        self.acc = 0.0

    def step(self, action):
        frame, r, term, trunc = super().step(action)
        self.acc = 0.0 if term or trunc else 0.9 * self.acc + r
        return frame, r, term, trunc


def _env(k):
    return _Env(k)


class _Uniforms:
    """An rng whose ``random(n)`` returns the next ``n`` values of a fixed
    sequence (``Worker._uniforms`` draws blocks of them)."""

    def __init__(self, values):
        self.values = values
        self.pos = 0

    def random(self, n):
        out = self.values[self.pos:self.pos + n]
        assert out.size == n, "the test's sequence is too short"
        self.pos += n
        return out.copy()


class _GradStore(RecordingStore):
    """Keeps every applied gradient and leaves the worker's parameters as
    they are (fixed parameters: the updates of different workers compare)."""


    def __init__(self, fused=True):
        super().__init__(0)
        self.grads = []
        # normalized rewards whose scale stays 1 (too few returns for a
        # scale), so each env's running return is checked, and the targets
        # still compare across workers
        self.norm = ReturnNormalizer(0.99, min_count=10**9)
        self.fused = fused

    def target_stats(self):
        return (self.norm.stats, self.norm.params, np.zeros(0), np.zeros(0)) if self.fused else None

    def apply(self, grads, max_grad_norm, offset=0):
        self.grads.append(grads.copy())
        return super().apply(grads, max_grad_norm, offset)

    def reward_scale(self, returns):
        return self.norm.update(returns)


def _settings(**kw):
    return RolloutSettings(**{"t_max": 10, "gamma": 0.9, **kw})


@pytest.mark.parametrize("fused_act", [True, False])
@pytest.mark.parametrize("kw", [{}, {"min_steps": 6}, {"gae_lambda": 0.9}],
                         ids=["paper", "min-steps", "gae"])
def test_k_env_worker_is_the_sum_of_single_env_workers(kw, fused_act):
    K, T, R = 3, 10, 12
    s = _settings(**kw)
    u = np.random.default_rng(3).random(K * T * Worker.UNIFORM_BLOCK)
    multi_store = _GradStore(fused=fused_act)
    multi = Worker(0, [_env(k) for k in range(K)], _net(seed=7), ObsPipeline(
        _env(0).preprocess_spec, _env(0).obs_shape), multi_store, s, _Uniforms(u),
        fused_act=fused_act)
    assert multi.n_envs == K and (multi.actor is not None) == fused_act
    singles = []
    for k in range(K):
        # env k's uniforms: its t_max of each rollout's block, in rollout order
        uk = u.reshape(-1, K, T)[:, k, :].reshape(-1)
        w = Worker(0, _env(k), _net(seed=7), ObsPipeline(_env(k).preprocess_spec, RAW_SHAPE),
                   _GradStore(fused=fused_act), s, _Uniforms(uk), fused_act=fused_act)
        singles.append(w)
    for _ in range(R):
        n, *_ = multi.rollout()
        parts = [w.rollout()[0] for w in singles]
        assert n == sum(parts)
        off = 0
        for w, m in zip(singles, parts):        # the same steps, row for row
            np.testing.assert_array_equal(multi.actions[off:off + m], w.actions[:m])
            np.testing.assert_array_equal(multi.values[off:off + m], w.values[:m])
            np.testing.assert_array_equal(multi.raw_rewards[off:off + m], w.raw_rewards[:m])
            np.testing.assert_array_equal(multi._ret[off:off + m], w._ret[:m])
            np.testing.assert_array_equal(multi._adv[off:off + m], w._adv[:m])
            off += m
        for k, w in enumerate(singles):         # each env's running return
            multi._use(k)
            assert multi._ret_acc == pytest.approx(multi.env.acc, rel=1e-12, abs=1e-12)
            assert multi._ret_acc == w._ret_acc
        # one update: the sum of the parts' gradients (the loss sums over rows)
        want = np.sum([w.store.grads[-1].astype(np.float64) for w in singles], axis=0)
        got = multi_store.grads[-1].astype(np.float64)
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
    assert len(multi_store.grads) == R
    assert multi_store.steps == sum(w.store.steps for w in singles)
    # each env's episodes and LSTM state carried on as in its own worker
    assert sorted(multi_store.episodes) == sorted(e for w in singles for e in w.store.episodes)
    assert len(multi_store.episodes) > 2 * K
    for k, w in enumerate(singles):
        multi._use(k)
        assert (multi.ep_return, multi.ep_length) == (w.ep_return, w.ep_length)
        if w.state is not None:
            np.testing.assert_array_equal(multi.state[0], w.state[0])
            np.testing.assert_array_equal(multi.state[1], w.state[1])


RAW_SHAPE = FrameEnv().obs_shape


def _train(fused, K, settings, adv_norm, rollouts=25):
    envs = [_env(k) for k in range(K)]
    pipe = ObsPipeline(envs[0].preprocess_spec, envs[0].obs_shape)
    net = _net(seed=7)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params, lr=1e-3))
    episodes = []
    rn = ReturnNormalizer(0.99)
    store = ThreadStore(shared, rn, lambda w, r, n, i, **_: episodes.append((r, n)), adv_norm)
    w = Worker(0, envs, net, pipe, store, settings, np.random.default_rng(11),
               fused_targets=fused)
    assert (w._stats is not None) == fused
    lengths = [w.rollout()[0] for _ in range(rollouts)]
    accs = []
    for k in range(K):
        w._use(k)
        accs.append(w._ret_acc)
    return shared.params.copy(), lengths, episodes, rn.stats.copy(), accs


@pytest.mark.parametrize("settings", [
    RolloutSettings(t_max=10, normalize_advantages=True),
    RolloutSettings(t_max=10, min_steps=10, normalize_advantages=True, reward_clip=0.7),
], ids=["paper", "cross"])
def test_k_env_targets_in_one_call_are_the_separate_calls_bit_for_bit(settings):
    """Normalized rewards: each env's running return starts from its own and
    carries on to its next rollout, in the compiled call as in the separate
    calls (which take the store's reward_scale and advantage_scale)."""
    new = _train(True, 3, settings, AdvantageNormalizer(horizon=50.0))
    old = _train(False, 3, settings, AdvantageNormalizer(horizon=50.0))
    assert new[1] == old[1] and new[2] == old[2] and len(new[2]) > 6
    np.testing.assert_array_equal(new[0], old[0])
    np.testing.assert_array_equal(new[3], old[3])
    assert new[4] == old[4] and any(a != 0 for a in new[4])


def test_one_env_in_a_list_is_the_single_env_worker_bit_for_bit():
    s = RolloutSettings(t_max=10, normalize_advantages=True)
    a = _train(True, 1, s, AdvantageNormalizer())
    env = _env(0)
    net = _net(seed=7)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params, lr=1e-3))
    rn = ReturnNormalizer(0.99)
    episodes = []
    w = Worker(0, env, net, ObsPipeline(env.preprocess_spec, env.obs_shape),
               ThreadStore(shared, rn, lambda *e, **_: episodes.append(e[1:3]), AdvantageNormalizer()),
               s, np.random.default_rng(11))
    lengths = [w.rollout()[0] for _ in range(25)]
    assert lengths == a[1] and episodes == a[2]
    np.testing.assert_array_equal(shared.params, a[0])


def test_worker_refuses_an_empty_env_list():
    with pytest.raises(ValueError, match="at least one env"):
        Worker(0, [], _net(), None, _GradStore(), _settings(), np.random.default_rng(0))


@pytest.mark.parametrize("bad", [0, -1, 65])
def test_config_envs_per_worker_range_names_the_field(bad):
    with pytest.raises(ConfigError, match="envs_per_worker"):
        Config(envs_per_worker=bad).validate()


def test_trainer_gives_each_worker_its_envs_with_their_own_seeds(tmp_path, monkeypatch):
    import a3c_core.envs as envs_mod
    from a3c_core.checkpoint import load_checkpoint
    from a3c_core.train.trainer import Trainer

    made = []               # (seed, steps counter)
    real = envs_mod.make_env

    def make_env(env_id, seed, **kw):
        env = real(env_id, seed=seed, **kw)
        count = [seed, 0]
        step = env.step

        def counted(a):
            count[1] += 1
            return step(a)

        env.step = counted
        made.append(count)
        return env

    monkeypatch.setattr(envs_mod, "make_env", make_env)
    monkeypatch.setattr("a3c_core.train.trainer.make_env", make_env)   # the name it calls
    cfg = Config(env="CartPole-v1", workers=2, envs_per_worker=3, total_steps=1500, seed=4,
                 quiet=True, tensorboard=False, checkpoint_interval=0,
                 run_dir=str(tmp_path / "run"))
    trainer = Trainer(cfg)
    res = trainer.run()
    assert sorted(w.n_envs for w in trainer.workers) == [3, 3]
    assert len(made) == 6 and len({seed for seed, _ in made}) == 6
    played = sum(n for _, n in made)
    assert played == res.steps >= 1500
    assert all(n > 0 for _, n in made)        # every env of every worker played
    assert res.episodes > 0
    assert load_checkpoint(res.run_dir).meta["config"]["envs_per_worker"] == 3


def test_warm_up_compiles_the_reset_variant_for_several_envs(tmp_path, monkeypatch):
    """Env k's part starts a new segment in the recorded rows, so with
    several envs the warm-up compiles the LSTM backward's reset variant even
    where rollouts never run across episodes (merge_below 0)."""
    import a3c_core.train.trainer as T
    from a3c_core.train.config import resolve
    from a3c_core.train.trainer import Trainer

    assert not resolve(Config(merge_below=0.0)).records_resets
    assert resolve(Config(merge_below=0.0, envs_per_worker=2)).records_resets
    assert resolve(Config()).records_resets and resolve(Config(min_rollout=20)).records_resets
    seen = []
    monkeypatch.setattr(T, "warm_up_network", lambda net, resets, **kw: seen.append(resets))
    for k, want in ((1, False), (2, True)):
        t = Trainer(Config(env="CartPole-v1", workers=1, envs_per_worker=k, merge_below=0.0,
                           quiet=True, tensorboard=False, run_dir=str(tmp_path / f"r{k}")))
        try:
            t.warm_up()
        finally:
            t.close()
    assert seen == [False, True]
