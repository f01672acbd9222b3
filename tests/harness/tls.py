"""A throwaway certificate authority for tests: a CA and a server certificate for 127.0.0.1 and
localhost, written as PEM files (made with ``cryptography``, nothing downloaded)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TestCa:
    ca_file: Path
    cert_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_test_ca(directory: Path, common_name: str = "milvus-cdc test CA") -> TestCa:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    found = TestCa(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    found.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    found.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    found.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    found.key_file.chmod(0o600)
    (directory / "ca.key").write_bytes(
        ca_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (directory / "ca.key").chmod(0o600)
    return found


@dataclass(frozen=True)
class Pki:
    """Certificates for the secure-connection tests (Kafka through tests/harness/
    kafka_secure_proxy.py, etcd, MariaDB, Milvus): good ones and the bad ones."""

    ca_file: Path  # the CA every good certificate chains to
    server_cert: Path  # 127.0.0.1 and localhost
    server_key: Path
    client_cert: Path  # for mutual TLS
    client_key: Path
    wrong_host_cert: Path  # chains to the CA, names another host
    wrong_host_key: Path
    expired_cert: Path  # chains to the CA, names 127.0.0.1, expired yesterday
    expired_key: Path
    other_ca_file: Path  # a CA nothing here is signed by
    stranger_cert: Path  # a client certificate the other CA signed
    stranger_key: Path


def _write_pair(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_file, key_file = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert_file, key_file


def _issue(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    common_name: str,
    names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    not_after: datetime.datetime,
    not_before: datetime.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or not_after - datetime.timedelta(days=2))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _load_ca(found: TestCa) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(found.ca_file.read_bytes())
    key = serialization.load_pem_private_key((found.ca_file.parent / "ca.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def make_test_pki(directory: Path) -> Pki:
    """A CA, the good server and client certificates, and the bad ones the failure tests use."""
    ca = make_test_ca(directory / "ca")
    other = make_test_ca(directory / "other", common_name="another CA")
    issuer = _load_ca(ca)
    now = datetime.datetime.now(datetime.UTC)
    tomorrow = now + datetime.timedelta(days=1)
    usage = x509.oid.ExtendedKeyUsageOID
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    client = _issue(issuer, "milvus-cdc", [], usage.CLIENT_AUTH, tomorrow)
    wrong = _issue(
        issuer,
        "server.elsewhere.test",
        [x509.DNSName("server.elsewhere.test")],
        usage.SERVER_AUTH,
        tomorrow,
    )
    expired = _issue(
        issuer, "127.0.0.1", local, usage.SERVER_AUTH, now - datetime.timedelta(days=1)
    )
    stranger = _issue(_load_ca(other), "stranger", [], usage.CLIENT_AUTH, tomorrow)
    client_files = _write_pair(directory, "client", *client)
    wrong_files = _write_pair(directory, "wrong-host", *wrong)
    expired_files = _write_pair(directory, "expired", *expired)
    return Pki(
        ca.ca_file,
        ca.cert_file,
        ca.key_file,
        *client_files,
        *wrong_files,
        *expired_files,
        other.ca_file,
        *_write_pair(directory, "stranger", *stranger),
    )


def issue_client_certificate(
    pki: Pki, directory: Path, stem: str, not_after: datetime.datetime
) -> tuple[Path, Path]:
    """A client certificate (and key) of ``pki``'s CA, valid from a week ago until
    ``not_after`` (in the past: an expired one), written as ``<stem>.pem``/``<stem>.key``."""
    issuer = _load_ca(TestCa(pki.ca_file, pki.server_cert, pki.server_key))
    week_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=7)
    usage = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
    pair = _issue(issuer, "milvus-cdc", [], usage, not_after, not_before=week_ago)
    return _write_pair(directory, stem, *pair)
