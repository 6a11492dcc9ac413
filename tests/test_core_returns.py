"""Discounted returns and GAE: classic values, bootstrap, lambda limits, parity, errors."""
import numpy as np
import pytest

from a3c_core.core import discounted_returns, gae
from a3c_core.core.ref import ref_gae, ref_returns


def test_classic_discounting():
    r = np.array([10, 20, 30, 40], np.float32)
    np.testing.assert_allclose(discounted_returns(r, 0.0, 0.99),
                               [98.01496, 88.904, 69.6, 40.0], rtol=1e-6)


def test_terminal_vs_bootstrap():
    r = np.array([1.0, 0.0, 2.0], np.float32)
    term = discounted_returns(r, 0.0, 0.9)
    boot = discounted_returns(r, 10.0, 0.9)
    np.testing.assert_allclose(term, [1 + 0.81 * 2, 1.8, 2.0], rtol=1e-6)
    np.testing.assert_allclose(boot - term, [10 * 0.9 ** 3, 10 * 0.9 ** 2, 10 * 0.9], rtol=1e-6)


@pytest.mark.parametrize("T", [0, 1, 2, 5, 20, 257])
def test_parity(T):
    rng = np.random.default_rng(T)
    r = rng.standard_normal(T).astype(np.float32)
    v = rng.standard_normal(T).astype(np.float32)
    np.testing.assert_allclose(discounted_returns(r, 0.7, 0.99), ref_returns(r, 0.7, 0.99),
                               rtol=1e-6, atol=1e-6)
    for lam in (0.0, 0.5, 0.95, 1.0):
        ret, adv = gae(r, v, 0.7, 0.99, lam)
        want_ret, want_adv = ref_gae(r, v, 0.7, 0.99, lam)
        np.testing.assert_allclose(ret, want_ret, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(adv, want_adv, rtol=1e-6, atol=1e-6)


def test_gae_lambda_limits():
    rng = np.random.default_rng(0)
    r = rng.standard_normal(20).astype(np.float32)
    v = rng.standard_normal(20).astype(np.float32)
    boot, gamma = 0.3, 0.99
    ret1, adv1 = gae(r, v, boot, gamma, 1.0)
    R = discounted_returns(r, boot, gamma)
    np.testing.assert_allclose(adv1, R - v, rtol=1e-5, atol=1e-5)   # n-step advantages
    np.testing.assert_allclose(ret1, R, rtol=1e-5, atol=1e-5)
    ret0, adv0 = gae(r, v, boot, gamma, 0.0)
    v_next = np.append(v[1:], boot).astype(np.float64)
    td = r + gamma * v_next - v
    np.testing.assert_allclose(adv0, td, rtol=1e-5, atol=1e-6)     # TD errors
    np.testing.assert_allclose(ret0, r + gamma * v_next, rtol=1e-5, atol=1e-6)


def test_out_arrays_used():
    r = np.ones(4, np.float32)
    v = np.zeros(4, np.float32)
    o, a, b = (np.empty(4, np.float32) for _ in range(3))
    assert discounted_returns(r, 0.0, 0.5, out=o) is o
    ret, adv = gae(r, v, 0.0, 0.5, 1.0, out_returns=a, out_advantages=b)
    assert ret is a and adv is b
    np.testing.assert_allclose(a, o)


def test_bad_inputs():
    r = np.ones(4, np.float32)
    with pytest.raises(TypeError, match="rewards.*float32"):
        discounted_returns(np.ones(4), 0.0, 0.99)
    with pytest.raises(TypeError, match="rewards"):
        discounted_returns([1.0, 2.0], 0.0, 0.99)
    with pytest.raises(ValueError, match="values.*length"):
        gae(r, np.ones(3, np.float32), 0.0, 0.99, 1.0)
    with pytest.raises(ValueError, match="rewards.*contiguous"):
        discounted_returns(np.ones(8, np.float32)[::2], 0.0, 0.99)
    with pytest.raises(ValueError, match="rewards.*1-D"):
        discounted_returns(np.ones((2, 2), np.float32), 0.0, 0.99)
    with pytest.raises(ValueError, match="out.*length"):
        discounted_returns(r, 0.0, 0.99, out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="different"):
        o = np.empty(4, np.float32)
        gae(r, r, 0.0, 0.99, 1.0, out_returns=o, out_advantages=o)
