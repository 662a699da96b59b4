#!/usr/bin/env bash
# Create a virtualenv if needed and install into it; mark it installed.
#   scripts/venv.sh DIR PYTHON "PIP-ARGS" PREREQUISITE...
# The installer is uv (scripts/uv.sh: it resolves and downloads in parallel, 10-100x faster than
# pip here: checkov's tree took 3 s against 350 s), except for .venv-uv, uv itself, which pip
# installs. MARK (default .installed) names the file in DIR that marks the install done, so one
# virtualenv can take a second set of packages (the benchmarks' extras). The output goes to
# .scratch/logs/DIR.log, printed only if the install fails. Nothing is byte-compiled at install
# (modules compile when first imported). One install per virtualenv at a time (flock): `make test`
# may ask for .venv from two chains at once, and the second then finds it installed (newer than
# every prerequisite) and returns.
set -euo pipefail
dir=$1 python=$2 pipargs=$3
shift 3
mark=$dir/${MARK:-.installed}
mkdir -p .scratch/logs .scratch/locks
exec 9>".scratch/locks/${dir#.}.lock"
flock 9
if [[ -e $mark ]]; then
  fresh=1
  for prerequisite in "$@"; do [[ $mark -nt $prerequisite ]] || fresh=0; done
  ((fresh)) && exit 0
fi
log=".scratch/logs/$dir${MARK:+$MARK}.log"
echo "installing $dir ($pipargs)"
install() {
  # shellcheck disable=SC2086  # PIP-ARGS is a word list
  if [[ $dir == .venv-uv ]]; then
    [[ -x $dir/bin/python ]] || "$python" -m venv "$dir"
    "$dir/bin/python" -m pip install --no-compile $pipargs
  else
    [[ -x $dir/bin/python ]] || scripts/uv.sh venv --seed --python "$python" "$dir"
    scripts/uv.sh pip install --python "$dir/bin/python" $pipargs
  fi
}
install >"$log" 2>&1 || { cat "$log"; echo "install into $dir failed (log above)"; exit 1; }
touch "$mark"
