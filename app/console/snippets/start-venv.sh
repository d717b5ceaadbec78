# shellcheck shell=bash
# The wizard's bare-metal start command (C4, N3, N4): venv_start_command() in
# app/console/commands.py fills it. It runs in a ModelForge checkout on the node whose .venv has the
# project installed, in a subshell so `set -e`, the traps and `exit` never touch the admin's shell.
# @@MAKE_DIRS@@ creates the agent's four data directories below $agent_data and @@SETTINGS@@ exports
# its settings: the same variables as the README's bare-metal block, from app.rules. The preflight
# checks those directories as the agent's health will, and nothing starts if it fails.
#
# C4: the token goes from a hidden prompt into the agent's environment only: never echoed, traced,
# written to a file, or in any process's argv. A node whose state directory already holds its
# credential is not asked for one (I3), so the same command restarts the agent later.

# ModelForge: start the node agent from this checkout's virtual environment (no Docker).
(
  { set +x; } 2>/dev/null
  set -euo pipefail
  umask 077
  if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c 'import modelforge_node_agent' 2>/dev/null; then
    echo "modelforge: no .venv with the agent in $PWD; in a ModelForge checkout run: python3 -m venv .venv && .venv/bin/pip install -e ." >&2
    exit 1
  fi
  # The agent's data directories live below this one; change it to move them.
  agent_data=$HOME/modelforge-node-agent
  mkdir -p --@@MAKE_DIRS@@
@@SETTINGS@@
  if ! .venv/bin/python -m modelforge_node_agent --preflight; then
    echo "modelforge: the preflight above failed; nothing was started." >&2
    exit 1
  fi
  if [[ -s "$agent_data/state/node-credential" ]]; then
    echo "modelforge: this node is enrolled already; starting the agent without a token." >&2
    token=''
  else
    echo "modelforge: this node is not enrolled yet; it needs the one-time token." >&2
@@READ_TOKEN@@
  fi
  MODELFORGE_AGENT_ENROLLMENT_TOKEN=$token nohup .venv/bin/python -m modelforge_node_agent >>"$agent_data/agent.log" 2>&1 &
  unset token
  echo "modelforge: started the agent (process $!); its log is $agent_data/agent.log." >&2
)
