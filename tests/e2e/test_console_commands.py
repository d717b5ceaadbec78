"""The wizard's .env and Bash snippets (C4, I3, I5, P2, W3), run for real with bash and shellcheck.

A stand-in `docker` earlier on PATH records its argv and, for each `--env-file`, the file's path,
mode and contents (the only way to see the secret file, which is gone by the time bash returns).
"""

from __future__ import annotations

import json
import os
import pty
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from dotenv import dotenv_values
from hypothesis import given, settings
from hypothesis import strategies as st

from app.console.commands import (
    COMPOSE_FILE,
    LOCAL_BUILD,
    WORKER_COMPOSE_FILE,
    WORKER_CPU,
    WORKER_CPU_COMPOSE_FILE,
    WORKER_GPU,
    AgentEnv,
    env_file,
    env_value_error,
    pinned_image,
    recreate_command,
    replace_credential_command,
    start_command,
    venv_start_command,
    worker_start_command,
)
from modelforge_node_agent import State
from tests.support import PROJECT_ROOT, assert_no_secrets, wait_until
from tests.support.compose_dotenv import read_compose_dotenv

TOKEN = "mfe_" + secrets.token_urlsafe(32)
CREDENTIAL = "mfn_" + secrets.token_urlsafe(32)
OLD_CREDENTIAL = "mfn_" + secrets.token_urlsafe(32)
URL = "https://mf.lan:8000"
AGENT_UID = 65532
TIMEOUT = 30

FAKE_DOCKER = """\
import json, os, signal, stat, sys, time

signal.signal(signal.SIGINT, signal.SIG_DFL)  # die of Ctrl-C like a real CLI, no traceback
args = sys.argv[1:]
entry = {
    "argv": args,
    "env_files": [],
    "token_env": os.environ.get("MODELFORGE_AGENT_ENROLLMENT_TOKEN"),
    "state_volume_env": os.environ.get("MODELFORGE_AGENT_STATE_VOLUME"),
    "image_env": {name: value for name, value in os.environ.items() if name.endswith("_IMAGE")},
    "watched": None,
}
for flag, value in zip(args, args[1:]):
    if flag == "--env-file":
        with open(value, encoding="utf-8") as handle:
            entry["env_files"].append(
                {"path": os.path.abspath(value), "mode": stat.S_IMODE(os.stat(value).st_mode), "content": handle.read()}
            )
watched = os.environ.get("FAKE_DOCKER_WATCH")
if watched and os.path.exists(watched):
    with open(watched, encoding="utf-8") as handle:
        entry["watched"] = handle.read()
with open(os.environ["FAKE_DOCKER_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps(entry) + "\\n")
behaviour = os.environ.get("FAKE_DOCKER_BEHAVIOUR", "succeed")
if behaviour == "fail":
    print("fake docker: failing as asked", file=sys.stderr)
    sys.exit(1)
if behaviour == "sleep":
    time.sleep(30)
"""

FAKE_CHOWN = """\
import json, os, sys

with open(os.environ["FAKE_CHOWN_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_CHOWN_BEHAVIOUR") == "fail":
    print("chown: changing ownership: Operation not permitted", file=sys.stderr)
    sys.exit(1)
"""


def _install(path: Path, source: str) -> None:
    path.write_text(f"#!{sys.executable}\n{source}", encoding="utf-8")
    path.chmod(0o755)


