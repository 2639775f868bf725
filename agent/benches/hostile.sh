#!/usr/bin/env bash
# Hostile peers against a running agent (local istiod-lite, real Envoy), as docs/reliability.md
# reports them:
#  1. one peer (127.0.0.6) holds 10,000 idle connections to the status port, reconnecting each
#     one the agent closes, while a prober (127.0.0.7, the kubelet's side) asks /healthz/ready
#     every 50 ms: probe latency p50/p99/max and failures, the agent's CPU and RSS meanwhile;
#  2. HPACK bombs (64 KiB, 256 KiB, 1 MiB header blocks of one 4 KiB table entry referenced over
#     and over) on the XDS socket: the agent's peak RSS over the attack, alive, Envoy still ready.
# Usage: agent/benches/hostile.sh [pilot-agent-dir]   (default target/release; build first:
#   cargo build --release -p agent --bin pilot-agent -p control-plane --bin istiod-lite)
# AGENT_BIN=<Istio's Go pilot-agent> runs the same attacks against Istio's agent.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$(cd "${1:-$repo/target/release}" && pwd)"
istiod="${ISTIOD_LITE:-$bin/istiod-lite}"
envoy="${ENVOY_BIN:-$repo/.tools/bin/envoy}"
[ -x "$envoy" ] || envoy="$(command -v envoy)"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/ca" "$work/config" "$work/pod/var/run/secrets/tokens" "$work/pod/var/run/secrets/istio"
RUST_LOG=warn "$istiod" serve --config-dir "$work/config" --ca-dir "$work/ca" \
  --grpc-addr 127.0.0.1:36010 --secure-grpc-addr 127.0.0.1:36012 --monitoring-addr 127.0.0.1:36014 \
  >"$work/istiod.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/ca/root-cert.pem" ] && break; sleep 0.05; done
"$istiod" token --ca-dir "$work/ca" --namespace demo --service-account sa \
  >"$work/pod/var/run/secrets/tokens/istio-token"
cp "$work/ca/root-cert.pem" "$work/pod/var/run/secrets/istio/"
if [ -n "${AGENT_BIN:-}" ]; then
  # Istio's agent reads its bootstrap template from the image: Istio's own, from the shared
  # conformance data.
  mkdir -p "$work/pod/var/lib/istio/envoy"
  cp "$repo/../shared/conformance/istio-bootstrap/envoy_bootstrap.json" \
    "$work/pod/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
fi
cd "$work/pod"
# The kubelet's soft open-file limit; the agent raises it to the hard limit.
ulimit -Sn 1024
env -i PATH="$PATH" CLOUD_PLATFORM=none POD_NAME=bench POD_NAMESPACE=demo SERVICE_ACCOUNT=sa INSTANCE_IP=127.0.0.1 \
  ISTIOD_SAN=istiod.istio-system.svc ECC_SIGNATURE_ALGORITHM=ECDSA \
  ENVOY_STATUS_PORT=36021 ENVOY_PROMETHEUS_PORT=36090 \
  PROXY_CONFIG="{\"binaryPath\":\"$envoy\",\"discoveryAddress\":\"127.0.0.1:36012\",\"proxyAdminPort\":36000,\"statusPort\":36020,\"terminationDrainDuration\":\"1s\"}" \
  RUST_LOG=warn "${AGENT_BIN:-$bin/pilot-agent}" proxy sidecar >"$work/agent.log" 2>&1 &
agent=$!
pids+=($agent)
for i in $(seq 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 http://127.0.0.1:36021/healthz/ready)" = 200 ] && break
  [ "$i" = 600 ] && { echo "not ready in 30 s"; tail -20 "$work/agent.log"; exit 1; }
  sleep 0.05
done
sleep 3
echo "agent open-file limit: $(awk '/Max open files/ {print $4" soft, "$5" hard"}' /proc/$agent/limits)"

python3 - "$agent" "$work/pod/etc/istio/proxy/XDS" <<'PY'
import asyncio, os, resource, socket, statistics, sys, time
agent, xds = int(sys.argv[1]), sys.argv[2]
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE); resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
tck = os.sysconf("SC_CLK_TCK")

