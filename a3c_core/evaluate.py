"""``a3c eval``: play episodes with a checkpoint, report raw rewards and how the
episodes ended, optionally write a GIF."""
from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np


class EvalError(Exception):
    """A problem the user can fix (wrong file, env that does not match); printed without a traceback."""


def check_env_matches(policy, env, env_id):
    """Raise :class:`EvalError` unless ``env`` gives the observations and actions ``policy`` was trained on."""
    saved = policy.meta.get("env", {})
    want_shape, want_kind = tuple(policy.pipeline.raw_shape), policy.pipeline.kind
    got_shape, got_kind = tuple(env.obs_shape), getattr(env, "obs_kind", None)
    problems = []
    if got_kind != want_kind or got_shape != want_shape:
        problems.append(f"observations: {want_kind} {want_shape} in the checkpoint, "
                        f"{got_kind} {got_shape} from the env")
    if env.n_actions != policy.n_actions:
        problems.append(f"actions: {policy.n_actions} in the checkpoint, {env.n_actions} in the env")
    if problems:
        # the same id with other actions or frames: the env itself changed
        # (its cfg, or the adapter's action set), not the user's --env
        hint = ("The env's cfg or this version's adapter has changed since it trained: "
                "train a new run for it." if env_id == saved.get("id")
                else "Evaluate on the env it was trained on (leave out --env).")
        raise EvalError(
            f"env {env_id} does not match the checkpoint (trained on {saved.get('id')!r}): "
            + "; ".join(problems) + ". " + hint)


def trained_env_options(env_meta) -> dict:
    """The adapter options that rebuild a checkpoint's env as it trained: the
    options its family's spec records (:meth:`EnvFamily.trained_options`; a
    Doom checkpoint's action set and view, ``"buttons"`` and ``"full"`` for
    one saved before the checkpoint recorded them: a scenario's default may
    be another now)."""
    from a3c_core.envs.families import family_named

    family = family_named(env_meta.get("kind"))
    return family.trained_options(env_meta) if family is not None else {}


def episode_end(env, terminated, truncated) -> str:
    """How the episode that just ended ended: the env's own word where it
    has one (:attr:`~a3c_core.envs.base.Env.episode_end`: a Doom env tells
    "died", "timed out" and "ended alive", the goal of a scenario that has
    one), else "truncated" (a time limit) or "terminated"."""
    end = getattr(env, "episode_end", None)
    if end:
        return str(end)
    return "truncated" if truncated and not terminated else "terminated"


def write_gif(path, frames, step_seconds) -> dict:
    """Write RGB uint8 ``(H, W, 3)`` frames as a looping GIF, one frame per env step in real time.

    GIF delays are in 10 ms units, so each step lasts ``round(step_seconds, 2)``
    (at least 20 ms: viewers slow shorter delays down). Pillow merges identical
    consecutive frames into one longer frame. Returns what the file holds:
    ``{"frames", "steps", "frame_ms", "seconds"}``, read back from the file.
    """
    try:
        from PIL import Image
    except ImportError:
        raise EvalError("--gif needs Pillow: pip install 'a3c_core[log]'") from None
    imgs = [Image.fromarray(np.ascontiguousarray(f, dtype=np.uint8)) for f in frames if f is not None]
    if not imgs:
        raise EvalError("--gif: the episode produced no frames")
    frame_ms = max(20, int(round(step_seconds * 100.0)) * 10)
    tmp = path + ".tmp.gif"
    imgs[0].save(tmp, format="GIF", save_all=True, append_images=imgs[1:], duration=frame_ms, loop=0)
    os.replace(tmp, path)
    with Image.open(path) as im:
        n = getattr(im, "n_frames", 1)
        total = 0
        for i in range(n):
            im.seek(i)
            total += int(im.info.get("duration", frame_ms))
    return {"frames": n, "steps": len(imgs), "frame_ms": frame_ms, "seconds": total / 1000.0}


def run_eval(args) -> int:
    from a3c_core._safepoint import deferred_sigint, held_sigint

    with held_sigint():     # the policy's imports load numba's and llvmlite's C extensions
        from a3c_core.checkpoint import CheckpointError
        from a3c_core.envs import make_env
        from a3c_core.obs import ObservationError
        from a3c_core.policy import Policy

    env = None
    try:
        policy = Policy.load(args.checkpoint, which=args.which)
        print(f"loaded {policy.checkpoint.describe()}", flush=True)
        env_meta = policy.meta.get("env", {})
        env_id = args.env or env_meta.get("id")
        if not env_id:
            raise EvalError(f"checkpoint {policy.path} does not record its env; give --env")
        same_env = args.env is None or args.env == env_meta.get("id")
        extra = trained_env_options(env_meta) if same_env else {}
        env = make_env(env_id, seed=args.seed, frame_skip=env_meta.get("frame_skip") if same_env else None,
                       render=bool(args.gif), **extra)
        check_env_matches(policy, env, env_id)
    except (CheckpointError, EvalError, ValueError, ImportError, OSError) as e:
        if env is not None:
            env.close()
        print(f"a3c eval: error: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    returns, ends, frames = [], [], []
    try:
        for ep in range(args.episodes):
            obs, state, done, total, length = env.reset(), policy.initial_state(), False, 0.0, 0
            while not done:
                if args.gif and ep == 0:
                    frames.append(env.render_frame())
                if ep == 0 and length == 0:    # the first step compiles on a cold cache:
                    with deferred_sigint():     # a Ctrl-C there waits for a safe point
                        a, state = policy.act(obs, state, greedy=not args.sample, rng=rng)
                else:
                    a, state = policy.act(obs, state, greedy=not args.sample, rng=rng)
                obs, r, term, trunc = env.step(a)
                total += r
                length += 1
                done = term or trunc
            returns.append(total)
            ends.append(episode_end(env, term, trunc))
            if args.verbose:
                print(f"episode {ep + 1}: return {total:.2f}, {length} steps, {ends[-1]}")
        step_s, how = env.seconds_per_step()
    except ObservationError as e:
        print(f"a3c eval: error: env {env_id} gave an observation the policy cannot use: {e}",
              file=sys.stderr)
        return 2
    finally:
        env.close()
    r = np.asarray(returns)
    mode = "sampled" if args.sample else "greedy"
    print(f"{env_id}: {len(r)} episodes ({mode}): mean raw reward {r.mean():.2f} ± {r.std():.2f} "
          f"(min {r.min():.2f}, max {r.max():.2f})")
    print("episode ends: " + ", ".join(f"{n} {end}" for end, n in Counter(ends).most_common()))
    if args.gif:
        try:
            info = write_gif(args.gif, frames, step_s)
        except (EvalError, OSError) as e:
            print(f"a3c eval: error: {e}", file=sys.stderr)
            return 2
        merged = info["steps"] - info["frames"]
        print(f"wrote {args.gif}: {info['steps']} steps of episode 1 as {info['frames']} GIF frames"
              + (f" ({merged} identical consecutive frames merged)" if merged else "")
              + f", {info['frame_ms']} ms per step ({how}: {step_s * 1000:.0f} ms of game time), "
              f"{info['seconds']:.2f} s in all")
    return 0
