"""Console forms (Flask-WTF): each carries its CSRF token (C1)."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal

from flask_wtf import FlaskForm
from flask_wtf.file import FileField, FileRequired
from wtforms import (
    BooleanField,
    DecimalField,
    FloatField,
    IntegerField,
    PasswordField,
    RadioField,
    SelectField,
    StringField,
    TextAreaField,
)
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, InputRequired, Length, NumberRange, Optional, Regexp, ValidationError

from app import rules
from app.console.commands import LOCAL_BUILD, ImageSource, env_value_error, pinned_image, release_image
from app.jobs import artifacts, runtime, storage
from app.models import Artifact, StorageRoot
from app.models.api_key import MAX_NAME_LENGTH as MAX_API_KEY_NAME_LENGTH
from app.nodes.enrollment import MAX_EXPIRY_SECONDS
from app.release_manifest import MAX_PASTE_BYTES, parse_pasted
from app.serving import api_keys, deployments

# C4: the wizard offers exactly these token lifetimes.
EXPIRY_CHOICES = [
    SelectChoice(300, "5 minutes"),
    SelectChoice(900, "15 minutes"),
    SelectChoice(3600, "1 hour"),
    SelectChoice(MAX_EXPIRY_SECONDS, "24 hours"),
]
ACCELERATOR_CHOICES = [
    SelectChoice("nvidia", "nvidia — require NVML and a GPU (GPU nodes)"),
    SelectChoice("auto", "auto — require NVML only when NVIDIA devices are visible"),
    SelectChoice("cpu", "cpu — a CPU-only node"),
]
# D5: a release bundle is checked against its manifest, a registry image is pinned by digest. A
# newcomer has a clone and neither (issue 25), so the default is the one choice that needs nothing
# more: the image built on the node from the same checkout.
IMAGE_SOURCE_CHOICES = [
    SelectChoice("local", "Built on the node from a checkout of this repository — needs nothing else"),
    SelectChoice("release", "Release bundle loaded on the node — checked against the release's manifest"),
    SelectChoice("digest", "Registry image pinned by @sha256 digest"),
]


class Printable:
    """A field validator: the API's one text rule (app/rules.py), so both refuse the same names."""

    def __call__(self, form, field) -> None:
        if not rules.is_text(field.data or ""):
            raise ValidationError("Use printable characters only.")


class EmptyForm(FlaskForm):
    """A button-only POST that still carries its CSRF token (C1)."""


class LoginForm(FlaskForm):
    """C1: the operator key, never rendered back."""

    operator_key = PasswordField("Operator key", validators=[DataRequired(message="Paste the operator key.")])


def parse_labels(text: str) -> dict[str, str]:
    """`key=value` per line (blank lines ignored) → dict; raises ValueError naming the bad line."""
    labels: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        key, separator, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not separator or not key:
            raise ValueError(f"line {number}: write labels as key=value")
        if problem := rules.label_problem(key, value):
            raise ValueError(f"line {number}: {problem}")
        if key in labels:
            raise ValueError(f"line {number}: label {key!r} appears twice")
        labels[key] = value
    if len(labels) > rules.MAX_LABELS:
        raise ValueError(f"at most {rules.MAX_LABELS} labels")
    return labels


