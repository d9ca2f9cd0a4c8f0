# Sourced by scripts/demo.sh and scripts/test.sh: one virtual environment, .venv, with
# neuron_sift installed editable plus the xla, test and bench extras (torch 2.9.0 + torch-xla 2.9.0,
# CPU is enough). Idempotent: a second run only re-checks the install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
STAMP=.venv/.neuron_sift_installed
# Reinstall when the packaging or the C kernel (built in place by the editable install) changed.
if [ ! -f "$STAMP" ] || [ setup.py -nt "$STAMP" ] || [ kernels/_host.c -nt "$STAMP" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[xla,test,bench]"
    touch "$STAMP"
fi
export PJRT_DEVICE="${PJRT_DEVICE:-CPU}"
