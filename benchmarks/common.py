"""Plumbing shared by the benchmark runner and its worker processes.

Each benchmark case runs in a fresh Python process (`run_case`): Keras
builds into the process's default-graph machinery, v1 and v2 control flow
are process-wide switches, and a case that takes too long must be stoppable.
The worker prints one ``BENCH_RESULT <json>`` line whenever it has a
(partial) result; the parent keeps the last one, so a case stopped by its
time limit still reports what it finished.
"""

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time

__all__ = ["ROOT", "RESULT_PREFIX", "GIB", "MIB", "SERVER_HOST_MEM_GIB",
           "emit", "run_case",
           "machine_info", "setup_tensorflow", "fmt_bytes", "median",
           "fixed_params", "new_axes", "save_figure", "sim_beside_oracle"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PREFIX = "BENCH_RESULT "
GIB = float(1 << 30)
MIB = float(1 << 20)
# Host memory the benchmarks' plans may use (`autotune_host_mem`): they plan
# for the server the modelled GPU sits in, not for the machine they run on.
# An IBM AC922, the original's platform, holds up to 1 TiB for 4 V100s.
SERVER_HOST_MEM_GIB = 256.0


def sim_beside_oracle(row):
    """The simulator's peak to set beside the oracle's runtime peak in a
    result row of `measure.apply_tflms`: its count with copies instant, as
    the oracle replays them (``sim_instant_peak``), or in older results,
    which have only the tuner's count with copies timed, ``sim_peak``;
    None without either."""
    return row.get("sim_instant_peak") or row.get("sim_peak")


def fmt_bytes(nbytes):
    """``'1.23 GiB'``, ``'45.6 MiB'`` or ``'7.8 KiB'``."""
    if nbytes is None:
        return "-"
    if abs(nbytes) >= GIB:
        return "%.2f GiB" % (nbytes / GIB)
    if abs(nbytes) >= MIB:
        return "%.1f MiB" % (nbytes / MIB)
    return "%.1f KiB" % (nbytes / 1024.0)


def fixed_params(spec, num_levels, tuned=None):
    """Fixed LMS parameters ``[threshold, ahead, groupby, sync_mode]`` of a
    case: None, "tuned" (the auto-tuned ones, given as `tuned`), or a list
    whose threshold may be a float share of the graph's `num_levels`."""
    if spec is None:
        return None
    if spec == "tuned":
        return tuned
    t, a, g, sync = spec
    if isinstance(t, float):
        t = max(1, int(t * num_levels))
    return [int(t), int(a), int(g), int(sync)]


def median(values):
    """Median of a non-empty list of numbers."""
    ordered = sorted(float(v) for v in values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def emit(result):
    """Print a (partial) result of the current case for the parent."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True)
                     + "\n")
    sys.stdout.flush()


def setup_tensorflow(control_flow="v2"):
    """Graph mode for this worker process: "v2" disables eager execution
    only (v2 control flow, what Keras users get); "v1" calls
    ``disable_v2_behavior()`` (Switch/Merge control flow, ref-free v1
    graph mode); "eager" leaves TensorFlow 2's eager execution on, for
    steps traced as `tf.function` (`models.keras3_app`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    if control_flow == "v1":
        tf.compat.v1.disable_v2_behavior()
    elif control_flow == "v2":
        tf.compat.v1.disable_eager_execution()
    elif control_flow != "eager":
        raise ValueError("control_flow must be 'v1', 'v2' or 'eager'; got %r"
                         % (control_flow,))
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    return tf


def new_axes(width=8.0, height=4.5):
    """``(figure, axes)`` of one off-screen matplotlib figure, or None when
    matplotlib (an optional extra) is not installed."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        return None
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def save_figure(fig, path):
    """Write a figure from `new_axes` as a PNG; returns `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def run_case(section, case, timeout_s, env=None):
    """Run one case in a worker process.

    Args:
      section: section name (a module of `benchmarks`, one of
        `run.SECTIONS`).
      case: JSON-serialisable dict describing the case.
      timeout_s: wall-clock limit; the worker is killed after it.
      env: extra environment variables for the worker.

    Returns:
      The worker's last result dict, with ``wall_s`` and, when it did not
      finish, ``error`` ("timed out after N s" or the end of its stderr).
    """
    cmd = [sys.executable, "-m", "benchmarks.run", "--worker", section,
           "--case", json.dumps(case, sort_keys=True)]
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = ROOT + os.pathsep + child_env.get(
        "PYTHONPATH", "")
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    child_env.update(env or {})
    start = time.perf_counter()
    error = None
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env,
                              capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        stdout = _text(err.stdout)
        stderr = _text(err.stderr)
        code = None
        error = "timed out after %d s" % timeout_s
    result = {}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    if code not in (0, None) and error is None:
        tail = [l for l in stderr.strip().splitlines() if l.strip()][-3:]
        error = "exit %d: %s" % (code, " | ".join(tail))
    if error is None and not result.get("done"):
        error = "worker ended without a final result"
    result["wall_s"] = time.perf_counter() - start
    if error:
        result["error"] = error
    return result


def _text(data):
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib():
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / float(1 << 20)
    except OSError:
        pass
    return None


def machine_info():
    """CPU, cores, RAM and software versions of this machine."""
    info = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for key, dists in (("tensorflow", ("tensorflow-cpu", "tensorflow")),
                       ("numpy", ("numpy",))):
        info[key] = "unknown"
        for dist in dists:
            try:
                info[key] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            info["loadavg_at_start"] = f.read().split()[:3]
    except OSError:
        pass
    return info
