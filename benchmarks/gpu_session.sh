#!/usr/bin/env bash
# One lent-GPU call, in order of what matters most, each step under its own time limit so a slow
# one cannot starve the rest (307 s on an H200, 2026-11-26, before step 2 was added; the limits add
# up to 10 minutes):
#   1. tests/test_cuda.py: every architecture on CUDA against a float64 CPU reference
#   2. bench_centering.py: shaped attention's C V before and after its scan moved innermost
#   3. gpu_campaign.py all --smoke: the trainer, the reproduction and bench_gpu.py at toy sizes
#   4. gpu_campaign.py mfu: the MFU table (bench_gpu.py --quick)
#   5. gpu_campaign.py PIECE (default resformer: the ResFormer-82M claim, 400 steps, 3 seeds, 131 s on
#      an H200; sas-p, the codeparrot-18l claims, about 6 minutes by its first runs: PIECE_S=380 and a call of its own)
# Run from the repository root on the GPU machine: OUT=/some/dir bash benchmarks/gpu_session.sh
# (PIECE=sas-p PIECE_S=380 SKIP_CHECKS=1 for the SAS-P piece alone)
# Logs, gpu.json and a tarball of the claim's run store (weights left out) land in $OUT.
set -o pipefail
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a folder for the results}
RUNS=${RUNS:-/tmp/blocklab-gpu-runs}
step() {  # step NAME SECONDS COMMAND...: log to $OUT/NAME.log, keep going on failure
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit}s) $(date +%T)"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name: exit $? $(date +%T)"; tail -n 6 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
[ -n "${SKIP_CHECKS:-}" ] || step cuda-tests 130 python3 -m pytest -q -p no:cacheprovider -rf --durations=5 tests/test_cuda.py
[ -n "${SKIP_CHECKS:-}" ] || step centering 60 python3 benchmarks/bench_centering.py --device cuda \
    --dtype bfloat16 --train-size codeparrot-18l --train-batch 8 --out "$OUT/centering-cuda.json"
[ -n "${SKIP_CHECKS:-}" ] || step smoke 60 python3 benchmarks/gpu_campaign.py all --smoke --device cuda --out /tmp/blocklab-smoke
[ -n "${SKIP_CHECKS:-}" ] || step mfu 160 python3 benchmarks/gpu_campaign.py mfu --budget-s 125 --results "$OUT/gpu.json"
step "${PIECE:-resformer}" "${PIECE_S:-200}" python3 benchmarks/gpu_campaign.py "${PIECE:-resformer}" --out "$RUNS"
tar czf "$OUT/runs.tgz" --exclude=checkpoints -C "$RUNS" . 2>/dev/null
ls -la "$OUT"
