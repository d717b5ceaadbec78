# shellcheck shell=bash
# How start-worker.sh starts a pinned or locally built worker image; @@UP_FLAGS@@ keeps Compose
# from building (or, for a release, pulling) what must be loaded already (D5). `compose` is
# start-worker.sh's function (.env, the -f files, no token).

  compose up -d@@UP_FLAGS@@ node-agent runtime-worker
