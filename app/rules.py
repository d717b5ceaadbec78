"""Rules stated once: what counts as text, a label, an agent image reference (P5, D2, C4).

Standard library only and importing nothing from the app, so the deploy scripts that run on a
node without Flask (`deploy/env_preflight.py`, `deploy/release_manifest.py`) import it without the
package's Flask factory (deploy/app_modules.py) and apply the very same rules as the control
plane's API, console and OpenAPI document.
"""

from __future__ import annotations

import re

# Characters no text field accepts: C0 and C1 controls and DEL (NUL cannot even be stored in
# PostgreSQL text), every space but the ASCII one, line and paragraph separators, and the invisible
# format characters that hide or reorder text (soft hyphen, zero-width marks, bidi embeddings,
# overrides and isolates, the bidi marks U+200E/U+200F and U+061C — U+202E would reverse the
# timestamps printed after it; the console also isolates agent text in <bdi>). Written so that
# ECMA-262, Python's `re`, Rust's `regex` (pydantic's) and Go's RE2 all read it the same way, so it
# is published as-is in the OpenAPI document. Lone surrogates are refused too — they are not
# Unicode text, no UTF-8 encoding exists for them — but no pattern says so: Rust and RE2 cannot even
# name a surrogate, and tools built on them drop a pattern that does (schemathesis then generated
# C1 controls as "valid" data).
FORBIDDEN_CHARACTERS = (
    r"\x00-\x1f\x7f-\xa0\xad\u061c\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\ufeff\ufff9-\ufffb"
)
TEXT_PATTERN = rf"^[^{FORBIDDEN_CHARACTERS}]*$"
# Required text: at least one character besides the ASCII space (the only space allowed at all).
REQUIRED_TEXT_PATTERN = rf"^ *[^ {FORBIDDEN_CHARACTERS}][^{FORBIDDEN_CHARACTERS}]*$"
TEXT_RULE = "printable text (no control, format or separator characters, no space but ' ')"
_TEXT = re.compile(rf"[^{FORBIDDEN_CHARACTERS}]*")


def is_text(value: str) -> bool:
    """Whether `value` is printable text by the one rule above, lone surrogates refused."""
    if _TEXT.fullmatch(value) is None:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800" from a JSON escape
        return False
    return True


# Labels on enrolments and nodes: scheduling metadata, the same rules from the API and the console.
LABEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"
LABEL_KEY_RULE = "up to 63 letters, digits, . _ / - starting with a letter or digit"
MAX_LABELS = 32
MAX_LABEL_VALUE_LENGTH = 200
_LABEL_KEY = re.compile(LABEL_KEY_PATTERN[1:-1])


def label_problem(key: object, value: object) -> str | None:
    """Why one label is refused, or None (fullmatch: a key ending in a newline is refused)."""
    if not isinstance(key, str) or _LABEL_KEY.fullmatch(key) is None:
        return f"a label name is {LABEL_KEY_RULE}"
    if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE_LENGTH or not is_text(value):
        return f"a label value is up to {MAX_LABEL_VALUE_LENGTH} printable characters"
    return None


# What nodes do (J1, J3): storage root names and paths, Hub repository ids, revisions, patterns.
ROOT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# N4: the agent's four named data directories as its inventory names them, and the variable that
# sets each (the agent's DATA_DIRS; a unit test holds the two together). The readiness hint and the
# wizard's bare-metal start command name them from here.
AGENT_DATA_DIR_VARIABLES = {
    "state": "MODELFORGE_AGENT_STATE_DIR",
    "hf-cache": "MODELFORGE_AGENT_HF_CACHE_DIR",
    "artifacts": "MODELFORGE_AGENT_ARTIFACT_DIR",
    "quarantine": "MODELFORGE_AGENT_QUARANTINE_DIR",
}
MAX_PATH_LENGTH = 1000
REPO_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_REPO_ID_LENGTH = 96
# A branch, a tag, `refs/pr/N` or a 40-hex commit.
REVISION_PATTERN = r"^[A-Za-z0-9._/-]+$"
MAX_REVISION_LENGTH = 200
MAX_PATTERNS = 64
MAX_PATTERN_LENGTH = 200

# S2: a deployment's name is what clients send as OpenAI's `model` (letters, digits, . _ : / -).
MAX_DEPLOYMENT_NAME_LENGTH = 64
DEPLOYMENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$"
DEPLOYMENT_NAME_RULE = "1 to 64 letters, digits, . _ : / - starting with a letter or digit"
# Larger whole numbers lose precision in JSON parsers that read every number as a double.
MAX_BYTES = 2**62

