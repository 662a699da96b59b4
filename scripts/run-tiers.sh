#!/usr/bin/env bash
# Run the checks and the test tiers in parallel, each into its own log file
# (.scratch/logs/<tier>.log), and print a tier's log as soon as it finishes, so the output stays
# readable. Exits non-zero if any of them failed. Usage: scripts/run-tiers.sh lint build unit integration e2e
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LOGS=.scratch/logs
mkdir -p "$LOGS"

declare -A tier_of=()
for tier in "$@"; do
  case "$tier" in
    lint|build)  cmd=(make --no-print-directory "$tier") ;;
    unit)        cmd=("$PY" -m pytest -p no:cacheprovider tests/unit -m "not integration and not e2e") ;;
    integration) cmd=("$PY" -m pytest -p no:cacheprovider tests/integration -m integration -n 4 --dist loadfile) ;;
    e2e)         cmd=("$PY" -m pytest -p no:cacheprovider tests/e2e -m e2e) ;;
    *) echo "run-tiers: unknown tier $tier" >&2; exit 2 ;;
  esac
  ( started=$SECONDS
    "${cmd[@]}" >"$LOGS/$tier.log" 2>&1
    code=$?
    echo "== $tier: exit $code after $((SECONDS - started)) s" >>"$LOGS/$tier.log"
    exit "$code" ) &
  tier_of[$!]=$tier
  echo "== $tier: started (log: $LOGS/$tier.log)"
done

failed=()
while ((${#tier_of[@]})); do
  wait -n -p finished "${!tier_of[@]}"
  code=$?
  tier=${tier_of[$finished]}
  unset "tier_of[$finished]"
  echo
  echo "==================================== $tier ===================================="
  cat "$LOGS/$tier.log"
  ((code == 0)) || failed+=("$tier")
done

echo
if ((${#failed[@]})); then
  echo "FAILED tiers: ${failed[*]}"
  exit 1
fi
echo "all tiers passed: $*"
