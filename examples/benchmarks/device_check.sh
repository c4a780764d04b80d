#!/usr/bin/env bash
# This project's figures on the machine's accelerator, as one markdown table: training step
# time (nn.Stacked, lax.scan, flax.linen.scan; bf16), compiled memory of the checkpoint
# policies, decode tokens/s (derived step, hand-written cache, Flax decode=True).
#   examples/benchmarks/device_check.sh            full sizes (an accelerator: under 8 minutes)
#   examples/benchmarks/device_check.sh --tiny     tiny sizes (a CPU check, seconds)
# The table goes to stdout and, if $OUT is set, to $OUT/device_check.md.
# PYTHON selects the interpreter (default: python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=()
if [[ -n "${OUT:-}" ]]; then
  out=(--out "$OUT/device_check.md")
fi
exec "${PYTHON:-python3}" "$here/device_check.py" "${out[@]}" "$@"
