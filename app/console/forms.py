"""Console forms (Flask-WTF): each carries its CSRF token (C1)."""

from __future__ import annotations

from flask_wtf import FlaskForm
from wtforms import BooleanField, PasswordField, SelectField, StringField, TextAreaField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from app.console.commands import env_value_error
from app.enrollment import LABEL_KEY, MAX_EXPIRY_SECONDS, MAX_LABEL_VALUE_LENGTH, MAX_LABELS

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


def _printable(text: str) -> bool:
    return not any(ord(char) < 32 or ord(char) == 127 for char in text)


class Printable:
    """A field validator: no control characters (NUL and friends end up in the database)."""

    def __call__(self, form, field) -> None:
        if not _printable(field.data or ""):
            raise ValidationError("Use printable characters only.")


class EmptyForm(FlaskForm):
    """A button-only POST still carries the CSRF token."""


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
        if not LABEL_KEY.match(key):
            raise ValueError(
                f"line {number}: a label name is up to 63 letters, digits, . _ / - and starts with a letter or digit"
            )
        if len(value) > MAX_LABEL_VALUE_LENGTH or not _printable(value):
            raise ValueError(f"line {number}: a value is up to {MAX_LABEL_VALUE_LENGTH} printable characters")
        if key in labels:
            raise ValueError(f"line {number}: label {key!r} appears twice")
        labels[key] = value
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
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
    lab_eligible = BooleanField("Lab eligible")
    benchmark_eligible = BooleanField("Benchmark eligible")

    def validate_display_name(self, field) -> None:
        """Nothing a .env file cannot hold exactly (the name goes into one)."""
        if problem := env_value_error((field.data or "").strip()):
            raise ValidationError(f"The display name {problem}.")

    def validate_labels(self, field) -> None:
        """Labels parse as key=value lines."""
        try:
            parse_labels(field.data or "")
        except ValueError as error:
            raise ValidationError(str(error)) from None
