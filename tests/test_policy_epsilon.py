"""--policy-epsilon: sampling from the epsilon-mixture and its policy gradient,
against a numpy twin, exact inverse-CDF frequencies and finite differences."""
import numpy as np
import pytest

from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline
from a3c_core.sampling import sample_mixed, sample_mixed_ref
from a3c_core.train.config import Config, ConfigError
from a3c_core.train.worker import RolloutSettings, Worker

from test_worker import RecordingStore, ScriptedEnv, SpyNet


def _mixture(p, eps):
    return (1.0 - eps) * p + eps / p.size


def test_kernel_matches_numpy_twin():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(1, 7))
        p = rng.random(n).astype(np.float32)
        p[rng.random(n) < 0.3] = 0.0
        if not p.any():
            p[int(rng.integers(n))] = 1.0
        p /= p.sum()
        eps = float(rng.choice([0.01, 0.03, 0.3, 0.5]))
        u = float(rng.random())
        a, w = sample_mixed(p, eps, u)
        a_ref, w_ref = sample_mixed_ref(p, eps, u)
        assert a == a_ref
        assert w == pytest.approx(w_ref, rel=1e-6, abs=1e-12)
        q = _mixture(p.astype(np.float64), eps)
        assert w == pytest.approx((1 - eps) * p[a] / q[a], rel=1e-6, abs=1e-12)


def test_frequencies_are_the_mixture_and_weights_bound_the_score():
    p = np.array([0.998, 0.002, 0.0], np.float64)
    eps = 0.03
    u = (np.arange(100_000) + 0.5) / 100_000          # exact inverse CDF on a grid
    draws = [sample_mixed(p, eps, x) for x in u]
    counts = np.bincount([a for a, _ in draws], minlength=3) / u.size
    np.testing.assert_allclose(counts, _mixture(p, eps), atol=2e-5)
    w = {a: wa for a, wa in draws}
    assert w[2] == 0.0                                  # probability 0: no policy gradient
    assert w[1] == pytest.approx(0.97 * 0.002 / (0.97 * 0.002 + 0.01))   # ~0.16: damped
    assert w[0] > 0.98                                   # a likely action: almost unchanged
    assert sample_mixed(p, eps, 0.9999999999)[0] == 2    # the top of [0, 1) is the last action


def test_weighted_advantages_are_the_mixture_policy_gradient():
    """loss_and_grad with advantages A * w has the gradient of
    sum_t -A_t log q(a_t | s_t), q = (1 - eps) pi + eps / n (finite differences)."""
    eps, n_act, T = 0.2, 3, 5
    net = build_network("mlp", (4,), n_act, hidden=(6,), dtype=np.float64, seed=3)
    rng = np.random.default_rng(7)
    obs = rng.standard_normal((T, 4))
    actions = np.array([0, 2, 1, 2, 0])
    adv = rng.standard_normal(T)
    returns = np.zeros(T)
    net.loss(obs, actions, returns, adv, None, value_coef=0.0, entropy_beta=0.0)
    probs = net.last_probs[:T].copy()
    q = _mixture(probs, eps)
    w = (1 - eps) * probs[np.arange(T), actions] / q[np.arange(T), actions]
    assert (w < 1).all()
    net.loss_and_grad(obs, actions, returns, adv * w, None, value_coef=0.0, entropy_beta=0.0)
    grads = net.grads.copy()                        # the flat gradient, params' layout

    def mixture_loss():
        net.loss(obs, actions, returns, adv, None, value_coef=0.0, entropy_beta=0.0)
        qa = _mixture(net.last_probs[:T], eps)[np.arange(T), actions]
        return float(-(adv * np.log(qa)).sum())

    params = net.params
    h = 1e-6
    for i in rng.choice(params.size, 25, replace=False):
        old = params[i]
        params[i] = old + h
        up = mixture_loss()
        params[i] = old - h
        down = mixture_loss()
        params[i] = old
        assert grads[i] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-8)


class _AdvSpy(SpyNet):
    def __init__(self, net):
        super().__init__(net)
        self.probs = []

    def step(self, obs, state, record=False):
        probs, v, state = super().step(obs, state, record=record)
        if record:
            self.probs.append(np.array(probs, np.float64))
        return probs, v, state

    def rollout_grad(self, actions, returns, adv, **kw):
        self.got = (np.array(actions), np.array(returns, np.float64), np.array(adv, np.float64))
        return super().rollout_grad(actions, returns, adv, **kw)


@pytest.mark.parametrize("min_steps", [0, 6])     # the paper's rollouts; across episodes
def test_worker_samples_the_mixture_and_weights_the_advantages(min_steps):
    eps = 0.4
    env = ScriptedEnv([1.0, -2.0, 0.5, 3.0])
    net = _AdvSpy(build_network("mlp", (2,), 2, hidden=(8,), seed=0))
    pipe = ObsPipeline({"kind": "vector"}, env.obs_shape)
    store = RecordingStore(net.n_params)
    s = RolloutSettings(t_max=6, gamma=0.5, gae_lambda=1.0, reward_scale=1.0,
                        policy_epsilon=eps, min_steps=min_steps)
    w = Worker(0, env, net, pipe, store, s, np.random.default_rng(0))
    n, _, _, applied = w.rollout()
    assert (n, applied) == ((4, True) if min_steps == 0 else (6, True))
    actions, returns, adv = net.got
    values = np.array([v for _, v in net.step_values[:n]])
    probs = np.array(net.probs[:n])
    pa = (1 - eps) * probs[np.arange(n), actions]
    weight = pa / (pa + eps / 2)
    np.testing.assert_allclose(adv, (returns - values) * weight, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.pg_weights[:n], weight, rtol=1e-5)


def test_config_bounds_and_flag():
    assert Config(policy_epsilon=0.03).validate().policy_epsilon == 0.03
    for bad in (-0.01, 0.6):
        with pytest.raises(ConfigError, match="policy_epsilon"):
            Config(policy_epsilon=bad).validate()
