#!/usr/bin/env bash
# The GPU half of the sizes issue (item 5), as one script for a machine with CUDA: every check of three
# implementations on the GPU at TINY (pytest --device cuda, tracebacks kept), their audit matrix and that of the
# device-portability bugs there, the reference at base on the GPU, and tests/test_devices.py. Each step has its own time limit and its
# output file under $OUT (default ./device-out); a failed step does not stop the next. Usage, from the checkout:
#   OUT=/some/dir bash benchmarks/device_check.sh
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=200
{ nvidia-smi -L; nproc; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__,
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"; } 2>&1 | tee "$OUT/env.txt"
# The project without its dependencies (the machine's own torch, pytest, hypothesis, pluggy, onnx); offline.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.txt" 2>&1 \
  || export PYTHONPATH=$PWD
step() {  # step NAME SECONDS COMMAND...: run COMMAND with a time limit, its output in $OUT/NAME.txt
  local name=$1 start=$SECONDS; shift
  timeout "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
  tail -n 4 "$OUT/$name.txt"
}
step pytest-tiny 150 python3 -m pytest conformance/ --impl=reference,fused,torch-nn --device cuda -q -rs \
  --tb=short --durations=8 -n 4 --dist loadscope
step audit-tiny 120 python3 -m aiayn_conformance audit --impl reference,fused,torch-nn --device cuda --format md
step audit-portable 80 python3 -m aiayn_conformance audit --plugin tests/broken_models.py \
  --impl broken-cpu-causal-mask,broken-constructor-device,broken-plain-attribute-table --device cuda --format md
step audit-base 150 python3 -m aiayn_conformance audit --impl reference --config base --device cuda --format md
step tests-devices 60 python3 -m pytest tests/test_devices.py -q
