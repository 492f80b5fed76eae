#!/bin/sh
# rendezvous_check.sh - the rendezvous of the CUDA backend's NCCL
# communicators (backends/cuda/rendezvous.h), without a GPU: processes of
# tests/cuda/test_rendezvous.c share process 0's id through a file (readers
# started before the writer agree with it; readers time out cleanly when it
# never comes; an earlier run's file is waited past; a file that is not one
# fails at once) and through MPI's broadcast under mpirun.
# Usage: sh tests/rendezvous_check.sh BIN [MPI_PLUGIN_DIR]
BIN=$1
MPIDIR=$2
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
fail() { echo "rendezvous-check: FAIL: $*"; exit 1; }
ids() { sed -n 's/^process [0-9]* of [0-9]*: id //p' "$@" | sort -u; }

# 1. three readers, then the writer 0.3 s later: all four hold one id
for r in 1 2 3; do "$BIN" "file:$tmp/id" $r 4 20 >"$tmp/out$r" 2>&1 & done
"$BIN" "file:$tmp/id" 0 4 20 0.3 >"$tmp/out0" 2>&1 || fail "the writer: $(cat "$tmp/out0")"
wait
for r in 0 1 2 3; do grep -q "^process $r of 4: id [0-9a-f]\{256\}$" "$tmp/out$r" || fail "process $r: $(cat "$tmp/out$r")"; done
[ "$(ids "$tmp"/out? | wc -l)" = 1 ] || fail "the processes hold different ids"
[ -z "$(ls "$tmp" | grep tmp)" ] || fail "a temporary file was left: $(ls "$tmp")"
echo "rendezvous-check: file: 4 processes, readers started first, agree on process 0's id"

# 2. no writer: each reader gives up after its timeout, exit 2, one line
start=$(date +%s)
"$BIN" "file:$tmp/none" 1 2 0.5 >"$tmp/t1" 2>&1 & p1=$!
"$BIN" "file:$tmp/none" 2 3 0.5 >"$tmp/t2" 2>&1; rc2=$?
wait $p1; rc1=$?
[ $rc1 = 2 ] && [ $rc2 = 2 ] || fail "readers without a writer exit $rc1 and $rc2, not 2"
[ $(( $(date +%s) - start )) -lt 10 ] || fail "readers without a writer took $(( $(date +%s) - start )) s"
grep -q "process 1 of 2 waited 0.5 s for process 0 to write the communicator's id; it did not come (--timeout)" "$tmp/t1" ||
  fail "the timeout's message: $(cat "$tmp/t1")"
echo "rendezvous-check: file: without a writer, readers end after --timeout: $(sed 's/^test_rendezvous: //' "$tmp/t1")"

# 3. an earlier run's file (another key) is waited past; this run's is read
WEFT_RENDEZVOUS_KEY=run-1 "$BIN" "file:$tmp/k" 0 2 5 >"$tmp/old" 2>&1 || fail "the first run's writer"
WEFT_RENDEZVOUS_KEY=run-2 "$BIN" "file:$tmp/k" 1 2 20 >"$tmp/new1" 2>&1 & p=$!
sleep 0.3
kill -0 $p 2>/dev/null || fail "a reader took an earlier run's id: $(cat "$tmp/new1")"
WEFT_RENDEZVOUS_KEY=run-2 "$BIN" "file:$tmp/k" 0 2 5 >"$tmp/new0" 2>&1 || fail "the second run's writer"
wait $p || fail "the second run's reader: $(cat "$tmp/new1")"
[ "$(ids "$tmp/new0" "$tmp/new1" | wc -l)" = 1 ] || fail "the second run's processes hold different ids"
[ "$(ids "$tmp/old" "$tmp/new1" | wc -l)" = 2 ] || fail "the reader holds the first run's id"
echo "rendezvous-check: file: a file of another key (WEFT_RENDEZVOUS_KEY) is waited past"

# 4. files that are not one fail at once, with the file's name
echo "hello" >"$tmp/bad"
"$BIN" "file:$tmp/bad" 1 2 30 >"$tmp/b" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "file:$tmp/bad: not a rendezvous file of weft" "$tmp/b" || fail "a file that is not one: exit $rc: $(cat "$tmp/b")"
"$BIN" "file:$tmp/id" 1 2 30 >"$tmp/b" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "written by process 0 of 4 processes, but this run has 2" "$tmp/b" || fail "another count: exit $rc: $(cat "$tmp/b")"
"$BIN" "tcp:host" 1 2 1 >"$tmp/b" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "expected \`mpi\` or \`file:PATH\`" "$tmp/b" || fail "an unknown rendezvous: $(cat "$tmp/b")"
echo "rendezvous-check: file: a file that is not one, or of another count of processes, fails at once"

# 5. MPI: process 0's id broadcast through the MPI plugin
if [ -z "$MPIDIR" ] || [ ! -e "$MPIDIR/libweft_mpi.so" ] || ! command -v mpirun >/dev/null 2>&1; then
  echo "rendezvous-check: mpi: skipped (no mpirun or no libweft_mpi.so)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI keeps what MPI_Init allocates until exit: under AddressSanitizer
# the processes of mpirun skip the leak report (as in tests/run_check.sh)
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun -np 3 "$BIN" mpi "$MPIDIR" 20 >"$tmp/m" 2>&1 ||
  fail "under mpirun: $(cat "$tmp/m")"
[ "$(grep -c "^process [0-2] of 3: id [0-9a-f]\{256\}$" "$tmp/m")" = 3 ] || fail "under mpirun: $(cat "$tmp/m")"
[ "$(ids "$tmp/m" | wc -l)" = 1 ] || fail "under mpirun the processes hold different ids"
echo "rendezvous-check: mpi: 3 processes under mpirun agree on process 0's id"
