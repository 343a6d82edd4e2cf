#!/usr/bin/env bash
# The DLRM step with and without the device row cache (issue 31 point 3) on a GPU, in under 3 minutes.
#
#   python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site .whl/*.whl .
#   export PYTHONPATH=/tmp/site
#   OUT=/some/dir bash bench/torchsparse/gpu.sh          # DEVICE=cpu: the same on the CPU (a check)
#
# Needs `python3 -c 'import bosen.server, bosen.client, bosen.apps, torch'` to work (the package
# installed, not the checkout: the checkout's folders are not the package's layout). Runs from a
# scratch folder, with the checkout after the installed package on PYTHONPATH for the bench package.
# Writes JSON lines to $OUT/cache.jsonl (bench/torchsparse/devcache.py: one line per run, the median
# and spread per setting, the on / off ratios) and each case's progress to $OUT/<case>.log; every
# case runs under `timeout`, and a failed case does not stop the next.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$REPO"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
WORK=$(mktemp -d /tmp/bosen-gpu-XXXXXX)
cd "$WORK" || exit 1
trap 'rm -rf "$WORK"' EXIT
if [ "$DEVICE" = cpu ]; then STEPS=${STEPS:-50}; else STEPS=${STEPS:-120}; fi

{
  echo "{\"case\": \"env\", \"device\": \"$DEVICE\", \"date\": \"$(date -u +%FT%TZ)\", \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"nproc\": $(nproc)}"
  timeout 30 python3 -c 'import json, torch, bosen.apps.pytorch.rowcache; c = torch.cuda.is_available(); print(json.dumps({"case": "env", "torch": torch.__version__, "cuda": c, "gpu": torch.cuda.get_device_name(0) if c else None}))' \
    || echo '{"case": "env", "error": "torch or bosen did not import"}'
} >> "$OUT/cache.jsonl" 2> "$OUT/env.log"

run_case() {  # name, timeout (s), then the bench's arguments
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" python3 -m bench.torchsparse --cases devcache --device "$DEVICE" --steps "$STEPS" "$@" \
    >> "$OUT/cache.jsonl" 2> "$OUT/$name.log"
  local rc=$?
  echo "{\"case\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0)), \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >> "$OUT/cache.jsonl"
  echo "$name: rc $rc in $((SECONDS - t0)) s" >&2
}

# 1. warm-up: numba's kernels compiled into their cache, CUDA initialized (not a measurement)
run_case warmup 40 --rounds 1 --steps 25 --device-cache-rows 100000 --staleness 1
# 2. PSEmbedding, staleness 1 (the config's), 100,000 device rows, cache off / on alternated, 2 rounds
run_case s1-100k 55 --rounds 2 --device-cache-rows 100000 --staleness 1
# 3. ids that repeat more (Zipf 1.1, the small DLRM config's), staleness 2 (rows live a tick longer)
run_case z11-s2 40 --rounds 2 --device-cache-rows 100000 --staleness 2 --zipf 1.1
# 4. nn.Embedding over a dense 1M-row table: its weight on the GPU, each row's clock kept when on
run_case dense-s1 45 --rounds 2 --device-cache-rows 100000 --staleness 1 --storage dense
