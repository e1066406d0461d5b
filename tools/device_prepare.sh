#!/usr/bin/env bash
# Builds, on the dev machine, the git-ignored folders that the `device` tool carries to the GPU
# machine (which cannot download anything). Run once per fresh checkout, after `make models`:
#   tools/device_prepare.sh
# Each folder stays under the 64 MiB carry limit together with the ones it travels with:
#   .whl-nvc  PyNvVideoCodec + the small pure-Python needs of the package (pydantic set, tflite)
#   .whl-av   PyAV + the same small set
#   .whl-litert  LiteRT (the CPU analyser, for the GPU tests that compare against it)
#   .whl-rtc  aiortc and its needs (it also needs PyAV: carry .whl-av in the same or an earlier call)
#   .whl-spy  py-spy (3 MB), for tools/profile_run.py (device_check.sh run_profile)
# PyAV and LiteRT are apart because .whl-av + .models + .bench + the tree must stay under 64 MiB;
# .whl-nvc (trimmed, below) fits beside them.
#   .models   the built-in .tflite files every job needs (`swapstream setup` put them in the cache)
#   .models-hands  MediaPipe Hands' four files, for mask.hands (12 MB: carry them only when needed)
#   .bench    the 720p30 and 1080p30 clips of tools/bench_streams.py and bench_pipeline.py
#   .devtools/nginx  Debian's nginx and its RTMP module with the libraries they load, unpacked from
#             the .deb files (the GPU machine has no Debian packages): the RTMP publishers and sinks
#             of tools/bench_streams.py and bench_live.py. About 8 MB.
# Versions are the ones the dev venv resolved from pyproject.toml, so both machines run the same.
# The device keeps what an earlier call on a warm machine installed in /tmp/site, so two calls in
# a row can carry different folders (tools/device_check.sh none installs without running anything).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[[ -x $PY ]] || { echo "error: no .venv here; run 'make models' first" >&2; exit 2; }

pin() {  # NAME -> NAME==VERSION as installed in the venv (pyproject's pins and their resolution)
  local v
  v=$($PY -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}')
  [[ -n $v ]] || { echo "error: $1 is not installed in .venv" >&2; exit 2; }
  echo "$1==$v"
}

