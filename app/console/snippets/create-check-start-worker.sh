# shellcheck shell=bash disable=SC2154  # $image_id: check-release-image.sh
# How start-worker.sh starts a checked release image (W3, D5): as create-check-start.sh does for
# the agent, the containers are created, not started; the worker's must have been created from
# exactly the image check-release-image.sh checked, or it is removed before it ever runs.
# `compose` is start-worker.sh's function (.env, the -f files, no token).

  compose up --no-start --no-build --pull never node-agent runtime-worker
  created_from=$(docker inspect --format '{{.Image}}' "$(compose ps -a -q runtime-worker)")
  if [[ "$created_from" != "$image_id" ]]; then
    compose rm -f -s runtime-worker
    echo "modelforge: runtime-worker was created from image $created_from, not the checked $image_id;" \
      "it was removed before it started." >&2
    exit 1
  fi
  compose start node-agent runtime-worker
