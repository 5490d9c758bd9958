"""--ssl_config_file: the gRPC port's TLS, as TF Serving builds it (server.cc
`BuildServerCredentials`): the server's key and certificate, and with client_verify the
client must present a certificate that custom_ca signed (mutual TLS). The fields hold PEM
text, not paths. The key, the certificates and their match are checked with
`cryptography` before the port opens, so a bad file ends the start with one line naming
the file and the field instead of a handshake that fails for every client.
"""

import datetime

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from sat_tf.server import model_config
from sat_tf.server.model_config import ConfigError


def read_credentials(path: str) -> grpc.ServerCredentials:
    """The server credentials of the SSLConfig file at `path`."""
    return server_credentials(model_config.read_ssl_config(path), path)


def server_credentials(config, source: str) -> grpc.ServerCredentials:
    """grpc's SSL server credentials for an SSLConfig, checked first.

    Raises:
        ConfigError: naming `source` and the field, for an empty or unreadable key or
            certificate, an encrypted key, a key that is not the certificate's, an
            expired certificate, or client_verify without custom_ca.
    """
    key = _private_key(config.server_key, source)
    certificate = _certificates(config.server_cert, source, "server_cert")[0]
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != certificate.public_key().public_bytes(*spki):
        raise ConfigError(f"{source}: server_key: not the key of the certificate in server_cert")
    expiry = certificate.not_valid_after_utc
    if expiry < datetime.datetime.now(datetime.UTC):
        raise ConfigError(f"{source}: server_cert: expired on {expiry:%Y-%m-%d %H:%M} UTC")
    if config.custom_ca:
        _certificates(config.custom_ca, source, "custom_ca")
    elif config.client_verify:
        raise ConfigError(
            f"{source}: client_verify: true, but custom_ca is empty; it holds the PEM "
            "certificates of the authorities that sign client certificates"
        )
    return grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() or None,
        require_client_auth=config.client_verify,
    )


def _pem(text: str, source: str, field: str) -> bytes:
    if not text.strip():
        raise ConfigError(f"{source}: {field}: empty")
    if "-----BEGIN " not in text:
        raise ConfigError(
            f"{source}: {field}: holds no PEM text (it holds the PEM itself, not a path)"
        )
    return text.encode()


def _private_key(text: str, source: str):
    pem = _pem(text, source, "server_key")
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # cryptography's answer to a key that needs a password
        raise ConfigError(
            f"{source}: server_key: encrypted; gRPC takes an unencrypted key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(f"{source}: server_key: not a PEM private key") from None


def _certificates(text: str, source: str, field: str) -> list:
    pem = _pem(text, source, field)
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise ConfigError(f"{source}: {field}: not PEM certificates") from None
