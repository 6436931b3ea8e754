#!/usr/bin/env bash
# The device side of the H200 study (run from the repository root on the GPU machine).
#
#   bench/gpu/on-device.sh stash            copy the carried chunk folder(s) out of
#                                           bench/gpu/.bundle/ at once (the next call's carry
#                                           replaces them)
#   bench/gpu/on-device.sh facts            what the machine has (GPU, python, packages)
#   bench/gpu/on-device.sh install          join the chunks, check the sha256, unpack to
#                                           /tmp/slotune-site, check that vLLM and slotune import
#   bench/gpu/on-device.sh warm             start vLLM's defaults once and stop them: a fresh
#                                           machine's first engine start takes about 185 s
#                                           (compiling), later ones 75-100 s, and a finely
#                                           bracketed trial needs all but that of one call
#   bench/gpu/on-device.sh tune SECONDS     the study (`slotune tune --local`), stopped between
#                                           trials so that it ends within SECONDS; records in
#                                           /tmp/slotune-study, copied to $OUT; resumes from
#                                           bench/gpu/.state/trials.jsonl when that is longer
#   bench/gpu/on-device.sh study SECONDS [TRIAL_SECONDS]
#                                           starts the card's study (h100-study.yaml on an H100,
#                                           h200-study.yaml on an H200, with the card's
#                                           platform) in the background, stopped between
#                                           trials so that it ends within SECONDS (no trial
#                                           starts with less than TRIAL_SECONDS left,
#                                           default 480); records
#                                           in /tmp/slotune-study; resumes like `tune`
#   bench/gpu/on-device.sh study-follow SECONDS
#                                           brings the running study's log and records back
#                                           to $OUT for SECONDS (or until it ends)
#   bench/gpu/on-device.sh landscape MINUTES
#                                           starts extending the card's landscape (bench/
#                                           landscapes/h200-study.jsonl or h100-study.jsonl, carried; bench/
#                                           landscape.py) for MINUTES, in the background
#   bench/gpu/on-device.sh follow SECONDS   brings the running landscape's file and log back
#                                           to $OUT for SECONDS (or until it ends)
#   bench/gpu/on-device.sh side-by-side [CONFIGS]
#                                           capacity of vLLM's defaults and of the study's
#                                           winner (or CONFIGS: defaults,winner,trial numbers)
#                                           on one machine, with the prefill ceiling; a later
#                                           call goes on with what is not measured yet
#   bench/gpu/on-device.sh repeat N [SEED]  starts, in the background, vLLM's defaults (h200
#                                           platform) on N fresh engine starts, each measured
#                                           with the capacity search (bench/
#                                           capacity_repeatability.py, part 1 only; engine i
#                                           uses workload seed SEED+i, default 100); the JSON
#                                           (/tmp/slotune-repeat/) is rewritten after each engine
#   bench/gpu/on-device.sh cache            starts, in the background, bench/gpu/compile_cache.py
#                                           on the card's study spec: engine starts with an
#                                           empty and a warm shared cache folder, and trials
#                                           that change max-num-seqs or max-num-batched-tokens
#   bench/gpu/on-device.sh cache-follow SECONDS
#                                           brings its log and JSON back to $OUT for SECONDS
#                                           (or until it ends)
#   bench/gpu/on-device.sh lossy [stacked]  starts, in the background, the lossy side-by-side
#                                           (h100-lossy.yaml): seeded weights drawn on the
#                                           GPU, then vLLM's defaults, fp8 with 2048 x 96,
#                                           2048 x 96, and fp8 weights on the same schedules, the
#                                           prefill ceiling with and without fp8, and the
#                                           quality gate against the defaults
#   bench/gpu/on-device.sh lossy-follow SECONDS
#                                           brings its log and JSON back to $OUT for SECONDS
#                                           (or until it ends)
#   bench/gpu/on-device.sh repeat-follow SECONDS
#                                           brings the repeat run's log and JSON back to $OUT
#                                           for SECONDS (or until it ends)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
stash=/tmp/slotune-bundle
site=/tmp/slotune-site
study=/tmp/slotune-study
OUT="${OUT:-/tmp/slotune-out}"
mkdir -p "$OUT"
# A frozen copy of slotune (git archive of a commit, carried in bench/gpu/.state/operator) runs
# in place of the working tree's, so that edits in flight elsewhere in the tree stay out of a study.
operator="$here/.state/operator"
[[ -d "$operator/slotune" ]] || operator="$root/operator"
export PYTHONPATH="$site:$operator" PYTHONUNBUFFERED=1
# Multicast stays off (the device README); harmless on one GPU.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# The card this machine has: capacities compare within one kind of GPU only, and a call may
# get an H100 where an H200 was asked for.
card() {
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H100*) echo h100 ;;
    *) echo h200 ;;
  esac
}

