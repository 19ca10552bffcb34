"""What each suite measures: the cases of every section.

* ``smoke``: the smallest graphs, every section once, for the CI test
  (about a minute).
* ``quick``: the real models at moderate sizes, small budgets so the
  capacity searches stay short; under ten minutes on a 2-core machine.
* ``full``: the sizes and budgets of the issue (16 and 32 GiB, graphs up to
  200,000 ops); regenerates ``docs/benchmarks.md``.
* ``thirdparty``: the fidelity and capacity cases of the models written by
  others (issue 22, item 4), which ``full`` runs too: the Keras
  applications of `benchmarks.models.KERAS_APPS` and segmentation-models-3D's
  3D U-Net (`benchmarks.models.unet3d_recipe`; the package is not a test
  dependency, see `benchmarks.models.SM3D_INSTALL`), each in a Session
  graph as their users write it.
* ``keras3``: the capacity of a Keras 3 ResNet50's ``fit()`` step traced as
  a `tf.function` (`benchmarks.models.keras3_app`, issue 24 item 8), beside
  the Session-graph figure of ``thirdparty``; TensorFlow 2.16+ with Keras 3
  only (run it without TF_USE_LEGACY_KERAS), so ``full`` does not run it.
* ``keras3_graph``: the Session-graph figure of the same computation on
  TensorFlow 2.15: tf.keras ResNet50 (`benchmarks.models.keras_app`) with
  every batch-norm layer unfused, as Keras 3 computes batch norm, with and
  without ``minimize``'s gating of gradients, and the fused model both
  ways; the other half of the ``keras3`` comparison, run with
  TF_USE_LEGACY_KERAS (or on a TensorFlow with Keras 2).

Each case is a dict handed to a worker (see the section modules); the
``timeout_s`` of a case is enforced by the runner, and a stopped case keeps
its partial results. Budgets in GiB are what the GPU has; tflms plans for
``TF_LMS_SIMULATOR_MEM_RATIO`` (set by ``--mem-ratio``) of it.
"""

__all__ = ["SUITES", "suite"]


def _resnet(image, batch=1, **kw):
    args = {"image": image, "batch": batch}
    args.update(kw)
    return args


def _unet(volume, base_filters=16, depth=4, batch=1):
    return {"volume": volume, "base_filters": base_filters, "depth": depth,
            "batch": batch}


