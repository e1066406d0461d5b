#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root:
#   tools/device_check.sh [tests|engines|bench|kernels|swap|pipeline|streams|run|run_live|run_diag|run_batch|run_priority|run_profile|serve|serve_ab|serve_wait|x264|live|live_bench|live_rtmp|hands|mesh|pending|recheck|face_stack|serve_stack|stack_profile|stack_tests|stack|all|none][,...]
#     (default: all; bench = kernels + swap + pipeline; none = install the carried wheels only)
#   tools/device_check.sh pytest ARGS...    (pytest with ARGS, in the same environment)
# Installs the carried wheels (.whl/, ignored by git), makes `swapstream` importable from this tree,
# runs `pytest -m gpu`, then the benchmarks. Logs and JSON go to $OUT (or ./device_out locally).
# Carry the folders tools/device_prepare.sh builds (.whl-nvc, .whl-av, .whl-litert, .whl-rtc,
# .models, .bench; docs/kernels.md says which go together), so nothing is downloaded there.
# Benchmarks record $GIT_SHA as their commit: pass it from the dev machine (the device's copy of the
# tree may carry a stale .git), e.g. GIT_SHA=abc1234 tools/device_check.sh bench.
set -uo pipefail
what="${1:-all}"
shift || true
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# The wheel folders do not all fit one 64 MiB carry, so a run carries some of them; what an earlier
# call on a warm machine installed stays in /tmp/site, and its folders may still be here too:
# install each wheel once (the same file can be in several folders).
if compgen -G ".whl*/*.whl" >/dev/null; then
  mapfile -t wheels < <(ls .whl*/*.whl | awk -F/ '!seen[$NF]++')
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" || { echo "wheel install failed"; exit 1; }
fi
# The folders map onto one package (pyproject's package-dir); mirror that with links so the tree
# runs in place without a build step.
mkdir -p /tmp/shim
ln -sfn "$PWD/kernels" stream/kernels
ln -sfn "$PWD/engines" stream/engines
ln -sfn "$PWD/stream" /tmp/shim/swapstream
export PYTHONPATH="/tmp/shim:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export SWAPSTREAM_MODELS_DIR="$PWD/.models"
# MediaPipe Hands' models travel apart (tools/device_prepare.sh): link them in when carried.
if compgen -G ".models-hands/*.tflite" >/dev/null; then
  mkdir -p .models && ln -sf "$PWD"/.models-hands/*.tflite .models/
fi
# nginx-rtmp for the RTMP tests and benchmarks: the machine has no Debian packages, so Debian's
# nginx, its RTMP module and its libraries are carried in .devtools/nginx (see docs/performance.md).
if [[ -x .devtools/nginx/nginx ]]; then
  export SWAPSTREAM_NGINX="$PWD/.devtools/nginx/nginx"
  export SWAPSTREAM_NGINX_RTMP_MODULE="$PWD/.devtools/nginx/ngx_rtmp_module.so"
fi

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import sys, numpy, cupy, cv2; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'cv2', cv2.__version__)"
  python3 -c "import importlib.util as u; print('present:', {m: bool(u.find_spec(m)) for m in ('av', 'ai_edge_litert', 'PyNvVideoCodec', 'pydantic', 'tflite', 'flatbuffers', 'torch', 'pynvml', 'aiortc', 'aiohttp')})"
  [[ -n "${SWAPSTREAM_NGINX:-}" ]] && "$SWAPSTREAM_NGINX" -v 2>&1
  git rev-parse --short HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/env.txt"

# WHAT is one mode or several, comma-separated (e.g. pending,run_live), run in this file's order.
want() {
  local m
  for m in "$@"; do [[ ",$what," == *",$m,"* ]] && return 0; done
  return 1
}

# The stream benchmark's setup for issue 18's targets (serve, serve_ab): the full-size inswapper
# architecture (random weights), one face per stream, random arrival phases, the compiled networks,
# file sources paced by the server, null sinks; and the clips that were carried (a run near the
# carry limit takes the one its --res needs).
SERVE_SETUP="--workers 8 --source file --sink null --seconds 8 --settle 6 --swapper inswapper_128 --synthetic-models --set neural.max_batch=4 --set detector.max_faces=1 --set detector.detect_every=10 --set landmarks.compile=true"
SERVE_CLIPS=()
for r in 720p 1080p; do [[ -f ".bench/streams_${r}30.mp4" ]] && SERVE_CLIPS+=(--clip "$r=.bench/streams_${r}30.mp4"); done

# `swapstream run -c live -o null:` on the 1080p clip against the removed loop (ff84cf7, in
# .baseline), in the same rounds, with `--variant`s: run_ab NAME SECONDS REPEAT VARIANT... Its
# record is rewritten after each round, so a call stopped by its time limit keeps the rounds it ran.
# APPEND_FROM=DIR adds the rounds to DIR/NAME.json, the record an earlier call brought back (carry
# DIR in the tree): it is copied into $OUT and bench_run adds to it (--append), so that the rounds
# of several calls, each within its time limit, make one record.
run_ab() {
  local name=$1 secs=$2 repeat=$3 v
  shift 3
  local variants=()
  for v in "$@"; do variants+=(--variant "$v"); done
  if [[ -n "${APPEND_FROM:-}" ]]; then
    cp "$APPEND_FROM/$name.json" "$OUT/" || { echo "APPEND_FROM: no $APPEND_FROM/$name.json"; rc=1; return; }
    variants+=(--append)
  fi
  timeout -s INT -k 10 "$secs" python3 tools/bench_run.py --clip .bench/streams_1080p30.mp4 \
    --synthetic-models --only null --config live --out "$OUT" --name "$name" --repeat "$repeat" "${variants[@]}" \
    --baseline-tree "${BASELINE_TREE:-.baseline}" --baseline-label "${BASELINE_LABEL:-ff84cf7}" 2>&1 \
    | tee "$OUT/bench_$name.log" || rc=1
}
# The GPU job tests whose names match a pytest -k expression: gpu_job_test EXPR LOG (GPU_TEST=0
# skips them, e.g. in a call that adds rounds to a record after a call that ran them).
gpu_job_test() {
  [[ "${GPU_TEST:-1}" == 0 ]] && return
  timeout -s INT -k 10 240 python3 -m pytest -m gpu -rs -v -p no:cacheprovider tests/stream/test_gpu_job.py \
    -k "$1" 2>&1 | tee "$OUT/$2" || rc=1
}

rc=0
if want pytest; then
  python3 -m pytest -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest_args.log"
  exit "${PIPESTATUS[0]}"
fi
if want none; then
  exit 0
fi
if want live all; then
  # The runtime's GPU path as every command uses it (run, live and WHIP publishers are runtime
  # streams): its tests (run's against the CPU, without the face stack's models), then RTMP -> RTMP
  # and the WebRTC round trip at 720p30, both through the commands (swapstream live / serve).
  python3 -m pytest -m gpu -rs -v -s -p no:cacheprovider tests/stream/test_gpu_live.py \
    tests/stream/test_whip_runtime.py tests/runtime/test_runtime_gpu.py "tests/stream/test_nvcodec.py" \
    tests/stream/test_gpu_job.py -k "not face_stack" 2>&1 | tee "$OUT/pytest_gpu_live.log"
  rc=${PIPESTATUS[0]}
fi
if want live live_bench all; then
  # live_bench: the benchmark alone, without the tests above.
  timeout -s INT -k 20 "${LIVE_S:-400}" python3 tools/bench_live.py --device gpu --size 1280x720 --fps 30 --seconds 15 \
    --out "$OUT" 2>&1 | tee "$OUT/bench_live_gpu.log" || rc=1
fi
if want live_rtmp; then
  # RTMP -> swap -> RTMP alone, kept beside the WebRTC records of docs/benchmarks (the JSON merges).
  cp docs/benchmarks/live_latency_gpu.json "$OUT/" 2>/dev/null || true
  timeout -s INT -k 20 "${LIVE_S:-200}" python3 tools/bench_live.py --device gpu --size 1280x720 --fps 30 --seconds 15 \
    --only rtmp --out "$OUT" 2>&1 | tee "$OUT/bench_live_rtmp.log" || rc=1
fi
if want swap engines; then
  # The runner's accuracy against ONNX Runtime goes with its benchmark.
  python3 -m pytest -m gpu -rs -v -p no:cacheprovider tests/engines 2>&1 | tee "$OUT/pytest_gpu_engines.log"
  rc=${PIPESTATUS[0]}
fi
if want tests all; then
  # A CPU-only test module that cannot import here (its packages are not carried) must not stop
  # the GPU tests: report it and go on.
  python3 -m pytest -m gpu -rs -v -s -p no:cacheprovider --continue-on-collection-errors tests 2>&1 | tee "$OUT/pytest_gpu.log"
  rc=${PIPESTATUS[0]}
fi
if want bench kernels all; then
  python3 tools/bench_kernels.py --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log" || rc=1
  python3 tools/bench_watermark.py --out "$OUT" 2>&1 | tee "$OUT/bench_watermark.log" || rc=1
fi
if want bench swap all; then
  python3 tools/bench_swap.py --out "$OUT" 2>&1 | tee "$OUT/bench_swap.log" || rc=1
fi
if want bench pipeline all; then
  # The clips are made on the dev machine by tools/make_bench_clips.py (PyAV + x264) and carried in
  # .bench/, so the same clips serve the runs with and without PyAV.
  clip=".bench/streams_1080p30.mp4"
  tag=""
  python3 -c "import PyNvVideoCodec" 2>/dev/null && tag="_nvdec"
  python3 tools/bench_pipeline.py --clip "$clip" --out "$OUT" --tag "$tag" 2>&1 | tee "$OUT/bench_pipeline$tag.log" || rc=1
fi
if want streams all; then
  # Each stage's GPU time per stream frame, on a quiet GPU (what a frame costs at most).
  python3 tools/bench_frame_gpu.py --clip720 .bench/streams_720p30.mp4 --clip1080 .bench/streams_1080p30.mp4 --out "$OUT" ${FRAME_GPU_ARGS---compiled} 2>&1 | tee "$OUT/bench_frame_gpu.log" || rc=1
fi
# `swapstream run` itself on the 1080p clip with the full-size inswapper architecture, with x264
# (the H200 has no NVENC) and with encoding excluded, median of 3 runs each: the default preset
# (detector every frame), then `live` (detector every 5th frame, landmarks track between; issue 18's
# >= 250 fps target). run_live: the live preset alone, when the call has no time for both.
if want run all; then
  python3 tools/bench_run.py --clip .bench/streams_1080p30.mp4 --repeat 3 --synthetic-models --out "$OUT" \
    --name run_gpu 2>&1 | tee "$OUT/bench_run.log" || rc=1
fi
if want run run_live all; then
  python3 tools/bench_run.py --clip .bench/streams_1080p30.mp4 --repeat 3 --synthetic-models --out "$OUT" \
    --config live --name run_gpu_live 2>&1 | tee "$OUT/bench_run_live.log" || rc=1
fi
if want pending; then
  # What was written on the dev machine and has not yet run on a GPU, in one call: the fused
  # occlusion kernels and the masker on them, MediaPipe Hands through the torch executor, the file
  # job's decode-ahead and shared warm-up; then the GPU time of the mesh swap with its mask, what
  # mask.hands costs `run`, and watermark v2's kernel cost. Needs LiteRT installed by an earlier
  # call (`none` with .whl-litert), then .whl-nvc, .whl-av, .models, .models-hands and
  # .bench/streams_1080p30.mp4.
  python3 -m pytest -m gpu -rs -v -p no:cacheprovider tests/kernels/test_occlusion_gpu.py tests/stream/test_occlusion.py \
    tests/stream/test_hands.py tests/engines/test_tflite_torch.py tests/stream/test_gpu_job.py \
    tests/kernels/test_watermark_v2_gpu.py 2>&1 | tee "$OUT/pytest_gpu_pending.log" || rc=1
  python3 tools/profile_mesh_gpu.py --clip .bench/streams_1080p30.mp4 --out "$OUT" 2>&1 | tee "$OUT/profile_mesh_gpu.log" || rc=1
  python3 tools/bench_hands.py --repeat 3 --out "$OUT" --name hands_gpu 2>&1 | tee "$OUT/bench_hands.log" || rc=1
  python3 tools/bench_watermark_v2.py --out "$OUT" 2>&1 | tee "$OUT/bench_watermark_v2.log" || rc=1
fi
if want mesh all; then
  # The mesh swap's wall and GPU time per 1080p face, with and without the occlusion mask (issue 20:
  # <= 150 us of GPU time with the mask).
  python3 tools/profile_mesh_gpu.py --clip .bench/streams_1080p30.mp4 --out "$OUT" 2>&1 | tee "$OUT/profile_mesh_gpu.log" || rc=1
fi
if want hands all; then
  # mask.hands on the GPU: the hand models through the torch executor against LiteRT, then what the
  # option costs `swapstream run` (needs the four hand .tflite files in .models and the av wheel).
  python3 -m pytest -m gpu -rs -v -p no:cacheprovider tests/stream/test_hands.py \
    "tests/engines/test_tflite_torch.py::test_gpu_executor_matches_litert" 2>&1 | tee "$OUT/pytest_gpu_hands.log" || rc=1
  python3 tools/bench_hands.py --repeat 3 --out "$OUT" --name hands_gpu 2>&1 | tee "$OUT/bench_hands.log" || rc=1
fi
if want serve all; then
  # The stream benchmark: a load generator driving `swapstream serve --workers` (MPS on with 2 or
  # more workers), so the figures are the product's own. The defaults are the targets' setup
  # (SERVE_SETUP) at 16 and 32 720p streams; SERVE_NS and SERVE_RES change the streams and sizes,
  # SERVE_SETS adds settings, SERVE_S is a time limit (SIGINT: the configurations done are written).
  # Issue 18's runs: SERVE_NS=24,32 SERVE_RES=720p,1080p (the record); SERVE_NS=40 SERVE_RES=1080p
  # (faces/s at overload); SERVE_SETS="--set runtime.degrade=false" SERVE_NS=24,28,32 (full
  # settings: no stream detects less often). SERVE_ARGS replaces the setup, e.g.
  # "--workers 4 --ns 8 --res 720p --sink null --seconds 5". RTMP sources and sinks need
  # .devtools/nginx (tools/device_prepare.sh).
  timeout -s INT -k 30 "${SERVE_S:-590}" python3 tools/bench_streams.py "${SERVE_CLIPS[@]}" --out "$OUT" \
    --name "${SERVE_NAME:-serve_streams}" \
    ${SERVE_ARGS:-$SERVE_SETUP ${SERVE_SETS:-} --ns ${SERVE_NS:-16,32} --res ${SERVE_RES:-720p}} 2>&1 \
    | tee "$OUT/bench_serve.log" || rc=1
fi
if want x264; then
  # x264's cost per frame alone, and beside a thread running Python (the GIL waits of a serve
  # worker's encoders: docs/benchmarks/x264_gil.md was measured on the 2-core CPU machine).
  python3 tools/bench_x264.py --frames 60 --out "$OUT" 2>&1 | tee "$OUT/bench_x264.log" || rc=1
  python3 tools/bench_x264.py --beside --frames 150 --out "$OUT" 2>&1 | tee -a "$OUT/bench_x264.log" || rc=1
fi
if want recheck; then
  # The NVDEC/NVENC tests and the GPU file job's, in one process with the NVENC probe's test first
  # (the order that once broke the thread's CUDA context); passed at 0db19e7.
  # Needs LiteRT installed by an earlier call (`none` with .whl-litert), then .whl-nvc, .whl-av,
  # .models and .bench.
  timeout -s INT -k 10 "${RECHECK_S:-240}" python3 -m pytest -m gpu -rs -v -s -p no:cacheprovider \
    tests/stream/test_nvcodec.py tests/stream/test_gpu_job.py -k "not face_stack" \
    2>&1 | tee "$OUT/pytest_gpu_recheck.log" || rc=1
fi
if want serve_ab; then
  # Issue 18 through `swapstream serve`: the targets' setup (as `serve` above) with analysis in a
  # thread of its own (the default) at 32 streams and at the 1,500 faces/s load, then the single
  # device thread at 32 streams, in the same call. Each under a time limit (SIGINT, so serve's
  # workers are stopped and the configurations finished so far are written).
  timeout -s INT -k 30 "${SERVE_NEW_S:-270}" python3 tools/bench_streams.py "${SERVE_CLIPS[@]}" --out "$OUT" \
    --name serve_streams $SERVE_SETUP --ns "${SERVE_NS:-32,52}" --res "${SERVE_RES:-720p,1080p}" 2>&1 \
    | tee "$OUT/bench_serve.log" || rc=1
  if [[ "${SERVE_OLD_S:-110}" != 0 ]]; then  # 0: the new layout alone
    timeout -s INT -k 30 "${SERVE_OLD_S:-110}" python3 tools/bench_streams.py "${SERVE_CLIPS[@]}" --out "$OUT" \
      --name serve_streams_one_thread $SERVE_SETUP --ns 32 --res 720p --set runtime.analysis_thread=false 2>&1 \
      | tee "$OUT/bench_serve_one_thread.log" || rc=1
  fi
fi
if want serve_wait; then
  # Issue 18 through `swapstream serve`: how long frames wait to be batched. The targets' setup at
  # 32 720p streams, once per SERVE_WAITS entry "ANALYSIS/SWAP" (runtime.max_wait_ms and
  # runtime.swap_max_wait_ms, ms), each a serve process tree of its own under SERVE_WAIT_S.
  for pair in ${SERVE_WAITS:-4/4 8/0 12/0}; do
    a=${pair%/*}; s=${pair#*/}
    timeout -s INT -k 30 "${SERVE_WAIT_S:-185}" python3 tools/bench_streams.py "${SERVE_CLIPS[@]}" --out "$OUT" \
      --name "serve_wait_${a}_${s}" $SERVE_SETUP --ns "${SERVE_NS:-32}" --res 720p \
      --set "runtime.max_wait_ms=$a" --set "runtime.swap_max_wait_ms=$s" 2>&1 \
      | tee "$OUT/bench_serve_wait_${a}_${s}.log" || rc=1
  done
