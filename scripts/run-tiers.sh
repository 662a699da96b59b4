#!/usr/bin/env bash
# Run the checks and the test tiers in parallel, each into its own log file
# (.scratch/logs/<tier>.log), and print a tier's log as soon as it finishes, so the output stays
# readable. Exits non-zero if any of them failed.
#
#   scripts/run-tiers.sh @setup-dev unit integration , @setup-e2e build e2e , @setup-lint lint docs simulation
#
# Comma-separated chains run side by side. In a chain, "@target" is a make target that installs
# what the tiers after it need: a chain's first one starts at once, each later one when the one
# before it is done, and the tiers after it start when it is done (a failed install fails them).
# What has slack runs at a lower CPU priority (nice): the checks' install most (it mostly waits on
# the package index), the e2e tier's installs and the interleaving simulation (1,000 schedules,
# about 35 CPU-seconds, on two processes) some (the e2e tier mostly waits; the integration tier is
# CPU-bound). lint (its four checks at once, about 24 CPU-seconds) and docs run at normal priority:
# at nice 10 they were starved until the test tiers ended and then ran alone, and the run ended
# 45 s after its last test tier (a clean clone with one core kept busy).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LOGS=.scratch/logs
mkdir -p "$LOGS"

declare -A tier_of=() chain_of=()
failed=()
cpu_total=0

start_tier() {  # start_tier TIER [CHAIN]
  local tier=$1 cmd
  case "$tier" in
    lint)        cmd=(make --no-print-directory -j4 --output-sync=target lint) ;;
    build|docs)  cmd=(make --no-print-directory "$tier") ;;
    unit)        cmd=("$PY" -m pytest -p no:cacheprovider tests/unit -m "not integration and not e2e") ;;
    integration) cmd=("$PY" -m pytest -p no:cacheprovider tests/integration -m integration -n 6 --dist loadfile --durations=8) ;;
    e2e)         cmd=("$PY" -m pytest -p no:cacheprovider tests/e2e -m e2e -n 2 --durations=8) ;;
    simulation)  cmd=(env PYTHONPATH=layers/sume_poller "$PY" -m tests.sim --schedules 1000 --workers 2 --quiet) ;;
    @*)          cmd=(make --no-print-directory "${tier#@}") ;;
    *) echo "run-tiers: unknown tier $tier" >&2; exit 2 ;;
  esac
  case "$tier" in
    @setup-lint) cmd=(nice -n 10 "${cmd[@]}") ;;
    @setup-e2e|simulation) cmd=(nice -n 5 "${cmd[@]}") ;;
  esac
  ( started=$SECONDS
    "${cmd[@]}" >"$LOGS/$tier.log" 2>&1
    code=$?
    # CPU time of what the tier ran (bash's `times`: this subshell's waited-for children), which
    # the wall time on shared cores does not show: the sum over tiers is what the run costs.
    times >"$LOGS/$tier.times"  # not in a pipe: that runs it in a subshell with no children
    cpu=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); t += p[1] * 60 + p[2] } printf "%.0f", t }' "$LOGS/$tier.times")
    echo "== $tier: exit $code after $((SECONDS - started)) s, ${cpu} CPU-s" >>"$LOGS/$tier.log"
    exit "$code" ) &
  tier_of[$!]=$tier
  chain_of[$!]=${2:-}
  echo "== $tier: started (log: $LOGS/$tier.log)"
}

# Each chain is kept as the words still to start; advance CHAIN starts its tiers up to and
# including its next "@target", and leaves the rest for when that target is done.
chains=("")
for word in "$@"; do
  if [[ $word == "," ]]; then chains+=(""); else chains[-1]+="$word "; fi
done
advance() {  # advance CHAIN
  local words=(${chains[$1]}) i=0
  while ((i < ${#words[@]})); do
    start_tier "${words[$i]}" "$1"
    if [[ ${words[$i]} == @* ]]; then i=$((i + 1)); break; fi
    i=$((i + 1))
  done
  chains[$1]="${words[*]:i}"
}
for c in "${!chains[@]}"; do advance "$c"; done

while ((${#tier_of[@]})); do
  wait -n -p finished "${!tier_of[@]}"
  code=$?
  tier=${tier_of[$finished]}
  chain=${chain_of[$finished]}
  unset "tier_of[$finished]" "chain_of[$finished]"
  echo
  echo "==================================== $tier ===================================="
  cat "$LOGS/$tier.log"
  cpu=$(sed -n 's/^== .*: exit .* s, \([0-9]*\) CPU-s$/\1/p' "$LOGS/$tier.log" | tail -1)
  cpu_total=$((cpu_total + ${cpu:-0}))
  ((code == 0)) || failed+=("$tier")
  if [[ $tier == @* ]]; then
    if ((code == 0)); then
      advance "$chain"
    else
      for word in ${chains[$chain]}; do [[ $word == @* ]] || failed+=("$word (not run)"); done
      chains[$chain]=""
    fi
  fi
done

echo
echo "CPU time of all steps: $cpu_total CPU-s"
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all passed: $*"