class EnrollForm(FlaskForm):
    """C4: what the wizard asks. The API origin and production_eligible are not fields: both are fixed."""

    display_name = StringField(
        "Display name",
        validators=[DataRequired(message="Give the node a name you will recognise."), Length(max=200), Printable()],
    )
    role = StringField("Role", validators=[Optional(), Length(max=100), Printable()])
    labels = TextAreaField("Labels", validators=[Optional(), Length(max=8000)])
    expires_in_seconds = SelectField("Token expires in", choices=EXPIRY_CHOICES, coerce=int, default=900)
    accelerator_mode = SelectField("Accelerator mode", choices=ACCELERATOR_CHOICES, default="nvidia")
    image_source = RadioField("Agent image", choices=IMAGE_SOURCE_CHOICES, default="local")
    release_entry = TextAreaField("images.modelforge-node-agent", validators=[Length(max=MAX_PASTE_BYTES)])
    pinned_reference = StringField("Pinned image", validators=[Length(max=500)])
    # S3: a new homelab node is for lab work and benchmarks unless the operator says otherwise.
    lab_eligible = BooleanField("Lab eligible", default=True)
    benchmark_eligible = BooleanField("Benchmark eligible", default=True)

    def validate_display_name(self, field) -> None:
        """Nothing a .env file cannot hold exactly (the name goes into one)."""
        if problem := env_value_error((field.data or "").strip()):
            raise ValidationError(f"The display name {problem}.")

    def validate_release_entry(self, field) -> None:
        """D5: the manifest entry the start command checks the loaded image against."""
        if self.image_source.data != "release":
            return
        if not (field.data or "").strip():
            raise ValidationError("Paste images.modelforge-node-agent from the release's manifest.json.")
        try:
            self.release_record = parse_pasted(field.data)
        except ValueError as error:
            raise ValidationError(f"That is not a release manifest entry: {error}.") from None

    def validate_pinned_reference(self, field) -> None:
        """A registry image counts only when pinned by digest (D2: never a moving tag)."""
        if self.image_source.data != "digest":
            return
        try:
            pinned_image((field.data or "").strip())
        except ValueError as error:
            raise ValidationError(f"Pin the image by digest: {error}.") from None

    def agent_image(self) -> ImageSource:
        """The validated choice as the commands use it (call after validate)."""
        if self.image_source.data == "release":
            return release_image(self.release_record)
        if self.image_source.data == "digest":
            return pinned_image(self.pinned_reference.data.strip())
        return LOCAL_BUILD

    def validate_labels(self, field) -> None:
        """Labels parse as key=value lines."""
        try:
            parse_labels(field.data or "")
        except ValueError as error:
            raise ValidationError(str(error)) from None


# Free space is thought of in GiB (a model is gigabytes); MiB is there for small test roots.
SIZE_UNITS = {"GiB": 2**30, "MiB": 2**20}
REPO_TYPE_CHOICES = [SelectChoice("model", "model"), SelectChoice("dataset", "dataset")]


def _stripped(value: str | None) -> str | None:
    return value.strip() if isinstance(value, str) else value


class Matches:
    """The whole value matches `pattern` (fullmatch: a trailing newline is not let through by `$`)."""

    def __init__(self, pattern: str, message: str) -> None:
        self.pattern = re.compile(pattern)
        self.message = message

    def __call__(self, form, field) -> None:
        if field.data and self.pattern.fullmatch(field.data) is None:
            raise ValidationError(self.message)


class AbsolutePath:
    """A field validator for the API's path rule (`rules.absolute_path_problem`)."""

    def __call__(self, form, field) -> None:
        if field.data and (problem := rules.absolute_path_problem(field.data)):
            raise ValidationError(problem)


class StorageRootForm(FlaskForm):
    """J1: a root on a node; where the bytes are on the host and where the agent sees them are two facts."""

    name = StringField(
        "Name",
        filters=[_stripped],
        validators=[
            DataRequired(message="Name the root, e.g. models."),
            Matches(rules.ROOT_NAME_PATTERN, "Up to 63 letters, digits, . _ - starting with a letter or digit."),
        ],
    )
    host_path = StringField(
        "Host path",
        filters=[_stripped],
        validators=[DataRequired(message="Where the files live on the host."), AbsolutePath()],
    )
    container_path = StringField(
        "Container path",
        filters=[_stripped],
        validators=[DataRequired(message="Where the agent sees the same directory."), AbsolutePath()],
    )
    min_free = DecimalField(
        "Keep free at least",
        default=Decimal(10),
        places=None,  # shown as typed: 10, 1.5
        validators=[InputRequired(message="How much space must stay free (0 for none).")],
    )
    min_free_unit = SelectField("Unit", choices=list(SIZE_UNITS), default="GiB")

    def validate_min_free(self, field) -> None:
        """A finite, non-negative size that fits in the API's byte count."""
        if field.data is None:
            return
        if not field.data.is_finite() or field.data < 0:
            raise ValidationError("Write a size of 0 or more.")
        if self.min_free_bytes() > rules.MAX_BYTES:
            raise ValidationError("That is more space than any disk holds.")

    def min_free_bytes(self) -> int:
        """The size in whole bytes (what the API and the agent use)."""
        return int(self.min_free.data * SIZE_UNITS.get(self.min_free_unit.data, SIZE_UNITS["GiB"]))

    def root_request(self) -> storage.RootRequest:
        """The validated root as the domain takes it; paths without a trailing / (as the API stores them)."""
        return storage.RootRequest(
            name=self.name.data,
            host_path=self.host_path.data.rstrip("/"),
            container_path=self.container_path.data.rstrip("/"),
            min_free_bytes=self.min_free_bytes(),
        )