fi
if want run_diag; then
  # Issue 18: why `swapstream run` on the runtime is slower on a GPU than the loop it replaced
  # (docs/benchmarks/run_gpu_live.md). Needs PyAV installed by an earlier call (`none` with .whl-av),
  # then .whl-nvc, .models, .bench and .baseline (`git archive ff84cf7 stream kernels engines
  # configs | tar -x -C .baseline`). The hand-over probe on this host (about 20 s), then `run` with
  # encoding excluded as it is, with the settings that bear on the hand-overs (the GIL's switch
  # interval; analysis and swap in one thread; the next frame asked for while one is analysed),
  # and the old loop, in the same rounds: about 50 s a `swapstream run` on a GPU (models, graphs,
  # warm-up), 2 rounds of 5; the record is rewritten after each round. Give the call 600 s.
  timeout -s INT -k 5 25 python3 tools/probe_gil_hops.py --busy 0,1 --intervals-ms 5,1,0.2 --out "$OUT" \
    --name gil_hops_gpu_host 2>&1 | tee "$OUT/probe_gil_hops.log" || rc=1
  run_ab run_gpu_live "${RUN_DIAG_S:-520}" "${RUN_DIAG_REPEAT:-2}" gil0.2:runtime.switch_interval_ms=0.2 \
    one_thread:runtime.analysis_thread=false depth2:runtime.analysis_depth=2
