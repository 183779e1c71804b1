#!/usr/bin/env bash
# Records labs 06 and 08 on a lent 16-core GPU machine in one call (its python3 holds torch):
# lab 08's section 1 at P = 1, 4, 8 on cores 0-7, and, beside it on cores 8-15, lab 06's section 3
# at k = 1, 2, 4, 8 and then lab 06's GPU numbers (WideResNet). Each set gets cores of its own, so
# neither measures the other's turns. Results go to $OUT (or benchmarks/results/ when OUT is unset).
set -u
OUT=${OUT:-benchmarks/results}
NAME=${NAME:-$(python3 -c "import torch; print(torch.cuda.get_device_name(0).lower().replace(' ', '_') if torch.cuda.is_available() else 'cpu')")}
mkdir -p "$OUT"
nproc; nvidia-smi -L || true; python3 -c "import torch; print('torch', torch.__version__)"
taskset -c 0-7 python3 benchmarks/bench_lab08_psgd.py --workers 1 4 8 --seeds 0 1 --budget-s 400 \
    --out "$OUT/lab08_psgd_${NAME}_host.json" > "$OUT/lab08_psgd.log" 2>&1 &
lab08=$!
taskset -c 8-15 python3 benchmarks/bench_lab06_scaling.py --workers 1 2 4 8 \
    --out "$OUT/lab06_scaling_${NAME}_host.json" > "$OUT/lab06_scaling.log" 2>&1
echo "lab06 scaling exit $?"
taskset -c 8-15 python3 benchmarks/bench_wrn_gpu.py > "$OUT/wrn_gpu.log" 2>&1
echo "wrn gpu exit $?"
cp benchmarks/results/wrn_gpu_*"${NAME}"*.json "$OUT/" 2>/dev/null || true
wait $lab08; echo "lab08 exit $?"
tail -3 "$OUT"/*.log
