#!/usr/bin/env bash
# The single-pass language-model task (benchmarks/lm_suite.py) on one accelerator: 3 seeds,
# every default arm, sized to finish within 8 minutes on one recent GPU, and the same tables
# as on the CPU (times on the wall clock, read after the device is synchronised; every
# record names the device).
#
#   bash benchmarks/device_run.sh             # one CUDA GPU, eager
#   BACKEND=cuda-compiled bash benchmarks/device_run.sh   # the model under torch.compile
#   BACKEND=xla PJRT_DEVICE=NEURON bash benchmarks/device_run.sh   # Trainium, through torch-xla
#   bash benchmarks/device_run.sh --tiny      # the CPU, seconds (what the tests run)
#
# Further arguments go to lm_suite.py (e.g. --seeds 0 --arms lm-full,lm-sift-probabilistic).
# Environment: PYTHON (default: the checkout's .venv, else python3), DEVICE_RUN_OUT (results
# folder; the task's records go to its lm/ subfolder), LIMIT_S (the run's time limit in
# seconds, default 480: past it the run stops, and the records of the seeds it finished
# print with `lm_suite.py --summarize DEVICE_RUN_OUT/lm/runs.jsonl`).
#
# The accelerator's size: a model four times the CPU default's width and twice its depth and
# context, so that matrix multiplies, not kernel launches, dominate a step; the stream still
# outlasts the arm that reads furthest (beta 2 reads about three times full's windows).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
out="${DEVICE_RUN_OUT:-$root/benchmarks/results/device}"
limit="${LIMIT_S:-480}"

if [[ "${1:-}" == "--tiny" ]]; then
    shift
    backend="${BACKEND:-eager}"
    sizes=(--tiny)
else
    backend="${BACKEND:-cuda}"
    sizes=(--layers 4 --d-model 512 --heads 8 --context 128 --batch-size 48 --steps 400 --evals 20)
fi

echo "device_run: backend $backend, results in $out/lm, limit ${limit} s" >&2
start=$(date +%s)
status=0
timeout "$limit" "$PYTHON" "$root/benchmarks/lm_suite.py" --backend "$backend" --seeds 0,1,2 "${sizes[@]}" \
    --out "$out/lm" --no-progress "$@" || status=$?
if [[ $status -eq 124 ]]; then
    echo "device_run: stopped at the ${limit} s limit; the finished seeds' tables:" >&2
    "$PYTHON" "$root/benchmarks/lm_suite.py" --summarize "$out/lm/runs.jsonl" --out "$out/lm"
fi
echo "device_run: $(($(date +%s) - start)) s in all" >&2
exit "$status"
