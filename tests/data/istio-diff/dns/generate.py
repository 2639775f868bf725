#!/usr/bin/env python3
"""Generates the `dns` differential suite's inputs (issue #26), seeded (26).

Writes, next to this file:
  config.yaml   istiod-lite's config: Kubernetes Services (ClusterIP v4, v6, dual-stack,
                headless with pods, ExternalName) in four namespaces and ServiceEntries (v4/v6
                addresses, wildcard hosts, shared hosts, many addresses): the NDS table
  upstream.conf the upstream dnsmasq's records (names not in the table)
  cases.jsonl   one query a line: id, proto (udp|tcp), query (the packet, hex), what (readable)

    python3 tests/data/istio-diff/dns/generate.py
"""

import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 26
CASES = 5200
POD_NS = "demo"
NAMESPACES = ["demo", "ns-a", "ns-b", "ns-c"]
SEARCH = [f"{POD_NS}.svc.cluster.local", "svc.cluster.local", "cluster.local"]

rng = random.Random(SEED)

# --- the mesh: istiod-lite's config --------------------------------------------------------

docs = []
# Table entries the generator asks for: (kind, fqdn, short, ns) where kind is k8s|se|wild|pod.
k8s_names = []
se_names = []
wild_names = []
pod_names = []


def svc_doc(name, ns, cluster_ips, *, headless=False, ext=None, selector=None):
    spec = {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    if ext:
        spec = {"type": "ExternalName", "externalName": ext}
    elif headless:
        spec["clusterIP"] = "None"
    else:
        spec["clusterIP"] = cluster_ips[0]
        spec["clusterIPs"] = cluster_ips
    if selector:
        spec["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


n = 0
for ni, ns in enumerate(NAMESPACES):
    for i in range(45):
        n += 1
        name = rng.choice(["web", "api", "db", "cache", "auth", "pay", "cart", "mail"]) + f"-{i}"
        v4 = f"198.19.{10 + ni}.{i + 1}"
        v6 = f"fd00::19:{10 + ni:x}:{i + 1:x}"
        mode = rng.choice(["v4", "v4", "v4", "dual", "v6"])
        ips = {"v4": [v4], "dual": [v4, v6], "v6": [v6]}[mode]
        docs.append(svc_doc(name, ns, ips))
        k8s_names.append((f"{name}.{ns}.svc.cluster.local", name, ns))
    # A headless Service with pods that have hostname/subdomain, and one with many pods.
    sel = {"app": f"hl-{ns}"}
    docs.append(svc_doc("hl", ns, [], headless=True, selector=sel))
    k8s_names.append((f"hl.{ns}.svc.cluster.local", "hl", ns))
    for p in range(3):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"hl-{p}", "namespace": ns, "labels": sel},
               "spec": {"hostname": f"hl-{p}", "subdomain": "hl",
                        "containers": [{"name": "app", "image": "app"}]},
               "status": {"podIP": f"198.18.{60 + ni}.{p + 1}",
                          "podIPs": [{"ip": f"198.18.{60 + ni}.{p + 1}"}]}}
        docs.append(pod)
        pod_names.append((f"hl-{p}.hl.{ns}.svc.cluster.local", f"hl-{p}.hl", ns))
    sel = {"app": f"wide-{ns}"}
    docs.append(svc_doc("wide", ns, [], headless=True, selector=sel))
    k8s_names.append((f"wide.{ns}.svc.cluster.local", "wide", ns))
    for p in range(40):
        docs.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"wide-{p}", "namespace": ns, "labels": sel},
                     "spec": {"containers": [{"name": "app", "image": "app"}]},
                     "status": {"podIP": f"198.18.{70 + ni}.{p + 1}"}})
    docs.append(svc_doc("ext", ns, [], ext="up-1.upstream.test"))

se_i = 0


