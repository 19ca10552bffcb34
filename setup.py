"""Packaging for tflms: Large Model Support for TensorFlow 2.15 graph mode."""
from setuptools import find_packages, setup

setup(
    name="tflms",
    version="0.1.0",
    description=("Large Model Support for TensorFlow: swap tensors between "
                 "GPU and host memory by rewriting tf.compat.v1 graphs."),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["tflms", "tflms.*"]),
    python_requires=">=3.11,<3.12",
    install_requires=[
        "numpy<2",
        "networkx>=3.0",
        "toposort>=1.7",
    ],
    extras_require={
        # TensorFlow is not pinned in install_requires on purpose: CPU users
        # install tensorflow-cpu, GPU users tensorflow[and-cuda]; both provide
        # the `tensorflow` module.
        "cpu": ["tensorflow-cpu==2.15.1"],
        "gpu": ["tensorflow[and-cuda]==2.15.1"],
        "plot": ["matplotlib>=3.5"],
        "test": [
            "tensorflow-cpu==2.15.1",
            "matplotlib>=3.5",
            "pytest>=7",
            "pytest-timeout>=2.1",
            "pytest-xdist>=3",
            "hypothesis>=6",
            "scikit-learn>=1.3",
        ],
    },
    entry_points={"console_scripts": ["tflms=tflms.__main__:main"]},
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