fetch() {  # DIR SPEC...: CPython 3.12 manylinux x86_64 wheels, without their dependencies
  local dir=$1
  shift
  mkdir -p "$dir"
  local log
  # pip's index warnings are noise here; a failed download must still stop the script.
  if ! log=$(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" "$@" 2>&1); then
    grep -v '^WARNING' <<<"$log" >&2
    echo "error: could not download $* into $dir" >&2
    exit 1
  fi
}

small=("$(pin pydantic)" "$(pin pydantic_core)" "$(pin annotated-types)" "$(pin typing-inspection)" "$(pin tflite)")
fetch .whl-nvc pynvvideocodec==2.2.4 "${small[@]}"
# PyNvVideoCodec's wheel (27 MB) carries FFmpeg's source tarball and Jupyter samples, which nothing
# imports: without them (about 11 MB left) it travels in one call with PyAV, so the x264 sink and
# NVDEC decoding run together. The wheel's RECORD is rewritten to match, so pip installs it as usual.
wheels=(.whl-nvc/pynvvideocodec-*.whl)
[[ ${#wheels[@]} -eq 1 && -f ${wheels[0]} ]] || { echo "error: expected one PyNvVideoCodec wheel in .whl-nvc, found: ${wheels[*]}" >&2; exit 1; }
$PY - "${wheels[0]}" <<'PYEOF'
import sys, zipfile, pathlib
src = pathlib.Path(sys.argv[1])
# The wheel's data folder is named after its version (NAME-VERSION.data/), so the prefix is read
# from the file name: a new pin still gets trimmed.
name, version = src.name.split("-")[:2]
unused = (f"{name}-{version}.data/data/external/", "samples/")
marker = f"{name}-{version}.dist-info/TRIMMED"
with zipfile.ZipFile(src) as zin:
    names = zin.namelist()
    if marker in names:
        sys.exit(0)  # trimmed by an earlier run
    kept = [n for n in names if not n.startswith(unused)]
    if len(kept) == len(names):
        sys.exit(f"error: {src.name} has none of {unused}: the trim no longer matches the wheel's layout; "
                 "update tools/device_prepare.sh (the untrimmed wheel does not fit one carry with PyAV)")
    tmp = src.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for n in kept:
            data = zin.read(n)
            if n.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines()
                data = ("\n".join([r for r in rows if not r.startswith(unused)] + [f"{marker},,"]) + "\n").encode()
            zout.writestr(zin.getinfo(n), data)
        zout.writestr(marker, "FFmpeg's source tarball and the samples were removed (tools/device_prepare.sh)\n")
tmp.replace(src)
PYEOF
fetch .whl-av "$(pin av)" "${small[@]}"
fetch .whl-litert "$(pin ai-edge-litert)" "$(pin backports.strenum)"
# py-spy is a static binary in a py2.py3 wheel; the version is pyproject's `profile` pin.
fetch .whl-spy "$(grep -o 'py-spy==[0-9.]*' pyproject.toml)"
fetch .whl-rtc "$(pin aiortc)" "$(pin aioice)" "$(pin pyee)" "$(pin pylibsrtp)" "$(pin pyOpenSSL)" \
  "$(pin cryptography)" "$(pin google-crc32c)" "$(pin dnspython)" "$(pin ifaddr)" "$(pin cffi)" "$(pin pycparser)"

models=$($PY -c "from swapstream.engines.builtin import builtin_model_path as p; print(p('face_landmark.tflite', None).parent)")
# The models every job needs in .models (1.4 MB); MediaPipe Hands' four (12 MB, mask.hands only)
# apart in .models-hands, carried only by the calls that need them (device_check.sh links them in).
mkdir -p .models .models-hands
for m in $($PY -c "from swapstream.engines.builtin import BUILTIN_MODELS as B; print(' '.join(n for n, m in B.items() if not m.feature))"); do
  cp "$models/$m" .models/
done
for m in $($PY -c "from swapstream.engines.builtin import BUILTIN_MODELS as B; print(' '.join(n for n, m in B.items() if m.feature))"); do
  cp "$models/$m" .models-hands/
done

if [[ ! -f .bench/streams_1080p30.mp4 || ! -f .bench/streams_720p30.mp4 ]]; then
  $PY tools/make_bench_clips.py
fi
if [[ ! -x .devtools/nginx/nginx ]]; then
  # nginx and the module must come from one build (a module checks nginx's signature when loaded).
  # The libraries travel too, behind a wrapper that sets LD_LIBRARY_PATH for nginx alone: Python's
  # own OpenSSL on the GPU machine must not be replaced by Debian's.
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download -q nginx libnginx-mod-rtmp libpcre2-8-0 libcrypt1 libssl3 zlib1g >/dev/null) \
    || { echo "error: apt-get download failed (run 'apt-get update' once)" >&2; exit 1; }
  for d in "$debs"/*.deb; do dpkg -x "$d" "$debs/root"; done
  mkdir -p .devtools/nginx/lib
  cp "$debs/root/usr/sbin/nginx" .devtools/nginx/nginx.bin
  cp "$debs/root/usr/lib/nginx/modules/ngx_rtmp_module.so" .devtools/nginx/
  for l in libpcre2-8.so.0 libcrypt.so.1 libssl.so.3 libcrypto.so.3 libz.so.1; do
    cp -L "$(find "$debs/root" -name "$l" | head -1)" .devtools/nginx/lib/
  done
  printf '#!/bin/sh\nd=$(dirname "$0")\nLD_LIBRARY_PATH="$d/lib" exec "$d/nginx.bin" "$@"\n' > .devtools/nginx/nginx
  chmod +x .devtools/nginx/nginx
  rm -rf "$debs"
fi
du -sh .whl-nvc .whl-av .whl-litert .whl-rtc .whl-spy .models .models-hands .bench .devtools/nginx