fi
if want run_batch; then
  # Issue 18: `swapstream run` with a file's frames swapped neural.max_batch at a time
  # (runtime.file_batch, on by default) against one at a time (as before it) and the removed loop
  # ff84cf7, which swapped batches of frames, in the same rounds. Needs what run_diag needs (PyAV from
  # an earlier call, .whl-nvc, .models, .bench, .baseline). First the GPU test that batched frames
  # come out as single ones. Give the call 600 s.
  gpu_job_test in_batches pytest_file_batch.log
  run_ab run_gpu_live "${RUN_BATCH_S:-330}" "${RUN_BATCH_REPEAT:-2}" one_by_one:runtime.file_batch=false
fi
if want run_priority; then
  # `runtime.analysis_priority` (the analysis stream at the device's highest CUDA priority, so its
  # kernels go ahead of a swap batch's): first its GPU test (the same frames as without), then
  # `swapstream run -c live -o null:` as it is, with it, with it and a 0.2 ms GIL switch interval
  # (frames that wait for the GIL rather than the GPU), and the removed loop ff84cf7, in the same
  # rounds (about 3 minutes a round; the test takes about 105 s). Needs what run_batch needs. Give
  # the call 600 s.
  gpu_job_test analysis_stream_first pytest_priority.log
  run_ab run_gpu_live "${RUN_PRIORITY_S:-330}" "${RUN_PRIORITY_REPEAT:-2}" first:runtime.analysis_priority=true \
    first_gil0.2:runtime.analysis_priority=true,runtime.switch_interval_ms=0.2