def parse_patterns(text: str) -> list[str] | None:
    """One glob per line (blank lines ignored) → list, or None for none; ValueError names the bad line."""
    patterns = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if len(line) > rules.MAX_PATTERN_LENGTH or not rules.is_text(line):
            raise ValueError(f"line {number}: a pattern is up to {rules.MAX_PATTERN_LENGTH} printable characters")
        patterns.append(line)
    if len(patterns) > rules.MAX_PATTERNS:
        raise ValueError(f"at most {rules.MAX_PATTERNS} patterns")
    return patterns or None


class ParsedBy:
    """A field validator: the text must parse with `parser` (whose ValueError says what is wrong)."""

    def __init__(self, parser: Callable[[str], object]) -> None:
        self.parser = parser

    def __call__(self, form, field) -> None:
        try:
            self.parser(field.data or "")
        except ValueError as error:
            raise ValidationError(f"{str(error).capitalize()}.") from None


class AcquireForm(FlaskForm):
    """J3, J4: which repository revision to download onto which of this node's roots."""

    repo_id = StringField(
        "Repository",
        filters=[_stripped],
        validators=[
            DataRequired(message="Name the repository as owner/name."),
            Length(max=rules.MAX_REPO_ID_LENGTH),
            Matches(rules.REPO_ID_PATTERN, "Write the repository as owner/name (letters, digits, . _ -)."),
        ],
    )
    revision = StringField(
        "Revision",
        default="main",
        filters=[_stripped],
        validators=[
            DataRequired(message="Name a branch, tag or commit (main by default)."),
            Length(max=rules.MAX_REVISION_LENGTH),
            Matches(rules.REVISION_PATTERN, "A branch, tag or commit: letters, digits, . _ / -."),
        ],
    )
    repo_type = SelectField("Type", choices=REPO_TYPE_CHOICES, default="model")
    # Choices are this node's roots; a root of another node is refused here with words, not "Not a valid choice".
    storage_root_id = SelectField("Storage root", validate_choice=False)
    allow_patterns = TextAreaField("Only files matching", validators=[Length(max=20_000), ParsedBy(parse_patterns)])
    ignore_patterns = TextAreaField("Skip files matching", validators=[Length(max=20_000), ParsedBy(parse_patterns)])

    def __init__(self, roots: list[StorageRoot], **kwargs) -> None:
        super().__init__(**kwargs)
        # J1: a root the agent reports it cannot use is shown, disabled, with why; never the default.
        self.unusable = {root.id: reason for root in roots if (reason := storage.unusable_reason(root))}
        self.storage_root_id.choices = [
            SelectChoice(root.id, f"{root.name} — {root.container_path}")
            if root.id not in self.unusable
            else SelectChoice(
                root.id,
                f"{root.name} — {root.container_path} (not usable: {self.unusable[root.id]})",
                render_kw={"disabled": True},
            )
            for root in roots
        ]
        if self.storage_root_id.data is None and kwargs.get("formdata", True) is None:  # a fresh form
            self.storage_root_id.data = next((root.id for root in roots if root.id not in self.unusable), None)

    def validate_storage_root_id(self, field) -> None:
        """Only a root of this node (J1): the job must never land somewhere else; and one the agent
        can use, so the job does not fail on it."""
        if field.data not in {choice.value for choice in field.choices}:
            raise ValidationError("Pick one of this node's storage roots.")
        if field.data in self.unusable:
            raise ValidationError(
                f"That root is not usable: {self.unusable[field.data]}. Fix it on the node (the roots table "
                "shows what the agent sees at each heartbeat) or pick another root."
            )

    def params(self) -> dict[str, object]:
        """The job's params, shaped exactly as the API stores them (every key, None when unset)."""
        return {
            "repo_id": self.repo_id.data,
            "revision": self.revision.data,
            "repo_type": self.repo_type.data,
            "storage_root_id": self.storage_root_id.data,
            "allow_patterns": parse_patterns(self.allow_patterns.data or ""),
            "ignore_patterns": parse_patterns(self.ignore_patterns.data or ""),
        }


# --------------------------------------------------------------------------- runtime jobs (W2)


class RelativePath:
    """A field validator for the API's model file rule (`rules.relative_path_problem`)."""

    def __call__(self, form, field) -> None:
        if field.data and (problem := rules.relative_path_problem(field.data)):
            raise ValidationError(problem)


