# shellcheck shell=bash disable=SC2154  # $credential: read-secret.sh (@@READ_CREDENTIAL@@)
# I5, I2: after a rotation the new credential goes into <state>/node-credential exactly as the
# agent writes it (write_private_file: the text plus "\n", mode 0600, atomic rename; the agent's
# State._read_state strips the newline). The temp file is made inside the state directory so the
# rename is atomic, and is prepared (written, chmod, chown) before anything is stopped, so a
# failure leaves the node as it was. The state directory is taken from .env and exported, so
# Compose mounts exactly the directory written to. Only host paths: a named volume has no path
# the admin can write to here. Runs in a subshell, as start.sh does; @@PREAMBLE@@ is preamble.sh.

# ModelForge: install a rotated node credential into the agent's state directory. Paste in deploy/, as root.
(
@@PREAMBLE@@
  state_dir=''
  setting='^[[:space:]]*(export[[:space:]]+)?MODELFORGE_AGENT_STATE_VOLUME[[:space:]]*[=:][[:space:]]*(.*)$'
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" =~ $setting ]]; then state_dir=${BASH_REMATCH[2]}; fi
  done <.env
  single_quoted="^'([^']*)'"
  double_quoted='^"([^"\\$]*)"'
  if [[ "$state_dir" =~ $single_quoted || "$state_dir" =~ $double_quoted ]]; then
    state_dir=${BASH_REMATCH[1]}
  elif [[ "$state_dir" == [\'\"]* || "$state_dir" == *'$'* ]]; then
    echo "modelforge: write MODELFORGE_AGENT_STATE_VOLUME in .env as a plain path (no \$ or escapes)." >&2
    exit 1
  else
    state_dir=${state_dir%% #*}
    state_dir=${state_dir%"${state_dir##*[![:space:]]}"}
  fi
  if [[ "$state_dir" != /* || ! -d "$state_dir" ]]; then
    echo "modelforge: MODELFORGE_AGENT_STATE_VOLUME in .env must be the absolute path of an existing host" \
      "directory (now: '${state_dir}'). Named Docker volumes are not supported here: use a host path." >&2
    exit 1
  fi
  if [[ -n "${MODELFORGE_AGENT_STATE_VOLUME:-}" && "$MODELFORGE_AGENT_STATE_VOLUME" != "$state_dir" ]]; then
    echo "modelforge: your shell exports MODELFORGE_AGENT_STATE_VOLUME=$MODELFORGE_AGENT_STATE_VOLUME but .env" \
      "says $state_dir; unset it or make them agree." >&2
    exit 1
  fi
  export MODELFORGE_AGENT_STATE_VOLUME="$state_dir"
  unset MODELFORGE_AGENT_ENROLLMENT_TOKEN
@@READ_CREDENTIAL@@
  secret_file=$(mktemp "$state_dir/.node-credential.XXXXXXXXXX")
  chmod 600 -- "$secret_file"
  builtin printf '%s\n' "$credential" >"$secret_file"
  unset credential
  if ! chown -- 65532:65532 "$secret_file"; then
    echo "modelforge: cannot give the credential file to the agent's user (65532:65532); nothing was" \
      "changed. Open a root shell (sudo -i), cd back to this directory and paste this again." >&2
    exit 1
  fi
  sync
  echo "modelforge: stopping node-agent, replacing $state_dir/node-credential, recreating node-agent." >&2
  docker compose --env-file .env -f @@COMPOSE@@ stop node-agent
  mv -f -- "$secret_file" "$state_dir/node-credential"
  secret_file=''
  sync
  docker compose --env-file .env -f @@COMPOSE@@ up -d --force-recreate node-agent
  echo "modelforge: done; the node should show online again in the console within a minute." >&2
)
