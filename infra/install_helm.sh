#!/usr/bin/env bash
# Helm, for rendering and linting the Kubernetes chart (infra/helm/ledgerlm) in the unit
# tests. Helm ships no binary through a package registry we can reach, so it is built from
# the Go module proxy, pinned, into .local/bin/helm-VERSION, with .local/bin/helm pointing
# at it; a later run finds it there and builds nothing. The Go caches are removed after a
# good build.
set -euo pipefail
SERVICE=helm
source "$(dirname "$0")/lib.sh"

MODULE=helm.sh/helm/v3/cmd/helm
VERSION=v3.22.1
BIN="$LOCAL/bin/helm-$VERSION"
LINK="$LOCAL/bin/helm"
BUILD_LOG="$LOGS/helm-build.log"

if [ -x "$BIN" ]; then
  ln -sfn "$(basename "$BIN")" "$LINK"
  say "helm $VERSION is built ($(rel "$LINK"))"
  exit 0
fi

go="$(command -v go || echo /usr/local/go/bin/go)"
[ -x "$go" ] || die "no Go toolchain (need Go >= 1.24 on PATH or at /usr/local/go/bin/go)"
gobuild="$LOCAL/go-helm"
say "building helm $VERSION with $("$go" env GOVERSION) (log: $(rel "$BUILD_LOG"); a few minutes)"
began=$SECONDS
(
  export GOPATH="$gobuild" GOMODCACHE="$gobuild/mod" GOCACHE="$gobuild/cache" \
    GOBIN="$gobuild/bin" GOFLAGS=-mod=mod CGO_ENABLED=0
  timeout 1200 "$go" install "$MODULE@$VERSION"
) >"$BUILD_LOG" 2>&1 || { show_log "$BUILD_LOG"; die "go install $MODULE@$VERSION failed"; }
mkdir -p "$LOCAL/bin"
mv -f "$gobuild/bin/helm" "$BIN"
GOPATH="$gobuild" GOMODCACHE="$gobuild/mod" GOCACHE="$gobuild/cache" \
  timeout 300 "$go" clean -cache -modcache >>"$BUILD_LOG" 2>&1 || true
rm -rf "$gobuild"
ln -sfn "$(basename "$BIN")" "$LINK"
"$LINK" version --short >/dev/null 2>&1 || die "the built helm does not run (see $(rel "$BUILD_LOG"))"
say "built helm $VERSION in $(elapsed "$began") ($(rel "$LINK"))"