# Calls the mode's `bring_back` every 5 s while the background run (pid $1) lives, for at most
# $2 s of this call, then once more; succeeds when the run has ended.
follow_run() {
  local pid="$1" seconds="$2"
  while (( SECONDS < seconds )) && kill -0 "$pid" 2>/dev/null; do
    bring_back
    sleep 5
  done
  bring_back
  ! kill -0 "$pid" 2>/dev/null
}

# A study resumes from the carried records (bench/gpu/.state/trials.jsonl) when they hold more
# trials than this machine's.
resume_records() {
  local carried="$here/.state/trials.jsonl"
  if [[ -f "$carried" ]] && (( $(wc -l <"$carried") > $(cat "$study/trials.jsonl" 2>/dev/null | wc -l) )); then
    cp -v "$carried" "$study/trials.jsonl"
  fi
  return 0
}

case "${1:-}" in
stash)
  mkdir -p "$stash"
  cp -v "$here"/.bundle/*/* "$stash"/
  ls -la "$stash"
  ;;
facts)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))'
  python3 -m pip list 2>/dev/null | grep -iE '^(pydantic|pyyaml|aiohttp|optuna|alembic|sqlalchemy|colorlog|tqdm|matplotlib|kopf|kubernetes|prometheus|protobuf|numba|setuptools|transformers|triton|torch) ' || true
  ;;
install)
  count="$(awk '/^chunks/ {print $2}' "$stash/manifest.txt")"
  have="$(ls "$stash"/site.tar.xz.* | wc -l)"
  [[ "$have" == "$count" ]] || { echo "have $have of $count chunks" >&2; exit 1; }
  want="$(awk 'NR==1 {print $1}' "$stash/manifest.txt")"
  got="$(cat "$stash"/site.tar.xz.* | sha256sum | awk '{print $1}')"
  [[ "$got" == "$want" ]] || { echo "sha256 mismatch: $got != $want" >&2; exit 1; }
  rm -rf "$site" && mkdir -p "$site"
  time (cat "$stash"/site.tar.xz.* | xz -T0 -dc | tar -x -C "$site")
  # Wheels carried beside the chunks replace what the archive holds (a fix without a re-pack).
  for wheel in "$stash"/*.whl; do
    [[ -e "$wheel" ]] || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$wheel"
    echo "Laid $(basename "$wheel") over the archive"
  done
  time python3 -c 'import vllm, optuna, pydantic, slotune.local.runner as l; print("vllm", vllm.__version__, "optuna", optuna.__version__, "pydantic", pydantic.__version__)'
  ;;
warm)
  python3 - "$here/h200-study.yaml" "$here/llama-8b" <<'PY'
import sys
import time
from pathlib import Path

from slotune.local.process import LocalRuntime
from slotune.local.runner import defaults_config, load_deployment
from slotune.tuner.space import H200

spec = load_deployment(Path(sys.argv[1])).spec
runtime = LocalRuntime(Path("python3"), Path("/tmp/slotune-warm"), dummy_weights=True)
started = time.monotonic()
engine = runtime.start(defaults_config(spec, H200, sys.argv[2], "warm"), timeout=600)
print(f"vLLM's defaults started in {time.monotonic() - started:.0f} s (compile caches now warm)")
engine.stop()
PY
  ;;
tune)
  seconds="${2:?tune SECONDS}"
  mkdir -p "$study"
  resume_records
  python3 "$here/timebox.py" --seconds "$seconds" --trial-seconds 590 \
    --records "$study/trials.jsonl" -- \
    python3 -c "import sys; from slotune.local.runner import main; sys.exit(main(sys.argv[1:]))" "$here/h200-study.yaml" --local --platform h200 \
    --model-dir "$here/llama-8b" --dummy-weights --vllm-python python3 --out "$study" \
    2>&1 | tee -a "$OUT/study.log" || true
  cp "$study/trials.jsonl" "$OUT/" 2>/dev/null || true
  cp "$study/trials.txt" "$study/report.html" "$OUT/" 2>/dev/null || true
  tar -czf "$OUT/engine-logs.tar.gz" -C "$study" engines 2>/dev/null || true
  ;;
study)
  # Like `repeat`: its own process session, so that it goes on across calls (`study-follow`)
  # for as long as the machine stays held; `timebox.py` stops it between trials by SECONDS.
  seconds="${2:?study SECONDS}"
  trial_seconds="${3:-480}"
  name="$(card)"
  mkdir -p "$study"
  resume_records
  echo "== $(date -u +%FT%TZ) study on $name ($name-study.yaml), at most $seconds s" >>/tmp/slotune-study.log
  setsid bash -c '"$@"; echo "[study ended with status $?]"' study \
    python3 "$here/timebox.py" --seconds "$seconds" --trial-seconds "$trial_seconds" \
    --records "$study/trials.jsonl" -- \
    python3 -c "import sys; from slotune.local.runner import main; sys.exit(main(sys.argv[1:]))" \
    "$here/$name-study.yaml" --local --platform "$name" --model-dir "$here/llama-8b" \
    --dummy-weights --vllm-python python3 --out "$study" >>/tmp/slotune-study.log 2>&1 </dev/null &
  echo "$!" >/tmp/slotune-study.pid
  echo "study started on $name (pid $!); bench/gpu/on-device.sh study-follow SECONDS brings it back"
  ;;
study-follow)
  seconds="${2:?study-follow SECONDS}"
  pid="$(cat /tmp/slotune-study.pid)"
  bring_back() {
    cp /tmp/slotune-study.log "$OUT/study.log" 2>/dev/null || true
    cp "$study/trials.jsonl" "$study/trials.txt" "$study/report.html" "$OUT/" 2>/dev/null || true
    return 0
  }
  if follow_run "$pid" "$seconds"; then
    echo "the study has ended"
    tar -czf "$OUT/study-engine-logs.tar.gz" -C "$study" engines 2>/dev/null || true
  fi
  tail -n 40 /tmp/slotune-study.log
  ;;
landscape)
  # Runs in its own process session, so that it outlives this call and goes on across the
  # calls that follow (`follow`), for as long as the machine stays held: a trial needs not fit
  # into one call. The file grows in /tmp, one whole point at a time; `follow` copies it to $OUT.
  minutes="${2:?landscape MINUTES}"
  work=/tmp/slotune-landscape.jsonl
  # The file is the card's: capacities compare within one kind of GPU only, and a call may get
  # an H100 where an H200 was asked for (h100-study.jsonl, same spec).
  name="$(card)-study"
  echo "$name" >/tmp/slotune-landscape.name
  carried="$root/bench/landscapes/$name.jsonl"
  if [[ ! -f "$work" && -f "$carried" ]]; then cp -v "$carried" "$work"; fi
  spec=()
  [[ -s "$work" ]] || spec=(--spec "$here/h200-study.yaml")
  # The study's space: max-num-batched-tokens 512-16384, max-num-seqs 64-1024; block 16,
  # prefix caching on, KV dtype auto and gmu 0.9 fixed by the spec. The grid runs in the order
  # given, measured points skipped: 96 and 128 sequences first, between the 64 that queue
  # (TTFT) and the 256 that stall decodes (TPOT) at the target rate (bench/landscapes/README.md).
  # The frozen copy's commit (bench/gpu/.state/COMMIT) goes into the run line.
  SLOTUNE_COMMIT="$(cat "$here/.state/COMMIT" 2>/dev/null || true)" \
    setsid python3 "$root/bench/landscape.py" "$work" "${spec[@]}" --platform h200 \
    --vllm-python python3 --model-dir "$here/llama-8b" --out /tmp/slotune-landscape \
    --engine "vllm 0.24.0 (CUDA), dummy weights" --minutes "$minutes" --trial-minutes 5 \
    --repeats 2 --grid max_num_batched_tokens=2048,8192,16384,512 \
    --grid max_num_seqs=96,128,64,256,1024 >>/tmp/slotune-landscape.log 2>&1 </dev/null &
  echo "$!" >/tmp/slotune-landscape.pid
  echo "landscape started (pid $!); bench/gpu/on-device.sh follow SECONDS brings it back"
  ;;
follow)
  # Copies the running landscape's file and log to $OUT every few seconds, for SECONDS or
  # until it ends.
  seconds="${2:?follow SECONDS}"
  pid="$(cat /tmp/slotune-landscape.pid)"
  bring_back() {
    cp /tmp/slotune-landscape.jsonl "$OUT/$(cat /tmp/slotune-landscape.name).jsonl" 2>/dev/null || true
    cp /tmp/slotune-landscape.log "$OUT/landscape.log" 2>/dev/null || true
  }
  follow_run "$pid" "$seconds" && echo "the landscape run has ended"
  tail -n 30 /tmp/slotune-landscape.log
  ;;
repeat)
  # Like `landscape`: its own process session, so that it goes on across calls for as long as
  # the machine stays held; `repeat-follow` brings it back. One engine at a time on the GPU.
  engines="${2:?repeat N}"
  seed="${3:-100}"
  for running in /tmp/slotune-repeat.pid /tmp/slotune-landscape.pid; do
    if [[ -f "$running" ]] && kill -0 "$(cat "$running")" 2>/dev/null; then
      echo "already running: $running (pid $(cat "$running"))" >&2
      exit 1
    fi
  done
  # The card's platform: the H100 shares the H200's vLLM defaults (and the spec), not its
  # spread between engine starts.
  name="$(card)"
  echo "$name" >/tmp/slotune-repeat.name
  mkdir -p /tmp/slotune-repeat
  echo "== $(date -u +%FT%TZ) repeat: $engines engines, seed $seed, on $name" >>/tmp/slotune-repeat.log
  # bench/ on the path too: the script imports tuner_comparison and variance_components.
  PYTHONPATH="$PYTHONPATH:$root/bench" \
    SLOTUNE_COMMIT="$(cat "$here/.state/COMMIT" 2>/dev/null || true)" \
    setsid bash -c '"$@"; echo "[repeat ended with status $?]"' repeat \
    python3 "$root/bench/capacity_repeatability.py" --spec "$here/h200-study.yaml" \
    --platform "$name" --model-dir "$here/llama-8b" --vllm-python python3 --dummy-weights \
    --engines "$engines" --seed "$seed" --repeats 0 --out /tmp/slotune-repeat-work \
    --results /tmp/slotune-repeat --json-every >>/tmp/slotune-repeat.log 2>&1 </dev/null &
  echo "$!" >/tmp/slotune-repeat.pid
  echo "repeat started (pid $!); bench/gpu/on-device.sh repeat-follow SECONDS brings it back"
  ;;
cache)
  # Like `repeat`: its own process session, so that it goes on across calls.
  name="$(card)"
  mkdir -p /tmp/slotune-cache
  echo "== $(date -u +%FT%TZ) compile cache on $name" >>/tmp/slotune-cache.log
  setsid bash -c '"$@"; echo "[cache run ended with status $?]"' cache \
    python3 "$here/compile_cache.py" --spec "$here/$name-study.yaml" --platform "$name" \
    --model-dir "$here/llama-8b" --work /tmp/slotune-cache-work \
    --json "/tmp/slotune-cache/$name-compile-cache.json" >>/tmp/slotune-cache.log 2>&1 </dev/null &
  echo "$!" >/tmp/slotune-cache.pid
  echo "cache run started (pid $!); bench/gpu/on-device.sh cache-follow SECONDS brings it back"
  ;;
cache-follow)
  seconds="${2:?cache-follow SECONDS}"
  pid="$(cat /tmp/slotune-cache.pid)"
  bring_back() {
    cp /tmp/slotune-cache.log "$OUT/cache.log" 2>/dev/null || true
    cp /tmp/slotune-cache/*.json "$OUT/" 2>/dev/null || true
    return 0
  }
  if follow_run "$pid" "$seconds"; then
    echo "the cache run has ended"
    tar -czf "$OUT/cache-engine-logs.tar.gz" -C /tmp/slotune-cache-work engines 2>/dev/null || true
  fi
  tail -n 40 /tmp/slotune-cache.log
  ;;
repeat-follow)
  # Copies the repeat run's log and JSON to $OUT every 5 s, for SECONDS or until it ends.
  seconds="${2:?repeat-follow SECONDS}"
  pid="$(cat /tmp/slotune-repeat.pid)"
  name="$(cat /tmp/slotune-repeat.name 2>/dev/null || echo h200)"
  bring_back() {
    cp /tmp/slotune-repeat.log "$OUT/repeat.log" 2>/dev/null || true
    for f in /tmp/slotune-repeat/*.json; do
      [[ -e "$f" ]] && cp "$f" "$OUT/$name-$(basename "$f")"
    done
    return 0
  }
  if follow_run "$pid" "$seconds"; then
    echo "the repeat run has ended"
    tar -czf "$OUT/repeat-engine-logs.tar.gz" -C /tmp/slotune-repeat-work engines 2>/dev/null || true
  fi
  tail -n 30 /tmp/slotune-repeat.log
  ;;
side-by-side)
  # The study's records on this machine, or the carried ones on a fresh machine.
  records="$study/trials.jsonl"
  [[ -f "$records" ]] || records="$here/.state/trials.jsonl"
  python3 "$here/capacity_side_by_side.py" --spec "$here/h200-study.yaml" \
    --model-dir "$here/llama-8b" --records "$records" --work /tmp/slotune-side \
    --json /tmp/side-by-side.json --configs "${2:-defaults;winner}" 2>&1 \
    | tee -a "$OUT/side-by-side.log" || true
  cp /tmp/side-by-side.json "$OUT/" 2>/dev/null || true
  tar -czf "$OUT/side-engine-logs.tar.gz" -C /tmp/slotune-side . 2>/dev/null || true
  ;;
lossy)
  weights=/tmp/slotune-seeded-8b
  sched='"max_num_batched_tokens": 2048, "max_num_seqs": 96'
  fp8='"quantization": "fp8"'
  configs="defaults;fp8+sched={$fp8, $sched};sched={$sched};fp8={$fp8}"
  ceilings='vllm-defaults,fp8'
  if [[ "${2:-}" == stacked ]]; then  # a short session: does fp8 add to the scheduler settings?
    configs="sched={$sched};fp8+sched={$fp8, $sched}"
    ceilings=''
  fi
  setsid bash -c '"$@"; echo "[lossy ended with status $?]"' lossy bash -c "
    set -e
    [[ -f $weights/model.safetensors ]] || time python3 '$root/tests/support/seeded_weights.py' \
      '$here/llama-8b' $weights --seed 1 --device cuda
    python3 '$here/capacity_side_by_side.py' --spec '$here/h100-lossy.yaml' \
      --model-dir '$here/llama-8b' --seeded-weights $weights --records /dev/null \
      --work /tmp/slotune-lossy --json /tmp/lossy.json --platform h100 --quality \
      --ceilings '$ceilings' --configs '$configs'
  " >>/tmp/slotune-lossy.log 2>&1 </dev/null &
  echo "$!" >/tmp/slotune-lossy.pid
  echo "lossy side-by-side started (pid $!); bench/gpu/on-device.sh lossy-follow SECONDS brings it back"
  ;;
lossy-follow)
  seconds="${2:?lossy-follow SECONDS}"
  pid="$(cat /tmp/slotune-lossy.pid)"
  bring_back() {
    cp /tmp/slotune-lossy.log "$OUT/lossy.log" 2>/dev/null || true
    cp /tmp/lossy.json "$OUT/" 2>/dev/null || true
    return 0
  }
  if follow_run "$pid" "$seconds"; then
    echo "the lossy side-by-side has ended"
    tar -czf "$OUT/lossy-engine-logs.tar.gz" -C /tmp/slotune-lossy --exclude='*.json' . 2>/dev/null || true
  fi
  tail -n 40 /tmp/slotune-lossy.log
  ;;
*)
  sed -n '2,45p' "$0"
  exit 2
  ;;
esac