class Node:
    """A node's deploy/ directory, a private TMPDIR, and a stand-in docker on PATH."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.deploy = root / "deploy"
        self.bin = root / "bin"
        self.tmpdir = root / "tmp"
        self.log = root / "docker.log"
        self.chown_log = root / "chown.log"
        for directory in (self.deploy, self.bin, self.tmpdir):
            directory.mkdir()
        for name in (COMPOSE_FILE, WORKER_COMPOSE_FILE, WORKER_CPU_COMPOSE_FILE):
            shutil.copyfile(PROJECT_ROOT / "deploy" / name, self.deploy / name)
        self.write_env(AgentEnv(control_plane_url=URL, display_name="Bob's GPU box"))
        _install(self.bin / "docker", FAKE_DOCKER)

    def write_env(self, agent_env: AgentEnv) -> None:
        (self.deploy / ".env").write_text(env_file(agent_env), encoding="utf-8")

    def fake_chown(self) -> None:
        """Put a recording chown first on PATH (to make it fail, or where the suite is not root)."""
        _install(self.bin / "chown", FAKE_CHOWN)

    def env(self, behaviour: str = "succeed", **extra: str) -> dict[str, str]:
        # A clean environment: nothing from the test runner's shell leaks in.
        return {
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.tmpdir),
            "FAKE_DOCKER_LOG": str(self.log),
            "FAKE_DOCKER_BEHAVIOUR": behaviour,
            "FAKE_CHOWN_LOG": str(self.chown_log),
            **extra,
        }

    def run(self, snippet: str, stdin: str = "", *bash_options: str, behaviour: str = "succeed", **extra: str):
        """The snippet as pasted: `bash -c`, the secret on standard input."""
        return subprocess.run(
            ["bash", *bash_options, "-c", snippet],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=self.deploy,
            env=self.env(behaviour, **extra),
            timeout=TIMEOUT,
        )

    def calls(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]

    def leftovers(self) -> list[str]:
        return sorted(path.name for path in self.tmpdir.iterdir())


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def output(result) -> str:
    return result.stdout + result.stderr


# --------------------------------------------------------------------------- shellcheck


def shellcheck(snippet: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "snippet.sh"
    script.write_text(snippet + "\n", encoding="utf-8")
    return subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize(
    "command",
    [
        start_command,
        recreate_command,
        replace_credential_command,
        worker_start_command,
        lambda: worker_start_command(LOCAL_BUILD, WORKER_CPU),
        lambda: venv_start_command(AgentEnv(control_plane_url=URL, display_name="Bob's GPU box")),
    ],
)
def test_every_snippet_passes_shellcheck(command, tmp_path):
    """C4: what the admin pastes has no shellcheck findings, and disables none."""
    snippet = command()
    assert "shellcheck disable" not in snippet
    result = shellcheck(snippet, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_does_report_a_broken_snippet(tmp_path):
    """The check above can fail: an unquoted, word-split loop is reported."""
    result = shellcheck("for f in $(ls); do rm $f; done", tmp_path)
    assert result.returncode != 0
    assert "SC2045" in result.stdout or "SC2086" in result.stdout


# --------------------------------------------------------------------------- start command


@pytest.mark.parametrize("typed", [f"{TOKEN}\n", TOKEN, f"  {TOKEN} \r\n"], ids=["line", "no-newline", "padded"])
def test_start_passes_the_token_in_a_private_temp_file_and_removes_it(node, typed):
    """C4, P2: mode 0600, the token line then .env, Compose's only env file, gone afterwards, never printed."""
    # A token still exported from an earlier attempt must not override the one just typed.
    result = node.run(start_command(), typed, MODELFORGE_AGENT_ENROLLMENT_TOKEN="mfe_stale")
    assert result.returncode == 0, output(result)
    [call] = node.calls()
    [token_file] = call["env_files"]  # one --env-file: read by every Compose v2, not only 2.17+
    token_path = token_file["path"]
    assert call["argv"] == ["compose", "--env-file", token_path, "-f", COMPOSE_FILE, "up", "-d", "node-agent"]
    assert Path(token_path).parent == node.tmpdir
    assert token_file["mode"] == 0o600
    env_text = (node.deploy / ".env").read_text()
    # The token first: a Compose that reports a bad .env line with the rest of the file never quotes it.
    assert token_file["content"] == f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={TOKEN}\n" + env_text
    settings = read_compose_dotenv(token_file["content"])
    assert settings["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] == TOKEN
    assert settings["MODELFORGE_AGENT_DISPLAY_NAME"] == "Bob's GPU box"  # .env's settings still count
    assert call["token_env"] is None
    assert not Path(token_path).exists()
    assert node.leftovers() == []
    assert_no_secrets(output(result), TOKEN)
    assert "starting node-agent" in result.stderr


def test_a_token_left_in_env_loses_to_the_one_typed(node):
    """A token line in .env is left out of the temp file, so only the typed token reaches Compose."""
    env_path = node.deploy / ".env"
    env_path.write_text(env_path.read_text() + "MODELFORGE_AGENT_ENROLLMENT_TOKEN=mfe_stale_from_env")  # no newline
    assert node.run(start_command(), f"{TOKEN}\n").returncode == 0
    content = node.calls()[0]["env_files"][0]["content"]
    assert "mfe_stale_from_env" not in content  # .env's own token line is left out
    assert content.startswith(f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={TOKEN}\n")
    assert read_compose_dotenv(content)["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] == TOKEN
    path = node.root / "as-written.env"
    path.write_text(content)
    assert dotenv_values(path)["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] == TOKEN


def test_start_records_the_nodes_own_host_name_once(node):
    """I4: the container cannot see the host's name, so the start command writes it into .env."""
    env_path = node.deploy / ".env"
    env_path.write_text(env_path.read_text().rstrip("\n"))  # a file without a final newline
    assert node.run(start_command(), f"{TOKEN}\n").returncode == 0
    lines = env_path.read_text().splitlines()
    assert f"MODELFORGE_AGENT_HOSTNAME={os.uname().nodename}" in lines
    assert lines[-2].startswith("MODELFORGE_RUNTIME_WORKER_CPU_IMAGE=")  # appended on a line of its own
    assert node.run(start_command(), f"{TOKEN}\n").returncode == 0
    assert env_path.read_text().count("MODELFORGE_AGENT_HOSTNAME=") == 2  # the commented hint + one value
    env_path.write_text(env_path.read_text().replace(os.uname().nodename, "tower"))
    assert node.run(start_command(), f"{TOKEN}\n").returncode == 0
    assert "MODELFORGE_AGENT_HOSTNAME=tower" in env_path.read_text().splitlines()
    assert os.uname().nodename not in env_path.read_text()


def test_start_removes_the_token_file_when_docker_fails(node):
    """C4: an error ends the subshell, and the token file goes with it."""
    result = node.run(start_command(), f"{TOKEN}\n", behaviour="fail")
    assert result.returncode != 0
    [call] = node.calls()
    assert call["env_files"][0]["content"].startswith(f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={TOKEN}\n")
    assert not Path(call["env_files"][0]["path"]).exists()
    assert node.leftovers() == []
    assert "stopped after an error" in result.stderr
    assert_no_secrets(output(result), TOKEN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_start_removes_the_token_file_on_a_signal(node, sig):
    """C4: Ctrl-C (SIGINT to the foreground process group) or SIGTERM while Compose runs."""
    out_path = node.root / "out.txt"
    with out_path.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", start_command()],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=node.deploy,
            env=node.env("sleep"),
            start_new_session=True,
            preexec_fn=default_signals,
            text=True,
        )
        try:
            process.stdin.write(f"{TOKEN}\n")
            process.stdin.close()
            wait_until(lambda: node.calls() != [], "the stand-in docker to start")
            token_path = Path(node.calls()[0]["env_files"][0]["path"])
            assert token_path.exists()  # so it is the signal that removes it below
            os.killpg(process.pid, sig)
            returncode = process.wait(timeout=TIMEOUT)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=TIMEOUT)
    assert returncode in (128 + sig, -sig)
    # bash itself may die of SIGTERM before its subshell has run the trap: give that a moment.
    wait_until(lambda: not token_path.exists() and node.leftovers() == [], "the token file to be removed")
    assert_no_secrets(out_path.read_text(), TOKEN)


def default_signals() -> None:
    """In the child before exec: SIGINT, SIGQUIT and SIGTERM as a person's shell gets them. A
    suite started from a background job inherits them ignored, and bash keeps an ignored signal
    ignored (and `trap -p` shows it), so each scenario sets up the dispositions it assumes."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


class Terminal:
    """A program on a pseudo-terminal, as an admin sees it: what is typed, what is shown."""

    def __init__(self, argv: list[str], node: Node, behaviour: str = "succeed", **extra: str) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.seen = b""
        self.process = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=node.deploy,
            env=node.env(behaviour, **extra),
            start_new_session=True,
            preexec_fn=default_signals,
        )
        os.close(slave)

    def _read(self, wait: float) -> None:
        if select.select([self.master], [], [], wait)[0]:
            try:
                self.seen += os.read(self.master, 4096)
            except OSError:  # EIO: nothing holds the terminal any more
                time.sleep(wait)

    def expect(self, text: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while text.encode() not in self.seen:
            assert time.monotonic() < deadline, f"never shown: {text!r}; the terminal showed {self.seen!r}"
            self._read(0.05)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def type_hidden(self, text: str) -> None:
        """Type `text` once the terminal stops echoing. bash's `read -s` prints its prompt before it
        turns echo off, so a test typing the instant the prompt shows could see its own keystrokes
        echoed (a person never types that fast); the pty master reads the terminal's own flags."""
        deadline = time.monotonic() + TIMEOUT
        while termios.tcgetattr(self.master)[3] & termios.ECHO:
            assert time.monotonic() < deadline, f"echo never went off; the terminal showed {self.seen!r}"
            self._read(0.01)
        self.type(text)

    def type_until_shown(self, text: str, shown: str, attempts: int = 5) -> None:
        """Type `text` again until `shown` appears. Readline now and then drops a line typed the
        instant it has redrawn its prompt after a foreground job ended (seen with and without this
        project's snippet); a person would simply type it again."""
        for _ in range(attempts):
            self.type(text)
            deadline = time.monotonic() + 2
            while shown.encode() not in self.seen and time.monotonic() < deadline:
                self._read(0.05)
            if shown.encode() in self.seen:
                return
        raise AssertionError(f"never shown: {shown!r}; the terminal showed {self.seen!r}")

    def finish(self) -> int:
        try:
            returncode = self.process.wait(timeout=TIMEOUT)
            for _ in range(5):
                self._read(0.02)
            return returncode
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=TIMEOUT)
            os.close(self.master)


PROMPT = "Paste the one-time enrolment token (input hidden): "


def test_start_reads_the_token_without_echo_on_a_terminal(node):
    """C4: on a real terminal the prompt shows and the pasted token is not echoed back."""
    terminal = Terminal(["bash", "-c", start_command()], node)
    terminal.expect(PROMPT)
    terminal.type_hidden(f"{TOKEN}\r")  # Enter on a terminal
    assert terminal.finish() == 0, terminal.seen
    assert node.calls()[0]["env_files"][0]["content"].startswith(f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={TOKEN}\n")
    assert_no_secrets(terminal.seen.decode(errors="replace"), TOKEN)


def test_start_pasted_into_an_interactive_shell_leaves_that_shell_as_it_was(node):
    """C4: the subshell's set -e, set +x, traps and exit stay in it, even when Compose fails."""
    terminal = Terminal(["bash", "--norc", "--noprofile", "-i"], node, "fail", PS1="admin$ ", TERM="dumb")
    terminal.expect("admin$ ")
    terminal.type("set -x\n")  # the admin was tracing: that must not leak the token either
    terminal.type(start_command() + "\n")
    terminal.expect(PROMPT)
    terminal.type_hidden(f"{TOKEN}\r")
    terminal.expect("stopped after an error")
    # Shown = echo's output at the start of a line, not the typed command's echo.
    terminal.type_until_shown('echo "still here: status=$? options=$-"; trap -p; exit\n', "\nstill here: status=")
    assert terminal.finish() == 0
    shown = terminal.seen.decode(errors="replace")
    [state] = re.findall(r"(?m)^still here: status=(\d+) options=(\w+)", shown)
    assert state[0] == "1"
    assert "x" in state[1] and "e" not in state[1] and "u" not in state[1]
    assert "trap --" not in shown
    assert node.leftovers() == []
    assert_no_secrets(shown, TOKEN)


def test_the_secrets_are_only_ever_arguments_of_builtins():
    """P2: a secret in an external command's argv would show in `ps`; only builtins ever see it."""
    builtins = ("IFS= read -rs", "token=${token", "credential=${credential", "if [[ ! ", "builtin printf")
    for snippet, name in ((start_command(), "token"), (replace_credential_command(), "credential")):
        uses = [line.strip() for line in snippet.splitlines() if re.search(rf"\$\{{?{name}\b", line)]
        assert uses, f"${name} is never used"
        for use in uses:
            assert use.startswith(builtins), use


def test_start_leaks_nothing_when_the_caller_traces(node):
    """C4: tracing on in the admin's shell (bash -x) is switched off before the token is read."""
    result = node.run(start_command(), f"{TOKEN}\n", "-x")
    assert result.returncode == 0, output(result)
    assert node.calls()[0]["env_files"][0]["content"].startswith(f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={TOKEN}\n")
    assert_no_secrets(output(result), TOKEN)


def test_start_without_its_first_line_would_leak_under_tracing(node):
    """The check above can fail: drop `{ set +x; } 2>/dev/null` and bash -x prints the token."""
    snippet = start_command().replace("{ set +x; } 2>/dev/null", ":", 1)
    assert snippet != start_command()
    result = node.run(snippet, f"{TOKEN}\n", "-x")
    assert TOKEN in result.stderr


@pytest.mark.parametrize(
    "typed",
    ["not-a-token\n", "\n", "", f"{CREDENTIAL}\n", "mfe_\n", "mfe_abc$(touch pwned)\n", "mfe_ab cd'ef\n"],
    ids=["word", "empty-line", "eof", "credential", "prefix-only", "substitution", "quote"],
)
def test_start_refuses_what_is_not_a_token(node, typed):
    """Refused with a message, docker never called, no temp file, the input never echoed."""
    result = node.run(start_command(), typed)
    assert result.returncode == 1
    assert "not an enrolment token (they start with mfe_)" in result.stderr
    assert node.calls() == []
    assert node.leftovers() == []
    assert not (node.deploy / "pwned").exists()
    if typed.strip() not in ("", "mfe_"):
        assert typed.strip() not in output(result)


@pytest.mark.parametrize("missing", [".env", COMPOSE_FILE])
def test_start_needs_env_and_compose_file_here(node, missing):
    """Run elsewhere than deploy/: a clear message before the token is asked for."""
    (node.deploy / missing).unlink()
    result = node.run(start_command(), f"{TOKEN}\n")
    assert result.returncode == 1
    assert f"no {missing} in {node.deploy}" in result.stderr
    assert "cd to the deploy/ directory" in result.stderr
    assert node.calls() == []
    assert node.leftovers() == []


# --------------------------------------------------------------------------- recreate command


def test_recreate_uses_only_env_and_drops_the_token(node):
    """C4, I3: recreated from .env alone, even with a token still exported in the shell."""
    result = node.run(recreate_command(), "", MODELFORGE_AGENT_ENROLLMENT_TOKEN=TOKEN)
    assert result.returncode == 0, output(result)
    [call] = node.calls()
    assert call["argv"] == [
        "compose", "--env-file", ".env", "-f", COMPOSE_FILE, "up", "-d", "--force-recreate", "node-agent",
    ]  # fmt: skip
    assert [entry["path"] for entry in call["env_files"]] == [str(node.deploy / ".env")]
    assert call["token_env"] is None
    assert "ENROLLMENT_TOKEN=" not in recreate_command()


# --------------------------------------------------------------------------- runtime worker (W3)

PINNED_AGENT = pinned_image("registry.lan/modelforge-node-agent:1.3.0@sha256:" + "a" * 64)
PINNED_WORKER = "registry.lan/modelforge-runtime-worker:1.3.0@sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("image", "files"),
    [
        (WORKER_GPU, [COMPOSE_FILE, WORKER_COMPOSE_FILE]),
        (WORKER_CPU, [COMPOSE_FILE, WORKER_COMPOSE_FILE, WORKER_CPU_COMPOSE_FILE]),
    ],
    ids=["gpu", "cpu"],
)
def test_worker_start_recreates_the_agent_with_the_overlays_and_no_token(node, image, files):
    """W3: both services from .env and the overlay files; a token still exported never reaches them."""
    result = node.run(worker_start_command(LOCAL_BUILD, image), "", MODELFORGE_AGENT_ENROLLMENT_TOKEN=TOKEN)
    assert result.returncode == 0, output(result)
    up, ps = node.calls()
    options = ["compose", "--env-file", ".env", *(part for name in files for part in ("-f", name))]
    assert up["argv"] == [*options, "up", "-d", "node-agent", "runtime-worker"]  # builds a local image if missing
    assert ps["argv"] == [*options, "ps", "runtime-worker"]
    assert up["token_env"] is None and ps["token_env"] is None
    assert [entry["path"] for entry in up["env_files"]] == [str(node.deploy / ".env")]
    assert "logs runtime-worker" in result.stderr


@pytest.mark.parametrize("missing", [".env", WORKER_COMPOSE_FILE, WORKER_CPU_COMPOSE_FILE])
def test_worker_start_needs_env_and_every_compose_file_here(node, missing):
    (node.deploy / missing).unlink()
    result = node.run(worker_start_command(LOCAL_BUILD, WORKER_CPU))
    assert result.returncode == 1 and f"no {missing} in {node.deploy}" in result.stderr
    assert node.calls() == []


def test_a_pinned_agents_worker_must_be_named_in_env_and_is_never_built(node):
    """D5: without a checked release entry the worker image is the one .env pins, never a build."""
    node.write_env(AgentEnv(control_plane_url=URL, display_name="x", image=PINNED_AGENT.reference, worker_image=None))
    command = worker_start_command(PINNED_AGENT, WORKER_GPU)
    refused = node.run(command)
    assert refused.returncode == 1 and "set MODELFORGE_RUNTIME_WORKER_IMAGE in .env" in refused.stderr
    assert node.calls() == []

    node.write_env(
        AgentEnv(control_plane_url=URL, display_name="x", image=PINNED_AGENT.reference, worker_image=PINNED_WORKER)
    )
    shell = {"MODELFORGE_RUNTIME_WORKER_IMAGE": "modelforge-runtime-worker:other", "MODELFORGE_NODE_AGENT_IMAGE": "x:1"}
    started = node.run(command, "", **shell)
    assert started.returncode == 0, output(started)
    up, _ps = node.calls()
    assert up["argv"][-4:] == ["-d", "--no-build", "node-agent", "runtime-worker"]
    assert up["image_env"] == {}  # exported images dropped: .env decides what runs


# --------------------------------------------------------------------------- replace credential


@pytest.fixture
def state_dir(node) -> Path:
    """A host-path state volume (with a space in its path) holding an identity and an old credential."""
    directory = node.root / "app data" / "state"
    directory.mkdir(parents=True)
    state = State(directory)
    state.node_id()
    state.store_credential(OLD_CREDENTIAL)
    node.write_env(AgentEnv(control_plane_url=URL, display_name="gpu-1", state_volume=str(directory)))
    return directory


def replace(node: Node, state_dir: Path, typed: str, **extra: str):
    return node.run(replace_credential_command(), typed, FAKE_DOCKER_WATCH=str(state_dir / "node-credential"), **extra)


def test_replace_credential_installs_it_as_the_agent_would(node, state_dir):
    """I5, I2: stop, atomic replace (mode 0600, the agent's user), recreate; the agent reads it back."""
    if os.geteuid() != 0:  # chown to another user needs root; record the call instead
        node.fake_chown()
    result = replace(node, state_dir, f"{CREDENTIAL}\n")
    assert result.returncode == 0, output(result)
    stop, up = node.calls()
    assert stop["argv"] == ["compose", "--env-file", ".env", "-f", COMPOSE_FILE, "stop", "node-agent"]
    assert up["argv"] == [
        "compose", "--env-file", ".env", "-f", COMPOSE_FILE, "up", "-d", "--force-recreate", "node-agent",
    ]  # fmt: skip
    assert stop["watched"] == f"{OLD_CREDENTIAL}\n"  # replaced only once the agent is stopped
    assert up["watched"] == f"{CREDENTIAL}\n"
    assert stop["state_volume_env"] == up["state_volume_env"] == str(state_dir)
    assert up["token_env"] is None
    credential_path = state_dir / "node-credential"
    assert stat.S_IMODE(credential_path.stat().st_mode) == 0o600
    assert State(state_dir).credential() == CREDENTIAL
    assert sorted(path.name for path in state_dir.iterdir()) == ["node-credential", "node-id"]
    if os.geteuid() == 0:
        assert (credential_path.stat().st_uid, credential_path.stat().st_gid) == (AGENT_UID, AGENT_UID)
    else:
        [chown_args] = [json.loads(line) for line in node.chown_log.read_text().splitlines()]
        assert chown_args[:2] == ["--", f"{AGENT_UID}:{AGENT_UID}"]
        assert Path(chown_args[2]).parent == state_dir
    assert_no_secrets(output(result), CREDENTIAL, OLD_CREDENTIAL)


@pytest.mark.parametrize("typed", [f"{TOKEN}\n", "nope\n", ""], ids=["token", "word", "eof"])
def test_replace_credential_refuses_what_is_not_a_credential(node, state_dir, typed):
    result = replace(node, state_dir, typed)
    assert result.returncode == 1
    assert "not a node credential (they start with mfn_)" in result.stderr
    assert node.calls() == []
    assert State(state_dir).credential() == OLD_CREDENTIAL
    assert sorted(path.name for path in state_dir.iterdir()) == ["node-credential", "node-id"]
    assert_no_secrets(output(result), TOKEN)


def test_replace_credential_stops_nothing_when_chown_fails(node, state_dir):
    """Not root: a clear error before the agent is stopped, and no temp file in the state directory."""
    node.fake_chown()
    result = replace(node, state_dir, f"{CREDENTIAL}\n", FAKE_CHOWN_BEHAVIOUR="fail")
    assert result.returncode == 1
    assert "sudo -i" in result.stderr
    assert node.calls() == []
    assert State(state_dir).credential() == OLD_CREDENTIAL
    assert sorted(path.name for path in state_dir.iterdir()) == ["node-credential", "node-id"]
    assert_no_secrets(output(result), CREDENTIAL)


@pytest.mark.parametrize(
    "line",
    [
        "export MODELFORGE_AGENT_STATE_VOLUME = '{dir}'",
        'MODELFORGE_AGENT_STATE_VOLUME="{dir}"',
        "  MODELFORGE_AGENT_STATE_VOLUME={dir}   # the state",
    ],
    ids=["export-single-quoted", "double-quoted", "comment"],
)
def test_replace_credential_reads_the_state_directory_as_compose_does(node, tmp_path, line):
    directory = tmp_path / "state"
    directory.mkdir()
    if os.geteuid() != 0:
        node.fake_chown()
    (node.deploy / ".env").write_text(f"# x\nMODELFORGE_AGENT_STATE_VOLUME=/elsewhere\n{line.format(dir=directory)}")
    result = replace(node, directory, f"{CREDENTIAL}\n")
    assert result.returncode == 0, output(result)
    assert State(directory).credential() == CREDENTIAL
    assert [call["state_volume_env"] for call in node.calls()] == [str(directory)] * 2


@pytest.mark.parametrize(
    "line",
    [
        "# no state volume here",
        "MODELFORGE_AGENT_STATE_VOLUME=modelforge-node-agent-state",
        "MODELFORGE_AGENT_STATE_VOLUME=./state",
        "MODELFORGE_AGENT_STATE_VOLUME=/nonexistent/modelforge/state",
    ],
    ids=["unset", "named-volume", "relative", "missing-directory"],
)
def test_replace_credential_needs_an_existing_host_directory(node, line):
    (node.deploy / ".env").write_text(line + "\n")
    result = node.run(replace_credential_command(), f"{CREDENTIAL}\n")
    assert result.returncode == 1
    assert "must be the absolute path of an existing host directory" in result.stderr
    assert "Named Docker volumes are not supported here" in result.stderr
    assert node.calls() == []


def test_replace_credential_refuses_a_different_exported_state_volume(node, state_dir):
    """Compose would mount the shell's value, not the directory written to."""
    result = replace(node, state_dir, f"{CREDENTIAL}\n", MODELFORGE_AGENT_STATE_VOLUME="/somewhere/else")
    assert result.returncode == 1
    assert "unset it or make them agree" in result.stderr
    assert node.calls() == []
    assert State(state_dir).credential() == OLD_CREDENTIAL


# --------------------------------------------------------------------------- .env


def read_python_dotenv(text: str, tmp_path: Path) -> dict[str, str | None]:
    """The .env as python-dotenv reads it (podman-compose's reader)."""
    path = tmp_path / "read.env"
    path.write_text(text, encoding="utf-8")
    return dotenv_values(path)


def test_the_compose_reader_follows_composes_rules():
    """The reader the round trips rely on matches Compose's documented quirks."""
    assert read_compose_dotenv('A=a #c\nB="x\\\\\\"y"\nC=$$z\nD=\'$$ #\'\nE="\\$"') == {
        "A": "a",
        "B": 'x\\"y',
        "C": "$z",
        "D": "$$ #",
        "E": "$",
    }
    with pytest.raises(AssertionError, match="unterminated"):
        read_compose_dotenv("A='x\\'")
    with pytest.raises(AssertionError, match="interpolate"):
        read_compose_dotenv("A=$HOME")


def test_env_file_holds_only_non_secret_settings(tmp_path):
    """P2, C4, D2: no token, credential or Hub token, not even commented out; the console's origin."""
    text = env_file(AgentEnv(control_plane_url=URL, display_name="GPU Node"))
    assert not re.search(r"mf[en]_", text)
    assert not re.search(r"(?m)^\s*#?\s*(export\s+)?\w*(TOKEN|CREDENTIAL)\w*\s*=", text)
    assert "#MODELFORGE_AGENT_HOSTNAME=\n" in text  # a hint; the admin sets the real host name
    expected = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": URL,
        "MODELFORGE_AGENT_DISPLAY_NAME": "GPU Node",
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia",
        "MODELFORGE_AGENT_TLS_VERIFY": "true",
        "MODELFORGE_NODE_AGENT_IMAGE": "modelforge-node-agent:local",
        "MODELFORGE_AGENT_STATE_VOLUME": "/mnt/user/appdata/modelforge-node-agent/state",
        "MODELFORGE_AGENT_HF_CACHE_VOLUME": "/mnt/user/appdata/modelforge-node-agent/hf-cache",
        "MODELFORGE_AGENT_ARTIFACT_VOLUME": "/mnt/user/appdata/modelforge-node-agent/artifacts",
        "MODELFORGE_AGENT_QUARANTINE_VOLUME": "/mnt/user/appdata/modelforge-node-agent/quarantine",
        "MODELFORGE_RUNTIME_WORKER_IMAGE": "modelforge-runtime-worker:local",
        "MODELFORGE_RUNTIME_WORKER_CPU_IMAGE": "modelforge-runtime-worker-cpu:local",
    }
    assert read_compose_dotenv(text) == expected
    assert read_python_dotenv(text, tmp_path) == expected
    assert f"MODELFORGE_AGENT_CONTROL_PLANE_URL={URL}\n" in text
    assert all(len(line) <= 100 for line in text.splitlines())


TRICKY_VALUES = [
    "Bob's GPU box",
    'GPU #2 (rack "A")',
    "costs $5 # a lot",
    "C:\\models\\gpu 'one'",
    "\"quoted\" and 'quoted'",
    "  padded  ",
    "Büro-GPU ☃ \t tab",
    "a\\nb \\\\ \\0123 \\x",
    "#leading hash",
    "=equals= :colon:",
    "",
]


@pytest.mark.parametrize("value", TRICKY_VALUES)
def test_env_file_values_read_back_exactly(value, tmp_path):
    """Display names with spaces, apostrophes, quotes, `#`, `$` and backslashes survive both readers."""
    text = env_file(AgentEnv(control_plane_url=URL, display_name=value, state_volume=f"/mnt/{value}/state"))
    for read in (read_compose_dotenv(text), read_python_dotenv(text, tmp_path)):
        assert read["MODELFORGE_AGENT_DISPLAY_NAME"] == value
        assert read["MODELFORGE_AGENT_STATE_VOLUME"] == f"/mnt/{value}/state"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab '\"\\$#{}=:\t\n\r\0é☃\u2028\x85")))
def test_env_file_writes_any_value_exactly_or_refuses_it(tmp_path_factory, value):
    """Every value either reads back exactly in both readers or is refused with a ValueError naming it."""
    agent_env = AgentEnv(control_plane_url=URL, display_name=value)
    problem = env_value_error(value)
    if problem is not None:
        with pytest.raises(ValueError, match=f"^MODELFORGE_AGENT_DISPLAY_NAME {re.escape(problem)}$"):
            env_file(agent_env)
        return
    text = env_file(agent_env)
    assert read_compose_dotenv(text)["MODELFORGE_AGENT_DISPLAY_NAME"] == value
    assert read_python_dotenv(text, tmp_path_factory.mktemp("dotenv"))["MODELFORGE_AGENT_DISPLAY_NAME"] == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("two\nlines", "single line"),
        ("carriage\rreturn", "single line"),
        ("nul\0byte", "single line"),
        ("ends with \\", "backslash"),
        ("${HOME}", "'${'"),
        ("Bob's $5 box", "'$' together with"),
    ],
)
def test_env_file_refuses_what_it_cannot_write_exactly(value, reason):
    assert reason in (env_value_error(value) or "")
    with pytest.raises(ValueError, match="MODELFORGE_AGENT_DISPLAY_NAME"):
        env_file(AgentEnv(control_plane_url=URL, display_name=value))
    with pytest.raises(ValueError, match="MODELFORGE_AGENT_ARTIFACT_VOLUME"):
        env_file(AgentEnv(control_plane_url=URL, display_name="x", artifact_volume=value))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"control_plane_url": "mf.lan:8000"}, "control_plane_url"),
        ({"accelerator_mode": "gpu"}, "accelerator_mode"),
        ({"image": "modelforge-node-agent:latest"}, "never latest"),
        ({"image": "registry.lan:5000/modelforge-node-agent"}, "never latest"),
    ],
)
def test_env_file_refuses_settings_the_agent_would_refuse(change, message):
    with pytest.raises(ValueError, match=message):
        env_file(AgentEnv(**{"control_plane_url": URL, "display_name": "x", **change}))


def test_env_file_accepts_digest_pinned_and_tagged_images():
    for image in ("registry.lan:5000/modelforge-node-agent:1.2.0", "modelforge-node-agent@sha256:" + "a" * 64):
        text = env_file(AgentEnv(control_plane_url=URL, display_name="x", image=image))
        assert read_compose_dotenv(text)["MODELFORGE_NODE_AGENT_IMAGE"] == image
