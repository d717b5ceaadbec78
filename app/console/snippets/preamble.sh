# shellcheck shell=bash
# The first lines of both secret-reading snippets, inside their subshell (C4, I5); @@COMPOSE@@ is
# the Compose file's name. Tracing goes off first, and that line is not traced itself. The traps
# remove the temporary secret file on success, on error and on HUP/INT/TERM (exit 128+signal); the
# file variable is empty until mktemp has made the file.

  { set +x; } 2>/dev/null
  set -euo pipefail
  umask 077
  secret_file=''
  trap 'if [[ -n "$secret_file" ]]; then rm -f -- "$secret_file"; fi' EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'echo "modelforge: stopped after an error; no secret file is left behind." >&2' ERR
  for required in .env @@COMPOSE@@; do
    if [[ ! -f "$required" ]]; then
      echo "modelforge: no $required in $PWD; cd to the deploy/ directory that holds .env and @@COMPOSE@@." >&2
      exit 1
    fi
  done
  if ! command -v docker >/dev/null; then
    echo "modelforge: docker is not on PATH; install Docker with Compose v2 first." >&2
    exit 1
  fi
