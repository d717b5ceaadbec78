# shellcheck shell=bash
# W3, D5: a release or pinned agent is never built on the node, and neither is its worker; without
# a checked release entry for it, the worker image is the one .env names in @@VARIABLE@@.

  image_setting='^[[:space:]]*(export[[:space:]]+)?@@VARIABLE@@[[:space:]]*=[[:space:]]*[^[:space:]#]'
  if ! grep -Eq "$image_setting" .env; then
    echo "modelforge: set @@VARIABLE@@ in .env to the worker image's release tag or @sha256 digest first." >&2
    exit 1
  fi
