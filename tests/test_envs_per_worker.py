"""The batched worker (``envs_per_worker`` K > 1): K envs in lockstep, one
forward per tick, one backward over the T x K rows.  Its update is checked
against the sum of ``loss_and_grad`` over every env's segments, each from
the LSTM state the worker carried for that env (so the state carried across
rollouts and the per-row resets are checked too), with the targets it
computed; its running returns against the envs' own."""
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
    sequence (``Worker.uniforms`` draws blocks of them)."""

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


class _SpyNet:
    """Wraps the worker's network: keeps each update's recorded rows,
    targets, reset mask and the state it started from."""

    def __init__(self, net):
        self._net = net
        self.calls = []
        self.start_state = None

    def __getattr__(self, name):
        return getattr(self._net, name)

    def record_tick(self, t, state=None, reset=None):
        if t == 0:
            self.start_state = None if state is None else (state[0].copy(), state[1].copy())
        return self._net.record_tick(t, state, reset)

    def rollout_grad(self, actions, returns, adv, **kw):
        net = self._net
        cws = net._ws[len(net.encoder)]
        n = actions.shape[0]
        self.calls.append({"obs": net.recorded_obs.copy(), "actions": actions.copy(),
                           "returns": np.array(returns), "adv": np.array(adv),
                           "reset": cws["reset"][:n].copy(), "state": self.start_state,
                           "kw": kw})
        return net.rollout_grad(actions, returns, adv, **kw)


def _segment_sum(net, call, K):
    """The sum of loss_and_grad over every env's segments of one update."""
    n = call["actions"].shape[0] // K
    rows = lambda a: a.reshape((n, K) + a.shape[1:])            # noqa: E731
    obs, acts, ret, adv = (rows(call[k]) for k in ("obs", "actions", "returns", "adv"))
    reset = rows(call["reset"])
    total = np.zeros_like(net.grads)
    for k in range(K):
        cuts = [0] + [t for t in range(1, n) if reset[t, k]] + [n]
        for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            s0 = None
            if j == 0 and call["state"] is not None:
                s0 = (call["state"][0][k], call["state"][1][k])
            net.loss_and_grad(obs[a:b, k], acts[a:b, k], ret[a:b, k], adv[a:b, k], s0,
                              **call["kw"])
            total += net.grads
    return total


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kw", [{}, {"gae_lambda": 0.9}], ids=["n-step", "gae"])
def test_k_env_update_is_the_sum_of_its_envs_segment_gradients(kw, fused):
    K = 3
    envs = [_env(k) for k in range(K)]
    inner = _net(seed=7)
    net = _SpyNet(inner)
    store = _GradStore(fused)
    w = Worker(0, envs, net, ObsPipeline(envs[0].preprocess_spec, envs[0].obs_shape), store,
               _settings(**kw), np.random.default_rng(3))
    ref = _net(seed=7)                   # the same parameters (the store leaves them as they are)
    for r in range(6):
        n, *_ = w.rollout()
        assert n == 10 * K
        want = _segment_sum(ref, net.calls[-1], K)
        scale = np.abs(want).max()
        np.testing.assert_allclose(store.grads[-1], want, rtol=2e-3, atol=2e-4 * scale)
        # each env's running return for the normalizer is its own
        np.testing.assert_allclose(w.targets.ret_acc, [e.acc for e in envs], rtol=1e-9)
    assert any(c["reset"].any() for c in net.calls)       # episodes ended inside rollouts
    assert all(e.episode >= 1 for e in envs)


def test_k_env_worker_reports_every_envs_episodes_with_their_own_returns():
    K = 3
    envs = [_env(k) for k in range(K)]
    episodes = []
    net = _net(seed=1)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params, lr=1e-4))
    store = ThreadStore(shared, ReturnNormalizer(0.99),
                        lambda wid, r, n, i, **_: episodes.append((r, n)), AdvantageNormalizer())
    w = Worker(0, envs, net, ObsPipeline(envs[0].preprocess_spec, envs[0].obs_shape), store,
               _settings(), np.random.default_rng(0))
    for _ in range(8):
        w.rollout()
    assert shared.steps == 8 * 10 * K
    lengths = sorted(n for _, n in episodes)
    want = sorted(L for k in range(K) for i, L in enumerate(LENGTHS[k] * 10)
                  if sum((LENGTHS[k] * 10)[:i + 1]) <= 80)
    assert lengths == want
    assert all(np.isfinite(shared.params))


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
    monkeypatch.setattr("a3c_core.train.env_slots.make_env", make_env)   # the name it calls
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

    assert not resolve(Config(merge_below=0.0, envs_per_worker=1)).records_resets
    assert resolve(Config(merge_below=0.0, envs_per_worker=2)).records_resets
    assert resolve(Config()).records_resets
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


def test_envs_that_would_not_fit_in_memory_are_refused_naming_the_field(tmp_path):
    """K envs per worker whose estimated footprint exceeds the available
    memory: a ConfigError naming envs_per_worker, before the other envs
    start; the same config fits a larger machine."""
    from a3c_core.envs import make_env
    from a3c_core.train.build import check_memory, plan_run

    cfg = Config(env="CartPole-v1", workers=2, envs_per_worker=64, quiet=True,
                 run_dir=str(tmp_path / "r"))
    env = make_env("CartPole-v1", seed=0)
    try:
        plan = plan_run(cfg, env)
        with pytest.raises(ConfigError, match="'envs_per_worker' = 64: 2 workers x 64 envs"):
            check_memory(cfg, plan, env, available=100 * 2**20)
        check_memory(cfg, plan, env, available=64 * 2**30)
    finally:
        env.close()
