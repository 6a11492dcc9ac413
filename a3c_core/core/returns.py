"""n-step discounted returns and GAE over one rollout (Cython, nogil).

Both take float32 1-D arrays of length T in time order and a
``bootstrap_value`` = V(s_T):

* pass ``0.0`` when the rollout ended in a TERMINAL state (no future reward);
* pass the critic's V(s_T) when the rollout was CUT by t_max, or TRUNCATED by
  a time limit (the episode would have gone on).

``discounted_returns(rewards, bootstrap_value, gamma, out=None) -> R``:
R_t = r_t + gamma * R_{t+1}, R_T = bootstrap_value.

``gae(rewards, values, bootstrap_value, gamma, lam, out_returns=None,
out_advantages=None) -> (returns, advantages)``:
delta_t = r_t + gamma*V_{t+1} - V_t (V_T = bootstrap_value),
A_t = delta_t + gamma*lam*A_{t+1}, returns = A + V (lambda-returns).
lam = 1 gives the n-step return advantages R_t - V_t; lam = 0 gives the TD
errors delta_t.  Recursions run in float64; outputs are float32 (new arrays,
or written into the given ``out*`` arrays, which must be float32 (T,)).
A rollout never crosses an episode boundary, so there is no done mask.
Bad input raises TypeError/ValueError naming the argument.
"""
from a3c_core._returns import discounted_returns, gae

__all__ = ["discounted_returns", "gae"]
