#!/usr/bin/env bash
# The one prepared GPU script: every check in benchmarks/gpu/check_*.py, each under its own time limit, on the
# machine the `device` tool lends (15 minutes in all). Results: $OUT/gpu/*.json (or results/gpu/) and gpu.log.
#
#   bash benchmarks/gpu.sh              # on the GPU machine, from the repository root
#   SMALL=1 DEVICE=cpu bash benchmarks/gpu.sh   # smoke test of every check on CPU (tiny model, seconds each)
#
# Set up first (a fresh machine is bare): `pip install torch==2.13.0` is already there on the lent machines; the
# project itself is installed with `pip install --no-deps -e .` plus its requirements (see README).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-results}/gpu"; mkdir -p "$out"
device="${DEVICE:-cuda}"; small=(); [ -n "${SMALL:-}" ] && small=(--small)
limit="${CHECK_LIMIT_S:-170}"  # 5 checks x 170 s fit the 15 minutes a lent GPU gives
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$out/gpu.log"
status=0
for check in benchmarks/gpu/check_*.py; do
  echo "== $check" | tee -a "$out/gpu.log"
  start=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$limit" python3 "$check" --device "$device" --out "$out" "${small[@]}" 2>&1 \
    | tee -a "$out/gpu.log"
  rc=${PIPESTATUS[0]}
  echo "== $check rc=$rc seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.log"
  [ "$rc" -ne 0 ] && status=1
done
exit $status
