"""TLS with a private CA made in the test: the agent trusts it only through MODELFORGE_AGENT_CA_CERT_PATH (D3)."""

from __future__ import annotations

import ipaddress
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.agent_support import AgentProcess, mint_token
from tests.support import GunicornServer, assert_no_secrets

pytestmark = pytest.mark.e2e


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_private_ca(directory):
    """A CA and a server certificate for 127.0.0.1/localhost signed by it; returns (cert, key, ca) paths."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("ModelForge Test Private CA"))
        .issuer_name(_name("ModelForge Test Private CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("modelforge.test"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "server.pem", directory / "server.key", directory / "ca.pem"
    paths[0].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths[2].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return paths


@pytest.fixture
def tls_server(sqlite_template, tmp_path):
    path = tmp_path / "tls.sqlite3"
    shutil.copyfile(sqlite_template, path)
    running = GunicornServer(
        f"sqlite:///{path}",
        tmp_path,
        workers=2,
        tls=make_private_ca(tmp_path),
        MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1",
    )
    running.start()
    yield running
    running.stop()


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
