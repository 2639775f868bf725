#!/usr/bin/env python3
"""Objects of one Kubernetes manifest that another lacks.

  manifest_diff.py A.yaml B.yaml   prints `kind namespace name` for each object in A not in B

The kind is qualified by its API version and group (`Gateway.v1.networking.istio.io`) where it
has a group, so that kubectl tells apart kinds of the same name.
"""

import re
import sys

# istioctl's manifests: top-level keys at column 0, `metadata`'s own keys two spaces in.
TOP = re.compile(r"^(\w+):\s*(.*)$")
META = re.compile(r"^  (name|namespace):\s*(\S+)\s*$")


def objects(path: str) -> "set[tuple[str, str, str]]":
    """(kind, namespace, name) of each document, read without a YAML library."""
    found = set()
    with open(path, encoding="utf-8") as f:
        for doc in re.split(r"^---\s*$", f.read(), flags=re.M):
            kind, api, meta, in_meta = "", "", {}, False
            for line in doc.splitlines():
                top = TOP.match(line)
                if top:
                    in_meta = top.group(1) == "metadata"
                    if top.group(1) == "kind":
                        kind = top.group(2).strip().strip('"')
                    elif top.group(1) == "apiVersion":
                        api = top.group(2).strip().strip('"')
                    continue
                field = META.match(line) if in_meta else None
                if field:
                    meta.setdefault(field.group(1), field.group(2).strip('"'))
            group, _, version = api.rpartition("/")
            if kind and group:
                kind = f"{kind}.{version}.{group}"
            if kind:
                found.add((kind, meta.get("namespace", "default"), meta.get("name", "")))
    return found


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: manifest_diff.py A.yaml B.yaml")
    for kind, namespace, name in sorted(objects(sys.argv[1]) - objects(sys.argv[2])):
        print(kind, namespace, name)


if __name__ == "__main__":
    main()
