#!/usr/bin/env bash
# The tensorrt target end to end on a machine with an NVIDIA GPU and its driver: installs
# TensorRT and polygraphy next to edgeflow, builds the digits demo in float32, fp16 and int8
# (symmetric QDQ), runs each engine on the GPU and prints the figures. On a machine without
# a GPU the builds end "not verified: no GPU", as in CI.
#
#   bash benchmarks/tensorrt_gpu.sh            (from the repository root, in a fresh venv)
#
# It needs the network for pip: PyPI's tensorrt packages are stubs that fetch TensorRT's
# libraries (hundreds of MB) from pypi.nvidia.com at install time. On an offline GPU machine,
# install TensorRT from your own wheel cache first; the script then skips nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e .
python -m pip install -q "tensorrt>=10,<11" "polygraphy>=0.49"
python -c "import tensorrt; print('TensorRT', tensorrt.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
for mode in none fp16 int8; do
  edgeflow run recipe=digits_cnn target=tensorrt "quantization=$mode"
done
python - <<'PY'
import json
from pathlib import Path

for mode in ("none", "fp16", "int8"):
    m = json.loads(Path(f"build/digits_cnn/tensorrt-{mode}/metrics.json").read_text())
    if m.get("not_verified"):
        print(f"tensorrt-{mode}: NOT VERIFIED ({m['not_verified']})")
        continue
    acc, agree, lat = m["accuracy"], m["agreement"], m["latency_ms"]
    print(
        f"tensorrt-{mode}: accuracy {acc['source']:.4f} -> {acc['artifact']:.4f}, "
        f"top-1 agreement {agree['top1']:.4f}, max abs diff {agree['max_abs_diff']:.3g}, "
        f"p50 {lat['p50']:.3f} ms, {m['size_bytes']:,} bytes"
    )
PY
