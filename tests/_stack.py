"""Which TensorFlow stack the tests run on, and the skips that depend on it.

Two stacks are supported (docs/install.md): TensorFlow 2.15.1, with Keras 2
as tf.keras, tf.estimator and Horovod; and TensorFlow 2.16+ with tf-keras,
tested with TF_USE_LEGACY_KERAS=1 (tools/ci_tf_latest.sh). Only what cannot
exist on the newer stack is skipped there, with a reason naming the stack.
"""

import pytest
import tensorflow as tf

from tflms.tf import compat

TF_VERSION = compat.TF_VERSION
NEW_STACK = TF_VERSION >= (2, 16, 0)

ESTIMATOR_REASON = "tf.estimator was removed in TensorFlow 2.16"
HOROVOD_REASON = (
    "Horovod 0.28.1 does not build against TensorFlow %s (the TensorFlow "
    "2.16+ stack): the TensorFlow headers it compiles against include "
    "highwayhash/arch_specific.h, which the wheel does not ship; see "
    "docs/install.md" % tf.__version__)

# Tests that build an Estimator.
needs_estimator = pytest.mark.skipif(NEW_STACK, reason=ESTIMATOR_REASON)
# Tests that need Horovod: skipped on the 2.16+ stack only. On TensorFlow
# 2.15 a missing Horovod is a failure naming the command that builds it.
needs_horovod_stack = pytest.mark.skipif(NEW_STACK, reason=HOROVOD_REASON)
