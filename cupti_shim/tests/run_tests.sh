#!/usr/bin/env bash
# Build the shim and its tests, run every CPU-side test, print "N passed, N failed" and exit non-zero
# on any failure. Usage: cupti_shim/tests/run_tests.sh [BUILD_DIR] [PYTHON]
# PYTHON must have `msgpack`; the Python-nvtx test is skipped when it lacks `nvtx`.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
B="${1:-$HERE/../../build/cupti_shim}"
PY="${2:-python3}"
mkdir -p "$B"
B="$(cd "$B" && pwd)"
PASS=0; FAIL=0; SKIP=0
ok() { echo "PASS $1"; PASS=$((PASS + 1)); }
ko() { echo "FAIL $1${2:+: $2}"; FAIL=$((FAIL + 1)); }

if ! PYTHON="$PY" "$HERE/../build.sh" "$B" --tests; then
  echo "FAIL build"; echo "0 passed, 1 failed"; exit 1
fi
SHIM="$B/libteller_shim.so"
CHECK=("$PY" "$HERE/check_raw.py")
W="$B/work"
rm -rf "$W"; mkdir -p "$W"
ulimit -c 0
export TELLER_SHIM_QUIET=1

fresh() { rm -rf "$W/$1"; mkdir -p "$W/$1"; echo "$W/$1"; }

# exported symbols: exactly the two entry points
syms="$(nm -D --defined-only "$SHIM" | awk '$2 == "T" {print $3}' | sort | tr '\n' ' ')"
[ "$syms" = "InitializeInjection InitializeInjectionNvtx2 " ] && ok "exports" || ko "exports" "$syms"

# clock: TSC path agrees with clock_gettime(CLOCK_MONOTONIC)
"$B/test_clock" && ok "clock" || ko "clock"
TELLER_CLOCK=gettime "$B/test_clock" && ok "clock-gettime" || ko "clock-gettime"

# NVTX scenarios (clean exit): basic, fork
for s in basic fork; do
  d="$(fresh "$s")"
  if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" "$s" > "$d/facts.json" \
      && "${CHECK[@]}" "$s" "$d" "$d/facts.json"; then ok "nvtx-$s"; else ko "nvtx-$s"; fi
done

# the same without the 32-byte store path (body first, header byte last)
d="$(fresh basic-noavx)"
if TELLER_NO_AVX=1 TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" basic > "$d/facts.json" \
    && "${CHECK[@]}" basic "$d" "$d/facts.json"; then ok "nvtx-basic-noavx"; else ko "nvtx-basic-noavx"; fi

# signal handlers calling NVTX while their thread is inside the shim (reentrancy guard)
for s in signal-inside signal-storm; do
  d="$(fresh "$s")"
  if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" "$s" > "$d/facts.json" \
      && "${CHECK[@]}" "$s" "$d" "$d/facts.json"; then ok "nvtx-$s"; else ko "nvtx-$s"; fi
done

# span mode (one SPAN per push/pop) still decodes
d="$(fresh span)"
if TELLER_NVTX_MODE=span TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" basic > "$d/facts.json"; then
  n=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
sp = [r for r in f.of(c.SPAN) if r[1] == 1]
print(len(sp) if all(r[4] <= r[5] for r in sp) else -1)")
  [ "$n" = "12006" ] && ok "nvtx-span-mode" || ko "nvtx-span-mode" "$n spans"
else ko "nvtx-span-mode"; fi

# crash scenarios: records written before death are readable, the open range is visible
expect_rc() { # name expected_rc
  local s="$1" want="$2" d; d="$(fresh "$s")"
  TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" "$s" > "$d/facts.json" 2>/dev/null
  local rc=$?
  if [ "$rc" != "$want" ]; then ko "$s" "exit status $rc, expected $want"; return; fi
  "${CHECK[@]}" "$s" "$d" "$d/facts.json" && ok "$s" || ko "$s"
}
expect_rc crash-exit 3
expect_rc crash-segv 139
expect_rc crash-abort 134
for sig in kill term; do
  s="crash-$sig"; d="$(fresh "$s")"
  TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" "$B/test_nvtx" "$s" "$d/ready" > "$d/facts.json" 2>/dev/null &
  pid=$!
  for _ in $(seq 100); do [ -e "$d/ready" ] && break; sleep 0.1; done
  if [ ! -e "$d/ready" ]; then kill -9 "$pid" 2>/dev/null; ko "$s" "never ready"; continue; fi
  [ "$sig" = kill ] && kill -KILL "$pid" || kill -TERM "$pid"
  wait "$pid" 2>/dev/null
  "${CHECK[@]}" "$s" "$d" "$d/facts.json" && ok "$s" || ko "$s"
