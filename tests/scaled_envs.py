"""CartPole-v1 with its reward multiplied (x100, x0.01), registered on import:
the ``module:Env-v0`` id form, ``scaled_envs:ScaledCartPole100-v0``."""
import gymnasium as gym


def _make(scale, **kw):
    env = gym.make("CartPole-v1", **kw)
    return gym.wrappers.TransformReward(env, lambda r: r * scale)


for _name, _scale in (("ScaledCartPole100-v0", 100.0), ("ScaledCartPole001-v0", 0.01)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_make, kwargs={"scale": _scale})
