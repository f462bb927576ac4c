"""One test CA for a real control plane and the serving certificates it signs.

The API server's own `--cert-dir` pair names only its advertise address; the simulated nodes
reach it on the bridge address and the API server reaches Kueue's webhooks on 127.0.0.1, so
every TLS name is issued here from one CA, and one CA file is what every client trusts.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

VALID_FOR = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _key() -> object:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(folder: Path, name: str, cert: object, key: object) -> Pair:
    from cryptography.hazmat.primitives import serialization

    folder.mkdir(parents=True, exist_ok=True)
    pair = Pair(folder / f"{name}.crt", folder / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))  # type: ignore[attr-defined]
    pair.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,  # type: ignore[attr-defined]
                                           serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    pair.key.chmod(0o600)
    return pair


def make_ca(folder: Path, name: str = "trainyard-test-ca") -> Pair:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())  # type: ignore[attr-defined]
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))  # type: ignore[arg-type]
    return _write(folder, "ca", cert, key)


def issue(ca: Pair, folder: Path, name: str, *, ips: tuple[str, ...] = (), dns: tuple[str, ...] = ()) -> Pair:
    """A serving certificate for `ips` and `dns` names, signed by `ca`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(d) for d in dns]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())  # type: ignore[attr-defined]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    return _write(folder, name, cert, key)
