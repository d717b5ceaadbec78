"""axe-core in the page under test, offline: the vendored copy in tests/data/vendor/, run by Playwright.

The console's CSP refuses a script tag it did not serve, so the source goes in through
`page.evaluate` (the DevTools protocol, which the CSP does not govern), never `add_script_tag`
and never `bypass_csp`: the page is checked exactly as the console serves it.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache

from tests.support import DATA_DIR

AXE_DIR = DATA_DIR / "vendor" / "axe-core-4.10.3"
# WCAG 2.0 and 2.1, levels A and AA: what the "0 violations" is measured against.
WCAG_21_AA = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa")


@cache
def axe_source() -> str:
    """The vendored axe.min.js, after checking it is the file SOURCE.md names."""
    source = (AXE_DIR / "axe.min.js").read_bytes()
    pinned = re.search(r"`axe\.min\.js`.*?SHA-256 `([0-9a-f]{64})`", (AXE_DIR / "SOURCE.md").read_text(), re.S)
    assert pinned and hashlib.sha256(source).hexdigest() == pinned.group(1), "axe.min.js is not the pinned file"
    return source.decode()


def violations(page, tags: tuple[str, ...] = WCAG_21_AA) -> list[dict[str, object]]:
    """axe's violations on the page as it stands, each as its rule id, impact and failing nodes'
    selectors (and the first node's summary), so a failing `== []` prints what to fix."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(f"() => {{ {axe_source()}\n}}")
        # The library assigns window.axe when its wrapper sees no module system; make sure it did.
        assert page.evaluate("() => typeof window.axe === 'object'"), "axe-core did not load"
    found = page.evaluate(
        """async (tags) => {
            const results = await window.axe.run(document, {runOnly: {type: "tag", values: tags},
                                                           resultTypes: ["violations"]});
            return results.violations.map((v) => ({
                id: v.id, impact: v.impact,
                targets: v.nodes.map((n) => n.target.join(" ")),
                summary: v.nodes.length ? v.nodes[0].failureSummary : "",
            }));
        }""",
        list(tags),
    )
    return found
