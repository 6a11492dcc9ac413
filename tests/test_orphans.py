"""No simulator process outlives its Python owner: real processes, real signals.

Each test runs a small Python program in a subprocess that creates an env
(a ViZDoom engine, or a :class:`ProcEnv` child), prints the pids of every
process it started, then dies (SIGKILL, SIGTERM) or receives a terminal-style
SIGINT to its process group. Liveness is checked by pid through /proc.
"""
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc"),
              pytest.mark.slow]  # signals and faults: the slow tier

# Prints {"pids": [...descendants...]} once the env is up, then waits for a line on stdin.
PROGRAM = textwrap.dedent("""
    import json, os, signal, sys
    from a3c_core.envs import make_env

    # a launcher that ignores SIGINT (a background job of a non-interactive
    # shell) would pass SIG_IGN on and this program would never see Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def descendants(root):
        kids = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                kids.setdefault(ppid, []).append(int(name))
        out, todo = [], [root]
        while todo:
            for k in kids.get(todo.pop(), []):
                out.append(k)
                todo.append(k)
        return out

    env = make_env(sys.argv[1], env_process=json.loads(sys.argv[2]))
    env.reset()
    try:
        print(json.dumps({"pids": descendants(os.getpid())}), flush=True)
        sys.stdin.readline()            # the test signals us while we wait here
    except KeyboardInterrupt:
        # Ctrl-C reached us, not the simulator: it must still step.
        obs, r, term, trunc = env.step(0)
        print(json.dumps({"after_sigint": "stepped", "shape": list(obs.shape)}), flush=True)
        env.close()
        print(json.dumps({"left": [p for p in descendants(os.getpid())]}), flush=True)
""")


def _alive(pid):
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_gone(pids, timeout=8.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _start(env_id, env_process, *, new_session=False):
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, env_id, json.dumps(env_process)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=new_session,
    )
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"helper failed: {proc.stderr.read()}")
    pids = json.loads(line)["pids"]
    assert pids, "the env started no process"
    assert all(_alive(p) for p in pids)
    return proc, pids


def _cleanup(pids):
    for p in pids:  # only if the test failed: never leave our own processes behind
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


CASES = [
    pytest.param("doom:basic", False, id="doom-engine"),
    pytest.param("CartPole-v1", True, id="proc-env-child"),
    pytest.param("doom:basic", True, id="proc-env-child-with-doom-engine"),
]


@pytest.mark.parametrize("env_id,env_process", CASES)
def test_sigkill_of_owner_leaves_no_process(env_id, env_process):
    if env_id.startswith("doom:"):
        pytest.importorskip("vizdoom")
    proc, pids = _start(env_id, env_process)
    if env_id.startswith("doom:"):
        # the engine plus its guard (and the ProcEnv child when there is one)
        assert len(pids) == (3 if env_process else 2)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _wait_gone(pids) == [], "processes outlived their SIGKILLed owner"
    finally:
        _cleanup(pids)


def test_sigterm_of_owner_leaves_no_process():
    proc, pids = _start("CartPole-v1", True)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert _wait_gone(pids) == []
    finally:
        _cleanup(pids)


@pytest.mark.parametrize("env_id,env_process", CASES[:2])
def test_terminal_sigint_reaches_only_the_owner(env_id, env_process):
    """Ctrl-C at a terminal = SIGINT to the foreground process group."""
    if env_id.startswith("doom:"):
        pytest.importorskip("vizdoom")
    proc, pids = _start(env_id, env_process, new_session=True)
    try:
        # never wait forever: a Ctrl-C that finds no answer in 10 s is sent
        # again (seen once in a CI run on a loaded machine, not reproduced
        # in 8 reruns), and three unanswered ones fail the test
        for _ in range(3):
            os.killpg(proc.pid, signal.SIGINT)
            if select.select([proc.stdout], [], [], 10.0)[0]:
                break
        else:
            pytest.fail("the helper answered none of three SIGINTs")
        out = json.loads(proc.stdout.readline() or "{}")
        assert out.get("after_sigint") == "stepped", proc.stderr.read()
        assert json.loads(proc.stdout.readline())["left"] == []  # closed cleanly
        assert proc.wait(timeout=10) == 0
        assert _wait_gone(pids) == []
    finally:
        _cleanup(pids)
