"""The API keys page (S1, S6): list client keys, mint one with a one-time reveal, revoke.

A minted key exists in exactly one place afterwards: the HTML of the POST response that reveals
it (never the session, a URL, a log or a cacheable response; console.js removes it when the
reader hides it, revokes a key or leaves the page). The table shows only the visible prefix.
"""

from __future__ import annotations

from app.console import bp, page_or_partial
from app.console.auth import login_required
from app.console.forms import ApiKeyForm, EmptyForm
from app.db import begin_read_only
from app.models.api_key import MAX_NAME_LENGTH
from app.serving import api_keys
from app.timeutil import utcnow


def _panel(status: int = 200, form: ApiKeyForm | None = None, **context):
    """The keys panel: the page, or the panel alone for htmx (swapped over #api-keys)."""
    now = utcnow()
    keys = [(key, api_keys.state(key, now)) for key in api_keys.list_all()]
    return page_or_partial(
        "api_keys.html",
        "partials/_api_keys.html",
        keys=keys,
        form=form or ApiKeyForm(formdata=None),
        revoke_form=EmptyForm(),
        max_name_length=MAX_NAME_LENGTH,
        active="api_keys",
        **context,
    ), status


@bp.get("/settings/api-keys")
@login_required
def api_keys_page():
    """S1: every client key with its prefix, creation, last use, expiry and state."""
    begin_read_only()
    return _panel()


@bp.post("/settings/api-keys")
@login_required
def api_key_mint():
    """S1: mint a key and reveal it once, in this response only."""
    form = ApiKeyForm()
    if not form.validate_on_submit():
        return _panel(422, form=form)
    minted, secret = api_keys.mint(form.name.data.strip(), form.expiry())
    return _panel(201, revealed=minted, revealed_key=secret)


@bp.post("/settings/api-keys/<api_key_id>/revoke")
@login_required
def api_key_revoke(api_key_id: str):
    """S1: revoke a key; its next request is refused (API_KEY_NOT_FOUND is the error page)."""
    form = EmptyForm()
    if not form.validate_on_submit():
        return _panel(400, notice="The form expired; reload the page and try again.")
    revoked = api_keys.revoke(api_key_id)
    return _panel(notice=f"Key “{revoked.name}” ({revoked.prefix}…) revoked: its next request is refused.")
