#!/bin/sh
# The GPU check: run.sh [--simulate] [--budget 9m] [--parts 4,6] [--rows batch64] [--time-slice 100ms] OUTDIR
# Runs from the bundle `make gpu-check` builds; writes OUTDIR/report.md and
# OUTDIR/bench.txt and prints the BENCH lines. Run as root (cgroups, eBPF).
# Exit status: 0 when no part failed, 1 when one did, 2 on bad usage.
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/bin/gpuwarden" gpu-check --bundle "$here" "$@"