def bounded(label: str, bound: runtime.Bound) -> IntegerField:
    """A whole-number runtime param; left empty it takes the worker's default (app/jobs/runtime.py)."""
    return IntegerField(
        label,
        default=bound.default,
        validators=[
            Optional(),
            NumberRange(bound.minimum, bound.maximum, message=f"Between {bound.minimum} and {bound.maximum}."),
        ],
    )


class RuntimeJobForm(FlaskForm):
    """W2: which model file of which of this node's artifacts a runtime job runs."""

    # Choices are this node's artifacts; another's is refused here with words, not "Not a valid choice".
    artifact_id = SelectField("Artifact", validate_choice=False)
    model_file = StringField(
        "Model file",
        filters=[_stripped],
        validators=[
            DataRequired(message="Name the GGUF file inside the artifact, e.g. model-q4_k_m.gguf."),
            RelativePath(),
        ],
    )

    def __init__(self, node_artifacts: list[Artifact], **kwargs) -> None:
        super().__init__(**kwargs)
        self.artifact_id.choices = [
            SelectChoice(artifact.id, f"{artifact.repo_id} @ {artifact.commit[:7]}") for artifact in node_artifacts
        ]

    def validate_artifact_id(self, field) -> None:
        """Only an artifact of this node: the worker reads the model from the node's own disk."""
        if field.data not in {choice.value for choice in field.choices}:
            raise ValidationError("Pick one of this node's artifacts.")

    def _value(self, field: IntegerField, bound: runtime.Bound) -> int:
        return bound.default if field.data is None else field.data


def _first_readable(files: list[tuple[str, str | None]] | None) -> str | None:
    return next((path for path, problem in files or [] if problem is None), None)


class RunModelForm(RuntimeJobForm):
    """W2: "Run a model" on a node: the model file is picked from the GGUF files the artifact is
    known to hold (its acquire job read their headers, `artifacts.model_files`); an artifact
    acquired before that was recorded takes the file's path as typed. A fresh form starts on the
    newest artifact that holds a readable GGUF file, and on that file; `pick_file` picks the file
    for an artifact the operator just chose."""

    model_file = SelectField("Model file", validate_choice=False, filters=[_stripped])

    def __init__(self, node_artifacts: list[Artifact], pick_file: bool = False, **kwargs) -> None:
        super().__init__(node_artifacts, **kwargs)
        fresh = "formdata" in kwargs and kwargs["formdata"] is None
        self.by_id = {artifact.id: artifact for artifact in node_artifacts}
        listed = {artifact.id: artifacts.model_files(artifact) for artifact in node_artifacts}
        self.artifact_id.choices = [
            SelectChoice(
                artifact.id,
                f"{artifact.repo_id} @ {artifact.commit[:7]}"
                + (" — no GGUF file" if listed[artifact.id] == [] else ""),
            )
            for artifact in node_artifacts
        ]
        if fresh and node_artifacts:
            self.artifact_id.data = next(
                (artifact.id for artifact in node_artifacts if _first_readable(listed[artifact.id])),
                next((artifact.id for artifact in node_artifacts if listed[artifact.id]), node_artifacts[0].id),
            )
        self.chosen = self.by_id.get(self.artifact_id.data)
        self.files = listed[self.chosen.id] if self.chosen else []
        self.model_file.choices = [
            SelectChoice(path, path if problem is None else f"{path} — header unreadable")
            for path, problem in self.files or []
        ]
        if fresh or pick_file:
            self.model_file.data = _first_readable(self.files) or next((path for path, _ in self.files or []), None)

    @property
    def files_known(self) -> bool:
        """Whether the chosen artifact's GGUF files are known (a select), or its file is typed."""
        return self.files is not None

    def validate_model_file(self, field) -> None:
        """A file the chosen artifact holds (the worker reads nothing else); typed, by the path rule,
        only where its files are not known."""
        if self.chosen is None:
            return  # the artifact's own error says it
        if self.files is None:
            if not field.data:
                raise ValidationError("Name the GGUF file inside the artifact, e.g. model-q4_k_m.gguf.")
            if problem := rules.relative_path_problem(field.data):
                raise ValidationError(problem)
            return
        if not self.files:
            raise ValidationError(
                f"{self.chosen.repo_id} holds no GGUF file: acquire a GGUF model (a repository with .gguf files) first."
            )
        if field.data not in {path for path, _ in self.files}:
            raise ValidationError(f"Pick one of the GGUF files of {self.chosen.repo_id}.")


