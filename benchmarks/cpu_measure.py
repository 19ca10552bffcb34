"""Real runs on this machine's CPU, for the benchmark sections that set
measured numbers beside predicted ones: `cpu_step_pair` (the median wall
time of training steps of two graphs) and `cpu_allocator_peaks` (the
CPU allocator's peak of one step, from its step stats), on built graphs
(`benchmarks.models.Built`).
"""

import time

import tensorflow as tf

from benchmarks.common import median

__all__ = ["cpu_step_pair", "cpu_allocator_peaks", "persistent_bytes"]


def _session_config(grappler):
    config = tf.compat.v1.ConfigProto()
    if not grappler:
        config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def cpu_step_pair(first, second, steps=5, warmup=2):
    """Median wall time of training steps of two graphs on this CPU.

    After `warmup` steps each, the graphs take turns, one step at a time,
    so slow drifts of a shared machine's load hit both alike. A last traced
    step counts the LMS swap ops that ran.

    Returns:
      ``(first, second)``: dicts with step_s (median), min_s, steps and
      swap_ops_run.
    """
    runs = []
    for built in (first, second):
        sess = tf.compat.v1.Session(graph=built.graph,
                                    config=_session_config(True))
        if built.init_op is not None:
            sess.run(built.init_op)
        feed = built.make_feed()
        for _ in range(warmup):
            sess.run(built.train_op, feed)
        runs.append((built, sess, feed, []))
    try:
        for _ in range(steps):
            for built, sess, feed, times in runs:
                start = time.perf_counter()
                sess.run(built.train_op, feed)
                times.append(time.perf_counter() - start)
        results = []
        for built, sess, feed, times in runs:
            meta = tf.compat.v1.RunMetadata()
            sess.run(built.train_op, feed,
                     options=tf.compat.v1.RunOptions(
                         trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                     run_metadata=meta)
            ran = {ns.node_name for dev in meta.step_stats.dev_stats
                   for ns in dev.node_stats}
            results.append({
                "step_s": median(times), "steps": steps,
                "min_s": min(times),
                "swap_ops_run": sum(1 for n in ran
                                    if n.startswith("lms/swap"))})
    finally:
        for _, sess, _, _ in runs:
            sess.close()
    return results[0], results[1]


def persistent_bytes(graph):
    """Bytes of variables and constants (allocated before a traced step)."""
    total = 0
    for op in graph.get_operations():
        if op.type in ("VarHandleOp", "VariableV2"):
            shape = tf.TensorShape(op.get_attr("shape"))
            dtype = tf.as_dtype(op.get_attr("dtype"))
            if shape.is_fully_defined():
                total += shape.num_elements() * dtype.size
        elif op.type == "Const":
            t = op.outputs[0]
            if t.shape.is_fully_defined() and t.dtype != tf.string:
                total += t.shape.num_elements() * t.dtype.size
    return total


def _allocator_curves(step_stats):
    """(all events, events of allocations that outlive their op)."""
    every, lasting = [], []
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            end = ns.all_start_micros + ns.all_end_rel_micros
            for mem in ns.memory:
                records = sorted(mem.allocation_records,
                                 key=lambda r: r.alloc_micros)
                open_allocs = {}
                scratch = set()
                for i, r in enumerate(records):
                    if r.alloc_bytes > 0:
                        open_allocs.setdefault(r.alloc_bytes, []).append(i)
                    elif r.alloc_bytes < 0 and r.alloc_micros <= end:
                        pending = open_allocs.get(-r.alloc_bytes)
                        if pending:
                            scratch.add(pending.pop())
                            scratch.add(i)
                for i, r in enumerate(records):
                    event = (r.alloc_micros, r.alloc_bytes)
                    every.append(event)
                    if i not in scratch:
                        lasting.append(event)
    return every, lasting


def _peak(events):
    # Frees before allocations at one microsecond: the allocator sees them
    # in that order when one op's output replaces another's.
    current = peak = 0
    for _, nbytes in sorted(events, key=lambda e: (e[0], e[1])):
        current += nbytes
        peak = max(peak, current)
    return peak


def cpu_allocator_peaks(built, grappler=False):
    """Real peaks of one traced training step on this machine's CPU.

    From the FULL_TRACE allocator records of the step: ``all`` counts every
    allocation (including kernel scratch such as im2col buffers), ``outputs``
    only allocations that outlive the op that made them (tensors). Both add
    `persistent_bytes` (variables and constants, allocated before the
    step). ``grappler=False`` runs the graph as given (meta optimizer off),
    the graph the simulator and the oracle see.

    Returns:
      dict with all, outputs, persistent (bytes) and step_s.
    """
    feed = built.make_feed()
    with tf.compat.v1.Session(graph=built.graph,
                              config=_session_config(grappler)) as sess:
        if built.init_op is not None:
            sess.run(built.init_op)
        sess.run(built.train_op, feed)
        meta = tf.compat.v1.RunMetadata()
        start = time.perf_counter()
        sess.run(built.train_op, feed,
                 options=tf.compat.v1.RunOptions(
                     trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                 run_metadata=meta)
        elapsed = time.perf_counter() - start
    every, lasting = _allocator_curves(meta.step_stats)
    resident = persistent_bytes(built.graph)
    return {"all": _peak(every) + resident,
            "outputs": _peak(lasting) + resident,
            "persistent": resident, "step_s": elapsed}
