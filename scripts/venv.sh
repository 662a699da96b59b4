#!/usr/bin/env bash
# Create a virtualenv if needed and pip install into it; mark it installed.
#   scripts/venv.sh DIR PYTHON "PIP-ARGS" PREREQUISITE...
# pip's output goes to .scratch/logs/DIR.log, printed only if pip fails. --no-compile: modules are
# byte-compiled when first imported instead of all at install (most are never imported).
# One install per virtualenv at a time (flock): `make test` may ask for .venv from two chains at
# once, and the second then finds it installed (newer than every prerequisite) and returns.
set -euo pipefail
dir=$1 python=$2 pipargs=$3
shift 3
mkdir -p .scratch/logs .scratch/locks
exec 9>".scratch/locks/${dir#.}.lock"
flock 9
if [[ -e $dir/.installed ]]; then
  fresh=1
  for prerequisite in "$@"; do [[ $dir/.installed -nt $prerequisite ]] || fresh=0; done
  ((fresh)) && exit 0
fi
echo "installing $dir ($pipargs)"
[[ -x $dir/bin/python ]] || "$python" -m venv "$dir"
# shellcheck disable=SC2086  # PIP-ARGS is a word list
"$dir/bin/python" -m pip install --no-compile $pipargs >".scratch/logs/$dir.log" 2>&1 \
  || { cat ".scratch/logs/$dir.log"; echo "pip install into $dir failed (log above)"; exit 1; }
touch "$dir/.installed"