class BenchmarkForm(RunModelForm):
    """W2: runtime.benchmark.v1, pp/tg tokens per second as llama-bench measures them."""

    n_gpu_layers = bounded("GPU layers", runtime.N_GPU_LAYERS)
    prompt_tokens = bounded("Prompt tokens", runtime.PROMPT_TOKENS)
    generate_tokens = bounded("Generated tokens", runtime.GENERATE_TOKENS)
    repetitions = bounded("Repetitions", runtime.REPETITIONS)
    # S3: the artifact names the model; every benchmark-eligible node holding a copy runs it.
    everywhere = BooleanField("On every benchmark-eligible node that holds this model")

    def params(self) -> dict[str, object]:
        """The job's params, shaped exactly as the API stores them (defaults filled in)."""
        return {
            "artifact_id": self.artifact_id.data,
            "model_file": self.model_file.data,
            "n_gpu_layers": self._value(self.n_gpu_layers, runtime.N_GPU_LAYERS),
            "prompt_tokens": self._value(self.prompt_tokens, runtime.PROMPT_TOKENS),
            "generate_tokens": self._value(self.generate_tokens, runtime.GENERATE_TOKENS),
            "repetitions": self._value(self.repetitions, runtime.REPETITIONS),
        }


def parse_prompts(text: str) -> list[str]:
    """One prompt per line, sent as written (blank lines ignored); ValueError names the bad line."""
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line) > runtime.MAX_PROMPT_LENGTH or not rules.is_text(line):
            raise ValueError(f"line {number}: a prompt is up to {runtime.MAX_PROMPT_LENGTH} printable characters")
        prompts.append(line)
    if not prompts:
        raise ValueError("write at least one prompt")
    if len(prompts) > runtime.MAX_PROMPTS:
        raise ValueError(f"at most {runtime.MAX_PROMPTS} prompts")
    return prompts


class GenerateForm(RunModelForm):
    """W2: runtime.generate.v1, the smoke test that a model answers (temperature 0, fixed seed)."""

    prompts = TextAreaField(
        "Prompts",
        default="The capital of France is",
        validators=[Length(max=runtime.MAX_PROMPTS * (runtime.MAX_PROMPT_LENGTH + 2)), ParsedBy(parse_prompts)],
    )
    max_tokens = bounded("Max tokens", runtime.MAX_TOKENS)

    def params(self) -> dict[str, object]:
        """The job's params, shaped exactly as the API stores them (defaults filled in)."""
        return {
            "artifact_id": self.artifact_id.data,
            "model_file": self.model_file.data,
            "prompts": parse_prompts(self.prompts.data or ""),
            "max_tokens": self._value(self.max_tokens, runtime.MAX_TOKENS),
        }


class InspectForm(FlaskForm):
    """V1: the pasted `docker inspect` of the node-agent container; app.acceptance checks the text."""

    inspect = TextAreaField(
        "Output of the command", validators=[DataRequired(message="Paste the output of the command above.")]
    )


class ScreenshotForm(FlaskForm):
    """V1: one UI screenshot; its size and type are checked by app.acceptance (one rule for the API too)."""

    screenshot = FileField("Screenshot", validators=[FileRequired(message="Choose a PNG or JPEG file.")])


# S1: the lifetimes the console offers (0: until revoked); the API takes any within api_keys' bounds.
API_KEY_EXPIRY_CHOICES = [
    SelectChoice(0, "Never (until revoked)"),
    SelectChoice(86_400, "1 day"),
    SelectChoice(30 * 86_400, "30 days"),
    SelectChoice(90 * 86_400, "90 days"),
    SelectChoice(365 * 86_400, "1 year"),
]
assert all(
    api_keys.MIN_EXPIRY_SECONDS <= choice.value <= api_keys.MAX_EXPIRY_SECONDS
    for choice in API_KEY_EXPIRY_CHOICES
    if choice.value
)


class ApiKeyForm(FlaskForm):
    """S1: a client key to mint: its name, and how long it lasts."""

    name = StringField(
        "Name",
        validators=[
            DataRequired(message="Name the key after the program that will use it."),
            Length(max=MAX_API_KEY_NAME_LENGTH),
            Printable(),
        ],
    )
    expires_in_seconds = SelectField("Expires", choices=API_KEY_EXPIRY_CHOICES, coerce=int, default=0)

    def expiry(self) -> int | None:
        """The validated lifetime in seconds, or None for a key that lasts until revoked."""
        return self.expires_in_seconds.data or None


