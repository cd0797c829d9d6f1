"""A self-signed certificate for serving the demo (and the tests) over TLS on loopback.

`python -m demo_project.devcert DIR` writes DIR/cert.pem and DIR/key.pem, valid for localhost,
127.0.0.1 and ::1 for a week, and prints the directory. Made on the fly, never committed: the
key is new each time and only this machine's clients that are told to trust cert.pem accept it
(`curl --cacert DIR/cert.pem`, `HttpClient(..., verify="DIR/cert.pem")`).
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: Names the certificate is valid for: what the demo's ALLOWED_HOSTS lets in.
DNS_NAMES = ("localhost",)
IP_ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class DevCertificate:
    """Where a written certificate and its key are."""

    cert: Path
    key: Path


def write_certificate(directory: Path, days: int = 7) -> DevCertificate:
    """A new key and a self-signed certificate for loopback, as PEM files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acp-channels dev")])
    now = datetime.datetime.now(datetime.UTC)
    alternative_names: list[x509.GeneralName] = [x509.DNSName(host) for host in DNS_NAMES]
    alternative_names += [x509.IPAddress(ipaddress.ip_address(address)) for address in IP_ADDRESSES]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        # A CA certificate of its own, so clients can trust it as their CA file.
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    paths = DevCertificate(cert=directory / "cert.pem", key=directory / "key.pem")
    paths.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    paths.key.touch(mode=0o600)
    paths.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m demo_project.devcert DIR", file=sys.stderr)
        return 2
    written = write_certificate(Path(argv[0]))
    print(written.cert.parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
