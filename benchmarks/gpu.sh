#!/usr/bin/env bash
# The one prepared GPU script: every check in benchmarks/gpu/check_*.py, each under its own time limit, on the
# machine the `device` tool lends (15 minutes in all). Results: $OUT/gpu/*.json (or results/gpu/) and gpu.log.
#
#   bash benchmarks/gpu.sh              # on the GPU machine, from the repository root
#   SMALL=1 DEVICE=cpu bash benchmarks/gpu.sh   # smoke test of every check on CPU (tiny model, seconds each)
#
# A lent machine is bare and offline. Run `bash benchmarks/gpu_pack.sh` here first and carry `.gpu` (tokenizer
# files, UD EWT, the captum wheel): this script then installs the wheel, sets BERTSCOPE_UD_EWT and the tokenizer
# folder, and, where bertscope is not installed, puts the source tree on PYTHONPATH as the `bertscope` namespace
# (the same mapping as pyproject's package-dir). The machine's own torch, transformers, pandas, ... are used.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -d .gpu ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/gpu_site .gpu/wheels/*.whl || exit 1
  export PYTHONPATH="/tmp/gpu_site${PYTHONPATH:+:$PYTHONPATH}"
  export BERTSCOPE_GPU_TOKENIZER="$PWD/.gpu/tokenizer"
  [ -f .gpu/ud-english-ewt/en_ewt-ud-train.conllu ] && export BERTSCOPE_UD_EWT="$PWD/.gpu/ud-english-ewt"
fi
repo="$PWD"; run_in="$repo"
if ! (cd /tmp && python3 -c "import bertscope.models") 2>/dev/null; then
  ns=/tmp/gpu_ns/bertscope; rm -rf "$ns"; mkdir -p "$ns"; cp bertscope/*.py "$ns"/
  for sub in models hooks probes experiments; do ln -s "$repo/$sub" "$ns/$sub"; done
  export PYTHONPATH="/tmp/gpu_ns${PYTHONPATH:+:$PYTHONPATH}"
  run_in=/tmp/gpu_ns  # not the repository root, whose bertscope/ (the namespace's __init__ alone) would shadow it
fi
out="$(realpath -m "${OUT:-results}/gpu")"; mkdir -p "$out"
device="${DEVICE:-cuda}"; small=(); [ -n "${SMALL:-}" ] && small=(--small)
# each check's time limit in seconds (CHECK_LIMIT_S overrides them all): 540 s together, so that a machine start
# and the transfers fit the 15 minutes of device time a lent GPU gives; every check writes its JSON as it goes, so
# one cut short still reports what finished
limit_for() {
  [ -n "${CHECK_LIMIT_S:-}" ] && { echo "$CHECK_LIMIT_S"; return; }
  case "$1" in *activations*) echo 160 ;; *dictionaries*|*erasure*) echo 110 ;; *) echo 80 ;; esac
}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee -a "$out/gpu.log"
status=0
# ONLY="activations erasure" runs those checks alone; ARGS_<name>="..." adds options to one check (e.g.
# ARGS_activations="--experiments heads --compare heads"): for a second, shorter call on the lent machine
for check in benchmarks/gpu/check_*.py; do
  name=$(basename "$check" .py); name=${name#check_}
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && continue
  extra_var="ARGS_$name"; read -r -a extra <<< "${!extra_var:-}"
  echo "== $check ${extra[*]}" | tee -a "$out/gpu.log"
  start=$(date +%s); limit=$(limit_for "$check")
  (cd "$run_in" && PYTHONUNBUFFERED=1 exec timeout "$limit" python3 "$repo/$check" --device "$device" --out "$out" "${small[@]}" "${extra[@]}") 2>&1 \
    | tee -a "$out/gpu.log"
  rc=${PIPESTATUS[0]}
  echo "== $check rc=$rc seconds=$(( $(date +%s) - start )) limit=$limit" | tee -a "$out/gpu.log"
  [ "$rc" -ne 0 ] && status=1
done
# minimal-pairs (issue 42): `run minimal-pairs` on BLiMP with a bert-base-shaped random BertForMaskedLM (tokens/s)
# and tuned-lens training, timed: benchmarks/minimal_pairs_gpu.py. BLiMP must be on the machine: copy
# ../shared/data/blimp/blimp.tsv.gz to .gpu/blimp/ before carrying .gpu (or set BERTSCOPE_BLIMP). ONLY=minimal_pairs
# runs it alone; ARGS_minimal_pairs="--pairs 67000" runs all of BLiMP (default 10,000 pairs, extrapolated).
if [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" minimal_pairs "* ]]; then
  read -r -a extra <<< "${ARGS_minimal_pairs:-}"
  echo "== benchmarks/minimal_pairs_gpu.py ${extra[*]}" | tee -a "$out/gpu.log"
  start=$(date +%s); limit="${CHECK_LIMIT_S:-150}"
  (cd "$run_in" && PYTHONUNBUFFERED=1 exec timeout "$limit" python3 "$repo/benchmarks/minimal_pairs_gpu.py" --device "$device" --out "$out" "${small[@]}" "${extra[@]}") 2>&1 \
    | tee -a "$out/gpu.log"
  rc=${PIPESTATUS[0]}
  echo "== benchmarks/minimal_pairs_gpu.py rc=$rc seconds=$(( $(date +%s) - start )) limit=$limit" | tee -a "$out/gpu.log"
  [ "$rc" -ne 0 ] && status=1
fi
exit $status
