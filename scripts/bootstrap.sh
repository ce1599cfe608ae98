#!/usr/bin/env bash
# Creates .venv (if missing) and installs halfmq into it with the given extras, e.g. `bootstrap.sh test`.
# Skips the install when pyproject.toml has not changed since the last successful one.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
stamps=".venv/.halfmq-installed-$(sha256sum pyproject.toml | cut -c1-16)"
stamp="$stamps-${extras:-base}"
# A request is met by any install of this pyproject.toml with at least its extras (every install has the base).
wanted=$(tr ',' '\n' <<<"$extras" | grep -v '^$' | sort -u || true)
for installed in "$stamps"-*; do
    [ -e "$installed" ] || continue
    have=$(tr ',' '\n' <<<"${installed#"$stamps"-}" | sort -u)
    if [ -z "$(comm -23 <(printf '%s\n' "$wanted" | grep -v '^$' || true) <(printf '%s\n' "$have"))" ]; then
        exit 0
    fi
done
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install -qq -e "$spec"  # -qq: not the build backend's notes (an editable install's "be careful" box)
    touch "$stamp"
fi
