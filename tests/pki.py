"""Certificates on disk for TLS tests (trustme)."""

from pathlib import Path


def write_cert(cert, directory, name: str) -> tuple[str, str]:
    """``cert``'s chain to ``directory/NAME.pem`` and its key to ``NAME.key``; -> both paths."""
    directory = Path(directory)
    crt, key = directory / f"{name}.pem", directory / f"{name}.key"
    with open(crt, "wb") as fh:
        for blob in cert.cert_chain_pems:
            fh.write(blob.bytes())
    cert.private_key_pem.write_to_path(str(key))
    return str(crt), str(key)