fi
if want run_profile; then
  # py-spy's view of `swapstream run -c live -o null:`'s threads on a GPU: each thread's ms a frame
  # holding the GIL and on a CPU (tools/profile_run.py, two runs, about 2 minutes; with the test
  # before it, give the call 500 s). Needs PyAV
  # installed by an earlier call, then .whl-nvc, .whl-spy, .models and .bench. PROFILE_SETS adds
  # settings (e.g. "--set runtime.analysis_depth=2"). First the GPU test of analysis_depth=2 (the
  # same frames as one at a time), which has not run on a GPU before.
  gpu_job_test asking_ahead pytest_depth.log
  timeout -s INT -k 10 "${RUN_PROFILE_S:-200}" python3 tools/profile_run.py --clip .bench/streams_1080p30.mp4 \
    --synthetic-models --config live ${PROFILE_SETS:-} --out "$OUT" --name run_gpu_profile 2>&1 \
    | tee "$OUT/profile_run.log" || rc=1
fi
if want face_stack stack; then
  # Issue 23: the occluder, the parser and the four enhancers' architectures (GFPGAN 1.4, CodeFormer,
  # GPEN-BFR-512, RestoreFormer++) per face at batch 1 and 4, fp16 with CUDA graphs, through the product's TorchRunner (models built here with random weights:
  # needs torch and onnx, which the image has; nothing carried).
  timeout -s INT -k 10 "${FACE_STACK_S:-300}" python3 tools/bench_face_stack.py --out "$OUT" 2>&1 \
    | tee "$OUT/bench_face_stack.log" || rc=1
