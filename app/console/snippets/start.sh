# shellcheck shell=bash disable=SC2154  # $token: read-secret.sh (@@READ_TOKEN@@)
# The wizard's start command (C4, D5, P2): start_command() in app/console/commands.py fills it.
# It runs in a subshell so `set -e`, the traps and `exit` never touch the admin's interactive
# shell. @@PREAMBLE@@ is preamble.sh; @@IMAGE_CHECK@@ is check-release-image.sh for a release
# bundle, use-pinned-image.sh for a pinned image, nothing for a local build; @@START_AGENT@@ is
# create-check-start.sh for a release bundle, up.sh otherwise.
#
# C4: the token goes from a hidden prompt into a mode-0600 temp file through the printf builtin,
# so it is never echoed, traced, in the shell history or in any process's argv. The temp file is
# the token line followed by .env (less any token line of its own), given to Compose as its only
# --env-file: every Compose v2 reads one env file, while a second --env-file is honoured only from
# 2.17 on (earlier ones silently use just the last). The token comes first so that a malformed
# .env line, which some Compose versions report with the rest of the file, is never reported with
# the token. The file is gone when the subshell ends. The charset check also keeps the token line
# parseable (P2).

# ModelForge: start the node agent with the one-time enrolment token. Paste in deploy/.
(
@@PREAMBLE@@
@@IMAGE_CHECK@@
  # I4: inside the container the agent sees only the container's name, which changes on every
  # recreate; the node's own name goes into .env once, so duplicate identities stay visible.
  hostname_setting='^[[:space:]]*(export[[:space:]]+)?MODELFORGE_AGENT_HOSTNAME[[:space:]]*=[[:space:]]*[^[:space:]#]'
  if ! grep -Eq "$hostname_setting" .env; then
    node_hostname=$(uname -n)
    if [[ ! "$node_hostname" =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]]; then
      echo "modelforge: set MODELFORGE_AGENT_HOSTNAME in .env to this node's host name first." >&2
      exit 1
    fi
    if [[ -s .env && -n "$(tail -c 1 .env)" ]]; then echo >>.env; fi
    echo "MODELFORGE_AGENT_HOSTNAME=$node_hostname" >>.env
    echo "modelforge: added MODELFORGE_AGENT_HOSTNAME=$node_hostname to .env." >&2
  fi
@@READ_TOKEN@@
  secret_file=$(mktemp "${TMPDIR:-/tmp}/modelforge-enrol.XXXXXXXXXX")
  chmod 600 -- "$secret_file"
  builtin printf 'MODELFORGE_AGENT_ENROLLMENT_TOKEN=%s\n' "$token" >"$secret_file"
  unset token MODELFORGE_AGENT_ENROLLMENT_TOKEN
  token_setting='^[[:space:]]*(export[[:space:]]+)?MODELFORGE_AGENT_ENROLLMENT_TOKEN[[:space:]]*='
  grep -Ev "$token_setting" .env >>"$secret_file" || true
  echo "modelforge: starting node-agent; the token is in a mode-0600 temp file, removed when this ends." >&2
@@START_AGENT@@
  echo "modelforge: started. When the console shows the node ready, run the recreate command." >&2
)
