#!/usr/bin/env bash
# A real SGLang 0.5.23 server on this CPU for tests/real_engines (the sglang tier): a venv of
# its own (VENV, default .venv/sglang) on the machine's CPU torch 2.13.0 (seconds; any other
# torch downloads gigabytes), SGLang's requirements less the CUDA-only ones (requirements.txt),
# SGLang and torchvision without their dependencies, our sgl_kernel stand-in, and one patched
# line of torchvision (patch_torchvision.py). ~2-4 min and ~3.4 GB on quiet cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-.venv/sglang}"
rm -rf "$venv"
"${PY:-python3}" -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip
"$pip" install -q torch==2.13.0
"$pip" install -q -c "$here/constraints.txt" -r "$here/requirements.txt"
"$pip" install -q --no-deps sglang==0.5.23 torchvision==0.28.0
site="$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
rm -rf "$site/sgl_kernel"
cp -r "$here/sgl_kernel" "$site/sgl_kernel"
"$venv/bin/python" "$here/patch_torchvision.py" "$site/torchvision/_meta_registrations.py"
"$venv/bin/python" -c "import sglang.launch_server, sglang.srt.entrypoints.http_server, sgl_kernel"
touch "$venv/.installed"
