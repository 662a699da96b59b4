#!/usr/bin/env bash
# Run the checks and the test tiers in parallel, each into its own log file
# (.scratch/logs/<tier>.log), and print a tier's log as soon as it finishes, so the output stays
# readable. Exits non-zero if any of them failed.
#   scripts/run-tiers.sh unit integration -- lint build e2e
# Tiers after "--" need the virtualenvs of `make setup-rest`: they start once it has installed
# them, while the tiers before "--" are already running.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LOGS=.scratch/logs
mkdir -p "$LOGS"
declare -A tier_of=()
start_tier() {
  local tier=$1 cmd
  case "$tier" in
    lint|build)  cmd=(make --no-print-directory "$tier") ;;
    unit)        cmd=("$PY" -m pytest -p no:cacheprovider tests/unit -m "not integration and not e2e") ;;
    integration) cmd=("$PY" -m pytest -p no:cacheprovider tests/integration -m integration -n 4 --dist loadfile) ;;
    e2e)         cmd=("$PY" -m pytest -p no:cacheprovider tests/e2e -m e2e) ;;
    setup-rest)  cmd=(make --no-print-directory setup-rest) ;;
    *) echo "run-tiers: unknown tier $tier" >&2; exit 2 ;;
  esac
  ( started=$SECONDS
    "${cmd[@]}" >"$LOGS/$tier.log" 2>&1
    code=$?
    echo "== $tier: exit $code after $((SECONDS - started)) s" >>"$LOGS/$tier.log"
    exit "$code" ) &
  tier_of[$!]=$tier
  echo "== $tier: started (log: $LOGS/$tier.log)"
}

later=()
seen_separator=0
for tier in "$@"; do
  if [[ $tier == "--" ]]; then
    seen_separator=1
  elif ((seen_separator)); then
    later+=("$tier")
  else
    start_tier "$tier"
  fi
done
((${#later[@]})) && start_tier setup-rest

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
  if [[ $tier == setup-rest ]]; then
    if ((code == 0)); then
      for next in "${later[@]}"; do start_tier "$next"; done
    else
      failed+=("${later[@]/%/ (not run)}")
    fi
  fi
done

echo
if ((${#failed[@]})); then
  echo "FAILED tiers: ${failed[*]}"
  exit 1
fi
echo "all tiers passed: $*"