fi
if want stack serve_stack; then
  # Issue 23 through `swapstream serve`: swap + XSeg occluder + GFPGAN v1.4 enhancer (real
  # architectures, random weights, built here), with the GPU memory per worker. Needs .whl-av,
  # .whl-nvc, .models and .bench. (`stack` = face_stack + serve_stack + stack_profile + stack_tests.) The ladder is
  # off (the whole stack runs however late); STACK_WORKERS sets the workers (fewer: bigger batches);
  # STACK_SETS adds settings, which win over the setup's (e.g. "--set neural.max_batch=2": each
  # worker then compiles GFPGAN for 2 batch sizes, not 4, about a minute each on a fresh machine).
  # 8 workers take about 5 minutes to compile on a fresh machine: give each resolution its own call,
  # and STACK_SETS="--warmup-timeout 40" so that an N past saturation does not wait 2 minutes.
  timeout -s INT -k 30 "${STACK_SERVE_S:-270}" python3 tools/bench_streams.py "${SERVE_CLIPS[@]}" --out "$OUT" \
    --name "${STACK_NAME:-serve_face_stack}" ${SERVE_SETUP/--workers 8/--workers ${STACK_WORKERS:-8}} --face-stack ${STACK_SETS:-} \
    --ns "${STACK_NS:-4,6,8,10}" --res "${STACK_RES:-720p}" 2>&1 \
    | tee "$OUT/bench_serve_stack.log" || rc=1
