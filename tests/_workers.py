"""Starting the processes of a distributed test job: each in a session of
its own, bounded by a timeout that kills its whole process group, and the
workers of a ``TF_CONFIG`` cluster on free ports of 127.0.0.1.

examples/multiworker_lms.py keeps a launcher of its own: an example must
run without the tests.
"""

import json
import os
import signal
import socket
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Variables of the job launchers that the test process may have inherited:
# a job's processes get only those the test gives them.
_LAUNCHER_VARS = ("TF_CONFIG", "HOROVOD_RANK", "HOROVOD_SIZE",
                  "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")


def job_env(**extra):
    """This process's environment for a job's process: tflms from this
    repository first, quiet TensorFlow, a fixed hash seed, no launcher
    variables but `extra`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for name in _LAUNCHER_VARS:
        env.pop(name, None)
    env.update(extra)
    return env


def spawn(cmd, env):
    """Start `cmd` in the repository, in a new session (so that `finish`
    can kill what it starts), its output and errors together."""
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc, timeout, what):
    """Wait for `proc`: ``(exit status, output)``. On timeout kill its
    whole process group and fail the test, naming `what` hung."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, _ = proc.communicate(timeout=15)
                break
            except subprocess.TimeoutExpired:
                out = ""
        pytest.fail("%s did not finish within %d s (a hang); output:\n%s"
                    % (what, timeout, (out or "")[-4000:]))
    return proc.returncode, out


def free_ports(n):
    """`n` ports of 127.0.0.1 free now (bound together, so distinct)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_workers(cmd, timeout, count=2, env_of=None):
    """Run `cmd` as the `count` workers of a ``TF_CONFIG`` cluster on free
    127.0.0.1 ports, all at once; ``[(exit status, output)]`` by worker.

    Args:
      cmd: the command line every worker runs.
      timeout: seconds each worker may take.
      env_of: ``index -> dict`` of variables for worker `index` (its dump
        folder...), beside its ``TF_CONFIG``.
    """
    cluster = {"worker": ["127.0.0.1:%d" % p for p in free_ports(count)]}
    procs = []
    for i in range(count):
        extra = dict(env_of(i)) if env_of is not None else {}
        extra["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}})
        procs.append(spawn(cmd, job_env(**extra)))
    try:
        return [finish(proc, timeout, "MultiWorkerMirroredStrategy worker %d"
                       % i) for i, proc in enumerate(procs)]
    finally:
        # A worker that hung fails the test; its peer, waiting for it in a
        # collective, must not outlive the test.
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.communicate()
