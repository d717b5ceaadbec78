# shellcheck shell=bash
# Reads one secret from a hidden prompt into the variable @@VARIABLE@@ and refuses a wrong one; one
# place for both secret-reading snippets (C4, I5). No echo, pasted whitespace dropped, and the
# charset check also keeps the value a valid .env line (P2). The secret is never echoed back, even
# when refused. @@PREFIX@@ is what every such secret starts with; @@PROMPT@@, @@KIND@@ and
# @@OUTCOME@@ are words of the prompt and of the refusal.

  @@VARIABLE@@=''
  IFS= read -rs -p 'Paste @@PROMPT@@ (input hidden): ' @@VARIABLE@@ || true
  printf '\n' >&2
  @@VARIABLE@@=${@@VARIABLE@@//[[:space:]]/}
  if [[ ! "$@@VARIABLE@@" =~ ^@@PREFIX@@[[:alnum:]_-]+$ ]]; then
    echo "modelforge: that is not @@KIND@@ (they start with @@PREFIX@@); nothing was @@OUTCOME@@." >&2
    exit 1
  fi
