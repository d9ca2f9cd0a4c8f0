# Sourced by scripts/_env.sh and scripts/test.sh: what each test leg is, in one place.
#   py311  Python 3.11, torch 2.9.0 + torch-xla 2.9.0   .venv         (the main job's)
#   py310  Python 3.10, torch 2.9.0 + torch-xla 2.9.0   .venv-py310   (Neuron's PyTorch/XLA images)
#   py313  Python 3.13, the newest torch on the index    .venv-py313   (no torch-xla)
# leg_settings LEG sets PY_VERSION, VENV, EXTRAS and NEWEST_TORCH, or fails for an unknown leg.
leg_settings() {
    case "$1" in
        py311) PY_VERSION=3.11; VENV=.venv;       EXTRAS="xla,test,bench,docs"; NEWEST_TORCH=0 ;;
        py310) PY_VERSION=3.10; VENV=.venv-py310; EXTRAS="xla,test,bench";      NEWEST_TORCH=0 ;;
        py313) PY_VERSION=3.13; VENV=.venv-py313; EXTRAS="test,bench,docs"; NEWEST_TORCH=1 ;;
        *) echo "scripts/_legs.sh: unknown leg '$1' (one of: py311 py310 py313)" >&2; return 2 ;;
    esac
}