fi
if want stack stack_profile; then
  # Where a one-face (and four-face) swap call with the face stack goes: wall time, GPU time and
  # host profile of serve's backend with the swapper alone, + occluder, + occluder and GFPGAN, on a
  # 1080p frame (needs .whl-av and .bench). Against face_stack's per-network times: the glue's cost.
  # STACK_PROFILE_ARGS narrows it, e.g. "--cases inswapper+occluder+gfpgan --batches 1" (GFPGAN alone
  # compiles for minutes; the JSON is written after each case, so a cut run keeps what finished).
  timeout -s INT -k 10 "${STACK_PROFILE_S:-300}" python3 tools/profile_mesh_gpu.py --neural ${STACK_PROFILE_ARGS:-} \
    --clip .bench/streams_1080p30.mp4 --out "$OUT" 2>&1 | tee "$OUT/profile_neural_gpu.log" || rc=1
fi
if want stack stack_tests; then
  # The stack's models in the torch runner (fp16, graphs) against ONNX Runtime, and the GPU file job
  # with the stack against the CPU one (with the GPU-job tests fixed since their last run). The CPU
  # jobs need LiteRT and every built-in model: .whl-litert and .models-hands besides the above.
  timeout -s INT -k 10 "${STACK_TESTS_S:-180}" python3 -m pytest -m gpu -rs -v -s -p no:cacheprovider \
    tests/engines/test_torch_runner_gpu.py tests/stream/test_gpu_job.py -k "face_stack or matches_cpu_job" 2>&1 \
    | tee "$OUT/pytest_gpu_stack.log" || rc=1
fi
# The device tool brings back a limited number of files: pack the logs into one.
tar -czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log 2>/dev/null) 2>/dev/null && (cd "$OUT" && rm -f *.log)
exit "$rc"