def _layered_fixed(num_ops):
    # About half of the forward activations go to the host: layer i's
    # output is read by the backward pass ~2 * (L - i) * 4 levels later.
    layers = max(2, (num_ops - 8) // 13)
    return [2 * layers, 8, 4, 0]


def _timing_layered(sizes, reps, timeout):
    return [{"model": "layered", "label": "synthetic %dk ops" % (n // 1000),
             "kwargs": {"num_ops": n}, "budget_fraction": 0.5,
             "fixed": _layered_fixed(n), "reps": reps, "timeout_s": timeout,
             "soft_limit_s": timeout / 2} for n in sizes]


def _timing_deep_mlp(sizes, reps, timeout):
    # Half of the activation bytes above the resident ones must go: about
    # half of the layers' activations are swapped (4,764 tensors at 200k
    # ops). Fixed: the first half of the layers, whose activations wait
    # longest for the backward pass.
    return [{"model": "deep_mlp",
             "label": "deep narrow MLP %dk ops" % (n // 1000),
             "kwargs": {"num_ops": n}, "budget_fraction": 0.5,
             "fixed": [0.5, 8, 4, 0], "reps": reps, "timeout_s": timeout,
             "soft_limit_s": timeout / 2} for n in sizes]


def _resnet_timing(label, control_flow, budget_gib, reps, timeout):
    # The graph a user of examples/Keras_ResNet50.py gets (Adam, accuracy
    # metric, Keras' learning-phase conds): v1 control flow is the ~11k-op
    # graph, v2 control flow (eager off only) hides batch norm in If ops.
    return {"model": "resnet50", "control_flow": control_flow,
            "label": label, "budget_gib": budget_gib,
            "kwargs": _resnet(1024, learning_phase="placeholder",
                              optimizer="adam"),
            "fixed": [40, 10, 5, 0], "reps": reps, "timeout_s": timeout}


_FALLBACK = [0.1, 3, 2, 0]


def _fractions(*shares):
    """Plans of a fidelity case: budgets as shares of the activations."""
    return [{"budget_fraction": f} for f in shares]


def _mlp_fidelity(variables, budgets, timeout, **kwargs):
    # Issue 15's case: ref variables under disable_v2_behavior (v1 graph
    # mode, as its user had it), resource variables in v2 graph mode.
    return {"model": "mlp", "kwargs": dict(kwargs, variables=variables),
            "control_flow": "v1" if variables == "ref" else "v2",
            "budgets": budgets, "fallback_fixed": _FALLBACK,
            "timeout_s": timeout}


def _app_fidelity(app, image, timeout=900):
    # Three budgets, each a share of the activations (the weights, their
    # momentum and the gradients stay): where plans engage at every size.
    return {"model": "keras_app", "kwargs": {"app": app, "image": image,
                                             "batch": 1},
            "real": False, "budgets": _fractions(0.8, 0.5, 0.3),
            "fallback_fixed": _FALLBACK, "timeout_s": timeout}


def _app_capacity(app, timeout=2400, **kw):
    case = {"model": "keras_app", "label": "Keras %s image side" % app,
            "dimension": "image", "kwargs": {"app": app, "image": 224,
                                             "batch": 1},
            "budget_gib": 16, "start": 1024, "step": 32, "tolerance": 0.05,
            "max": 32768, "methods": ["none", "tflms"],
            "timeout_s": timeout}
    case.update(kw)
    return case


# Issue 22, item 4: architectures written by others, used as their users use
# them (Session graph, model called on placeholders with training=True,
# momentum SGD), batch 1, 16 GiB.
THIRD_PARTY = {
    "fidelity": [
        _app_fidelity(app, 512) for app in ("ResNet50", "DenseNet121",
                                            "InceptionV3", "EfficientNetB0",
                                            "MobileNetV2")
    ] + [
        {"model": "unet3d_recipe", "kwargs": {"volume": 96, "batch": 1},
         "real": False, "budgets": _fractions(0.8, 0.5, 0.3),
         "fallback_fixed": _FALLBACK, "timeout_s": 900},
    ],
    "capacity": [
        _app_capacity(app) for app in ("ResNet50", "DenseNet121",
                                       "InceptionV3", "EfficientNetB0",
                                       "MobileNetV2")
    ] + [
        {"model": "unet3d_recipe",
         "label": "segmentation-models-3D U-Net volume side",
         "dimension": "volume", "kwargs": {"volume": 64, "batch": 1},
         "budget_gib": 16, "start": 128, "step": 32, "tolerance": 0.05,
         "max": 2048, "methods": ["none", "tflms"],
         "timeout_s": 2400},
    ],
}

SMOKE = {
    "timing": [
        {"model": "layered", "label": "synthetic 2k ops",
         "kwargs": {"num_ops": 2000, "width": 32, "batch": 8},
         "budget_fraction": 0.5, "fixed": _layered_fixed(2000), "reps": 2,
         "timeout_s": 120},
    ] + _timing_deep_mlp([2000], 1, 120),
    "memory": [
        {"model": "unet3d", "kwargs": _unet(32, 8, 3), "budget_gib": 0.008,
         "fixed": [0.25, 5, 5, 0], "timeout_s": 120},
    ],
    "capacity": [
        {"model": "unet3d", "label": "3D U-Net", "dimension": "volume",
         "kwargs": _unet(16, 4, 3), "budget_gib": 0.01, "start": 16,
         "step": 4, "tolerance": 0.3, "max": 256, "timeout_s": 150},
    ],
    "cost": [
        {"model": "unet3d", "kwargs": _unet(16, 4, 3), "steps": 2,
         "budget_fraction": 0.7, "fallback_fixed": _FALLBACK,
         "timeout_s": 120},
    ],
    "fidelity": [
        {"model": "unet3d", "kwargs": _unet(16, 4, 3),
         "budgets": _fractions(0.7), "fallback_fixed": _FALLBACK,
         "timeout_s": 120},
        # Tensors of 256 KiB: ops of about a microsecond in the virtual
        # cluster; smaller ones share one truncated microsecond, where the
        # runtime replay releases a swapped-out tensor only at its end.
        _mlp_fidelity("ref", _fractions(0.5), 120, depth=8, width=256,
                      batch=256),
    ],
}

QUICK = {
    "timing": [
        _resnet_timing("Keras ResNet50 1024x1024 b1, v1 graph, 2.5 GiB",
                       "v1", 2.5, 2, 240),
        _resnet_timing("Keras ResNet50 1024x1024 b1, v2 graph, 1 GiB", "v2",
                       1.0, 2, 240),
        {"model": "unet3d", "label": "3D U-Net 64^3", "kwargs": _unet(64),
         "budget_fraction": 0.5, "fixed": "tuned", "reps": 3,
         "timeout_s": 120},
        {"model": "transformer", "label": "Transformer 6 layers",
         "kwargs": {"layers": 6, "seq": 512, "d_model": 512, "batch": 4},
         "budget_fraction": 0.5, "fixed": "tuned", "reps": 2,
         "timeout_s": 150},
    ] + _timing_layered([5000], 2, 120) + _timing_layered([10000], 1, 150)
      + _timing_deep_mlp([5000], 2, 120) + _timing_deep_mlp([10000], 1, 150),
    "memory": [
        {"model": "resnet50", "kwargs": _resnet(1024), "budget_gib": 1.0,
         "fixed": [40, 10, 5, 0], "timeout_s": 240},
        {"model": "unet3d", "kwargs": _unet(96), "budget_gib": 0.4,
         "fixed": [0.25, 5, 5, 0], "timeout_s": 150},
        {"model": "transformer",
         "kwargs": {"layers": 6, "seq": 1024, "d_model": 512, "batch": 2},
         "budget_gib": 0.75, "fixed": [0.1, 5, 5, 0], "timeout_s": 180},
    ],
    "capacity": [
        {"model": "resnet50", "label": "ResNet50 image side",
         "dimension": "image", "kwargs": _resnet(224), "budget_gib": 2.0,
         "start": 512, "step": 32, "tolerance": 0.15, "max": 16384,
         "timeout_s": 420},
        {"model": "unet3d", "label": "3D U-Net volume side",
         "dimension": "volume", "kwargs": _unet(64), "budget_gib": 1.0,
         "start": 64, "step": 8, "tolerance": 0.1, "max": 1024,
         "timeout_s": 300},
    ],
    "cost": [
        {"model": "resnet50", "kwargs": _resnet(128), "steps": 4,
         "budget_fraction": 0.8, "fallback_fixed": _FALLBACK,
         "timeout_s": 240},
        {"model": "unet3d", "kwargs": _unet(32, 8), "steps": 4,
         "budget_fraction": 0.8, "fallback_fixed": _FALLBACK,
         "timeout_s": 150},
    ],
    "fidelity": [
        {"model": "unet3d", "kwargs": _unet(32, 8),
         "budgets": _fractions(0.8, 0.5), "fallback_fixed": _FALLBACK,
         "timeout_s": 150},
        {"model": "transformer",
         "kwargs": {"layers": 2, "seq": 128, "d_model": 128, "heads": 4,
                    "batch": 2},
         "budgets": _fractions(0.8, 0.5), "fallback_fixed": _FALLBACK,
         "timeout_s": 150},
        _mlp_fidelity("ref", _fractions(0.5), 150, depth=16, width=256,
                      batch=512),
        _mlp_fidelity("resource", _fractions(0.5), 150, depth=16,
                      width=256, batch=512),
    ],
}

FULL = {
    "timing": [
        _resnet_timing("Keras ResNet50 1024x1024 b1, v1 graph, 1 GiB "
                       "(the target)", "v1", 1.0, 3, 600),
        _resnet_timing("Keras ResNet50 1024x1024 b1, v1 graph, 2.5 GiB",
                       "v1", 2.5, 3, 600),
        _resnet_timing("Keras ResNet50 1024x1024 b1, v2 graph, 1 GiB", "v2",
                       1.0, 5, 600),
        {"model": "resnet50", "label": "Keras ResNet50 1024x1024 b1, "
         "training mode baked in, 1 GiB", "kwargs": _resnet(1024),
         "budget_gib": 1.0, "fixed": [40, 10, 5, 0], "reps": 3,
         "timeout_s": 600},
        {"model": "unet3d", "label": "3D U-Net 128^3", "kwargs": _unet(128),
         "budget_fraction": 0.5, "fixed": "tuned", "reps": 5,
         "timeout_s": 300},
        {"model": "transformer", "label": "Transformer 24 layers",
         "kwargs": {"layers": 24, "seq": 512, "d_model": 512, "batch": 4},
         "budget_fraction": 0.5, "fixed": "tuned", "reps": 5,
         "timeout_s": 900},
    ] + _timing_layered([5000, 10000], 3, 400)
      + _timing_layered([20000], 1, 400) + _timing_layered([50000], 1, 300)
      + _timing_layered([200000], 1, 600)
      + _timing_deep_mlp([5000, 10000], 3, 400)
      + _timing_deep_mlp([20000], 1, 400) + _timing_deep_mlp([50000], 1, 300)
      + _timing_deep_mlp([200000], 1, 900),
    "memory": [
        {"model": "resnet50", "kwargs": _resnet(2048), "budget_gib": 4.0,
         "fixed": [40, 10, 5, 0], "timeout_s": 600},
        {"model": "resnet50", "kwargs": _resnet(224, 64), "budget_gib": 4.0,
         "fixed": [40, 10, 5, 0], "timeout_s": 600},
        {"model": "unet3d", "kwargs": _unet(128), "budget_gib": 1.0,
         "fixed": [0.25, 5, 5, 0], "timeout_s": 600},
        {"model": "transformer",
         "kwargs": {"layers": 12, "seq": 2048, "d_model": 512, "batch": 2},
         "budget_gib": 4.0, "fixed": [0.1, 5, 5, 0], "timeout_s": 600},
    ],
    "capacity": [
        {"model": "resnet50", "label": "ResNet50 image side",
         "dimension": "image", "kwargs": _resnet(224), "budget_gib": gib,
         "start": 1024, "step": 32, "tolerance": 0.05, "max": 32768,
         "timeout_s": 1500} for gib in (16, 32)
    ] + [
        {"model": "unet3d", "label": "3D U-Net volume side",
         "dimension": "volume", "kwargs": _unet(64), "budget_gib": gib,
         "start": 64, "step": 8, "tolerance": 0.05, "max": 2048,
         "timeout_s": 1200} for gib in (16, 32)
    ] + [
        {"model": "resnet50", "label": "ResNet50 batch at 224x224",
         "dimension": "batch", "kwargs": _resnet(224), "budget_gib": gib,
         "start": 16, "step": 1, "tolerance": 0.05, "max": 1 << 16,
         "timeout_s": 1500} for gib in (16, 32)
    ],
    "cost": [
        {"model": "resnet50", "kwargs": _resnet(224, 2), "steps": 10,
         "budget_fraction": 0.8, "fallback_fixed": _FALLBACK,
         "timeout_s": 600},
        {"model": "unet3d", "kwargs": _unet(64, 8), "steps": 6,
         "budget_fraction": 0.8, "fallback_fixed": _FALLBACK,
         "timeout_s": 600},
        {"model": "transformer",
         "kwargs": {"layers": 6, "seq": 256, "d_model": 256, "batch": 4},
         "steps": 10, "budget_fraction": 0.8, "fallback_fixed": _FALLBACK,
         "timeout_s": 600},
    ],
    "fidelity": [
        {"model": "resnet50", "kwargs": _resnet(128),
         "budgets": _fractions(0.8, 0.5), "fallback_fixed": _FALLBACK,
         "timeout_s": 900},
        # At 128x128 the weights and the optimizer's gradients leave the
        # tuner nothing to fit (the fixed fallback plan is measured); at
        # 224x224, batch 4, activations dominate and it tunes both budgets.
        {"model": "resnet50", "kwargs": _resnet(224, 4), "real": False,
         "budgets": _fractions(0.8, 0.5), "fallback_fixed": _FALLBACK,
         "timeout_s": 900},
        {"model": "unet3d", "kwargs": _unet(48, 8),
         "budgets": _fractions(0.8, 0.5), "fallback_fixed": _FALLBACK,
         "timeout_s": 600},
        {"model": "transformer",
         "kwargs": {"layers": 4, "seq": 256, "d_model": 256, "batch": 2},
         "budgets": _fractions(0.8, 0.5), "fallback_fixed": _FALLBACK,
         "timeout_s": 600},
        # The issue's size and budget (0.25 GiB), and half the activations.
        _mlp_fidelity("ref", [{"budget_gib": 0.25}] + _fractions(0.5), 600),
        _mlp_fidelity("resource", [{"budget_gib": 0.25}] + _fractions(0.5),
                      600),
    ],
}


def _resnet50_capacity(model, label, kwargs=None, lms=None, **kw):
    # ResNet50's image side at 16 GiB, batch 1, on a 32-pixel grid without
    # tolerance: issue 24's item 8 and the Session graphs set against it.
    case = {"model": model, "label": label, "dimension": "image",
            "kwargs": dict({"app": "ResNet50", "image": 224, "batch": 1},
                           **(kwargs or {})),
            "budget_gib": 16, "start": 1024, "step": 32, "tolerance": 0,
            "max": 32768, "methods": ["none", "tflms"], "timeout_s": 3600}
    if lms:
        case["lms"] = lms
    case.update(kw)
    return case


def _keras3_capacity(label, lms=None, **kw):
    return _resnet50_capacity("keras3_app", label, lms=lms,
                              control_flow="eager", **kw)


# Issue 24, item 8: Keras 3 ResNet50, its fit() step as a tf.function, batch
# 1, 16 GiB, at a 32-pixel grid without tolerance (as the Session-graph
# figure it is compared with); tflms as auto-tuned by default (copies timed
# at PCIe 4.0), and with copies timed at NVLink 2.0 and instant.
KERAS3 = {
    "capacity": [
        _keras3_capacity("Keras 3 ResNet50 image side (fit step as a "
                         "tf.function)"),
        _keras3_capacity("Keras 3 ResNet50 image side, copies at NVLink 2.0",
                         lms={"interconnect": "nvlink2"},
                         methods=["tflms"]),
        _keras3_capacity("Keras 3 ResNet50 image side, copies instant",
                         lms={"interconnect": "instant"}, methods=["tflms"]),
    ],
}


def _graph_capacity(label, lms=None, fused_batch_norm=False,
                    gate_gradients=1, **kw):
    return _resnet50_capacity(
        "keras_app", label, {"fused_batch_norm": fused_batch_norm,
                             "gate_gradients": gate_gradients}, lms, **kw)


# Issue 24, item 8, the other side of KERAS3: the same computation in a
# Session graph (tf.keras on TensorFlow 2.15, batch norm unfused as Keras 3
# computes it), the same budget, grid and tolerance; with minimize's default
# gating (GATE_OP) and, as a GradientTape step computes its gradients,
# without (GATE_NONE); and the fused model both ways. The guesses (near the
# Keras 3 and Session-graph figures) only save probes.
KERAS3_GRAPH = {
    "capacity": [
        _graph_capacity("tf.keras ResNet50 image side, batch norm unfused "
                        "(Session graph)",
                        guess={"none": 3136, "tflms": 5824}),
        _graph_capacity("tf.keras ResNet50 image side, batch norm "
                        "unfused, copies instant",
                        lms={"interconnect": "instant"}, methods=["tflms"],
                        guess={"tflms": 6880}),
        _graph_capacity("tf.keras ResNet50 image side, batch norm "
                        "unfused, gradients not gated (Session graph)",
                        gate_gradients=0,
                        guess={"none": 3136, "tflms": 5824}),
        _graph_capacity("tf.keras ResNet50 image side, batch norm "
                        "unfused, gradients not gated, copies instant",
                        gate_gradients=0, lms={"interconnect": "instant"},
                        methods=["tflms"], guess={"tflms": 6880}),
        # The fused model (thirdparty's ResNet50) on the same grid and
        # code, gated and not.
        _graph_capacity("tf.keras ResNet50 image side, batch norm fused "
                        "(Session graph)", fused_batch_norm=True,
                        guess={"none": 3168, "tflms": 8544}),
        _graph_capacity("tf.keras ResNet50 image side, batch norm fused, "
                        "gradients not gated (Session graph)",
                        fused_batch_norm=True, gate_gradients=0,
                        guess={"none": 3168, "tflms": 8544}),
    ],
}

for _section, _cases in THIRD_PARTY.items():
    FULL[_section] = FULL[_section] + _cases

SUITES = {"smoke": SMOKE, "quick": QUICK, "full": FULL,
          "thirdparty": THIRD_PARTY, "keras3": KERAS3,
          "keras3_graph": KERAS3_GRAPH}


def suite(name):
    """The cases of suite `name`, by section."""
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError("unknown suite %r; use one of %s"
                         % (name, sorted(SUITES))) from None
