#!/usr/bin/env bash
# The binaries must not hold VEX-encoded VNNI (vpdpbusd / vpdpwssd with a VEX prefix = AVX-VNNI):
# Highway's AVX3_DL pass is selected on CPUs with AVX512-VNNI alone (Zen 4, Ice Lake server),
# which raise SIGILL on AVX-VNNI. The kernels use the EVEX encoding (src/ops/row_kernels-inl.h,
# dpbusd256). This checks the code itself, so it fails on any machine, not only on those CPUs.
# Usage: isa_encoding.sh BINARY...
set -euo pipefail
command -v objdump > /dev/null || { echo "isa_encoding: objdump (binutils) not found"; exit 1; }
status=0
for bin in "$@"; do
  [ -f "$bin" ] || { echo "isa_encoding: no such file: $bin"; exit 1; }
  found=$(objdump -d --no-show-raw-insn -C "$bin" |
    awk '/^[0-9a-f]+ <.*>:$/ { fn = $0 } /\{vex\}[ \t]+vpdp(bu|ws)sds?[ \t]/ { n[fn]++ } END { for (f in n) print n[f] "\t" f }')
  if [ -n "$found" ]; then
    echo "isa_encoding: $bin has VEX-encoded (AVX-VNNI) dot products in:"
    echo "$found" | cut -c1-240
    status=1
  else
    echo "isa_encoding: $bin: no VEX-encoded VNNI"
  fi
done
exit $status