# P5: a number written as text — by a node (nvidia-smi's output), or in a query string — is read
# only as ASCII digits, and only as many as the largest value allowed has: int() alone also takes
# " 5", "+5", "٥" and "1_000", and raises ValueError past 4,300 digits (sys.get_int_max_str_digits).
_WHOLE_NUMBER = re.compile(r"-?[0-9]{1,20}")


def whole_number(text: str, minimum: int = 0, maximum: int = MAX_BYTES) -> int | None:
    """The whole number `text` writes in ASCII digits, within minimum..maximum; None for anything else."""
    if not isinstance(text, str) or _WHOLE_NUMBER.fullmatch(text) is None:
        return None
    value = int(text)
    return value if minimum <= value <= maximum else None


def _absolute_path_pattern() -> str:
    """An absolute POSIX directory path: printable segments, none empty, `.` or `..`."""
    char = rf"[^/{FORBIDDEN_CHARACTERS}]"
    first = rf"[^/.{FORBIDDEN_CHARACTERS}]"
    segment = rf"(\.\.{char}+|\.{first}{char}*|{first}{char}*)"
    return rf"^(/{segment})+/?$"


ABSOLUTE_PATH_PATTERN = _absolute_path_pattern()
_ABSOLUTE_PATH = re.compile(ABSOLUTE_PATH_PATTERN[1:-1])


def absolute_path_problem(path: str) -> str | None:
    """J1: why a root path is refused (the pattern above decides; the message says why), or None."""
    if len(path) <= MAX_PATH_LENGTH and _ABSOLUTE_PATH.fullmatch(path) and is_text(path):
        return None
    if len(path) > MAX_PATH_LENGTH:
        return f"Use at most {MAX_PATH_LENGTH} characters."
    if not is_text(path):
        return "Use printable characters only."
    if not path.startswith("/"):
        return "Write an absolute path, starting with /."
    return "Write the path without empty, . or .. parts (no // and no going up)."


def _relative_path_pattern() -> str:
    """A relative POSIX file path: printable segments, none empty, `.` or `..`, no backslash."""
    char = rf"[^/\\{FORBIDDEN_CHARACTERS}]"
    first = rf"[^/.\\{FORBIDDEN_CHARACTERS}]"
    segment = rf"(\.\.{char}+|\.{first}{char}*|{first}{char}*)"
    return rf"^{segment}(/{segment})*$"


# W2: a model file inside an artifact (`model_file`), relative to the artifact's directory. The
# worker resolves it again against its own artifact directory and refuses what leaves it (symlinks
# included); this rule only keeps a path that names a way out from ever being queued.
RELATIVE_PATH_PATTERN = _relative_path_pattern()
RELATIVE_PATH_RULE = "a path inside the artifact: no leading /, no empty, . or .. parts, no backslash"
_RELATIVE_PATH = re.compile(RELATIVE_PATH_PATTERN[1:-1])


def relative_path_problem(path: str) -> str | None:
    """W2: why a model file path is refused (the pattern above decides; the message says why), or None."""
    if len(path) <= MAX_PATH_LENGTH and _RELATIVE_PATH.fullmatch(path) and is_text(path):
        return None
    if len(path) > MAX_PATH_LENGTH:
        return f"Use at most {MAX_PATH_LENGTH} characters."
    if not is_text(path):
        return "Use printable characters only."
    if path.startswith("/"):
        return "Write the path inside the artifact, without a leading /."
    if "\\" in path:
        return "Separate directories with /, not a backslash."
    return "Write the path without empty, . or .. parts (no // and no going up)."


# An image reference as Docker reads one: [registry[:port]/]path[:tag][@sha256:digest].
_IMAGE_NAME = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
_IMAGE_REFERENCE = re.compile(
    rf"{_IMAGE_NAME}(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?"
)
IMAGE_REFERENCE_FORM = "registry/path/name:tag or registry/path/name@sha256:<64 hex digits>"


def image_reference_problem(reference: str, *, digest_required: bool = False) -> str | None:
    """D2: why an agent image reference is refused, or None.

    An image needs a tag other than `latest` or an `@sha256:` digest: a reference with neither means
    `latest` to Docker, so an untagged image is refused exactly like `:latest`.
    """
    match = _IMAGE_REFERENCE.fullmatch(reference)
    if match is None:
        return f"it is not an image reference ({IMAGE_REFERENCE_FORM})"
    if match["digest"]:
        return None
    if digest_required:
        return "it is not pinned by digest (name@sha256:<64 hex digits>; a tag before @ is optional)"
    if match["tag"] is None:
        return "it has no tag, which means latest; name a release tag or an @sha256 digest"
    if match["tag"] == "latest":
        return "it uses the floating latest tag; name a release tag or an @sha256 digest"
    return None
