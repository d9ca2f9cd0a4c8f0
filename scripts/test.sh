#!/usr/bin/env bash
# The test command (README, CI): every test on every tested Python and torch, one leg after
# another, each in its own virtual environment created on first use (scripts/_env.sh):
#   py311  Python 3.11 + torch 2.9.0 + torch-xla 2.9.0: ruff, mypy and every test
#   py310  Python 3.10 + torch 2.9.0 + torch-xla 2.9.0: every test (Neuron's PyTorch/XLA images)
#   py313  Python 3.13 + the newest torch on the index: every test that does not need torch-xla
# LEGS="py311" (or "py310 py313", ...) runs only those legs; extra arguments go to pytest in
# every leg. A leg's failure does not stop the others; the exit status is non-zero if any
# leg failed, and the last line sums the legs.
# Disk: each leg's environment holds a CUDA build of torch (about 8 GB). An environment this
# run created is removed after its leg when fewer than NEURON_SIFT_LEG_FREE_GB (default 16)
# GB stay free for the next leg's set-up; environments that existed before are kept.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/_legs.sh
source scripts/_legs.sh
LEGS="${LEGS:-py311 py310 py313}"
FREE_GB="${NEURON_SIFT_LEG_FREE_GB:-16}"
free_gb() { df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }'; }
# After leg $1 (index $2), remove its environment if this run created it ($3 = 1), another leg
# follows, and the disk is short.
release_env() {
    if [ "$3" = 1 ] && [ $(($2 + 1)) -lt ${#legs[@]} ] && [ "$(free_gb)" -lt "$FREE_GB" ]; then
        rm -rf "$VENV"
        echo "=== leg $1: removed $VENV, which this run created: $(free_gb) GB free now (the next leg needs about $FREE_GB) ==="
    fi
}
LOGS="$(mktemp -d)"
status=0
summary=()
passed=0 failed=0 errors=0 skipped=0
legs=($LEGS)
for i in "${!legs[@]}"; do
    leg="${legs[$i]}"
    start=$SECONDS
    leg_settings "$leg" || { summary+=("leg $leg: unknown"); status=1; continue; }
    created=0
    [ -x "$VENV/bin/python" ] || created=1
    echo "=== leg $leg: setting up ($VENV$([ "$created" = 1 ] && echo ', new'); $(free_gb) GB free) ==="
    # Its own process: errexit is off inside a tested command (`if ! (...)`), which would let
    # a failed install pass as a set-up.
    LEG="$leg" bash scripts/_env.sh
    if [ $? -ne 0 ]; then
        echo "=== leg $leg: set-up FAILED ==="
        summary+=("leg $leg: set-up failed")
        status=1
        release_env "$leg" "$i" "$created"
        continue
    fi
    setup_s=$((SECONDS - start))
    # shellcheck disable=SC1091
    (
        LEG="$leg" source scripts/_env.sh
        versions="$("$PY" -c 'import sys, torch; v = sys.version.split()[0]
try:
    import torch_xla; x = torch_xla.__version__
except ImportError:
    x = "not installed"
print(f"Python {v}, torch {torch.__version__}, torch-xla {x}")')"
        echo "=== leg $leg: $versions ==="
        echo "$versions" > "$LOGS/$leg.versions"
        # What this machine or leg cannot run is deselected by marker, named here, not skipped.
        deselect=()
        warnings_as_errors=()
        if [ "$leg" = py313 ]; then
            deselect+=("not xla")  # no torch-xla for this Python and torch
            # The newest torch deprecates first: any DeprecationWarning is an error here.
            warnings_as_errors=(-W error::DeprecationWarning)
        else
            export NEURON_SIFT_REQUIRE_XLA=1
        fi
        # The docs extra is installed on this leg only: there a missing mkdocs fails tests/test_docs.py.
        if [ "$leg" = py310 ]; then
            deselect+=("not docs")  # the docs toolchain's releases for Python 3.10 fail together
        else
            export NEURON_SIFT_REQUIRE_DOCS=1
        fi
        if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
            deselect+=("not cuda")  # no CUDA device here
        fi
        export NEURON_SIFT_REQUIRE_HOST_KERNELS=1
        # Lint, format and types once, on the reference leg (configured in pyproject.toml).
        checks=0
        if [ "$leg" = py311 ]; then
            echo "=== leg $leg: ruff check, ruff format --check, mypy ==="
            "$PY" -m ruff check . || checks=1
            "$PY" -m ruff format --check . || checks=1
            "$PY" -m mypy || checks=1
            [ "$checks" -ne 0 ] && echo "=== leg $leg: lint, format or type check FAILED ==="
        fi
        if [ ${#deselect[@]} -gt 0 ]; then
            expr="$(printf '%s and ' "${deselect[@]}")"
            expr="${expr% and }"
            echo "=== leg $leg: deselected by marker: $expr (a -m of your own replaces this) ==="
            "$PY" -m pytest "${warnings_as_errors[@]}" -m "$expr" "$@"
        else
            "$PY" -m pytest "${warnings_as_errors[@]}" "$@"
        fi
        rc=$?
        [ "$checks" -ne 0 ] && [ "$rc" -eq 0 ] && rc=1
        exit "$rc"
    ) 2>&1 | tee "$LOGS/$leg.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=1
    # pytest's closing line, e.g. "==== 3 failed, 800 passed, 2 deselected in 412.3s ===="
    last="$(grep -E '^=+ .*(passed|failed|error|no tests ran).* in [0-9.]+s' "$LOGS/$leg.log" | tail -n 1)"
    for kind in passed failed errors skipped; do
        n="$(echo "$last" | grep -oE "[0-9]+ ${kind%s}s?" | grep -oE '^[0-9]+' || true)"
        n="${n:-0}"
        case $kind in
            passed) passed=$((passed + n)) ;; failed) failed=$((failed + n)) ;;
            errors) errors=$((errors + n)) ;; skipped) skipped=$((skipped + n)) ;;
        esac
    done
    summary+=("leg $leg ($(cat "$LOGS/$leg.versions" 2>/dev/null || echo '?')): exit $rc, set-up ${setup_s}s, total $((SECONDS - start))s: ${last//=/}")
    release_env "$leg" "$i" "$created"
done
echo
printf '%s\n' "${summary[@]}"
[ "$errors" -gt 0 ] && failed=$((failed + errors))
echo "legs: $passed passed, $failed failed, $skipped skipped"
exit $status
