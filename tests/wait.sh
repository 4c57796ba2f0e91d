# Sourced by the script tests: `wait_for SECONDS WHAT CMD...` runs CMD every 0.1 s until it
# succeeds (returns 0), or, once SECONDS have passed, prints what it was still waiting for and
# returns 1. The wait ends at the event; SECONDS is only an upper bound that catches a hang, so
# give it minutes (a busy 2-core machine runs these tests ten times slower than a quiet one).
wait_for() {
  local limit="$1" what="$2"; shift 2
  local end=$((SECONDS + limit))
  until "$@"; do
    if [ "$SECONDS" -ge "$end" ]; then echo "still waiting after $limit s for $what"; return 1; fi
    sleep 0.1
  done
}
