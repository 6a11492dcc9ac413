import numpy as np

from a3c_core.sampling import greedy, sample_categorical, sample_categorical_ref


def test_kernel_matches_numpy_twin():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        a = int(rng.integers(1, 8))
        p = rng.random(a).astype(np.float32)
        p[rng.random(a) < 0.3] = 0.0
        if not p.any():
            p[int(rng.integers(a))] = 1.0
        p /= p.sum()
        u = float(rng.random())
        assert sample_categorical(p, u) == sample_categorical_ref(p, u)


def test_frequencies_follow_probs_and_zero_mass_is_never_drawn():
    p = np.array([0.2, 0.0, 0.5, 0.3], np.float32)
    u = np.random.default_rng(1).random(40_000)
    counts = np.bincount([sample_categorical(p, x) for x in u], minlength=4) / u.size
    np.testing.assert_allclose(counts, p, atol=0.01)
    assert counts[1] == 0
    # u at the very top (rounding leaves total mass < u): last action with p > 0
    q = np.array([0.5, 0.4999, 0.0], np.float32)
    assert sample_categorical(q, 0.99999) == 1 == sample_categorical_ref(q, 0.99999)
    assert greedy(p) == 2
