#!/usr/bin/env bash
# The test command (README, CI): every test on every tested stack, each leg in its own virtual
# environment created on first use (scripts/_env.sh); the legs are named in scripts/_legs.sh:
#   reference  Python 3.11, torch 2.9.0 + torch-xla, the newest Hugging Face stack: ruff, mypy, every test
#   neuron     Python 3.12, Neuron's PyTorch/XLA training container's stack: every test but the docs site
#   oldest     Python 3.10, the lowest versions the metadata admits: every test but docs, streaming and finetune
#   newest     Python 3.13, the newest torch on the index: every test that does not need torch-xla or streaming
# LEGS="reference" (or "neuron oldest", ...) runs only those legs; extra arguments go to pytest
# in every leg. A leg's failure does not stop the others; the exit status is non-zero if any
# leg failed; a table gives each leg's stack, set-up and test seconds, and the last line
# sums the legs.
# Cores: a leg's tests run in one process, so legs run side by side, as many at once as
# there are cores (NEURON_SIFT_LEG_JOBS sets it; 1: one after another, its output live).
# Side by side, each leg's output is printed whole when the leg ends.
# Disk: each leg's environment holds a CUDA build of torch (about 8 GB). An environment this
# run created is removed after its leg when fewer than NEURON_SIFT_LEG_FREE_GB (default 16)
# GB stay free and a leg is still to start; environments that existed before are kept. A leg
# that must create its environment starts beside others only with 2 x that much free.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/_legs.sh
source scripts/_legs.sh
LEGS="${LEGS:-$ALL_LEGS}"
FREE_GB="${NEURON_SIFT_LEG_FREE_GB:-16}"
legs=($LEGS)
JOBS="${NEURON_SIFT_LEG_JOBS:-$(nproc 2>/dev/null || echo 1)}"
[ "$JOBS" -ge 1 ] 2>/dev/null || JOBS=1
[ "$JOBS" -gt "${#legs[@]}" ] && JOBS=${#legs[@]}
free_gb() { df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }'; }
LOGS="$(mktemp -d)"

# One leg, start to end: set-up, then lint (where LINT=1) and pytest. Writes its log's lines to
# stdout, and $LOGS/$leg.{versions,setup_s,test_s,rc} for the summary.
run_leg() {
    local leg="$1" start=$SECONDS created=0
    shift
    leg_settings "$leg" || { echo 2 > "$LOGS/$leg.rc"; return; }
    [ -x "$VENV/bin/python" ] || created=1
    echo "$created" > "$LOGS/$leg.created"
    echo "=== leg $leg: setting up ($VENV$([ "$created" = 1 ] && echo ', new'); $(free_gb) GB free) ==="
    # Its own process: errexit is off inside a tested command (`if ! (...)`), which would let
    # a failed install pass as a set-up.
    if ! LEG="$leg" bash scripts/_env.sh; then
        echo "=== leg $leg: set-up FAILED ==="
        echo "set-up failed" > "$LOGS/$leg.versions"
        echo 1 > "$LOGS/$leg.rc"
        return
    fi
    echo $((SECONDS - start)) > "$LOGS/$leg.setup_s"
    local tests_start=$SECONDS
    # shellcheck disable=SC1091
    (
        LEG="$leg" source scripts/_env.sh
        "$PY" -c 'import sys, torch, numpy
def version(name):
    try:
        return __import__(name).__version__
    except ImportError:
        return "-"
print(sys.version.split()[0], torch.__version__, version("torch_xla"), version("transformers"), numpy.__version__, sep="\t")' \
            > "$LOGS/$leg.versions" 2>/dev/null
        IFS=$'\t' read -r py torch xla transformers numpy < "$LOGS/$leg.versions"
        echo "=== leg $leg: Python $py, torch $torch, torch-xla $xla, transformers $transformers, numpy $numpy ==="
        # What this machine or leg cannot run is deselected by marker, named here, not skipped;
        # what it installs must run (a missing package then fails instead of skipping).
        deselect=()
        warnings_as_errors=()
        [ "$STRICT_WARNINGS" = 1 ] && warnings_as_errors=(-W error::DeprecationWarning)
        if [ "$HAS_XLA" = 1 ]; then export NEURON_SIFT_REQUIRE_XLA=1; else deselect+=("not xla"); fi
        if [ "$HAS_DOCS" = 1 ]; then export NEURON_SIFT_REQUIRE_DOCS=1; else deselect+=("not docs"); fi
        if [ "$HAS_STREAMING" = 1 ]; then export NEURON_SIFT_REQUIRE_STREAMING=1; else deselect+=("not streaming"); fi
        if [ "$HAS_FINETUNE" = 1 ]; then export NEURON_SIFT_REQUIRE_FINETUNE=1; else deselect+=("not finetune"); fi
        if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
            deselect+=("not cuda")  # no CUDA device here
        fi
        export NEURON_SIFT_REQUIRE_HOST_KERNELS=1
        # Lint, format and types once, on the reference leg (configured in pyproject.toml).
        checks=0
        if [ "$LINT" = 1 ]; then
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
    )
    echo $? > "$LOGS/$leg.rc"
    echo $((SECONDS - tests_start)) > "$LOGS/$leg.test_s"
}

# After leg $1 ended: remove its environment if this run created it, a leg is still to
# start, and the disk is short.
release_env() {
    leg_settings "$1" || return 0
    if [ "$(cat "$LOGS/$1.created" 2>/dev/null)" = 1 ] && [ "$next" -lt ${#legs[@]} ] \
        && [ "$(free_gb)" -lt "$FREE_GB" ]; then
        rm -rf "$VENV"
        echo "=== leg $1: removed $VENV, which this run created: $(free_gb) GB free now (the next leg needs about $FREE_GB) ==="
    fi
}

next=0
running=()
start_next() {
    local leg="${legs[$next]}"
    next=$((next + 1))
    if [ "$JOBS" -eq 1 ]; then
        run_leg "$leg" "$@" 2>&1 | tee "$LOGS/$leg.log"
    else
        echo "=== leg $leg: started (its output follows when it ends) ==="
        run_leg "$leg" "$@" > "$LOGS/$leg.log" 2>&1 &
        running+=("$leg")
    fi
}
# A leg side by side has ended when its rc file exists (written last).
reap() {
    local leg still=()
    for leg in "${running[@]}"; do
        if [ -f "$LOGS/$leg.rc" ]; then
            cat "$LOGS/$leg.log"
            release_env "$leg"
        else
            still+=("$leg")
        fi
    done
    running=("${still[@]+"${still[@]}"}")
}
# A leg whose environment is still to create starts beside others only with room on the
# disk for two set-ups; otherwise it waits for the running legs to end.
can_start() {
    [ ${#running[@]} -eq 0 ] && return 0
    [ ${#running[@]} -lt "$JOBS" ] || return 1
    leg_settings "${legs[$next]}" || return 0
    [ -x "$VENV/bin/python" ] || [ "$(free_gb)" -ge $((2 * FREE_GB)) ]
}
while [ "$next" -lt ${#legs[@]} ] || [ ${#running[@]} -gt 0 ]; do
    if [ "$next" -lt ${#legs[@]} ] && can_start; then
        start_next "$@"
        [ "$JOBS" -eq 1 ] && release_env "${legs[$((next - 1))]}"
        continue
    fi
    sleep 2
    reap
done
wait

status=0
passed=0 failed=0 errors=0 skipped=0
echo
printf '%-9s %-8s %-14s %-9s %-12s %-7s %8s %8s  %s\n' leg Python torch torch-xla transformers numpy "set-up s" "tests s" result
for leg in "${legs[@]}"; do
    rc="$(cat "$LOGS/$leg.rc" 2>/dev/null || echo 1)"
    [ "$rc" -ne 0 ] && status=1
    # pytest's closing line, e.g. "==== 3 failed, 800 passed, 2 deselected in 412.3s ===="
    last="$(grep -E '^=*.*(passed|failed|error|no tests ran).* in [0-9.]+s' "$LOGS/$leg.log" 2>/dev/null | tail -n 1)"
    for kind in passed failed errors skipped; do
        n="$(echo "$last" | grep -oE "[0-9]+ ${kind%s}s?" | grep -oE '^[0-9]+' || true)"
        n="${n:-0}"
        case $kind in
            passed) passed=$((passed + n)) ;; failed) failed=$((failed + n)) ;;
            errors) errors=$((errors + n)) ;; skipped) skipped=$((skipped + n)) ;;
        esac
    done
    IFS=$'\t' read -r py torch xla transformers numpy < "$LOGS/$leg.versions" 2>/dev/null \
        || { py="?" torch="?" xla="?" transformers="?" numpy="?"; }
    result="exit $rc: ${last//=/}"
    printf '%-9s %-8s %-14s %-9s %-12s %-7s %8s %8s  %s\n' "$leg" "$py" "$torch" "${xla:--}" "${transformers:--}" \
        "${numpy:--}" "$(cat "$LOGS/$leg.setup_s" 2>/dev/null || echo -)" "$(cat "$LOGS/$leg.test_s" 2>/dev/null || echo -)" \
        "$result"
done
[ "$errors" -gt 0 ] && failed=$((failed + errors))
echo "legs: $passed passed, $failed failed, $skipped skipped"
exit $status
