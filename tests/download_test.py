"""Tests for sat_tf.serving.download: a preset's archive downloaded over HTTPS from a
server on 127.0.0.1 into the cache once; truncated, stalled, corrupt and unsafe archives
and bad URLs refused, leaving nothing in the cache."""

import datetime
import http.server
import io
import ipaddress
import json
import os
import re
import shutil
import ssl
import tarfile
import tempfile
import threading
from unittest import mock

import numpy as np
import tensorflow as tf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fixtures import WORDS, scenes
from preset_test import flip_byte, float16_rounded, generate, save_tiny_preset

from sat_tf.serving import download, inference, preset
from sat_tf.training import publish


def repacked(archive, changes):
    """`archive` (a .tar.gz) with members added or replaced: name -> bytes, or an int
    for that many zero bytes (which gzip shrinks a thousandfold).

    Returns:
      (its bytes, their length): a route of `https_server`.
    """
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as source,
        tarfile.open(fileobj=buffer, mode="w:gz") as tar,
    ):
        for member in source:
            if member.name not in changes:
                tar.addfile(member, source.extractfile(member))
        for name, content in changes.items():
            info = tarfile.TarInfo(name)
            info.size = content if isinstance(content, int) else len(content)
            data = b"\0" * content if isinstance(content, int) else content
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return data, len(data)


def tar_bytes(members):
    """A .tar.gz archive of `members` (name -> bytes, or a str: a symbolic link's target).

    Returns:
      (its bytes, their length): a route of `https_server`.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    data = buffer.getvalue()
    return data, len(data)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves `server.routes`: path -> (body, declared Content-Length); counts requests.

    For a path in `server.stalls` it sends half the body, then nothing until
    `server.release` is set (or 30 s pass).
    """

    def do_GET(self):
        self.server.requests.append(self.path)
        if self.path not in self.server.routes:
            self.send_error(404)
            return
        body, declared = self.server.routes[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "application/gzip")
        self.send_header("Content-Length", str(declared))
        self.end_headers()
        if self.path in self.server.stalls:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.server.release.wait(30)
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args):
        pass


