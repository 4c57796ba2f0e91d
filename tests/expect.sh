# Sourced by the CLI script tests (cli_smoke.sh, limits.sh): `expect RC REGEX ARGS...` runs
# kvtrim ($bin) with ARGS and checks its exit code and that its stderr matches REGEX, counting
# into $pass / $failed. A time limit turns a case that runs by mistake (or hangs) into a failure;
# it is minutes, far above what any case takes on a slow, busy machine or under the sanitizers.
pass=0; failed=0
expect() {
  local rc="$1" re="$2"; shift 2
  local out; out=$(timeout 300 "$bin" "$@" 2>&1 >/dev/null); local got=$?
  [ "$got" -eq 124 ] && out="(still running after 300 s: killed) $out"
  if [ "$got" -eq "$rc" ] && [[ "$out" =~ $re ]]; then
    pass=$((pass + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: kvtrim $* -> exit $got (want $rc), stderr: $out" | head -c 800; echo
  fi
}
