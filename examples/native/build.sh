#!/bin/sh
# build.sh - builds the native kernels of examples/native.plan into
# OUTDIR/libweft_example_ops.so (examples/native.plan expects examples/native).
# usage: sh examples/native/build.sh OUTDIR
set -e
out=${1:?usage: sh examples/native/build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
${CC:-cc} -shared -fPIC -O2 -Wall -Wextra -o "$out/libweft_example_ops.so" "$here/example_ops.c" -lm
echo "built $out/libweft_example_ops.so"
