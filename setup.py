"""Packaging. ``kernels/`` is installed as ``neuron_sift.kernels`` (the top-level names
``kernels`` and ``benchmarks`` are taken on the public index, so neither is installed)."""

import re

from setuptools import Extension, setup

# The version's single source is neuron_sift/_version.py (read, not imported: importing the
# package needs torch, which may not be installed yet).
with open("neuron_sift/_version.py", encoding="utf-8") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

# The CPU step's ranking and history update (kernels/_host.c): optional, so an install
# without a C compiler still works (the CPU then runs the torch step, engine/step.py: the
# same selections; engine/cpu_step.py's host_kernels_available() tells which).
# -ffp-contract=off: the percentile must round exactly as the torch kernels do.
HOST_KERNELS = Extension(
    "neuron_sift.kernels._host",
    sources=["kernels/_host.c"],
    extra_compile_args=["-O3", "-ffp-contract=off"],
    optional=True,
)

setup(
    name="neuron-sift",
    version=VERSION,
    description="Loss-based data sifting (Selective Backprop) for PyTorch and torch-xla / AWS Trainium; "
    "a drop-in for SageMaker smart_sifting",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # What CI's legs run (scripts/test.sh): Python 3.10 and 3.11 with torch 2.9.0 (+ torch-xla),
    # Python 3.13 with the newest torch on the index.
    python_requires=">=3.10,<3.14",
    classifiers=[
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=[
        "neuron_sift",
        "neuron_sift.backends",
        "neuron_sift.data_model",
        "neuron_sift.dataloader",
        "neuron_sift.engine",
        "neuron_sift.epoch",
        "neuron_sift.integrations",
        "neuron_sift.loss",
        "neuron_sift.metrics",
        "neuron_sift.shared",
        "neuron_sift.sift_config",
        "neuron_sift.kernels",
    ],
    # kernels/ ships only as neuron_sift.kernels; the top-level names kernels and benchmarks
    # are excluded (tests/test_packaging.py builds the wheel and checks).
    package_dir={"neuron_sift.kernels": "kernels"},
    ext_modules=[HOST_KERNELS],
    install_requires=["torch>=2.9", "numpy>=1.24"],
    extras_require={
        # torch-xla's wheel is built against one torch release and declares no torch dependency.
        "xla": ["torch==2.9.0", "torch-xla==2.9.0"],
        "test": [
            "pytest>=7",
            "hypothesis>=6",
            "numpy>=1.24",
            "transformers>=4.40,<6",
            "accelerate>=1.1,<2",
            "lightning>=2.2,<3",
            "tensorboard>=2.14,<3",
            # The epoch mode over an Arrow dataset on local disk (tests/neuron_sift/epoch/test_formats.py).
            # 5.2 is the first to allow the legs' huggingface-hub 2.x and fsspec 2026.9 (older ones downgrade them).
            "datasets>=5.2,<6",
            # The lint, format and type checks of the test command (scripts/test.sh): ranges
            # narrow enough that a new release cannot change what the format check accepts.
            "ruff>=0.17.6,<0.18",
            "mypy>=1.20,<1.21",
        ],
        # benchmarks/: MNIST-1D generated locally (mnist1d's make_dataset; nothing downloaded),
        # scikit-learn's bundled digits, the accuracy-against-time plot, progress bars.
        "bench": [
            "mnist1d>=0.0.2,<0.1",
            "scikit-learn>=1.3,<2",
            "matplotlib>=3.7,<4",
            "tqdm>=4.60,<5",
            "numpy>=1.24",
            "transformers>=4.40,<6",
        ],
        # docs/: the MkDocs site (mkdocs build --strict runs in the tests, tests/test_docs.py).
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=1.0,<2"],
        # Neuron (torch-neuronx, neuronx-cc) is published only on AWS's repository; see README.
    },
)
