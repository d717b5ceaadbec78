"""TLS with a private CA made in the test: the agent trusts it only through MODELFORGE_AGENT_CA_CERT_PATH (D3)."""

from __future__ import annotations

from tests.support import assert_no_secrets
from tests.support.agent import AgentProcess, mint_token


def test_agent_trusts_the_private_ca_only_when_told(tls_server, tmp_path):
    minted = mint_token(tls_server.url, verify=tls_server.verify)
    assert minted["api_origin"] == tls_server.url

    untrusting = AgentProcess(tmp_path, tls_server.url, "untrusting", MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"])
    untrusting.start()
    untrusting.wait_for(r"TLSError \(certificate verify failed: set MODELFORGE_AGENT_CA_CERT_PATH", timeout=15)
    assert untrusting.stop() < 1.0
    assert list(untrusting.state_dir.iterdir()) == [untrusting.state_dir / "node-id"]  # no credential

    trusting = AgentProcess(
        tmp_path,
        tls_server.url,
        "trusting",
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"],
        MODELFORGE_AGENT_CA_CERT_PATH=str(tmp_path / "ca.pem"),
    )
    assert trusting.run("--once") == 0, trusting.log()
    assert "enrolled as node" in trusting.log()
    tls_server.stop()
    assert_no_secrets(untrusting.log() + trusting.log() + tls_server.log(), minted["token"], trusting.credential())
