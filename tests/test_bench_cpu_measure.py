"""benchmarks/cpu_measure.py: real runs on this CPU (the allocator's peak
of a step, from its step stats)."""

import tensorflow as tf

from benchmarks import cpu_measure


def test_allocator_peak_separates_scratch_from_outputs():
    step_stats = tf.compat.v1.RunMetadata().step_stats
    dev = step_stats.dev_stats.add()
    # Op a (runs 0-10 us): 100-byte output freed at 50 us, 1000 bytes of
    # scratch freed at 5 us. Op b (runs 20-30 us): 300-byte output.
    a = dev.node_stats.add(node_name="a", all_start_micros=0,
                           all_end_rel_micros=10)
    mem = a.memory.add(allocator_name="cpu")
    for micros, nbytes in ((1, 100), (2, 1000), (5, -1000), (50, -100)):
        mem.allocation_records.add(alloc_micros=micros, alloc_bytes=nbytes)
    b = dev.node_stats.add(node_name="b", all_start_micros=20,
                           all_end_rel_micros=10)
    mem = b.memory.add(allocator_name="cpu")
    for micros, nbytes in ((21, 300), (60, -300)):
        mem.allocation_records.add(alloc_micros=micros, alloc_bytes=nbytes)
    every, lasting = cpu_measure._allocator_curves(step_stats)
    assert cpu_measure._peak(every) == 1100
    assert cpu_measure._peak(lasting) == 400
