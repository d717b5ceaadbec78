# shellcheck shell=bash
# D5: Compose prefers an image exported in the admin's shell to the pinned one in .env.

  unset MODELFORGE_NODE_AGENT_IMAGE  # the pinned image in .env is the one that runs
