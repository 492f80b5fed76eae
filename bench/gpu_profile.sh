#!/bin/sh
# gpu_profile.sh - where a step of the CUDA backend spends its GPU time:
# Nsight Compute (ncu) times every kernel of one step of GPT-2 124M
# (bench/gpu/gpt2.plan, plan single, bf16, seq 1024) at batch BATCH
# (default 8), and the kernels are summed by family, largest first. The
# step is step STEP (default 3) of as many, alone: ncu starts with
# collection off and weft turns it on for that step
# (WEFT_CUDA_PROFILE_STEP), so that the setup (weights converted, buffers
# cleared) and the first step's timing of cuBLASLt's candidates are not
# counted, as they were in the profiles before 2026-11-27 (STEP=0: the
# whole of a run of one step, as those were).
# Writes DIR/gpu-profile-DATE-DEVICE.txt (default DIR: bench/results).
#
# Usage, from the repository root, with ./weft and ./libweft_cuda.so built
# where nvcc is:   sh bench/gpu_profile.sh [DIR]
# FROM=FILE sums an ncu output saved before (`ncu --metrics
# gpu__time_duration.sum --print-summary per-kernel ...`) instead of running
# ncu; DEVICE then names the GPU it ran on.
DIR=${1:-bench/results}
WEFT=./weft
PY=${PY:-$(command -v python3)}
BATCH=${BATCH:-8}
STEP=${STEP:-3}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$DIR" || exit 2
export WEFT_PLUGIN_DIR=${WEFT_PLUGIN_DIR:-$(pwd)}
device=${DEVICE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}
if [ -n "${FROM:-}" ]; then
  cp "$FROM" "$tmp/ncu.txt" || exit 2
  how="summed from $FROM"
else
  command -v ncu >/dev/null 2>&1 || { echo "bench/gpu_profile.sh: ncu (Nsight Compute) is not on the PATH"; exit 2; }
  if [ "$STEP" -gt 0 ] 2>/dev/null; then
    WEFT_CUDA_PROFILE_STEP=$STEP ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
      --print-summary per-kernel $WEFT run bench/gpu/gpt2.plan --plan single --set batch=$BATCH --backend cuda \
      --steps $STEP >"$tmp/ncu.txt" 2>&1 || { tail -20 "$tmp/ncu.txt"; exit 1; }
    which="step $STEP of $STEP"
  else
    ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      $WEFT run bench/gpu/gpt2.plan --plan single --set batch=$BATCH --backend cuda --steps 1 >"$tmp/ncu.txt" 2>&1 ||
      { tail -20 "$tmp/ncu.txt"; exit 1; }
    which="a run of one step, setup included"
  fi
  how="$(date -u '+%Y-%m-%d %H:%M UTC')"
fi
slug=$(echo "${device:-gpu}" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
out=$DIR/gpu-profile-$(date -u +%Y-%m-%d)-$slug.txt
{
  echo "bench/gpu_profile.sh: ${which:-one step} of GPT-2 124M (bf16, seq 1024, batch $BATCH), plan single, ${device:-GPU}; $how"
  "$PY" - "$tmp/ncu.txt" <<'PYEOF'
import re, sys
fam = {}
cur = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s+(\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\).*Invocations (\d+)", line)
    if m:
        cur = (m.group(1), int(m.group(2)))
        continue
    m = re.search(r"gpu__time_duration\.sum\s+(\S+)\s+([\d.,]+)\s+([\d.,]+)\s+([\d.,]+)", line)
    if m and cur:
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}[m.group(1)]
        name = re.split(r"[(<]", cur[0].replace("void ", "", 1))[0]
        f = fam.setdefault(name, [0.0, 0])
        f[0] += cur[1] * float(m.group(4).replace(",", "")) * scale
        f[1] += cur[1]
        cur = None
if not fam:
    sys.exit("gpu_profile: no kernel times in the ncu output")
total = sum(f[0] for f in fam.values())
print(f"{total:.2f} ms of kernels, {sum(f[1] for f in fam.values())} launches")
print(f"{'ms':>9} {'share':>6} {'calls':>6}  kernel family")
for name, (ms, n) in sorted(fam.items(), key=lambda x: -x[1][0]):
    if ms / total >= 0.002:
        print(f"{ms:9.2f} {100 * ms / total:5.1f}% {n:6d}  {name}")
rest = [f for f in fam.values() if f[0] / total < 0.002]
print(f"{sum(f[0] for f in rest):9.2f} {100 * sum(f[0] for f in rest) / total:5.1f}% {sum(f[1] for f in rest):6d}  "
      f"the other {len(rest)} families")
PYEOF
} >"$tmp/out" || { cat "$tmp/out"; exit 1; }
cp "$tmp/out" "$out" && cat "$out" && echo "written: $out"