def se_doc(ns, hosts, addresses, resolution="STATIC"):
    global se_i
    se_i += 1
    spec = {"hosts": hosts, "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "location": "MESH_EXTERNAL", "resolution": resolution}
    if addresses:
        spec["addresses"] = addresses
    if resolution == "STATIC":
        spec["endpoints"] = [{"address": "198.18.90.1"}]
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": f"se-{se_i}", "namespace": ns}, "spec": spec}


for i in range(70):
    ns = rng.choice(NAMESPACES)
    dom = rng.choice(["example.com", "example.org", "corp.internal", "mesh.test"])
    host = f"{rng.choice(['www', 'api', 'cdn', 'login', 'db'])}{i}.{dom}"
    mode = rng.choice(["v4", "v4", "dual", "v6", "two"])
    a4, a6 = f"198.19.40.{i + 1}", f"fd00::40:{i + 1:x}"
    addrs = {"v4": [a4], "dual": [a4, a6], "v6": [a6], "two": [a4, f"198.19.41.{i + 1}"]}[mode]
    hosts = [host]
    if i % 9 == 0:
        hosts.append(f"alt{i}.{dom}")  # a second host on the same entry
    docs.append(se_doc(ns, hosts, addrs))
    se_names.extend(hosts)
# Wildcard hosts.
for i in range(12):
    dom = f"wild{i}.example.net"
    docs.append(se_doc(rng.choice(NAMESPACES), [f"*.{dom}"], [f"198.19.42.{i + 1}"]))
    wild_names.append(dom)
# Two ServiceEntries on one host: the second's addresses are appended.
docs.append(se_doc("ns-a", ["shared.example.com"], ["198.19.43.1"]))
docs.append(se_doc("ns-b", ["shared.example.com"], ["198.19.43.2", "fd00::43:2"]))
se_names.append("shared.example.com")
# Many addresses: truncation over UDP.
docs.append(se_doc("ns-c", ["many.example.com"], [f"198.19.44.{i + 1}" for i in range(60)]))
docs.append(se_doc("ns-c", ["many6.example.com"], [f"fd00::44:{i + 1:x}" for i in range(40)]))
se_names.extend(["many.example.com", "many6.example.com"])
# A ServiceEntry host in the cluster's own domain (registry External, no short forms).
docs.append(se_doc("demo", ["legacy.demo.svc.cluster.local"], ["198.19.45.1"]))
se_names.append("legacy.demo.svc.cluster.local")
# A DNS-resolved ServiceEntry without addresses: no table entry (forwarded).
docs.append(se_doc("demo", ["noaddr.example.com"], [], resolution="DNS"))

with open(os.path.join(HERE, "config.yaml"), "w") as f:
    f.write("# Generated by generate.py (seed 26): istiod-lite's config for the dns suite.\n")
    for d in docs:
        f.write("---\n")
        f.write(json.dumps(d, sort_keys=True) + "\n")

# --- the upstream: dnsmasq records --------------------------------------------------------

up_lines = [
    "# Generated by generate.py: the dns suite's upstream (dnsmasq --conf-file).",
    "local-ttl=0",
    "local=/upstream.test/",
    "local=/cluster.local/",
    "local=/example.com/",
]
up_names = []
for i in range(1, 31):
    if i % 3 == 0:
        up_lines.append(f"host-record=up-{i}.upstream.test,198.18.100.{i},fd00::100:{i:x}")
    else:
        up_lines.append(f"host-record=up-{i}.upstream.test,198.18.100.{i}")
    up_names.append(f"up-{i}.upstream.test")
# Names asked once each (their TTL passes through).
ttl_names = []
for i in range(1, 41):
    up_lines.append(f"host-record=ttl-{i}.upstream.test,198.18.101.{i},{600 + i}")
    ttl_names.append(f"ttl-{i}.upstream.test")
up_lines += [
    "cname=alias.upstream.test,up-1.upstream.test",
    "cname=alias2.upstream.test,alias.upstream.test",
    "cname=alias3.upstream.test,alias2.upstream.test",
    "cname=to-mesh.upstream.test,web-0.demo.svc.cluster.local",
    "txt-record=txt.upstream.test,\"hello world\",\"second string\"",
    "txt-record=up-2.upstream.test,\"v=spf1 -all\"",
    "srv-host=_http._tcp.upstream.test,up-3.upstream.test,8080,10,20",
    "srv-host=_http._tcp.upstream.test,up-4.upstream.test,8081,20,10",
    "mx-host=upstream.test,up-5.upstream.test,10",
    "ptr-record=1.100.18.198.in-addr.arpa,up-1.upstream.test",
    "ptr-record=1.10.19.198.in-addr.arpa,mesh-ptr.upstream.test",
    "host-record=www.outside.test,198.18.102.1",
    # An upstream that never answers (a closed port on the node): the agents' own timeout.
    "server=/closed.test/198.18.1.1#5399",
]
up_names += ["alias.upstream.test", "alias2.upstream.test", "alias3.upstream.test",
             "to-mesh.upstream.test", "txt.upstream.test", "_http._tcp.upstream.test",
             "upstream.test", "www.outside.test"]
with open(os.path.join(HERE, "upstream.conf"), "w") as f:
    f.write("\n".join(up_lines) + "\n")

# --- the queries --------------------------------------------------------------------------

TYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28,
         "SRV": 33, "NAPTR": 35, "HTTPS": 65, "SVCB": 64, "ANY": 255, "CAA": 257, "T999": 999}


