#!/usr/bin/env python3
"""Writes an OCI image archive (an image layout in a tar) without a container engine.

Each --layer is a directory or an uncompressed tar; directories are packed with numeric owners
from --owner rules (path prefix → uid:gid), everything else owned by root. The archive carries
`io.containerd.image.name`, so `ctr images import` names the image as given.

  oci.py --name localhost/hub/img:tag --layer base.tar --layer dir --entrypoint /bin/x \
         [--env K=V] [--user 1337:1337] [--workdir /] [--owner /etc/istio=1337:1337] -o out.tar
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def owner_of(path: str, rules: list[tuple[str, int, int]]) -> tuple[int, int]:
    """The uid:gid of the longest rule whose prefix is path or one of its parents."""
    best = (0, 0, 0)
    for prefix, uid, gid in rules:
        if (path == prefix or path.startswith(prefix.rstrip("/") + "/")) and len(prefix) > best[0]:
            best = (len(prefix), uid, gid)
    return best[1], best[2]


def pack_dir(root: str, rules: list[tuple[str, int, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                info = tar.gettarinfo(full, arcname=rel)
                info.uid, info.gid = owner_of("/" + rel, rules)
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def parse_owner(rule: str) -> tuple[str, int, int]:
    path, _, ids = rule.partition("=")
    uid, _, gid = ids.partition(":")
    if not path.startswith("/") or not uid.isdigit() or not gid.isdigit():
        sys.exit(f"oci.py: --owner wants /path=uid:gid, got {rule!r}")
    return path, int(uid), int(gid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--layer", action="append", required=True)
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--user", default="")
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--owner", action="append", default=[])
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    rules = [parse_owner(r) for r in args.owner]

    blobs: dict[str, bytes] = {}
    layers = []
    for layer in args.layer:
        if os.path.isdir(layer):
            data = pack_dir(layer, rules)
        else:
            with open(layer, "rb") as f:
                data = f.read()
        d = digest(data)
        blobs[d] = data
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": len(data)})

    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *args.env]
    config = {
        "architecture": "amd64" if os.uname().machine == "x86_64" else "arm64",
        "os": "linux",
        "config": {"Env": env, "Entrypoint": args.entrypoint or None, "Cmd": args.cmd or None,
                   "User": args.user, "WorkingDir": args.workdir},
        "rootfs": {"type": "layers", "diff_ids": [entry["digest"] for entry in layers]},
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    blobs[digest(config_bytes)] = config_bytes
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(config_bytes), "size": len(config_bytes)},
        "layers": layers,
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    blobs[digest(manifest_bytes)] = manifest_bytes
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest_bytes), "size": len(manifest_bytes),
            "annotations": {"io.containerd.image.name": args.name,
                            "org.opencontainers.image.ref.name": args.name.rsplit(":", 1)[-1]},
        }],
    }

    out_dir = os.path.dirname(os.path.abspath(args.out))
    with tempfile.NamedTemporaryFile(dir=out_dir, delete=False) as tmp:
        with tarfile.open(fileobj=tmp, mode="w") as tar:
            def add(name: str, data: bytes) -> None:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add("index.json", json.dumps(index).encode())
            for d, data in blobs.items():
                add("blobs/sha256/" + d.split(":", 1)[1], data)
    os.replace(tmp.name, args.out)
    print(f"oci.py: {args.name} -> {args.out} ({sum(len(b) for b in blobs.values()) >> 20} MiB)")


if __name__ == "__main__":
    main()
