# shellcheck shell=bash disable=SC2154  # $secret_file: start.sh
# How start.sh starts a pinned or locally built image; @@UP_FLAGS@@ keeps Compose from building a
# pinned image (D5).

  docker compose --env-file "$secret_file" -f @@COMPOSE@@ up -d@@UP_FLAGS@@ node-agent
