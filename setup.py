"""Packaging for tflms: Large Model Support for TensorFlow graph mode
(TensorFlow 2.15.1, and 2.16+ with tf-keras)."""
from setuptools import find_packages, setup

# The `tensorflow` distribution, not `tensorflow-cpu`: tf-keras requires
# `tensorflow` by name, so `tensorflow-cpu` next to it would install a second
# TensorFlow into the same site-packages (two distributions owning the same
# files). `tensorflow` runs on machines without a GPU as well; its CUDA
# libraries come only with the `and-cuda` extra (the `gpu` extra below).
TF_LATEST = ["tensorflow>=2.16", "tf-keras>=2.16"]
TF_215 = ["tensorflow-cpu==2.15.1"]
TEST_TOOLS = [
    "matplotlib>=3.5",
    "pytest>=7",
    "pytest-timeout>=2.1",
    "pytest-xdist>=3",
    "hypothesis>=6",
    "scikit-learn>=1.3",
    # Independent implementations of the levels tflms.dag_levels computes,
    # for tests/test_dag_levels.py to compare with; tflms itself never
    # imports them.
    "networkx>=3.0",
    "toposort>=1.7",
    # The linter tools/run_tests.sh runs first (ruff.toml), pinned to a
    # minor version: a newer ruff may add checks to the rules selected.
    "ruff>=0.17,<0.18",
]

setup(
    name="tflms",
    version="0.1.0",
    description=("Large Model Support for TensorFlow: swap tensors between "
                 "GPU and host memory by rewriting tf.compat.v1 graphs."),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["tflms", "tflms.*"]),
    # TensorFlow 2.15.1 has wheels for Python 3.9-3.11, TensorFlow 2.21 for
    # 3.10-3.13; tflms is tested on 3.11, and its TensorFlow 2 and Keras 3
    # tests on 3.13 too (tools/ci_py313.sh; see docs/install.md).
    python_requires=">=3.11,<3.14",
    install_requires=[
        # No numpy bound of our own: TensorFlow brings its own (2.15 pins
        # numpy<2, 2.16+ accepts numpy 2).
        "numpy>=1.23.5",
    ],
    extras_require={
        # TensorFlow is not in install_requires on purpose: pick one stack
        # per environment; each extra installs exactly one TensorFlow
        # distribution (tools/install_test_deps.sh checks it). `tf` / `cpu`
        # / `gpu`: the newest TensorFlow with tf-keras (Keras 2, which the
        # LMS callback needs; tf-keras pins the matching TensorFlow minor
        # version). `tf215` / `gpu215`: TensorFlow 2.15.1, whose tf.keras is
        # Keras 2 and which still has tf.estimator (no tf-keras, so the small
        # tensorflow-cpu build is safe there).
        "tf": TF_LATEST,
        "cpu": TF_LATEST,
        "gpu": ["tensorflow[and-cuda]>=2.16", "tf-keras>=2.16"],
        "tf215": TF_215,
        "gpu215": ["tensorflow[and-cuda]==2.15.1"],
        "plot": ["matplotlib>=3.5"],
        # KerasHub's language models (Keras 3, TensorFlow 2.16+): the tests
        # and benchmarks build them from configs; tflms never imports it.
        "hub": ["keras-hub>=0.32"],
        # Shared test tools; combine with a stack: '.[tf,test]' or
        # '.[tf215,test]' (tools/install_test_deps.sh VENV STACK).
        "test": TEST_TOOLS,
    },
    entry_points={"console_scripts": ["tflms=tflms.__main__:main"]},
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
