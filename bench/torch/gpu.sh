#!/usr/bin/env bash
# Issue 31's checks on a GPU machine, in under 4 minutes: the ResNet-18 step split (a local torch step
# against PS mode at staleness 2, without and with overlap, and with bfloat16 updates) and hybrid mode
# beside DDP. Results: JSON lines in $OUT/gpu.jsonl (one per result, one "status" line per case), each
# case's log in $OUT/NAME.log. Each case runs under its own timeout; a failure is logged and the rest run.
#
#   from the repository root, with the package installed (e.g. into /tmp/site, on PYTHONPATH):
#   OUT=/some/dir bash bench/torch/gpu.sh            # DEVICE=cpu: the same cases on the CPU, fewer steps
#
# It runs from a scratch folder holding only a link to bench/: in the checkout, its bosen/ folder would
# shadow the installed package (whose bosen.server, .client and .apps come from server/, client/, apps/).
# A case's last JSON line is its result (cases write one after every repetition). Limits: 55+55+55+30+40 s.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
OUT=${OUT:-$REPO/gpu-out}
mkdir -p "$OUT"
RES="$OUT/gpu.jsonl"
: > "$RES"
WORK=$(mktemp -d /tmp/bosen-gpu-XXXXXX)
ln -s "$REPO/bench" "$WORK/bench"
cd "$WORK" || exit 1
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=lo

status() {  # case, exit code, seconds
    printf '{"status": "%s", "rc": %s, "seconds": %s, "device": "%s"}\n' "$1" "$2" "$3" "$DEVICE" >> "$RES"
}

run() {  # NAME SECONDS ARGS...: one case, its JSON lines into $RES, its log into $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s)" >&2
    timeout -k 10 "$limit" "$PY" "$@" >> "$RES" 2> "$OUT/$name.log"
    local rc=$?
    status "$name" "$rc" $((SECONDS - t0))
    [ "$rc" = 0 ] || { echo "   $name failed ($rc), log tail:" >&2; tail -5 "$OUT/$name.log" >&2; }
}

"$PY" - >> "$RES" 2> "$OUT/env.log" <<'PY'
import json, os, platform, torch
import bosen.server, bosen.client, bosen.apps  # noqa: F401 - the installed package, not the checkout
info = {"status": "env", "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.cuda.is_available(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpus": os.cpu_count(), "bosen": bosen.server.__file__, "loadavg": open("/proc/loadavg").read().strip()}
print(json.dumps(info))
PY
status env $? 0

if [ "$DEVICE" = cpu ]; then
    SPLIT=(--steps 3 --batch 8)
    HYB=(--steps 10)
else
    SPLIT=(--steps 10 --batch 256)
    HYB=(--steps 20)
fi
# the numba kernels (client and servers) compile on first use and are cached: a short run first
run warmup 55 -m bench.torch.steps --cases split --device "$DEVICE" --quick --steps 1 --warm 1 --batch 32 --wire bfloat16 \
    --timeout 50
# two repetitions of the split, as separate cases (the second in reverse order), so a timeout loses one
run split-a 55 -m bench.torch.steps --cases split --device "$DEVICE" --wire bfloat16 --timeout 25 --reps 1 "${SPLIT[@]}"
run split-b 55 -m bench.torch.steps --cases split --device "$DEVICE" --wire bfloat16 --timeout 25 --reps 1 --rep0 1 \
    "${SPLIT[@]}"
# hybrid on the GPU: NCCL needs a GPU per rank, so one worker (world size 1: no all-reduce) beside DDP
run hybrid-gpu 30 -m bench.torch.steps --cases hybrid --device "$DEVICE" --timeout 25 --reps 1 "${HYB[@]}"
# hybrid with 2 workers over gloo on this machine's CPU cores, beside DDP over gloo
run hybrid-gloo 40 -m bench.torch.steps --cases hybrid --device cpu --timeout 18 --reps 2 "${HYB[@]}"
rm -rf "$WORK"
echo "results: $RES" >&2
