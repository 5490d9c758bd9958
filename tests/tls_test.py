"""TLS and mutual TLS on a real gRPC port on 127.0.0.1, with certificates made here by
`cryptography`, and every bad SSLConfig refused with one line naming the file and field."""

import datetime
import ipaddress
import os
import re
from concurrent import futures

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import text_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sat_tf.server import tls
from sat_tf.server.health import SERVING, HealthService
from sat_tf.server.model_config import ConfigError
from sat_tf.server.protos import ssl_config_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE = 10  # seconds a call may take
NOW = datetime.datetime.now(datetime.UTC)


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key, password=None):
    encryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    ).decode()


def _certificate(name, key, issuer=None, ca=False, days=(-1, 30)):
    """A certificate for `key` named `name`, signed by `issuer` ((name, key)) or by itself."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW + datetime.timedelta(days=days[0]))
        .not_valid_after(NOW + datetime.timedelta(days=days[1]))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(issuer_key, hashes.SHA256())
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


class Authority:
    """A certificate authority that signs server and client certificates."""

    def __init__(self, name):
        self.key = _key()
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.pem = _certificate(name, self.key, ca=True)

    def issue(self, name, days=(-1, 30)):
        """(key PEM, certificate PEM) of a new key signed by this authority."""
        key = _key()
        return _pem_key(key), _certificate(name, key, (self.name, self.key), days=days)


@pytest.fixture(scope="module")
def pki():
    ca, other = Authority("test CA"), Authority("another CA")
    return {
        "ca": ca,
        "other": other,
        "server": ca.issue("localhost"),
        "client": ca.issue("a client"),
        "stranger": other.issue("a stranger"),
    }


def _config(pki, client_verify=False):
    key, certificate = pki["server"]
    return ssl_config_pb2.SSLConfig(
        server_key=key,
        server_cert=certificate,
        custom_ca=pki["ca"].pem if client_verify else "",
        client_verify=client_verify,
    )


def _serve(credentials):
    """A gRPC server answering grpc.health on 127.0.0.1 with `credentials`, and its port."""

    class Serving:
        def available(self):
            return {"sat": True}

        def draining(self):
            return False

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    HealthService(Serving()).add_to_server(server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


def _check(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="sat")
    return stub.Check(request, timeout=DEADLINE).status


def _secure(port, pki, root="ca", client=None):
    key, chain = pki[client] if client else (None, None)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki[root].pem.encode(),
        private_key=key and key.encode(),
        certificate_chain=chain and chain.encode(),
    )
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials)


def _fails(channel):
    with channel, pytest.raises(grpc.RpcError) as caught:
        _check(channel)
    return caught.value.code()


def test_a_channel_that_trusts_the_ca_is_answered_and_others_are_not(pki):
    server, port = _serve(tls.server_credentials(_config(pki), "ssl.config"))
    try:
        with _secure(port, pki) as channel:
            assert _check(channel) == SERVING
        with _secure(port, pki, client="client") as channel:  # a certificate not asked for
            assert _check(channel) == SERVING
        assert _fails(grpc.insecure_channel(f"127.0.0.1:{port}")) == grpc.StatusCode.UNAVAILABLE
        assert _fails(_secure(port, pki, root="other")) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)


def test_client_verify_answers_only_clients_the_ca_signed(pki):
    credentials = tls.server_credentials(_config(pki, client_verify=True), "ssl.config")
    server, port = _serve(credentials)
    try:
        with _secure(port, pki, client="client") as channel:
            assert _check(channel) == SERVING
        assert _fails(_secure(port, pki)) == grpc.StatusCode.UNAVAILABLE
        assert _fails(_secure(port, pki, client="stranger")) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)


def test_the_file_is_read_with_pem_text_inline(pki, tmp_path):
    path = tmp_path / "ssl.config"
    path.write_text(text_format.MessageToString(_config(pki, client_verify=True)))
    server, port = _serve(tls.read_credentials(str(path)))
    try:
        with _secure(port, pki, client="client") as channel:
            assert _check(channel) == SERVING
    finally:
        server.stop(grace=None)


def test_the_examples_ssl_config_takes_real_pem_in_its_layout(pki, tmp_path):
    # The example's PEM bodies are shortened; its layout (one quoted line per PEM line)
    # with a real key and certificates in their place gives working credentials.
    with open(os.path.join(ROOT, "export", "serving", "examples", "ssl.config")) as f:
        example = f.read()
    real = {"server_key": pki["server"][0], "server_cert": pki["server"][1]}
    real["custom_ca"] = pki["ca"].pem

    def lines(match):
        field = match.group(1)
        quoted = "".join(f'  "{line}\\n"\n' for line in real[field].splitlines())
        return f"{field}:\n{quoted}"

    text, count = re.subn(r'(\w+):\n(?:  ".*"\n)+', lines, example)
    assert count == 3
    path = tmp_path / "ssl.config"
    path.write_text(text)
    server, port = _serve(tls.read_credentials(str(path)))
    try:
        with _secure(port, pki, client="client") as channel:
            assert _check(channel) == SERVING
    finally:
        server.stop(grace=None)


def _refusal(config):
    with pytest.raises(ConfigError) as caught:
        tls.server_credentials(config, "/etc/ssl.config")
    return str(caught.value)


def test_a_key_that_is_not_the_certificates_is_refused(pki):
    config = _config(pki)
    config.server_key = pki["client"][0]
    assert _refusal(config) == (
        "/etc/ssl.config: server_key: not the key of the certificate in server_cert"
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("server_key", "", "server_key: empty"),
        ("server_key", "/etc/keys/server.key", "server_key: holds no PEM text (it holds the "
         "PEM itself, not a path)"),
        ("server_key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
         "server_key: not a PEM private key"),
        ("server_cert", "", "server_cert: empty"),
        ("server_cert", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
         "server_cert: not PEM certificates"),
        ("custom_ca", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
         "custom_ca: not PEM certificates"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named(pki, field, value, message):
    config = _config(pki)
    setattr(config, field, value)
    assert _refusal(config) == f"/etc/ssl.config: {message}"


def test_an_encrypted_key_is_refused(pki):
    config = _config(pki)
    config.server_key = _pem_key(serialization.load_pem_private_key(
        pki["server"][0].encode(), password=None), password=b"secret")  # fmt: skip
    assert _refusal(config) == (
        "/etc/ssl.config: server_key: encrypted; gRPC takes an unencrypted key"
    )


def test_an_expired_certificate_is_refused(pki):
    key, certificate = pki["ca"].issue("localhost", days=(-30, -1))
    config = ssl_config_pb2.SSLConfig(server_key=key, server_cert=certificate)
    expiry = x509.load_pem_x509_certificate(certificate.encode()).not_valid_after_utc
    assert _refusal(config) == (
        f"/etc/ssl.config: server_cert: expired on {expiry:%Y-%m-%d %H:%M} UTC"
    )


def test_client_verify_without_an_authority_is_refused(pki):
    config = _config(pki)
    config.client_verify = True
    assert _refusal(config) == (
        "/etc/ssl.config: client_verify: true, but custom_ca is empty; it holds the PEM "
        "certificates of the authorities that sign client certificates"
    )
