"""A long run of the LMS fuzzing property of tests/test_fuzz.py.

The CI test draws a fixed sample of 200 examples; this script draws many
more at random (a new seed each run unless --seed is given), checks the
same property on each (documented error with the graph untouched, or an
acyclic rewrite with every swap op on the CPU, a second run that changes
nothing, and training numbers equal to the unrewritten graph's), and prints
the counts of each outcome. Failing examples are shrunk by hypothesis and
printed with the decorator that reproduces them.

Usage::

    python tools/fuzz_long.py [--examples 2000] [--seed 7] [--max-nodes 12]

Exit status 1 if the property failed.
"""

import argparse
import collections
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000,
                        help="number of random examples (default 2000)")
    parser.add_argument("--seed", type=int, default=None,
                        help="hypothesis seed (default: random)")
    parser.add_argument("--max-nodes", type=int, default=12,
                        help="largest random graph, in nodes (default 12; "
                             "the CI test uses 8)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    sys.path.insert(0, os.path.join(_ROOT, "tests"))
    sys.path.insert(0, _ROOT)
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st
    import test_fuzz

    stats = collections.Counter()
    sizes = collections.Counter()

    @st.composite
    def examples(draw):
        spec = draw(test_fuzz.graph_specs(max_nodes=args.max_nodes))
        return spec, draw(test_fuzz.lms_specs(spec))

    @settings(max_examples=args.examples, deadline=None, database=None,
              print_blob=True,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(examples())
    def prop(example):
        stats["examples"] += 1
        sizes[len(example[0].nodes)] += 1
        test_fuzz.check_example(*example, stats=stats)

    if args.seed is not None:
        prop = seed(args.seed)(prop)
    start = time.perf_counter()
    failed = False
    try:
        prop()
    except Exception as e:
        failed = True
        print("PROPERTY FAILED: %s: %s" % (type(e).__name__, e))
    elapsed = time.perf_counter() - start
    print("examples run (with shrinking): %d in %.1f s (%.2f s each)"
          % (stats["examples"], elapsed,
             elapsed / max(1, stats["examples"])))
    print("graph sizes (nodes: count): %s" % dict(sorted(sizes.items())))
    for key in sorted(stats):
        if key != "examples":
            print("  %-28s %d" % (key, stats[key]))
    print("RESULT %s" % ("FAIL" if failed else "PASS"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
