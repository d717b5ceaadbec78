# shellcheck shell=bash
# I3: the state volume keeps identity and credential, so the container is recreated from .env
# alone; `env -u` also keeps a token still exported in the admin's shell out of it. For a release or
# pinned image @@UNSET_IMAGE@@ drops an exported MODELFORGE_NODE_AGENT_IMAGE too, so the image
# named in .env is the one that runs; @@UP_FLAGS@@ keeps Compose from building or pulling it (D5).

# Recreate node-agent without the enrolment token; identity and credential stay in the state volume.
env -u MODELFORGE_AGENT_ENROLLMENT_TOKEN@@UNSET_IMAGE@@ docker compose --env-file .env -f @@COMPOSE@@ up -d --force-recreate@@UP_FLAGS@@ node-agent