def encode_name(name):
    out = b""
    for label in name.rstrip(".").split("."):
        if label:
            out += bytes([len(label)]) + label.encode()
    return out + b"\x00"


def mixed_case(name):
    return "".join(c.upper() if c.isalpha() and rng.random() < 0.5 else c for c in name)


def packet(qid, name, qtype, *, qclass=1, rd=True, edns=None, flags_extra=0, opcode=0,
           qdcount=None, extra=b"", options=b""):
    flags = (opcode << 11) | (0x0100 if rd else 0) | flags_extra
    q = encode_name(name) + struct.pack("!HH", qtype, qclass)
    ar = 0
    opt = b""
    if edns is not None:
        size, do, version = edns
        ttl = (version << 16) | (0x8000 if do else 0)
        opt = b"\x00" + struct.pack("!HHIH", 41, size, ttl, len(options)) + options
        ar = 1
    qd = 1 if qdcount is None else qdcount
    body = q if qd >= 1 else b""
    if qd == 2:
        body = q + q
    return struct.pack("!HHHHHH", qid, flags, qd, 0, 0, ar) + body + opt + extra


def forms(fqdn, short, ns):
    """A Kubernetes host as an app's resolver asks for it."""
    out = [fqdn + ".", fqdn, f"{short}.{ns}.", f"{short}.{ns}.svc.", f"{short}.{ns}.svc.cluster."]
    if ns == POD_NS:
        out.append(short + ".")
    for s in SEARCH:  # the search list appended to each relative form
        out.append(f"{short}.{s}.")
        out.append(f"{short}.{ns}.{s}.")
        out.append(f"{short}.{ns}.svc.{s}.")
    return out


def ext_forms(host):
    return [host + ".", host, *[f"{host}.{s}." for s in SEARCH]]


def pick_name():
    r = rng.random()
    if r < 0.38:
        fqdn, short, ns = rng.choice(k8s_names + pod_names)
        return rng.choice(forms(fqdn, short, ns)), "table"
    if r < 0.56:
        return rng.choice(ext_forms(rng.choice(se_names))), "table"
    if r < 0.64:
        dom = rng.choice(wild_names)
        lbl = rng.choice(["a", "foo", "x.y", "deep.er.sub", "WWW"])
        name = rng.choice([f"{lbl}.{dom}.", f"{dom}.", f"*.{dom}.", f"{lbl}.{dom}.{SEARCH[0]}."])
        return name, "wildcard"
    if r < 0.82:
        return rng.choice(ext_forms(rng.choice(up_names))), "upstream"
    if r < 0.88:
        return rng.choice([
            "nope.upstream.test.", "missing.demo.svc.cluster.local.", "web-0.nowhere.svc.cluster.local.",
            "ext.demo.svc.cluster.local.", "noaddr.example.com.", "unknown.example.com.",
            "web-0.", "svc.cluster.local.", "cluster.local.", "hl-9.hl.demo.svc.cluster.local.",
            "a.b.c.d.e.f.upstream.test.", "many.example.com.demo.svc.cluster.local.extra.",
        ]), "nxdomain"
    if r < 0.93:
        return rng.choice(["1.10.19.198.in-addr.arpa.", "1.100.18.198.in-addr.arpa.",
                           "2.10.19.198.in-addr.arpa.", "9.9.9.198.in-addr.arpa.",
                           "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa."]), "ptr"
    return rng.choice(["outside.test.", "www.outside.test.", "web-0.demo", "WEB-0.DEMO.SVC.CLUSTER.LOCAL.",
                       "api-1.demo.svc.cluster.local.", "example.com.", "."]), "edge"