def self_signed_certificate(folder):
    """A key and a one-day certificate for 127.0.0.1 (CN and IP subjectAltName), as PEM files.

    Returns:
      (certificate path, key path).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    with open(cert, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert, key_path


def https_server(folder):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate.

    Returns:
      (server, certificate path); the server runs in a daemon thread.
    """
    cert, key = self_signed_certificate(folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.routes, server.requests = {}, []
    server.stalls, server.release = set(), threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, cert


class DownloadTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        model, _, _ = save_tiny_preset(cls)
        cls.images = scenes(0, 4).astype(np.float32)
        cls.want = generate(float16_rounded(model), {"image": cls.images})
        cls.server, cls.cert = https_server(cls.root)
        cls.addClassCleanup(cls.server.server_close)
        cls.addClassCleanup(cls.server.shutdown)
        cls.base = f"https://127.0.0.1:{cls.server.server_address[1]}"

        archive = os.path.join(cls.root, "tiny.tar.gz")
        cls.digest = publish.pack(cls.directory, archive)
        with open(archive, "rb") as f:
            good = f.read()
        damaged = os.path.join(cls.root, "damaged")
        shutil.copytree(cls.directory, damaged)
        flip_byte(os.path.join(damaged, preset.WEIGHTS_FILE))
        with mock.patch.object(preset, "verify", lambda d: preset.read_metadata(d)):
            publish.pack(damaged, os.path.join(cls.root, "damaged.tar.gz"))
        with open(os.path.join(cls.root, "damaged.tar.gz"), "rb") as f:
            damaged_archive = f.read()
        flipped = bytearray(good)
        flipped[len(good) // 2] ^= 0xFF
        cls.server.stalls.add("/stalled.tar.gz")
        cls.addClassCleanup(cls.server.release.set)
        cls.server.routes.update(
            {
                "/stalled.tar.gz": (good, len(good)),
                "/escape.tar.gz": tar_bytes({"../metadata.json": b"{}"}),
                "/link.tar.gz": tar_bytes(
                    {
                        "metadata.json": b'{"files": {"weights.npz": {"bytes": 0}}}',
                        "weights.npz": "/etc/passwd",
                    }
                ),
                "/extra.tar.gz": repacked(good, {"tiny/evil.sh": b"#!/bin/sh\nrm -rf ~\n"}),
                "/bomb.tar.gz": repacked(good, {"tiny/weights.npz": 64 * 2**20}),
                "/tiny.tar.gz": (good, len(good)),
                "/cut.tar.gz": (good[: len(good) // 2], len(good)),
                "/short.tar.gz": (good[: len(good) // 2], len(good) // 2),
                "/flipped.tar.gz": (bytes(flipped), len(good)),
                "/damaged.tar.gz": (damaged_archive, len(damaged_archive)),
                "/notes.tar.gz": (b"these are notes", 15),
            }
        )

    def setUp(self):
        super().setUp()
        self.cache = tempfile.mkdtemp(dir=self.root)
        self.server.requests.clear()
        patch = mock.patch.dict(os.environ, {"SSL_CERT_FILE": self.cert})
        patch.start()
        self.addCleanup(patch.stop)

    def cached(self):
        folder = os.path.join(self.cache, "presets")
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    def test_download_once_then_from_the_cache(self):
        url = f"{self.base}/tiny.tar.gz#sha256={self.digest}"
        model, vocab, _ = inference.load_preset(url, cache_dir=self.cache)
        self.assertAllEqual(generate(model, {"image": self.images}).tokens, self.want.tokens)
        self.assertEqual(vocab.words, WORDS)
        self.assertEqual(self.server.requests, ["/tiny.tar.gz"])
        self.assertLen(self.cached(), 1)
        folder = os.path.join(self.cache, "presets", self.cached()[0])  # the URL's entry
        with open(os.path.join(folder, "download.json")) as f:
            self.assertEqual(json.load(f)["sha256"], self.digest)

        with mock.patch.dict(os.environ, {download.CACHE_ENV: self.cache}):
            self.assertEqual(download.default_cache_dir(), self.cache)
            model, _, _ = inference.load_preset(url)
        self.assertAllEqual(generate(model, {"image": self.images}).tokens, self.want.tokens)
        self.assertEqual(self.server.requests, ["/tiny.tar.gz"])

        # Without the fragment: another cache entry, one more download.
        inference.load_preset(f"{self.base}/tiny.tar.gz", cache_dir=self.cache)
        self.assertEqual(self.server.requests, ["/tiny.tar.gz"] * 2)
        self.assertLen(self.cached(), 2)

        # A cached preset damaged later is refused, naming what to delete.
        flip_byte(os.path.join(folder, preset.WEIGHTS_FILE))
        message = rf"fails its checksum.*delete {re.escape(folder)} to download it again\)$"
        with self.assertRaisesRegex(ValueError, message):
            inference.load_preset(url, cache_dir=self.cache)

    def assertRefused(self, path, message, fragment=""):
        url = f"{self.base}{path}{fragment}"
        for attempt in (1, 2):
            with self.assertRaises(ValueError) as raised:
                inference.load_preset(url, cache_dir=self.cache)
            self.assertRegex(str(raised.exception), message)
            self.assertNotIn("\n", str(raised.exception))
            # Nothing was kept: the next load downloads again.
            self.assertEqual(self.cached(), [])
            self.assertEqual(self.server.requests, [path] * attempt)

    def test_truncated_download_is_refused(self):
        total = len(self.server.routes["/tiny.tar.gz"][0])
        self.assertRefused(
            "/cut.tar.gz",
            r"cannot download .*/cut.tar.gz: retrieval incomplete: got only \d+ "
            rf"out of {total} bytes",
        )

    def test_stalled_download_is_given_up(self):
        # The server sends half the archive, then waits on an event this test never sets.
        with mock.patch.object(download, "TIMEOUT_SECONDS", 0.3):
            self.assertRefused(
                "/stalled.tar.gz",
                r"cannot download .*/stalled.tar.gz: the server sent nothing for 0.3 s "
                r"\(timed out\)$",
            )

    def test_truncated_archive_is_refused(self):
        self.assertRefused(
            "/short.tar.gz", r"archive from .*/short.tar.gz is truncated or not a .tar.gz archive"
        )
        self.server.requests.clear()
        self.assertRefused("/notes.tar.gz", r"is truncated or not a .tar.gz archive \(.+\)$")

    def test_archive_members_outside_files_and_folders_are_refused(self):
        self.assertRefused(
            "/escape.tar.gz", r"holds '\.\./metadata.json', which would land outside its folder$"
        )
        self.server.requests.clear()
        self.assertRefused("/link.tar.gz", r"holds 'weights.npz', which is neither a file nor a")

    def test_files_the_metadata_does_not_list_are_refused(self):
        self.assertRefused(
            "/extra.tar.gz",
            r"holds 'tiny/evil.sh', which its metadata.json does not list: refused, nothing "
            r"unpacked$",
        )

    def test_an_archive_unpacking_to_more_than_listed_is_refused(self):
        archive, size = self.server.routes["/bomb.tar.gz"]
        self.assertLess(size, 2**20)
        self.assertRefused(
            "/bomb.tar.gz",
            r"unpacks to over [\d,]+ bytes, more than 4 times what its metadata.json lists: "
            r"refused, nothing unpacked$",
        )

    def test_a_url_without_a_checksum_warns_what_was_not_checked(self):
        with mock.patch.object(download.logging, "warning") as warning:
            inference.load_preset(f"{self.base}/tiny.tar.gz", cache_dir=self.cache)
            inference.load_preset(f"{self.base}/tiny.tar.gz", cache_dir=self.cache)
        warning.assert_called_once()
        self.assertIn(
            "has no #sha256=<hex>: the archive is trusted on TLS alone", warning.call_args[0][0]
        )
        with mock.patch.object(download.logging, "warning") as warning:
            inference.load_preset(
                f"{self.base}/tiny.tar.gz#sha256={self.digest}", cache_dir=self.cache
            )
        warning.assert_not_called()

    def test_corrupt_download_is_refused(self):
        self.assertRefused(
            "/flipped.tar.gz",
            rf"has sha256 [0-9a-f]{{64}}, the URL's #sha256= says {self.digest}",
            fragment=f"#sha256={self.digest}",
        )

    def test_archive_failing_a_file_checksum_is_refused(self):
        self.assertRefused(
            "/damaged.tar.gz", r"^preset https://127.0.0.1:\d+/damaged.tar.gz: weights.npz fails"
        )

    def test_bad_urls(self):
        with self.assertRaisesRegex(ValueError, r"cannot download .*/none.tar.gz: HTTP 404"):
            inference.load_preset(f"{self.base}/none.tar.gz", cache_dir=self.cache)
        with self.assertRaisesRegex(ValueError, r"is not https://; downloads go over HTTPS only"):
            inference.load_preset(f"http://127.0.0.1:{self.server.server_address[1]}/tiny.tar.gz")
        with self.assertRaisesRegex(ValueError, r"fragment #md5=abc of .* is not sha256="):
            inference.load_preset(f"{self.base}/tiny.tar.gz#md5=abc", cache_dir=self.cache)
        with mock.patch.dict(os.environ, {"SSL_CERT_FILE": "", "SSL_CERT_DIR": self.cache}):
            with self.assertRaisesRegex(ValueError, r"cannot download .*CERTIFICATE_VERIFY"):
                inference.load_preset(f"{self.base}/tiny.tar.gz", cache_dir=self.cache)
        self.assertEqual(self.cached(), [])


if __name__ == "__main__":
    tf.test.main()
