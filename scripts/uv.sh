#!/usr/bin/env bash
# uv (from .venv-uv, see scripts/venv.sh) with pip's configuration: uv does not read pip's, so
# what `pip config list` shows (its files and PIP_* variables) is handed to uv as its own
# variables: the index (or none), extra indexes, find-links, constraints, trusted hosts and CA
# bundle, with pip's strategy of the best version from any index (proxies: both read HTTPS_PROXY).
# Used for the virtualenvs and the layer's sam build.
#   scripts/uv.sh pip install --python DIR/bin/python -r requirements.txt
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export UV_INDEX_STRATEGY=unsafe-best-match
while IFS='=' read -r key value; do
  value=${value#\'} value=${value%\'}
  case "${key##*.}" in
    index-url)       export UV_DEFAULT_INDEX=$value ;;
    extra-index-url) export UV_INDEX=$value ;;
    find-links)      export UV_FIND_LINKS=${value// /,} ;;
    constraint)      export UV_CONSTRAINT=$value ;;
    cert)            export SSL_CERT_FILE=$value ;;
    trusted-host)    export UV_INSECURE_HOST=$value ;;
    no-index)        [[ $value =~ ^(1|true|yes|on)$ ]] && export UV_NO_INDEX=1 ;;
  esac
done < <("$here/.venv-uv/bin/python" -m pip config list 2>/dev/null)
exec "$here/.venv-uv/bin/uv" "$@"
