#!/bin/sh
# install_check.sh - `make install` into a scratch DESTDIR puts weft, the
# standard library (its heuristics too) and, when mpicc built it, the MPI plugin where README.md
# says, and the installed weft finds the plugin under mpirun.
#   sh tests/install_check.sh MAKE [PLUGIN]
MAKE=$1; plugin=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: install: $*"; }
if $MAKE --no-print-directory install DESTDIR="$tmp" PREFIX=/usr >"$tmp/log" 2>&1; then ok; else bad "make install failed"; cat "$tmp/log"; fi
bin=$tmp/usr/bin/weft
[ -x "$bin" ] && ok || bad "no usr/bin/weft"
[ -f "$tmp/usr/share/weft/stdlib/ops.plan" ] && ok || bad "no usr/share/weft/stdlib/ops.plan"
# the installed copy of the standard library is the one built in
if "$bin" check --stdlib "$tmp/usr/share/weft/stdlib" examples/mlp.plan >"$tmp/a" 2>&1 &&
   "$bin" check examples/mlp.plan >"$tmp/b" 2>&1 && cmp -s "$tmp/a" "$tmp/b"; then ok
else bad "the installed weft with --stdlib usr/share/weft/stdlib differs from its built-in one"; cat "$tmp/a"; fi
# and so are its heuristics: the same plan searched with either
if "$bin" search --stdlib "$tmp/usr/share/weft/stdlib" examples/mlp.plan --cluster 'cpus(4)' --heuristic memory_first \
     >"$tmp/a" 2>&1 && "$bin" search examples/mlp.plan --cluster 'cpus(4)' --heuristic memory_first >"$tmp/b" 2>&1 &&
   [ "$(sed 1,2d "$tmp/a")" = "$(sed 1,2d "$tmp/b")" ]; then ok
else bad "the installed heuristics (usr/share/weft/stdlib/heuristics) differ from the built-in ones"; cat "$tmp/a"; fi
if [ -n "$plugin" ]; then
  [ -f "$tmp/usr/lib/weft/libweft_mpi.so" ] && ok || bad "no usr/lib/weft/libweft_mpi.so"
  if command -v mpirun >/dev/null 2>&1; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    if mpirun -np 2 "$bin" run examples/mlp.plan --check >"$tmp/mpi" 2>&1 && grep -q "in 2 processes" "$tmp/mpi" && grep -q "match$" "$tmp/mpi"; then ok
    else bad "mpirun -np 2 of the installed weft"; cat "$tmp/mpi"; fi
  else
    echo "install: mpirun not installed, the installed plugin is not run"
  fi
else
  echo "install: no mpicc, no MPI plugin to install"
fi
echo "install: $pass passed, $fail failed"
[ "$fail" = 0 ]
