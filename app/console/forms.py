"""Console forms (Flask-WTF): each carries its CSRF token (C1)."""

from __future__ import annotations

from flask_wtf import FlaskForm
from wtforms import BooleanField, PasswordField, RadioField, SelectField, StringField, TextAreaField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from app import rules
from app.console.commands import LOCAL_BUILD, ImageSource, env_value_error, pinned_image, release_image
from app.enrollment import MAX_EXPIRY_SECONDS
from app.release_manifest import MAX_PASTE_BYTES, parse_pasted

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
# D5 and the seed: the release bundle is the default; a pinned registry image the alternative; a
# local source build is for development.
IMAGE_SOURCE_CHOICES = [
    SelectChoice("release", "Release bundle loaded on the node — checked against the release manifest"),
    SelectChoice("digest", "Registry image pinned by @sha256 digest"),
    SelectChoice("local", "Built from this checkout on the node (development)"),
]


class Printable:
    """A field validator: the API's one text rule (app/rules.py), so both refuse the same names."""

    def __call__(self, form, field) -> None:
        if not rules.is_text(field.data or ""):
            raise ValidationError("Use printable characters only.")


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
    image_source = RadioField("Agent image", choices=IMAGE_SOURCE_CHOICES, default="release")
    release_entry = TextAreaField("images.modelforge-node-agent", validators=[Length(max=MAX_PASTE_BYTES)])
    pinned_reference = StringField("Pinned image", validators=[Length(max=500)])
    lab_eligible = BooleanField("Lab eligible")
    benchmark_eligible = BooleanField("Benchmark eligible")

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
