#!/usr/bin/env bash
# What a lent GPU machine runs, in one call (README, "On a lent GPU machine"):
#   1. the GPU: `schedlab calibrate --cuda` (on the built-ins), then `schedlab fidelity --cuda`
#      on the built-ins and the held-out models (never calibrated on) round-robin in one
#      process, each under 1, 2 and 4 co-run slots (one CUDA stream per slot), the four
#      held-out models that run there only captured portable in a step of their own; the same at
#      size gpu (16x the batch: device-bound steps) with a calibration at that size; and the
#      first run re-scored with the host's issue costs from its own built-ins;
#   2. its many CPU cores: a quick CPU calibration over 1..N threads, the simulator's fidelity
#      over the many-core spread (slots 1/2/4 x threads up to N), and a concurrency search on
#      the simulator whose top plans are validated on the executor.
#   3. how the wake cost of throttled OpenMP helpers grows with the team, and whether one-thread
#      calls time slower right after a call at all the cores (scripts/wake_threads.py),
#      and multi-rank plans (placed, data parallel, pipelines) on 2 ranks of half the cores each.
# Usage: scripts/gpu_check.sh OUT_DIR BASE_PROFILE [DEADLINE_S]
# ONLY="step step ..." runs only the steps named (default every step), in the order below;
# HELDOUT_CPU: the held-out models of the many-core fidelity, groups split by commas, one
# step and results file per group (default all eleven in four groups: 70-90 s each on 16
# cores, 2026-11-27), so a lease cut short keeps the groups it finished.
# Every step has its own time limit inside DEADLINE_S (default 540 s); each step's output
# and log land in OUT_DIR, packed into OUT_DIR/results.tgz after every step, so a run cut
# short still returns what it finished. PYTHON (default python3, with schedlab importable)
# runs it.
set -u
out=${1:?OUT_DIR}; base=${2:?BASE_PROFILE}; deadline_s=${3:-540}
py=${PYTHON:-python3}; sl=${SCHEDLAB:-$py -m schedlab}
repo=$(cd "$(dirname "$0")/.." && pwd)
w=$(mktemp -d); t0=$(date +%s)
export PYTHONUNBUFFERED=1
mkdir -p "$out"
out=$(cd "$out" && pwd); base=$(cd "$(dirname "$base")" && pwd)/$(basename "$base")
cd "$w"  # not the checkout: its schedlab/ folder would shadow the installed package's other modules
cores=$(nproc)
step() {  # step NAME CAP_S COMMAND...: run with the lesser of CAP_S and what is left
  local name=$1 cap=$2; shift 2
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then return; fi
  local left=$(( deadline_s - ($(date +%s) - t0) - 15 ))
  (( left < cap )) && cap=$left
  if (( cap < 10 )); then echo "skip $name: no time left" | tee -a "$w/steps.txt"; return; fi
  local s=$(date +%s)
  timeout "$cap" "$@" > "$w/$name.out" 2> "$w/$name.log"
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s ))s (cap ${cap}s)" | tee -a "$w/steps.txt"
  tail -n 25 "$w/$name.out"
  tar czf "$out/results.tgz" -C "$w" .
}
{ nvidia-smi; nproc; python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())'; } > "$w/machine.txt" 2>&1
cp "$base" "$w/profile-cuda.json"
step calibrate-cuda 150 $sl calibrate --cuda --out "$w/profile-cuda.json"
# The held-out models whose CPU capture holds CPU-only kernels run on the GPU only captured
# portable (since 2026-11-27; an unrolled bilstm-classifier is 7,163 ops and 28 s to capture):
# a step of their own, so they cannot cost the others' step its output.
portable="heldout:encoder-classifier heldout:mha-regressor heldout:lstm-lm heldout:bilstm-classifier"
models="mlp cnn transformer nmt $($py -c "from schedlab.workloads.heldout import HELDOUT_WORKLOADS as h
print(*[m for m in h if m not in '$portable'.split()])")"
step fidelity-cuda 200 $sl fidelity --cuda --slots 1,2,4 --rounds 3 --steps 3 $models --profile "$w/profile-cuda.json" \
  --out "$w/fidelity-cuda.json"
# Two built-ins beside them: the host's issue speed swings 1.1-2x from process to process,
# and `--rescore --refit-issue` re-fits it only from built-ins measured in the same process.
step fidelity-cuda-portable 120 $sl fidelity --cuda --slots 1 --rounds 2 --steps 3 mlp transformer $portable \
  --profile "$w/profile-cuda.json" --out "$w/fidelity-cuda-portable.json"
step rescore-cuda-portable 60 $sl fidelity --cuda --rescore "$w/fidelity-cuda-portable.json" --refit-issue \
  --profile "$w/profile-cuda.json" --out "$w/fidelity-cuda-portable-refit.json"
# The same models at 16x their batch (size gpu): steps bound by the GPU's kernels, not the host's issue.
cp "$base" "$w/profile-cuda-gpu.json"
step calibrate-cuda-gpu 120 $sl calibrate --cuda --size gpu --out "$w/profile-cuda-gpu.json"
step fidelity-cuda-gpu 150 $sl fidelity --cuda --size gpu --slots 1,2 --rounds 2 --steps 3 $models \
  --profile "$w/profile-cuda-gpu.json" --out "$w/fidelity-cuda-gpu.json"
step rescore-cuda 150 $sl fidelity --cuda --rescore "$w/fidelity-cuda.json" --refit-issue --profile "$w/profile-cuda.json" \
  --out "$w/fidelity-cuda-refit.json"
threads=$($py -c "n=$cores; print(','.join(str(t) for t in sorted({1 << k for k in range(n.bit_length()) if 1 << k <= n} | {n})))")
step calibrate-cpu 240 $sl calibrate --quick --threads "$threads" --out "$w/profile-cpu.json" --no-progress
step wake-threads 60 $py "$repo/scripts/wake_threads.py" "$w/wake-threads.json"
groups=${HELDOUT_CPU:-mixer encoder-classifier gru-tagger,conv1d-two-branch depthwise-cnn grouped-resnet,dropout-encoder rnn-regressor,lstm-lm mha-regressor bilstm-classifier}
IFS=, read -ra group_list <<< "$groups"
for i in "${!group_list[@]}"; do
  # shellcheck disable=SC2086  # a group is a space-separated list of model names
  step "fidelity-cpu-heldout-$((i + 1))" 150 $sl fidelity --held-out ${group_list[$i]} --steps 3 \
    --profile "$w/profile-cpu.json" --out "$w/fidelity-cpu-heldout-$((i + 1)).json"
done
step search-cpu 60 $sl search transformer --space concurrency --trials 100 --profile "$w/profile-cpu.json" \
  --run-dir "$w/run-transformer" --no-progress
step validate-cpu 90 $sl validate "$w/run-transformer" --top 3 --no-progress
step fidelity-cpu 120 $sl fidelity mlp transformer --steps 3 --profile "$w/profile-cpu.json" --out "$w/fidelity-cpu.json"
# Placed, data-parallel and pipeline plans on 2 ranks of 8 cores each: over 170 s for the two
# models (2026-11-27), so the results file is checkpointed after each model (a cut run keeps mlp).
step fidelity-cpu-ranks 200 $sl fidelity --devices 2 mlp transformer --steps 3 --profile "$w/profile-cpu.json" \
  --out "$w/fidelity-cpu-ranks.json"
tar czf "$out/results.tgz" -C "$w" .
cat "$w/steps.txt"
