#!/usr/bin/env python3
"""Objects of one Kubernetes manifest that another lacks.

  manifest_diff.py A.yaml B.yaml   prints `kind namespace name` for each object in A not in B

The kind is qualified by its API version and group (`Gateway.v1.networking.istio.io`) where it
has a group, so that kubectl tells apart kinds of the same name.
"""

import sys

import yaml


def objects(path: str) -> "set[tuple[str, str, str]]":
    with open(path, encoding="utf-8") as f:
        found = set()
        for doc in yaml.safe_load_all(f):
            if not isinstance(doc, dict) or "kind" not in doc:
                continue
            meta = doc.get("metadata") or {}
            kind = doc["kind"]
            group, _, version = str(doc.get("apiVersion", "")).rpartition("/")
            if group:
                kind = f"{kind}.{version}.{group}"
            found.add((kind, meta.get("namespace") or "default", meta.get("name", "")))
        return found


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: manifest_diff.py A.yaml B.yaml")
    for kind, namespace, name in sorted(objects(sys.argv[1]) - objects(sys.argv[2])):
        print(kind, namespace, name)


if __name__ == "__main__":
    main()