ANYWHERE = ""  # the deploy form's node choice that leaves the node to placement (S3)


class DeploymentForm(RuntimeJobForm):
    """S2: deploy a model file of an artifact under a name clients use as OpenAI's `model`; placed
    on a node that holds the model and where it fits (S3), or on the node the operator names."""

    name = StringField(
        "Name",
        filters=[_stripped],
        validators=[
            DataRequired(message="Name the deployment: clients send this name as `model`."),
            Length(max=rules.MAX_DEPLOYMENT_NAME_LENGTH),
            Regexp(rules.DEPLOYMENT_NAME_PATTERN, message=f"Use {rules.DEPLOYMENT_NAME_RULE}."),
        ],
    )
    context_length = IntegerField(
        "Context",
        validators=[
            Optional(),
            NumberRange(
                deployments.CONTEXT_LENGTH.minimum,
                deployments.CONTEXT_LENGTH.maximum,
                message=f"Between {deployments.CONTEXT_LENGTH.minimum} and {deployments.CONTEXT_LENGTH.maximum}, "
                "or empty for the model's own.",
            ),
        ],
    )

    idle_unload_seconds = IntegerField(
        "Unload when idle",
        default=deployments.IDLE_UNLOAD_SECONDS.default,
        validators=[
            InputRequired(message="Seconds without a request before the model is freed, or 0 to keep it loaded."),
            NumberRange(
                deployments.IDLE_UNLOAD_SECONDS.minimum,
                deployments.IDLE_UNLOAD_SECONDS.maximum,
                message=f"Between {deployments.IDLE_UNLOAD_SECONDS.minimum} (keep it loaded) and "
                f"{deployments.IDLE_UNLOAD_SECONDS.maximum} seconds.",
            ),
        ],
    )
    node_id = SelectField("Node", validate_choice=False, default=ANYWHERE)
    tier = SelectField(
        "Tier", choices=[SelectChoice(tier, tier) for tier in deployments.TIERS], default=deployments.DEFAULT_TIER
    )

    def __init__(self, all_artifacts: list[Artifact], node_names: dict[str, str], **kwargs) -> None:
        super().__init__(all_artifacts, **kwargs)
        self.node_id.choices = [
            SelectChoice(ANYWHERE, "Wherever it fits"),
            *(SelectChoice(node_id, name) for node_id, name in sorted(node_names.items(), key=lambda item: item[1])),
        ]
        self.artifact_id.choices = [
            SelectChoice(
                artifact.id,
                f"{artifact.repo_id} @ {artifact.commit[:7]} on {node_names.get(artifact.node_id, artifact.node_id)}",
            )
            for artifact in all_artifacts
        ]

    def validate_artifact_id(self, field) -> None:
        if field.data not in {choice.value for choice in field.choices}:
            raise ValidationError("Pick one of the artifacts listed: acquire a model onto a node first.")

    def request(self) -> deployments.Request:
        """What the operator asks for, as the API's body would carry it."""
        return deployments.Request(
            name=self.name.data,
            artifact_id=self.artifact_id.data,
            model_file=self.model_file.data,
            node_id=self.node_id.data or None,
            tier=self.tier.data,
            context_length=self.context_length.data,
            idle_unload_seconds=self.idle_unload_seconds.data,
        )

    def validate_node_id(self, field) -> None:
        if field.data not in {choice.value for choice in field.choices}:
            raise ValidationError("Pick one of the nodes listed, or let placement choose.")


PLAYGROUND_MESSAGE_CHARS = 8000
PLAYGROUND_MAX_TOKENS = 256  # an answer in the page: enough to see the model, bounded


class PlaygroundForm(FlaskForm):
    """S6: one message to a deployment, answered as a stream in the page (static/console.js)."""

    message = TextAreaField(
        "Message", validators=[InputRequired("Write a message."), Length(max=PLAYGROUND_MESSAGE_CHARS)]
    )
    temperature = FloatField(
        "Temperature",
        default=0.8,
        validators=[Optional(), NumberRange(min=0, max=2, message="Use a number from 0 (greedy) to 2.")],
    )


class AlertTargetForm(FlaskForm):
    """O2: an alert target to add, one URL; never rendered back, since it holds the service's secret."""

    url = StringField("URL")

    def validate_url(self, field) -> None:
        from app.alerts import targets  # apprise, only where alert targets are handled

        try:
            self.prepared = targets.prepare(field.data or "")
        except targets.TargetRefused as refused:
            raise ValidationError(str(refused)) from None
