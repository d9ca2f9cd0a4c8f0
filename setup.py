"""Packaging: ``neuron_sift`` and its sub-packages only (the top-level names ``kernels`` and
``benchmarks`` are taken on the public index: the benchmarks are not installed, and the
kernels live inside the package, so no folder of a checkout shadows the index's ``kernels``,
which transformers imports)."""

import re

from setuptools import Extension, find_packages, setup

# The version's single source is neuron_sift/_version.py (read, not imported: importing the
# package needs torch, which may not be installed yet).
with open("neuron_sift/_version.py", encoding="utf-8") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

# The CPU step's ranking and history update (neuron_sift/kernels/_host.c): optional, so an install
# without a C compiler still works (the CPU then runs the torch step, engine/step.py: the
# same selections; engine/cpu_step.py's host_kernels_available() tells which).
# -ffp-contract=off: the percentile must round exactly as the torch kernels do.
HOST_KERNELS = Extension(
    "neuron_sift.kernels._host",
    sources=["neuron_sift/kernels/_host.c"],
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
    # What CI's legs run (scripts/test.sh, scripts/_legs.sh): Python 3.10 (the lowest admitted
    # versions), 3.11 (the newest Hugging Face stack) and 3.12 (Neuron's container) with torch
    # 2.9.0 + torch-xla, Python 3.13 with the newest torch on the index.
    python_requires=">=3.10,<3.14",
    classifiers=[
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # Every sub-package, found (a listed one forgotten would import in an editable install and
    # fail in a user's regular one; tests/test_packaging.py builds the wheel and checks).
    packages=find_packages(include=["neuron_sift", "neuron_sift.*"]),
    ext_modules=[HOST_KERNELS],
    install_requires=["torch>=2.9", "numpy>=1.24"],
    extras_require={
        # torch-xla's wheel is built against one torch release and declares no torch dependency.
        "xla": ["torch==2.9.0", "torch-xla==2.9.0"],
        "test": [
            "pytest>=7",
            "hypothesis>=6",
            "numpy>=1.24",
            # 4.52.1 (4.52.0 was never published): before 4.47 the Trainer cannot resume a checkpoint
            # under torch >= 2.6 (its RNG state fails torch.load's weights_only); before 4.52 it counts
            # floor(batches / gradient_accumulation_steps) optimizer steps per epoch but trains the
            # remainder too, so where they differ a run stops inside its last epoch (a sifted plan's
            # annealing epoch: 29 of 36 batches trained).
            "transformers>=4.52.1,<6",
            # 1.9: before 1.7 accelerate calls xm.xrt_world_size(), which torch-xla 2.9 removed (the
            # Trainer fails on XLA before its first step); before 1.9 its DataLoaderShard yields one
            # None batch from an empty loader (the empty rest of an epoch a checkpoint resumes).
            "accelerate>=1.9,<2",
            # 2.5 (the Neuron container's): 2.4 resumes a checkpoint taken at an epoch's last batch
            # inside that epoch, its epoch count one behind the uninterrupted run's, so a sifted run
            # resumed through SiftingResume trains other batches (test_lightning_checkpoint.py);
            # 2.2 and 2.3 import pkg_resources, which setuptools 81+ no longer ships.
            "lightning>=2.5,<3",
            "tensorboard>=2.14,<3",
            # The epoch mode over an Arrow dataset on local disk (tests/neuron_sift/epoch/user_data/test_formats.py).
            # 3.0 is the Neuron container's pin; transformers 4.x needs huggingface-hub<1, which
            # datasets 5.x excludes (5.2 needs huggingface-hub>=1.31), so 4.x stacks run datasets 3.x/4.x.
            "datasets>=3.0,<6",
            # The lint, format and type checks of the test command (scripts/test.sh): ranges
            # narrow enough that a new release cannot change what the format check accepts.
            "ruff>=0.17.6,<0.18",
            "mypy>=1.20,<1.21",
        ],
        # benchmarks/: MNIST-1D generated locally (mnist1d's make_dataset; nothing downloaded),
        # scikit-learn's bundled digits, the accuracy-against-time plot, progress bars.
        "bench": [
            # 0.0.2 was published only as 0.0.2.post1 (no release matches ==0.0.2).
            "mnist1d>=0.0.2.post1,<0.1",
            "scikit-learn>=1.3,<2",
            "matplotlib>=3.7,<4",
            # 4.66.3: what every datasets release the test extra admits needs (the legs install both).
            "tqdm>=4.66.3,<5",
            "numpy>=1.24",
            "transformers>=4.52.1,<6",  # as the test extra's
        ],
        # docs/: the MkDocs site (mkdocs build --strict runs in the tests, tests/test_docs.py).
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=1.0,<2"],
        # Neuron (torch-neuronx, neuronx-cc) is published only on AWS's repository; see README.
    },
)
