#!/bin/bash
# Litz's scale-out/in (bench.elastic.litz) on a many-core machine (the device machine: 16 cores):
# half = 4 workers, full = 8. Installs the package from this checkout (wheels for what the machine
# lacks in .whl/), runs from a scratch copy of bench/ (the checkout's bosen/ would shadow the install).
# Results: $OUT/litz.json (JSON lines), $OUT/litz.err (per-repeat lines).
set -euo pipefail
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site .whl/*.whl . >/dev/null
export PYTHONPATH=/tmp/site
rm -rf /tmp/b && mkdir -p /tmp/b && cp -r bench /tmp/b/ && cd /tmp/b
nproc; cat /proc/loadavg
python3 -m bench.elastic.litz --app lda --half "${HALF:-4}" --passes "${PASSES:-100}" --docs "${DOCS:-100000}" \
  --doc-len 100 --repeats "${REPEATS:-2}" > "$OUT/litz.json" 2> >(tee "$OUT/litz.err" >&2)
cat /proc/loadavg
