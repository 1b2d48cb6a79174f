#!/bin/sh
# The GPU check in one command, for a machine with an NVIDIA GPU and no network:
#
#   sh tools/gpu_box_check.sh [BUNDLE]
#
# BUNDLE (default .gpu-check) is made on the build machine by `make gpu-check-bundle`: the CUDA
# llama-server (xz-compressed) and the Python wheels reusebench needs, for Python 3.12 on x86_64. This script
#  1. installs the wheels offline into a scratch directory (nothing goes into the system Python);
#  2. generates the tiny models;
#  3. tools/gpu_check.py: NVML at 10 Hz, idle and during one prefill on the GPU;
#  4. reusebench run: the tiny hybrid at 32K on the GPU (first load, resend, re-ask, verified);
#  5. reusebench run --repeat-first-load 3 --idle-gap 10: each repeat's GPU state beside it.
# Everything goes under one results directory ($RESULTS, default results/), named in the last line.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)  # the checkout, wherever the script is run from
bundle=${1:-$root/.gpu-check}
python=${PYTHON:-python3}
out=${RESULTS:-results}/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
out=$(cd "$out" && pwd)
deps=$(mktemp -d)
trap 'rm -rf "$deps"' EXIT
trap 'exit 130' INT TERM  # stop there: the EXIT trap removes the scratch directory

failed=""
step() {  # step NAME COMMAND...: its output in $out/NAME.log and on screen, its exit status and seconds in summary.txt
    name=$1
    shift
    started=$(date +%s)
    echo "== $name: $*"
    status=0
    "$@" > "$out/$name.log" 2>&1 || status=$?
    cat "$out/$name.log"
    echo "$name: exit $status, $(( $(date +%s) - started )) s" | tee -a "$out/summary.txt"
    [ "$status" = 0 ] || failed="$failed $name"
}

[ -f "$bundle/llama-server.xz" ] || { echo "gpu_box_check: no $bundle/llama-server.xz: run \`make gpu-check-bundle\` first" >&2; exit 1; }
bundle=$(cd "$bundle" && pwd)
"$python" - "$bundle/llama-server.xz" "$deps/llama-server" <<'EOF'
import lzma, shutil, sys
with lzma.open(sys.argv[1]) as packed, open(sys.argv[2], "wb") as binary:
    shutil.copyfileobj(packed, binary)
EOF
chmod +x "$deps/llama-server"
step install "$python" -m pip install --quiet --no-index --find-links "$bundle/wheels" --target "$deps" \
    -r "$bundle/requirements.txt"
[ -z "$failed" ] || { echo "gpu_box_check: the offline install failed; results: $out" >&2; exit 1; }
export PYTHONPATH="$root:$deps" REUSEBENCH_LLAMA_SERVER="$deps/llama-server" REUSEBENCH_MODEL_CACHE="$out/models"

# The binary's RUNPATH names the build machine's toolkit; where that is absent, the CUDA libraries come
# from this machine's loader paths, else from its toolkit directories (of the build's CUDA major).
if ldd "$REUSEBENCH_LLAMA_SERVER" | grep -q "not found"; then
    major=$("$python" -c "import json, sys; print(json.load(open(sys.argv[1]))['cuda']['cuda'].split('.')[0])" \
        "$bundle/build.json")
    cublas=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu/ -name "libcublas.so.$major" 2>/dev/null | head -1)
    [ -z "$cublas" ] || export LD_LIBRARY_PATH="$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{ cat "$bundle/build.json"; ldd "$REUSEBENCH_LLAMA_SERVER"; nvidia-smi || true; } > "$out/machine.txt" 2>&1

rb() { "$python" -m reusebench "$@"; }
step models rb models qwen35
[ -z "$failed" ] || { echo "gpu_box_check: the tiny models could not be made; results: $out" >&2; exit 1; }
step nvml "$python" "$root/tools/gpu_check.py" --server "$REUSEBENCH_LLAMA_SERVER" \
    --model "$(rb models qwen35 | cut -f2)" --ctx-size 8192
step run-32k rb run --profile tiny-qwen35-gpu --variant mmproj=on,cache-reuse=256 --size 32K \
    --scenarios first_load resend reask --results "$out"
step repeats rb run --profile tiny-qwen35-gpu --variant mmproj=on,cache-reuse=256 --size 32K \
    --repeat-first-load 3 --idle-gap 10 --results "$out"
[ -z "$failed" ] || echo "gpu_box_check: failed:$failed (see their logs)"
echo "gpu check results: $out"
[ -z "$failed" ]