done

# CUPTI record conversion with real CUDA 13 header structs
d="$(fresh convert)"
if TELLER_TRACE_DIR="$d" timeout 60 "$B/test_cupti_convert" > "$d/facts.json" && "${CHECK[@]}" convert "$d" "$d/facts.json"; then
  ok "cupti-convert"; else ko "cupti-convert"; fi

# CUPTI entry point: no driver (graceful), fake driver+CUPTI pipeline, multiple subscribers, and
# libcupti found next to an already loaded libcudart (wheel layout, no TELLER_CUPTI_PATH)
for m in nodriver fake multi discover; do
  d="$(fresh "inject-$m")"
  extra=()
  [ "$m" = fake ] || [ "$m" = multi ] && extra=(LD_LIBRARY_PATH="$B/fake_cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TELLER_CUPTI_PATH="$B/libfake_cupti.so" FAKE_CUPTI_MODE="$m" FAKE_CUPTI_CALLBACK_LOG=1)
  [ "$m" = discover ] && extra=(LD_LIBRARY_PATH="$B/fake_cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FAKE_CUDART="$B/fake_cu13/lib/libcudart.so.13" FAKE_CUPTI_MODE=fake FAKE_CUPTI_CALLBACK_LOG=1)
  if env "${extra[@]}" TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_inject" "$m" "$SHIM" \
       > "$d/facts.json" 2> "$d/stderr.txt" \
     && ! grep -q VIOLATION "$d/stderr.txt" && ! grep -q "callback cudaLaunchKernel on" "$d/stderr.txt" \
     && "${CHECK[@]}" "inject-$m" "$d" "$d/facts.json"; then
    ok "inject-$m"; else ko "inject-$m" "$(head -c 500 "$d/stderr.txt")"; fi
done

# Python nvtx package (domains, registered strings, fork workers, os._exit, pool.terminate)
d="$(fresh python-nvtx)"
TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 120 "$PY" "$HERE/test_python_nvtx.py"
rc=$?
if [ $rc = 0 ]; then ok "python-nvtx"; elif [ $rc = 77 ]; then echo "SKIP python-nvtx"; SKIP=$((SKIP + 1)); else ko "python-nvtx"; fi

# periodic CLOCK_SYNC records (every chunk hand-out here)
d="$(fresh clock-sync)"
if TELLER_CLOCK_SYNC_MS=0 TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" many > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
cs = f.of(c.CLOCK_SYNC)
mono = [r[1] for r in cs]
print('ok' if len(cs) > 5 and mono == sorted(mono) and all(r[2] > r[1] for r in cs) else 'bad %d' % len(cs))")
  [ "$res" = ok ] && ok "clock-sync-records" || ko "clock-sync-records" "$res"
else ko "clock-sync-records"; fi

# file size limit: records beyond it are dropped and counted in DROPPED records
d="$(fresh max-size)"
if TELLER_MAX_FILE_MB=1 TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" many > /dev/null; then
  res=$("$PY" -c "
import os, sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
n = sum(r[1] for r in f.of(c.DROPPED))
kept = len(f.ranges())  # also asserts that no END lost its BEGIN
print('ok' if n > 0 and n + kept >= 200000 and os.path.getsize(f.path) <= (1 << 20) + 4096 and f.torn == 0 else 'bad %d %d' % (n, os.path.getsize(f.path)))")
  [ "$res" = ok ] && ok "max-size-dropped" || ko "max-size-dropped" "$res"
else ko "max-size-dropped"; fi

# ... and the drops of a thread still running at exit (it never takes another chunk) are reported too
d="$(fresh max-size-thread)"
if TELLER_MAX_FILE_MB=1 TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" many-thread > /dev/null; then
  res=$("$PY" -c "
import os, sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
n = sum(r[1] for r in f.of(c.DROPPED))
kept = len(f.ranges())
print('ok' if n > 0 and n + kept >= 200000 and f.torn == 0 else 'bad %d %d' % (n, kept))")
  [ "$res" = ok ] && ok "max-size-dropped-live-thread" || ko "max-size-dropped-live-thread" "$res"
else ko "max-size-dropped-live-thread"; fi

# names whose STRING could not be written while growth was refused: written at the next use, the next
# chunk, or in the exit's tail
d="$(fresh transient-full)"
if TELLER_GROW_MB=0 TELLER_CHUNK_KB=64 TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" transient-full > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
n = sum(r[1] for r in f.of(c.DROPPED))
names = [x['name'] for x in f.ranges().values()]  # (asserts that every name id has its STRING)
fresh = [x for x in names if x.startswith('fresh-')]
texts = {t[:17] for t in f.strings.values() if len(t) == 200}
ok = n > 0 and names[0] == 'before-full' and len(fresh) == 1 and len(fresh[0]) == 200
ok = ok and names.count('registered-while-full') == 1 and {'only-while-full-A', 'only-while-full-B'} <= texts
print('ok' if ok else 'bad %d %d %s' % (n, len(fresh), sorted(t[:20] for t in texts)))" 2>&1 | tail -1)
  [ "$res" = ok ] && ok "string-after-transient-full" || ko "string-after-transient-full" "$res"
else ko "string-after-transient-full"; fi

# two NVTX instances (exe + shared library): InitializeInjectionNvtx2 twice, one file, one string table
d="$(fresh instances)"
if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" instances "$B/libnvtx_user.so" > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
fs = c.load_dir('$d')
f = fs[0]
r = list(f.ranges().values())
names = [x['name'] for x in r]
marks = [f.s(m[2]) for m in f.of(c.MARK)]
ok = len(fs) == 1 and names.count('lib-range') == 11 and names.count('exe-range') == 1 and marks == ['lib-mark'] * 10
ok = ok and all(x['end'] is not None for x in r)
print('ok' if ok else 'bad %d files %s' % (len(fs), names[:5]))")
  [ "$res" = ok ] && ok "nvtx-two-instances" || ko "nvtx-two-instances" "$res"
else ko "nvtx-two-instances"; fi

# nesting deeper than 1024: deeper ranges are not recorded, every recorded range is closed, one DIAG
d="$(fresh deep)"
if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" deep > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
r = list(f.ranges().values())
deep = [x for x in r if x['name'] == 'deep']
ok = len(deep) == 1024 and all(x['end'] is not None for x in r) and any('deeper' in m for _, m in f.diags())
print('ok' if ok and [x['name'] for x in r][-1] == 'after-deep' else 'bad %d' % len(deep))")
  [ "$res" = ok ] && ok "nvtx-too-deep" || ko "nvtx-too-deep" "$res"
else ko "nvtx-too-deep"; fi

# strings cut at a byte limit (64 KiB names, 200-byte mark domains, the kernel's 15-byte thread
# names) end on a character: the file decodes as UTF-8 (check_raw reads strictly) and says what was kept
d="$(fresh utf8)"
if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" utf8 > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
try:
    f = c.load_dir('$d')[0]
except AssertionError as e:
    print('bad', str(e)[:200]); raise SystemExit
names = [x['name'] for x in f.ranges().values()]
marks = [(f.s(m[2]), m[5].get('domain') if len(m) > 5 and isinstance(m[5], dict) else None) for m in f.of(c.MARK)]
want_mark = ('ab' + '😀' * 16383, 'x' + 'é' * 99)
ok = names[0] == 'é' * 32767 and marks == [want_mark] and 'abcdefghijklmn' in f.thread_names().values()
print('ok' if ok else 'bad %r %r %r' % ([len(x) for x in names], [(len(a), b and len(b)) for a, b in marks], f.thread_names()))")
  [ "$res" = ok ] && ok "nvtx-utf8-cut" || ko "nvtx-utf8-cut" "$res"
else ko "nvtx-utf8-cut"; fi

# the wide-character (W) entry points: UTF-8 names, nesting kept, domains and registered strings
d="$(fresh wide)"
if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" wide > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
r = {x['name']: x for x in f.ranges().values()}
o, i, s = r.get('outer'), r.get('inner-\u00e9'), r.get('sibling')
ok = None not in (o, i, s) and o['start'] <= i['start'] <= i['end'] <= s['start'] <= s['end'] <= o['end']
ok = ok and r.get('started-w', {}).get('end') is not None and r.get('caf\u00e9') is not None
ok = ok and r.get('registered-w', {}).get('domain') == 'wide-dom'
ok = ok and [f.s(m[2]) for m in f.of(c.MARK)] == ['mark-\U0001F600'] and 'wide-thread' in f.thread_names().values()
print('ok' if ok else 'bad %r' % sorted(r))")
  [ "$res" = ok ] && ok "nvtx-wide" || ko "nvtx-wide" "$res"
else ko "nvtx-wide"; fi

# more distinct names than the string table keeps: every range still reads its own name, one DIAG
d="$(fresh names)"
if TELLER_TRACE_DIR="$d" TELLER_MAX_NAMES=1024 NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" names > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d', repeated_strings=True)[0]
names = [x['name'] for x in f.ranges().values()]
want = ['aten::add, seq = %d' % i for i in range(5000)] + ['aten::add, seq = 4999']
said = [m for _, m in f.diags() if 'string table holds' in m]
again = list(f.strings.values()).count('aten::add, seq = 4999')  # (the thread's own cache: once)
ok = names == want and len(said) == 1 and f.n_strings >= 5000 and again == 1
print('ok' if ok else 'bad %d %r %d %d' % (len(names), said, sum(a != b for a, b in zip(names, want)), again))")
  [ "$res" = ok ] && ok "string-table-budget" || ko "string-table-budget" "$res"
else ko "string-table-budget"; fi

# category names: args.category holds the name where one was given (per domain), else the number
d="$(fresh category)"
if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" category > /dev/null; then
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
cat = {x['name']: (x['args'] or {}).get('category') for x in f.ranges().values()}
marks = [(f.s(m[2]), m[5].get('category')) for m in f.of(c.MARK)]
ok = cat == {'default-1': 'io', 'dom-1': 'compute', 'default-3': 3}
ok = ok and marks == [('dom-2', 'a-category-name-longer-than-thi')]
print('ok' if ok else 'bad %r %r' % (cat, marks))")
  [ "$res" = ok ] && ok "nvtx-category-names" || ko "nvtx-category-names" "$res"
else ko "nvtx-category-names"; fi

# the program closes all descriptors and reuses the numbers: its files must stay untouched
d="$(fresh closefd)"
if TELLER_TRACE_DIR="$d" NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" closefd "$d/user" > /dev/null 2>&1; then
  bad=0
  for i in 0 1 2 3 4 5 6 7; do [ "$(cat "$d/user.$i")" = USERDATA ] || bad=1; done
  res=$("$PY" -c "
import sys; sys.path.insert(0, '$HERE'); import check_raw as c
f = c.load_dir('$d')[0]
print('ok' if [r['name'] for r in f.ranges().values()][:1] == ['before-close'] else 'bad')")
  [ "$bad" = 0 ] && [ "$res" = ok ] && ok "closed-fd-reuse" || ko "closed-fd-reuse" "user files modified or trace lost ($res)"
else ko "closed-fd-reuse"; fi

# a wrong/unwritable trace dir must not break the host
if TELLER_TRACE_DIR=/proc/teller-no NVTX_INJECTION64_PATH="$SHIM" timeout 60 "$B/test_nvtx" basic > /dev/null; then
  ok "unwritable-dir"; else ko "unwritable-dir"; fi

if [ "$SKIP" -gt 0 ]; then echo "$PASS passed, $FAIL failed, $SKIP skipped"; else echo "$PASS passed, $FAIL failed"; fi
[ "$FAIL" = 0 ]
