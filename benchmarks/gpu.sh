#!/usr/bin/env bash
# One command for a GPU: the GPU test tier (`pytest -m gpu`: bf16, torch.compile, fused attention
# against eager, one-GPU NCCL DDP, the recurrent GPT-2's slot path on CUDA), model FLOPs utilisation
# at the papers' shapes (benchmarks/mfu.py), a profile of each method's steps, and the benchmarks
# that take `--device cuda`, each part under its own time limit. The parts' output is appended, with
# the device's name, the date and the commit, to benchmarks/RESULTS.md as one section per run
# (written whole or not at all). Without a CUDA device it prints one line and exits 0. Exit status: 0
# when every part passed, 1 otherwise (results still appended). PYTHON picks the interpreter
# (default: python); PROFILE_DIR the profile part's folder (default runs/gpu_profiles/<UTC time>);
# MFU_ARGS replaces the mfu part's choice of rows (e.g. "--only transformer_xl/eval/flex ...").
# Naming parts runs only those (a GPU lent for minutes reruns what failed). The tests run serially
# (124 s on an H200; on 4 xdist workers a crashed worker's restart ran the tier past 200 s), with
# captured logs at WARNING (torch's DEBUG trace records buried a failure's message).
#
#   bash benchmarks/gpu.sh [tests] [mfu] [profile] [attention] [compile] [recurrence] [compressive]
#
# Expected on one H100 (estimates; limits in brackets): tests ~1.5 min [3.3], mfu 5 min (its
# budget) [5.8], profile ~1.5 min [2.3], attention ~0.5 [1], compile ~1.5 [1.5], recurrence ~2
# [2.5], compressive ~0.5 [1]: about 12 minutes in all, so a 15-minute lease runs `tests mfu` (9.2
# minutes at the limits) in one call and the rest in a second (benchmarks/RESULTS.md, "Ready for
# the next GPU").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PYTHON=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE="${WANDB_MODE:-disabled}"

PARTS=(tests mfu profile attention compile recurrence compressive)
for name in "$@"; do
    if [[ " ${PARTS[*]} " != *" $name "* ]]; then
        echo "error: no part '$name'; the parts are: ${PARTS[*]}" >&2
        exit 2
    fi
done
selected=" ${*:-${PARTS[*]}} "

device=$("$PYTHON" benchmarks/gpu_report.py device)
status=$?
if [ "$status" -eq 3 ]; then  # gpu_report.NO_CUDA_EXIT
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        echo "no CUDA device: nothing to run (nvidia-smi lists a GPU, but this torch cannot use it: install torch's CUDA build)"
    else
        echo "no CUDA device: nothing to run"
    fi
    exit 0
elif [ "$status" -ne 0 ]; then
    echo "error: could not ask torch for a CUDA device ($PYTHON exited $status); activate the project's environment" >&2
    exit "$status"
fi
echo "device: $device"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=0

# part N-NAME LIMIT_S COMMAND...: if NAME is selected, run COMMAND under a time limit, show its output and
# keep it in a log whose first line is the command and whose last is its exit status and time.
part() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    [[ $selected == *" ${name#*-} "* ]] || return 0
    echo "== $*"
    {
        echo "\$ $*"
        timeout -k 10 "$limit" "$@" 2>&1  # -k: Lightning catches SIGTERM; KILL 10 s later
        rc=$?
        echo "[exit $rc after $((SECONDS - start)) s; limit $limit s$([ "$rc" -eq 124 ] && echo ': timed out')]"
        [ "$rc" -eq 0 ]
    } | tee "$logs/$name.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
}

part 1-tests 200 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider -rs --log-level=WARNING -o faulthandler_timeout=60
# mfu starts no row its 300 s budget cannot hold and kills a worker 20 s past it (then prints its table).
read -ra mfu_rows <<< "${MFU_ARGS:-}"
part 2-mfu 350 "$PYTHON" benchmarks/mfu.py --device cuda --budget_s 300 "${mfu_rows[@]}"
if [[ $selected == *" profile "* ]]; then
    profiles=${PROFILE_DIR:-runs/gpu_profiles/$(date -u +%Y%m%d-%H%M%S)}
    echo "profiles: $profiles"
fi
part 3-profile 140 "$PYTHON" benchmarks/mfu.py --device cuda --variants sdpa --steps 3 --budget_s 100 \
    --profile "${profiles:-}"
part 4-attention 60 "$PYTHON" benchmarks/attention.py --device cuda --batch 16 --tgt_len 128
part 5-compile 90 "$PYTHON" benchmarks/compile.py --device cuda --methods transformer_xl adaptive_span \
    --batch 16 --warmup 10 --steps 20
part 6-recurrence 150 "$PYTHON" benchmarks/recurrence.py --device cuda --n_layer 12 --n_embd 768 \
    --n_head 12 --window 300 --windows 1 5 --modes window --steps 3
part 7-compressive 60 "$PYTHON" benchmarks/compressive.py --device cuda --n_layers 12 --d_model 512 \
    --n_heads 8 --segment 512 --mem_len 256 --cmem_len 256 --rate 4 --batch 16 --repeats 1

"$PYTHON" benchmarks/gpu_report.py append --results benchmarks/RESULTS.md --device "$device" "$logs"/*.log \
    || failed=1
exit "$failed"
