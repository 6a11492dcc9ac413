"""Installed-package smoke test (run by .ci/run in a fresh venv without extras, outside the source tree).

Import, build a network and step it, one optimizer apply (compiled Cython
extension), save a checkpoint, Policy.load + act, and the CLI's --version.
Each check compares against a value computed independently here.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

import a3c_core
from a3c_core import Policy, build_network

here = os.path.dirname(os.path.abspath(a3c_core.__file__))
assert "site-packages" in here, f"smoke test must use the installed package, not {here}"
from a3c_core import _hogwild, _preprocess, _returns  # noqa: E402,F401  the compiled extensions

net = build_network("mlp-lstm", (4,), 2, seed=0)
obs = np.array([0.1, -0.2, 0.3, 0.05], np.float32)
probs, value, state = net.step(obs, net.initial_state())
assert probs.shape == (2,) and abs(float(probs.sum()) - 1.0) < 1e-5 and np.isfinite(value), (probs, value)

# one Adam step from zero moments moves every parameter with a non-zero gradient by ~lr against it
rng = np.random.default_rng(0)
stats, _ = net.loss_and_grad(rng.standard_normal((5, 4)).astype(np.float32), np.array([0, 1, 1, 0, 1]),
                             np.ones(5, np.float32), np.ones(5, np.float32), net.initial_state())
assert np.isfinite(stats["loss"]), stats
from a3c_core.core import make_optimizer  # noqa: E402

opt = make_optimizer("adam", net.params.size, lr=1e-3)
before, grads = net.params.copy(), net.grads.copy()
opt.apply(net.params, grads)
moved = np.abs(grads) > 1e-4  # well above eps=1e-8, where the step is lr * sign(g)
expected = before[moved] - 1e-3 * np.sign(grads[moved])
np.testing.assert_allclose(net.params[moved], expected, atol=1e-5)

with tempfile.TemporaryDirectory() as tmp:
    path = Policy.from_network(net, (4,), env_id="gym:CartPole-v1").save(os.path.join(tmp, "policy.npz"))
    policy = Policy.load(path)
    p2, v2, _ = policy.probs(obs, policy.initial_state())
    t2, tv, _ = net.step(obs, net.initial_state())
    np.testing.assert_allclose(p2, t2, rtol=1e-6)
    action, state = policy.act(obs, policy.initial_state(), greedy=True)
    assert action == int(np.argmax(t2)), (action, t2)

out = subprocess.run([sys.executable, "-m", "a3c_core", "--version"], capture_output=True, text=True)
assert out.returncode == 0 and out.stdout.strip() == f"a3c_core {a3c_core.__version__}", out
print(f"smoke OK: a3c_core {a3c_core.__version__} from {here}")
