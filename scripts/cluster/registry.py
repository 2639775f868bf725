#!/usr/bin/env python3
"""A read-only image registry over the node's OCI archives, for pulls the kubelet must make.

  registry.py --listen 127.0.0.1:5000 DIR   serves every DIR/*.tar (OCI archives)

The images are imported into containerd and never pulled, except where a manifest says
`imagePullPolicy: Always` (Istio's ext-authz sample, which its security suites deploy): the
kubelet then asks containerd to resolve the reference, and containerd, told by the node's
hosts.toml that `localhost` is this server, gets the same manifest digest back and keeps the
image it has. Only the pull side of the OCI distribution API is served (GET and HEAD of
`/v2/`, manifests by tag or digest, blobs by digest); a push or any other path gets 405/404.
It listens inside the node's network namespace only.
"""

import argparse
import http.server
import json
import re
import sys
import tarfile
from pathlib import Path

MANIFEST = re.compile(r"^/v2/(.+)/manifests/([^/]+)$")
BLOB = re.compile(r"^/v2/(.+)/blobs/(sha256:[0-9a-f]{64})$")
# The registry part of an image name as containerd writes it (`localhost/mesh-agent/x:tag`).
HOST = re.compile(r"^[^/]*[.:][^/]*/|^localhost/")


class Store:
    """Manifests by (repository, tag) and blobs by digest, read in place from the archives."""

    def __init__(self, directory: Path):
        self.tags: dict[tuple[str, str], str] = {}
        self.blobs: dict[str, tuple[Path, int, int]] = {}
        self.types: dict[str, str] = {}
        for archive in sorted(directory.glob("*.tar")):
            self._index(archive)

    def _index(self, archive: Path) -> None:
        with tarfile.open(archive) as tar:
            index = None
            for member in tar.getmembers():
                if member.name.startswith("blobs/sha256/") and member.isfile():
                    digest = "sha256:" + member.name.rsplit("/", 1)[1]
                    self.blobs[digest] = (archive, member.offset_data, member.size)
                elif member.name == "index.json":
                    index = json.load(tar.extractfile(member))
        for desc in (index or {}).get("manifests", []):
            name = desc.get("annotations", {}).get("io.containerd.image.name", "")
            repo, _, tag = HOST.sub("", name).rpartition(":")
            if repo:
                self.tags[(repo, tag)] = desc["digest"]
            self.types[desc["digest"]] = desc["mediaType"]

    def read(self, digest: str) -> bytes:
        archive, offset, size = self.blobs[digest]
        with open(archive, "rb") as f:
            f.seek(offset)
            return f.read(size)


def handler(store: Store):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            # containerd adds `?ns=<registry host>` when it resolves through a hosts.toml.
            path = self.path.split("?", 1)[0]
            if path in ("/v2/", "/v2"):
                return self._send(200, b"{}", "application/json", None, body)
            m = MANIFEST.match(path)
            if m:
                repo, ref = m.groups()
                digest = ref if ref.startswith("sha256:") else store.tags.get((repo, ref))
                if digest in store.types and digest in store.blobs:
                    return self._send(200, store.read(digest), store.types[digest], digest, body)
                return self._error(404, "MANIFEST_UNKNOWN", f"{repo}:{ref}", body)
            m = BLOB.match(path)
            if m and m.group(2) in store.blobs:
                digest = m.group(2)
                return self._send(200, store.read(digest), "application/octet-stream", digest, body)
            if m:
                return self._error(404, "BLOB_UNKNOWN", m.group(2), body)
            return self._error(404, "NAME_UNKNOWN", path, body)

        def do_POST(self) -> None:
            self._error(405, "UNSUPPORTED", "read-only registry", True)

        do_PUT = do_PATCH = do_DELETE = do_POST

        def _error(self, code: int, what: str, detail: str, body: bool) -> None:
            doc = json.dumps({"errors": [{"code": what, "message": detail}]}).encode()
            self._send(code, doc, "application/json", None, body)

        def _send(self, code, data: bytes, ctype: str, digest, body: bool) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, fmt: str, *args) -> None:
            sys.stderr.write("registry: " + (fmt % args) + "\n")

    return Handler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:5000")
    p.add_argument("dir", type=Path)
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    store = Store(args.dir)
    print(f"registry: {len(store.tags)} images on {args.listen}", file=sys.stderr, flush=True)
    server = http.server.ThreadingHTTPServer((host, int(port)), handler(store))
    server.serve_forever()


if __name__ == "__main__":
    main()
