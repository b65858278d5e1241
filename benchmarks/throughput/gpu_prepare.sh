#!/usr/bin/env bash
# Step 1 of the GPU walk (docs/throughput.md#the-gpu-walk), on any CPU machine with the package registry: fetch into
# .gpu_wheels/cp312/ (ignored by git) the cp312 manylinux x86_64 wheels the GPU machine lacks -- Ray 2.60 repacked to
# fit, and the pure packages Ray Train/Tune/Data and the GPU parts need there -- check that they resolve together for
# Python 3.12, and that repository + wheels stay under the 64 MiB a device call carries
# (benchmarks/throughput/gpu_wheels.py says what and why).
#   bash benchmarks/throughput/gpu_prepare.sh                        # for the GPU machine (Python 3.12)
#   bash benchmarks/throughput/gpu_prepare.sh --python-version 3.11  # the same set for a CPU dry run under Python 3.11
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python}" benchmarks/throughput/gpu_wheels.py "$@"
