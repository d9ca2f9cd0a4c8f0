#!/usr/bin/env bash
# Both transformer workloads on one accelerator, 3 seeds, every default arm, sized to finish
# within 8 minutes on one recent GPU, with the same tables as on the CPU (times on the wall
# clock, read after the device is synchronised; every record names the device):
#   1. the single-pass language-model task (benchmarks/lm_suite.py), results in OUT/lm;
#   2. the multi-epoch fine-tune, the suite's bert task with the epoch-level arms and the
#      peers (benchmarks/suite.py --task bert; its step costs on the device, backward to
#      forward and the scoring forward's share, in every record), in OUT/bert.
#
#   bash benchmarks/device_run.sh             # one CUDA GPU, eager
#   BACKEND=cuda-compiled bash benchmarks/device_run.sh   # the models under torch.compile
#   BACKEND=xla PJRT_DEVICE=NEURON bash benchmarks/device_run.sh   # Trainium, through torch-xla
#   bash benchmarks/device_run.sh --tiny      # the CPU, seconds (what the tests run)
#
# Further arguments go to lm_suite.py (e.g. --seeds 0 --arms lm-full,lm-sift-probabilistic).
# Environment: PYTHON (default: the checkout's .venv, else python3), DEVICE_RUN_OUT (results
# folder, default benchmarks/results/device), TASKS ("lm bert" by default; either alone),
# LIMIT_S (the whole run's time limit in seconds, default 480) and LM_LIMIT_S (the language
# model's share of it, default 270; the fine-tune gets the rest). A task stopped at its limit
# prints the tables of the seeds it finished (each script's --summarize on its runs.jsonl).
#
# Sizes on the accelerator: the decoder is three times the CPU default's width and twice its
# depth and context, so that matrix multiplies, not kernel launches, dominate its step, and
# the stream still outlasts the arm that reads furthest (beta 2 reads about three times
# full's windows); the fine-tune keeps the CPU task's model and data, so its accuracies
# compare with the CPU's table (its step costs say how launch-bound it is there). These
# sizes are chosen from the models' arithmetic, not from a timed GPU run: none was lent.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
out="${DEVICE_RUN_OUT:-$root/benchmarks/results/device}"
limit="${LIMIT_S:-480}"
lm_limit="${LM_LIMIT_S:-270}"
tasks="${TASKS:-lm bert}"

if [[ "${1:-}" == "--tiny" ]]; then
    shift
    backend="${BACKEND:-eager}"
    lm_sizes=(--tiny)
    bert_sizes=(--tiny --arms full,full@0.6,epoch,sift-probabilistic,infobatch)
    clock=()
else
    backend="${BACKEND:-cuda}"
    lm_sizes=(--layers 4 --d-model 384 --heads 6 --context 128 --batch-size 48 --steps 400 --evals 20)
    bert_sizes=()
    clock=(--clock wall)
fi
for t in $tasks; do
    [[ "$t" == lm || "$t" == bert ]] || { echo "device_run: TASKS: unknown task $t (lm, bert)" >&2; exit 2; }
done

echo "device_run: backend $backend, tasks $tasks, results in $out, limit ${limit} s" >&2
start=$(date +%s)
status=0

# Runs "$@" within $1 seconds; at the limit prints the finished seeds' tables with $2.
within() {
    local seconds=$1 summarize=$2 rc=0
    shift 2
    timeout "$seconds" "$@" || rc=$?
    if [[ $rc -eq 124 ]]; then
        echo "device_run: stopped at the ${seconds} s limit; the finished seeds' tables:" >&2
        eval "$summarize"
    fi
    return "$rc"
}

if [[ " $tasks " == *" lm "* ]]; then
    share=$lm_limit
    [[ " $tasks " == *" bert "* ]] || share=$limit
    within "$share" "\"$PYTHON\" \"$root/benchmarks/lm_suite.py\" --summarize \"$out/lm/runs.jsonl\" --out \"$out/lm\"" \
        "$PYTHON" "$root/benchmarks/lm_suite.py" --backend "$backend" --seeds 0,1,2 "${lm_sizes[@]}" \
        --out "$out/lm" --no-progress "$@" || status=$?
fi
if [[ " $tasks " == *" bert "* ]]; then
    left=$((limit - ($(date +%s) - start)))
    if [[ $left -lt 30 ]]; then
        echo "device_run: ${left} s left of ${limit} s: the fine-tune does not run" >&2
        status=124
    else
        within "$((limit - ($(date +%s) - start)))" \
            "\"$PYTHON\" \"$root/benchmarks/suite.py\" --summarize \"$out/bert/runs.jsonl\" --out \"$out/bert\"" \
            "$PYTHON" "$root/benchmarks/suite.py" --task bert --backend "$backend" --seeds 0,1,2 "${bert_sizes[@]}" \
            "${clock[@]}" --out "$out/bert" --no-progress || status=$?
    fi
fi
echo "device_run: $(($(date +%s) - start)) s in all" >&2
exit "$status"
