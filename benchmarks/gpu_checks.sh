#!/usr/bin/env bash
# The checks that need a GPU, in one go (run on a GPU node from the repository root, with a CUDA build):
#   bash benchmarks/gpu_checks.sh [build-dir]
# 1. the GPU tests (CPU/GPU parity, layout round trip, NCCL and the input pipeline);
# 2. the quickstart on the GPU, which must reach val_acc >= 0.90;
# 3. a checkpoint written by the GPU run resumed for one more epoch on the CPU;
# 4. evaluate on the GPU and on the CPU agree; check-env reports the GPU (exit 0);
# 5. a GPU run's timeline has the host-to-device copy spans;
# 6. a mixed job: a GPU worker and a CPU worker under the parameter server (comm.backend auto);
# 7. the side-by-side epoch benchmark against PyTorch (if torch is importable).
set -euo pipefail
build=${1:-build}
scratch=${SCRATCH:-/tmp/ddptrain-gpu-checks}
mkdir -p "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== GPU tests"
"$build"/tests/ddptrain_gpu_tests --gtest_color=no

echo "== quickstart on the GPU"
[ -f "$scratch/quickstart.h5" ] || "$build"/ddptrain prepare synthetic --output "$scratch/quickstart.h5" \
  --train 20000 --test 4000 --vocab 2000 --maxlen 40 --seed 1
"$build"/ddptrain --config launch/configs/quickstart.ini --device cuda --data.path "$scratch/quickstart.h5" \
  --checkpoint.dir "$scratch/run-gpu" --log.progress lines
tail -n 1 "$scratch/run-gpu/metrics.jsonl"

echo "== the GPU checkpoint resumes on the CPU"
"$build"/ddptrain --config launch/configs/quickstart.ini --device cpu --data.path "$scratch/quickstart.h5" \
  --checkpoint.dir "$scratch/run-gpu" --train.epochs 7 --resume --log.progress lines
tail -n 1 "$scratch/run-gpu/metrics.jsonl"

echo "== evaluate: GPU against CPU"
"$build"/ddptrain evaluate --checkpoint "$scratch/run-gpu/best.h5" --data "$scratch/quickstart.h5" --device cuda
"$build"/ddptrain evaluate --checkpoint "$scratch/run-gpu/best.h5" --data "$scratch/quickstart.h5" --device cpu

echo "== check-env"
"$build"/ddptrain check-env || echo "check-env exit $?"

echo "== timeline of a GPU run"
"$build"/ddptrain --config launch/configs/quickstart.ini --device cuda --data.path "$scratch/quickstart.h5" \
  --checkpoint.dir "$scratch/run-gpu-timeline" --train.epochs 1 --log.progress lines \
  --log.timeline "$scratch/gpu-trace.json"
python3 -c "import json, collections, sys; t = json.load(open(sys.argv[1])); \
print(collections.Counter(e['name'] for e in t if e.get('ph') == 'X'))" "$scratch/gpu-trace.json"

echo "== mixed job: a GPU worker, a CPU worker and a parameter server"
mpirun -np 1 -x CUDA_VISIBLE_DEVICES=0 "$build"/ddptrain --config launch/configs/quickstart.ini \
  --data.path "$scratch/quickstart.h5" --checkpoint.dir "$scratch/run-mixed" --train.epochs 2 --log.progress lines : \
  -np 2 -x CUDA_VISIBLE_DEVICES= "$build"/ddptrain --config launch/configs/quickstart.ini \
  --data.path "$scratch/quickstart.h5" --checkpoint.dir "$scratch/run-mixed" --train.epochs 2 --log.progress lines

echo "== epoch benchmark against PyTorch"
[ -f "$scratch/synthetic-25000.h5" ] || "$build"/ddptrain prepare synthetic \
  --output "$scratch/synthetic-25000.h5" --train 25000 --test 25000 --vocab 20000 --maxlen 80 --seed 1
floor=()
[ -x "$build/benchmarks/cudnn_floor_bench" ] && floor=(--floor "$build/benchmarks/cudnn_floor_bench")
if python3 -c "import torch" 2>/dev/null; then
  python3 benchmarks/gpu_epoch_compare.py --ddptrain "$build"/ddptrain --data "$scratch/synthetic-25000.h5" "${floor[@]}"
else
  echo "PyTorch not importable: comparison skipped"
fi
