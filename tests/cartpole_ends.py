"""How a CartPole-v1 episode of a given length may have ended."""

#: CartPole-v1's time limit, in steps
CARTPOLE_LIMIT = 500


def cartpole_end_fits(length, end):
    """True when ``end`` is a possible end of a CartPole-v1 episode of ``length`` steps.

    Shorter episodes end by the pole falling (``"terminated"``).  At the limit the
    time limit cuts the episode (``"truncated"``), unless the pole falls on that
    very step: Gymnasium then sets both flags and the env reports the fall.
    """
    if length < CARTPOLE_LIMIT:
        return end == "terminated"
    return length == CARTPOLE_LIMIT and end in ("terminated", "truncated")
