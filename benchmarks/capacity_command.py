"""How long `tflms capacity` takes: a Keras 3 MobileNetV2 at 224x224
(weights=None, momentum SGD, sparse categorical cross-entropy) on a 16 GiB
V100 over PCIe 4.0, traced once per batch it tries (TensorFlow 2.16+ with
Keras 3; the issue's target: three minutes on two CPU cores).

    env -u TF_USE_LEGACY_KERAS python benchmarks/capacity_command.py \
        --out .bench/capacity [--max-overhead 10] [--oracle]

``--model gpt2`` searches the sequence length instead (``--dimension
sequence``): a KerasHub GPT-2 of the small configuration (12 layers, 768
wide, 1024 positions; random weights, nothing downloaded; Adam) at batch
8 (``--batch-size``); needs keras-hub.

Saves the model, runs ``tflms capacity`` in a fresh process (as a user
would), and prints its output and the wall time; the JSON and the plot are
written to ``--out``. Timing depends on the machine: docs/capacity.md
records one run.
"""

import argparse
import os
import subprocess
import sys
import time

_SAVE = r"""
import sys
import keras
keras.utils.set_random_seed(0)
model = keras.applications.MobileNetV2(weights=None,
                                       input_shape=(224, 224, 3))
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
              loss="sparse_categorical_crossentropy")
model.save(sys.argv[1])
"""

_SAVE_GPT2 = r"""
import sys
import keras
import keras_hub
keras.utils.set_random_seed(0)
backbone = keras_hub.models.GPT2Backbone(
    vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
    intermediate_dim=3072, max_sequence_length=1024)
model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
model.compile(optimizer=keras.optimizers.Adam(1e-4))
model.save(sys.argv[1])
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".bench/capacity")
    parser.add_argument("--gpu-mem", default="16")
    parser.add_argument("--gpu", default="V100-SXM2-16GB")
    parser.add_argument("--interconnect", default="pcie4")
    parser.add_argument("--max-overhead", default=None)
    parser.add_argument("--oracle", action="store_true")
    parser.add_argument("--model", choices=("mobilenetv2", "gpt2"),
                        default="mobilenetv2")
    parser.add_argument("--batch-size", default="8",
                        help="the fixed batch of --model gpt2")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, args.model + ".keras")
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-c", _SAVE_GPT2 if args.model ==
                        "gpt2" else _SAVE, path], check=True, env=env)
    command = [sys.executable, "-m", "tflms", "capacity", path,
               "--autotune-gpu-mem", args.gpu_mem, "--gpu", args.gpu,
               "--interconnect", args.interconnect,
               "--json", os.path.join(args.out, "capacity.json"),
               "--plot", os.path.join(args.out, "capacity.png"),
               "--progress"]
    if args.model == "gpt2":
        # Loaded, a KerasHub task is compiled with its defaults (Adam).
        command += ["--dimension", "sequence", "--batch-size",
                    args.batch_size, "--optimizer", "adam"]
    if args.max_overhead is not None:
        command += ["--max-overhead", args.max_overhead]
    if args.oracle:
        command.append("--oracle")
    start = time.monotonic()
    done = subprocess.run(command, env=env, check=False)
    print("tflms capacity took %.1f s (exit status %d) on %d CPUs"
          % (time.monotonic() - start, done.returncode, os.cpu_count()))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
