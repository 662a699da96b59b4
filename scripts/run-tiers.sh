#!/usr/bin/env bash
# Run the checks and the test tiers in parallel, each into its own log file
# (.scratch/logs/<tier>.log), and print a tier's log as soon as it finishes, so the output stays
# readable. Exits non-zero if any of them failed.
#   scripts/run-tiers.sh unit integration @setup-e2e build e2e @setup-lint lint
# "@target" is a make target that installs what the tiers after it need: the first one starts at
# once (beside the tiers before it), each later one when the one before it is done; a tier after
# "@target" starts when that target is done.
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
    @*)          cmd=(make --no-print-directory "${tier#@}") ;;
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

stages=()   # "@target tier tier ..." strings, in order
for tier in "$@"; do
  if [[ $tier == @* ]]; then
    stages+=("$tier")
  elif ((${#stages[@]})); then
    stages[-1]+=" $tier"
  else
    start_tier "$tier"
  fi
done
next_stage=0
start_next_stage() {
  if ((next_stage < ${#stages[@]})); then
    local words=(${stages[$next_stage]})
    start_tier "${words[0]}"
  fi
}
start_next_stage

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
  if [[ $tier == @* ]]; then
    words=(${stages[$next_stage]})
    next_stage=$((next_stage + 1))
    if ((code == 0)); then
      for next in "${words[@]:1}"; do start_tier "$next"; done
      start_next_stage
    else
      for stage in "${stages[@]:next_stage - 1}"; do
        words=($stage)
        failed+=("${words[@]:1}")
      done
      next_stage=${#stages[@]}
    fi
  fi
done

echo
if ((${#failed[@]})); then
  echo "FAILED tiers: ${failed[*]}"
  exit 1
fi
echo "all tiers passed: $*"
