#!/usr/bin/env bash
# Build the documentation site with mkdocs --strict (every warning an error), as CI does.
#
#     bash docs/build.sh [ENV] [OUT]
#
# ENV: a Python environment (default .venv) in which cbcl is installed, or at least its
# dependencies: the CLI reference imports the cbcl command's parser (from the checkout when
# the environment has no cbcl). docs/requirements.txt is installed into it first.
# OUT: where the site goes (default: a new temporary directory, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

env_dir=${1:-.venv}
[ -x "$env_dir/bin/python" ] || { echo "docs/build.sh: no Python environment at $env_dir" >&2; exit 1; }
out=${2:-$(mktemp -d "${TMPDIR:-/tmp}/cbcl-site.XXXXXX")}

"$env_dir/bin/python" -m pip install --quiet -r docs/requirements.txt
"$env_dir/bin/python" -m mkdocs build --strict --config-file mkdocs.yml --site-dir "$out"
echo "docs/build.sh: site built in $out"