TYPE_WEIGHTS = [("A", 30), ("AAAA", 22), ("SRV", 5), ("PTR", 4), ("TXT", 5), ("ANY", 5),
                ("CNAME", 5), ("MX", 3), ("NS", 2), ("SOA", 3), ("HTTPS", 6), ("SVCB", 1),
                ("NAPTR", 1), ("CAA", 1), ("T999", 2)]
TYPE_NAMES = [t for t, w in TYPE_WEIGHTS for _ in range(w)]

cases = []
ttl_iter = iter(ttl_names)
for i in range(CASES):
    qid = rng.randrange(1, 65536)
    proto = "udp" if rng.random() < 0.55 else "tcp"
    name, kind = pick_name()
    tname = rng.choice(TYPE_NAMES)
    if kind == "ptr":
        tname = rng.choice(["PTR", "PTR", "PTR", "A", "ANY"])
    # Names whose upstream TTL passes through: each asked once.
    if kind == "upstream" and rng.random() < 0.03:
        nxt = next(ttl_iter, None)
        if nxt:
            name, tname = nxt + ".", "A"
    if rng.random() < 0.35:
        name = mixed_case(name)
    qtype = TYPES[tname]
    kw = {}
    what = []
    r = rng.random()
    if r < 0.35:
        size = rng.choice([512, 1232, 1400, 4096, 65535, 100])
        do = rng.random() < 0.3
        kw["edns"] = (size, do, 0)
        what.append(f"edns={size}{'/do' if do else ''}")
        if rng.random() < 0.15:
            # A cookie option (client cookie, 8 bytes), or an ECS option.
            if rng.random() < 0.5:
                kw["options"] = struct.pack("!HH", 10, 8) + bytes(rng.randrange(256) for _ in range(8))
                what.append("cookie")
            else:
                kw["options"] = struct.pack("!HHHBB", 8, 7, 1, 24, 0) + bytes([198, 18, 5])
                what.append("ecs")
    if rng.random() < 0.1:
        kw["rd"] = False
        what.append("rd=0")
    odd = rng.random()
    if odd < 0.012:
        kw["qdcount"] = 0
        what.append("qdcount=0")
    elif odd < 0.02:
        kw["qdcount"] = 2
        what.append("qdcount=2")
    elif odd < 0.03:
        kw["flags_extra"] = 0x0010  # CD
        what.append("cd")
    elif odd < 0.04:
        kw["flags_extra"] = 0x0020  # AD
        what.append("ad")
    elif odd < 0.045:
        kw["flags_extra"] = 0x0040  # Z
        what.append("z")
    elif odd < 0.05:
        kw["opcode"] = rng.choice([1, 2, 4, 5])
        what.append(f"opcode={kw['opcode']}")
    elif odd < 0.055:
        kw["qclass"] = rng.choice([3, 255, 254])
        what.append(f"class={kw['qclass']}")
    elif odd < 0.06 and "edns" not in kw:
        kw["edns"] = (1232, False, 1)
        what.append("edns-version=1")
    elif odd < 0.065:
        kw["flags_extra"] = 0x0400  # AA set in a query
        what.append("aa")
    pkt = packet(qid, name, qtype, **kw)
    cases.append({"id": f"q{i + 1:04d}", "proto": proto, "query": pkt.hex(),
                  "what": " ".join([tname, name, *what])})

# Names whose upstream never answers, each asked once (after the others, so the rest of the
# cases do not depend on them): both agents give up after their forward timeout (5 s).
late = random.Random(SEED + 1)
for i, (tname, proto, edns) in enumerate([("A", "udp", None), ("AAAA", "udp", (1232, False, 0)),
                                          ("TXT", "udp", (4096, True, 0)), ("A", "tcp", None),
                                          ("A", "udp", None), ("SRV", "tcp", (1232, False, 0))]):
    name = f"t{i + 1}.closed.test."
    kw = {"edns": edns} if edns else {}
    pkt = packet(late.randrange(1, 65536), name, TYPES[tname], **kw)
    what = [tname, name] + ([f"edns={edns[0]}{'/do' if edns[1] else ''}"] if edns else [])
    cases.append({"id": f"q{len(cases) + 1:04d}", "proto": proto, "query": pkt.hex(),
                  "what": " ".join(what)})

with open(os.path.join(HERE, "cases.jsonl"), "w") as f:
    for c in cases:
        f.write(json.dumps(c) + "\n")
print(f"{len(cases)} cases, {len(docs)} config documents, {len(up_lines)} upstream lines")
