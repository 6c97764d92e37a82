#!/usr/bin/env bash
# Run the tests N times in a row, every run's time, summary and FAILED/ERROR lines kept in one log (issue 82: a suite
# that never fails at random). Usage: bash benchmarks/repeat_tests.sh N [pytest arguments (default: -n 2 tests)]
#   bash benchmarks/repeat_tests.sh 5                                  # the whole suite, 5 runs
#   bash benchmarks/repeat_tests.sh 50 -n 2 tests/test_workers.py tests/test_leaks.py
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:?how many runs}; shift
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(-n 2 tests)
log=${REPEAT_LOG:-repeat_tests.log}
: > "$log"
failed=0
for i in $(seq 1 "$runs"); do
  start=$SECONDS
  out=$(python -m pytest -q -p no:cacheprovider "${args[@]}" 2>&1); rc=$?
  echo "run $i: rc $rc, $((SECONDS - start)) s: $(tail -n 1 <<< "$out")" | tee -a "$log"
  grep -E "^(FAILED|ERROR)" <<< "$out" | tee -a "$log"
  [ "$rc" = 0 ] || failed=$((failed + 1))
done
echo "$failed of $runs runs failed ($log)"
[ "$failed" = 0 ]
