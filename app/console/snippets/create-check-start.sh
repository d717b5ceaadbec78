# shellcheck shell=bash disable=SC2154  # $secret_file: start.sh; $image_id: check-release-image.sh
# How start.sh starts a release image (D5): the container is created, not started, and must have
# been created from exactly the image check-release-image.sh checked; only then does it start, so a
# different image never runs with the token.

  docker compose --env-file "$secret_file" -f @@COMPOSE@@ up --no-start --no-build --pull never node-agent
  container_id=$(docker compose --env-file "$secret_file" -f @@COMPOSE@@ ps -a -q node-agent)
  created_from=$(docker inspect --format '{{.Image}}' "$container_id")
  if [[ "$created_from" != "$image_id" ]]; then
    docker compose --env-file "$secret_file" -f @@COMPOSE@@ rm -f -s node-agent
    echo "modelforge: node-agent was created from image $created_from, not the checked $image_id;" \
      "it was removed before it started." >&2
    exit 1
  fi
  docker compose --env-file "$secret_file" -f @@COMPOSE@@ start node-agent
