# shellcheck shell=bash
# The runtime worker's start command (W1-W3, D5): worker_start_command() in app/console/commands.py
# fills it, once for the GPU image and once for the CPU image. It holds no secret and reads none.
# @@FILES@@ is the Compose files as -f options (the node-agent file, the worker overlay and, for
# the CPU image, its overlay), @@FILE_NAMES@@ the same names for the check that they are here.
# The agent is recreated too, so that it mounts the socket volume the overlay adds; from .env alone
# and without a token still exported in the admin's shell (I3), as recreate.sh does.
# @@IMAGE_CHECK@@ is check-release-image.sh for the worker's entry of a pasted release manifest,
# which exports @@VARIABLE@@; otherwise @@NEEDS_ENV_IMAGE@@ makes sure .env names the worker image.
# @@UNSET_IMAGES@@ drops exported image variables so that .env (or the check) decides what runs.
# @@START@@ starts both services: for a checked release image the worker container is created,
# compared with the checked image and only then started, as create-check-start.sh does for the
# agent; otherwise one `up -d` with @@UP_FLAGS@@.

# ModelForge: start the runtime worker (@@WHICH@@) beside the node agent. Paste in deploy/ once the node is ready.
(
  set -euo pipefail
  for required in .env @@FILE_NAMES@@; do
    if [[ ! -f "$required" ]]; then
      echo "modelforge: no $required in $PWD; cd to the deploy/ directory that holds .env and the Compose files." >&2
      exit 1
    fi
  done
  if ! command -v docker >/dev/null; then
    echo "modelforge: docker is not on PATH; install Docker with Compose v2 first." >&2
    exit 1
  fi
@@IMAGE_CHECK@@
@@NEEDS_ENV_IMAGE@@
  compose() { env -u MODELFORGE_AGENT_ENROLLMENT_TOKEN@@UNSET_IMAGES@@ docker compose --env-file .env@@FILES@@ "$@"; }
@@START@@
  compose ps runtime-worker
  echo "modelforge: runtime worker started. The node page shows it and its compatibility within a minute;" \
    "its log: docker compose@@FILES@@ logs runtime-worker" >&2
)
