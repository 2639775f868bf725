#!/usr/bin/env python3
"""Polls for scripts/bench-side-by-side.sh, one process per measurement so that no process start
(curl, python) falls inside a timed interval; every poll is a plain HTTP GET on loopback, every
2 ms.

  start  GO_FILE ADMIN STATUS SPIFFE
      waits for GO_FILE (the agent's exec time, ns since the epoch, written by the script just
      before the exec), then polls Envoy's /certs on ADMIN and the agent's /healthz/ready on
      STATUS; prints "ready_ms=N cert_ms=N" (since the exec).
  resync ARMED_FILE READY SYNCZ KIND PROXY
      touches ARMED_FILE once polling, waits for the control plane's /ready on READY to fail (it
      was killed), then to answer 200 again: t0; then polls SYNCZ until PROXY's connection is
      synced (KIND lite: istiod-lite's per-type status, CDS and LDS SYNCED, others SYNCED or NOT
      SENT; KIND istiod: Istio's <type>_sent == <type>_acked for cluster and listener, route and
      endpoint equal or never sent); prints "resync_ms=N" (from t0).
Each gives up after 60 s with exit 1.
"""
import http.client
import json
import os
import sys
import time

POLL = 0.002
LIMIT = 60.0


def get(hostport, path):
    host, port = hostport.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=1)
    try:
        c.connect()
        # A connect to a port nobody listens on can meet itself (TCP simultaneous open): what
        # it reads back is its own request, not a server's answer.
        if c.sock.getsockname() == c.sock.getpeername():
            return None, b""
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        c.close()


def give_up(what):
    print(f"gave up after {LIMIT:.0f} s: {what}", file=sys.stderr)
    sys.exit(1)


def start(go_file, admin, status, spiffe):
    deadline = time.monotonic() + LIMIT
    while not os.path.exists(go_file) or not open(go_file).read().strip():
        if time.monotonic() > deadline:
            give_up("no start time")
        time.sleep(0.0005)
    t0 = int(open(go_file).read().strip())
    ready = cert = None
    while ready is None or cert is None:
        if time.monotonic() > deadline:
            give_up(f"ready={ready} cert={cert}")
        if cert is None:
            code, body = get(admin, "/certs")
            if code == 200 and spiffe.encode() in body:
                cert = (time.time_ns() - t0) // 1_000_000
        if ready is None:
            code, _ = get(status, "/healthz/ready")
            if code == 200:
                ready = (time.time_ns() - t0) // 1_000_000
        time.sleep(POLL)
    print(f"ready_ms={ready} cert_ms={cert}")


def synced(kind, body, proxy):
    try:
        rows = [r for r in json.loads(body) if proxy in r.get("proxy", "")]
    except ValueError:
        return False
    if len(rows) != 1:
        return False
    row = rows[0]
    if kind == "lite":
        return all(
            t.get("status") == "SYNCED"
            or (k not in ("CDS", "LDS") and t.get("status") == "NOT SENT")
            for k, t in row["types"].items()
        )
    for ty in ("cluster", "listener", "route", "endpoint"):
        sent, acked = row.get(f"{ty}_sent", ""), row.get(f"{ty}_acked", "")
        if ty in ("cluster", "listener") and not sent:
            return False
        if sent != acked:
            return False
    return True


def resync(armed_file, ready, syncz, kind, proxy):
    deadline = time.monotonic() + LIMIT
    open(armed_file, "w").close()
    while get(ready, "/ready")[0] == 200:
        if time.monotonic() > deadline:
            give_up("the control plane never went away")
        time.sleep(POLL)
    while get(ready, "/ready")[0] != 200:
        if time.monotonic() > deadline:
            give_up("the control plane never came back")
        time.sleep(POLL)
    t0 = time.monotonic()
    while True:
        code, body = get(syncz, "/debug/syncz")
        if code == 200 and synced(kind, body, proxy):
            break
        if time.monotonic() > deadline:
            give_up("not synced")
        time.sleep(POLL)
    print(f"resync_ms={int((time.monotonic() - t0) * 1000)}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"start": start, "resync": resync}[cmd](*args)