def cpu():
    f = open(f"/proc/{agent}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck

def status(key):
    for line in open(f"/proc/{agent}/status"):
        if line.startswith(key):
            return int(line.split()[1])

def reset_peak():
    with open(f"/proc/{agent}/clear_refs", "w") as f:
        f.write("5")

def fds():
    return len(os.listdir(f"/proc/{agent}/fd"))

async def probe_once():
    t = time.perf_counter()
    try:
        s = socket.socket(); s.setblocking(False); s.bind(("127.0.0.7", 0))
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.sock_connect(s, ("127.0.0.1", 36020)), 1)
        await loop.sock_sendall(s, b"GET /healthz/ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = await asyncio.wait_for(loop.sock_recv(s, 4096), 1)
            if not chunk: break
            data += chunk
        s.close()
        ok = data.startswith(b"HTTP/1.1 200")
    except Exception:
        ok = False
    return (time.perf_counter() - t) * 1000, ok

async def status_port(mode):
    import subprocess
    base = [await probe_once() for _ in range(100)]
    rss0 = status("VmRSS")
    reset_peak()
    # The attacker runs in its own process, so its 10,000 sockets do not slow the prober's loop.
    attack = subprocess.Popen([sys.executable, "-c", ATTACKER, mode], stdout=subprocess.PIPE, text=True)
    await asyncio.sleep(2)
    t0, cpu0 = time.time(), cpu()
    lat = []
    while time.time() - t0 < 20:
        lat.append(await probe_once())
        await asyncio.sleep(0.05)
    used = cpu() - cpu0
    held_fds = fds()
    attack.terminate()
    connects = attack.communicate()[0].strip() or "?"
    def pct(xs, p): xs = sorted(xs); return xs[min(len(xs) - 1, int(len(xs) * p))]
    ms = [l for l, ok in lat]
    what = "reconnecting each one closed" if mode == "reconnect" else "opened once"
    print(f"status port, one peer (127.0.0.6) with 10,000 idle connections, {what}: {connects} connects")
    print(f"  probes: {len(lat)}, failed {sum(1 for _, ok in lat if not ok)}; latency ms p50 {pct(ms, .5):.2f} p99 {pct(ms, .99):.2f} max {max(ms):.2f}"
          f" (unloaded p50 {pct([l for l, _ in base], .5):.2f} p99 {pct([l for l, _ in base], .99):.2f})")
    print(f"  agent CPU {100 * used / (time.time() - t0):.1f}% of a core; RSS {rss0} -> {status('VmRSS')} KiB (peak {status('VmHWM')} KiB); agent fds {held_fds}")

ATTACKER = r"""
import asyncio, resource, signal, socket, sys
HOLD = sys.argv[1] == "hold"
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE); resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
connects = 0
async def one():
    global connects
    loop = asyncio.get_running_loop()
    while True:
        s = socket.socket(); s.setblocking(False)
        s.bind(("127.0.0.6", 0))
        try:
            await loop.sock_connect(s, ("127.0.0.1", 36020))
            connects += 1
            await loop.sock_recv(s, 1)  # idle until the agent closes it
            if HOLD:
                await asyncio.Event().wait()  # hold: closed sockets are not reopened
        except OSError:
            await asyncio.sleep(0.05)
        finally:
            s.close()
async def main():
    tasks = [asyncio.create_task(one()) for _ in range(10000)]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    print(connects, flush=True)
asyncio.run(main())
"""

def frame(kind, flags, stream, payload):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

def put_len(n):
    if n < 127: return bytes([n])
    out, n = [127], n - 127
    while n >= 0x80: out.append((n & 0x7f) | 0x80); n >>= 7
    out.append(n); return bytes(out)

def request_block():
    def lit(n, v): return b"\x00" + put_len(len(n)) + n + put_len(len(v)) + v
    return (lit(b":method", b"POST") + lit(b":scheme", b"http") + lit(b":path", b"/x.Y/Z")
            + lit(b":authority", b"localhost") + lit(b"content-type", b"application/grpc") + lit(b"te", b"trailers"))

def bomb(size):
    entry = b"\x40" + put_len(6) + b"x-bomb" + put_len(4058) + b"b" * 4058
    head = request_block() + entry
    return head + b"\xbe" * (size - len(head))

def h2_bombs(size, count):
    s = socket.socket(socket.AF_UNIX); s.connect(xds); s.settimeout(10)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
    answered = 0
    try:
        send_bombs(s, size, count)
    except OSError as e:
        print(f"  the agent closed the connection while the bombs were sent ({e})")
        return answered
    buf = b""
    deadline = time.time() + 10
    while answered < count and time.time() < deadline:
        try: chunk = s.recv(65536)
        except OSError: break
        if not chunk: break
        buf += chunk
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big"); kind = buf[3]; buf = buf[9 + n:]
            if kind == 1: answered += 1  # the 431's HEADERS
            if kind == 7: print("  GOAWAY: the agent closed the connection"); return answered
    s.close()
    return answered

def send_bombs(s, size, count):
    for i in range(count):
        block, sid, out = bomb(size), 1 + 2 * i, b""
        chunks = [block[j:j + 16384] for j in range(0, len(block), 16384)]
        for k, c in enumerate(chunks):
            flags = (0x4 if k == len(chunks) - 1 else 0) | (0x1 if k == 0 else 0)
            out += frame(1 if k == 0 else 9, flags, sid, c)
        s.sendall(out)

def hpack():
    for size in (64 << 10, 256 << 10, (1 << 20) - 64):
        reset_peak(); before = status("VmRSS")
        refused = h2_bombs(size, 20)
        print(f"HPACK bombs, 20 × {size // 1024} KiB blocks on one connection: {refused}/20 streams answered (431);"
              f" agent RSS {before} KiB, peak over the attack {status('VmHWM')} KiB (+{status('VmHWM') - before} KiB)")

asyncio.run(status_port("hold"))
asyncio.run(status_port("reconnect"))
hpack()
PY
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 http://127.0.0.1:36021/healthz/ready)
echo "after the attacks: agent alive=$(kill -0 $agent 2>/dev/null && echo yes || echo no), Envoy's readiness through the agent: $code"
