#!/usr/bin/env bash
# DNS proxy benchmark, side by side in one run (issue 7 "Performance").
#
# dnsperf against our proxy, dnsmasq and unbound (one thread), all serving the same 1,000 names
# (hosts file / local-data) with the same query file and client settings; the server under test
# pinned to one core (SERVER_CPU), dnsperf to the other (CLIENT_CPU). Then forwarding with the
# cache off: our proxy vs dnsmasq (--cache-size=0), both forwarding to the same upstream (unbound,
# pinned with the client), and dnsperf against the upstream directly; plus a light-load run for
# the latency the forwarder adds.
#
# Our proxy runs the crate's `serve` example on a single-threaded tokio runtime (the server has
# one core). Prints QPS, average and p99 latency, server CPU seconds per million queries, and the ratios
# against the issue's goals. Needs: dnsperf, dnsmasq, unbound, taskset (scripts/setup.sh --test-tools).
# The machine is shared, so every measurement is repeated ROUNDS times, interleaved across the
# servers (all started up front, idle while another is measured), and the best round is kept;
# ratios are also given as the median over rounds of the two servers measured back to back in
# the same round (less swayed by load swings from other work on the machine).
# Usage: scripts/bench-dns.sh   (env: SKIP_BUILD=1 DURATION=5 ROUNDS=3 CLIENTS=4 OUTSTANDING=64 SERVER_CPU=0 CLIENT_CPU=1)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DURATION="${DURATION:-5}"
ROUNDS="${ROUNDS:-3}"
CLIENTS="${CLIENTS:-4}"
OUTSTANDING="${OUTSTANDING:-64}"
SERVER_CPU="${SERVER_CPU:-0}"
CLIENT_CPU="${CLIENT_CPU:-1}"
NAMES=1000

for bin in dnsperf dnsmasq unbound taskset; do
  command -v "$bin" >/dev/null || { echo "missing $bin (run scripts/setup.sh --test-tools)" >&2; exit 1; }
done

# The release build keeps envoy-types (a dependency of `proto`) unoptimised: it is not on the DNS
# path and optimising it costs minutes.
# SKIP_BUILD=1 reuses the last build.
if [[ -z "${SKIP_BUILD:-}" ]]; then
  (cd "$ROOT" && cargo build --release -p dns-proxy --example serve \
    --config 'profile.release.package.envoy-types.opt-level=0')
fi
SERVE="$ROOT/target/release/examples/serve"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket
while True:
    u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); u.bind(("127.0.0.1",0)); p=u.getsockname()[1]
    t=socket.socket()
    try:
        t.bind(("127.0.0.1",p)); print(p); break
    except OSError: pass'
}

# Names: hostN.bench.test answered from tables; fwdN.fwd.test only by the upstream.
: >"$WORK/hosts"; : >"$WORK/q-table.txt"; : >"$WORK/q-fwd.txt"; : >"$WORK/unbound-local.conf"; : >"$WORK/upstream-local.conf"
for ((i = 0; i < NAMES; i++)); do
  ip="198.18.$((i / 250)).$((i % 250 + 1))"
  echo "$ip host$i.bench.test" >>"$WORK/hosts"
  echo "host$i.bench.test A" >>"$WORK/q-table.txt"
  echo "fwd$i.fwd.test A" >>"$WORK/q-fwd.txt"
  echo "  local-data: \"host$i.bench.test. 30 IN A $ip\"" >>"$WORK/unbound-local.conf"
  echo "  local-data: \"fwd$i.fwd.test. 30 IN A $ip\"" >>"$WORK/upstream-local.conf"
done
echo "nameserver 127.0.0.1" >"$WORK/resolv.conf"

unbound_conf() { # port zone local-data-file
  cat <<EOF
server:
  interface: 127.0.0.1
  port: $1
  num-threads: 1
  do-daemonize: no
  username: ""
  chroot: ""
  directory: "$WORK"
  pidfile: ""
  use-syslog: no
  logfile: ""
  verbosity: 0
  do-ip6: no
  module-config: "iterator"
  access-control: 127.0.0.0/8 allow
  so-rcvbuf: 4m
  local-zone: "$2." static
$(cat "$3")
remote-control:
  control-enable: no
EOF
}

wait_answer() { # port name
  for _ in $(seq 1 100); do
    if dig @127.0.0.1 -p "$1" "$2" +time=1 +tries=1 +short 2>/dev/null | grep -q .; then return 0; fi
    sleep 0.1
  done
  echo "server on port $1 never answered $2" >&2
  exit 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
CLK_TCK="$(getconf CLK_TCK)"

declare -A QPS AVG P99 CPU ROUNDQ
# measure label port queryfile pid [extra dnsperf args]: one round; keeps the best QPS per label.
measure() {
  local label=$1 port=$2 file=$3 pid=$4
  shift 4
  local before after out
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$port" -d "$file" -l "$DURATION" \
    -c "$CLIENTS" -q "$OUTSTANDING" -t 2 "$@" 2>&1)
  after=$(cpu_ticks "$pid")
  local completed qps avg cpu p99
  completed=$(awk '/Queries completed:/ {print $3}' <<<"$out")
  qps=$(awk '/Queries per second:/ {print $4}' <<<"$out")
  avg=$(awk '/Average Latency/ {print $4}' <<<"$out")
  cpu=$(awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$completed" \
    'BEGIN {if (n > 0) printf "%.2f", t / hz / n * 1e6; else print "n/a"}')
  # p99 from a short verbose run with the same settings.
  p99=$(taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$port" -d "$file" -l 2 \
    -c "$CLIENTS" -q "$OUTSTANDING" -t 2 -v "$@" 2>/dev/null |
    awk '/^> / {print $NF}' | sort -g |
    awk '{v[NR] = $1} END {i = int(NR * 0.99); if (i < 1) i = 1; printf "%.3f", v[i] * 1000}')
  printf '  round: %-26s %10.0f q/s\n' "$label" "$qps"
  ROUNDQ["$label#$r"]=$qps
  # Best round: highest QPS; under fixed light load, lowest average latency.
  local better=0
  if [[ -z "${QPS[$label]:-}" ]]; then
    better=1
  elif [[ $label == light:* ]]; then
    awk -v a="$avg" -v b="${AVG[$label]}" 'BEGIN {exit !(a * 1000 < b)}' && better=1
  else
    awk -v a="$qps" -v b="${QPS[$label]}" 'BEGIN {exit !(a > b)}' && better=1
  fi
  if ((better)); then
    QPS[$label]=$qps
    AVG[$label]=$(awk -v a="$avg" 'BEGIN {printf "%.3f", a * 1000}')
    CPU[$label]=$cpu
    P99[$label]=$p99
  fi
}

report() {
  local label
  for label in "$@"; do
    printf '%-28s %10.0f q/s  avg %7s ms  p99 %7s ms  cpu %6s s/Mq\n' \
      "$label" "${QPS[$label]}" "${AVG[$label]}" "${P99[$label]}" "${CPU[$label]}"
  done
}

start() { # name cpu cmd...
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  LAST_PID=$!
}

echo "== table hits: $NAMES names, ${DURATION}s, $CLIENTS clients, $OUTSTANDING outstanding, server on cpu $SERVER_CPU, dnsperf on cpu $CLIENT_CPU"

P=$(free_port)
start proxy "$SERVER_CPU" env DNS_PROXY_ADDR="127.0.0.1:$P" SERVE_RUNTIME=current RUST_LOG=warn \
  "$SERVE" "$WORK/hosts" "$WORK/resolv.conf"
PROXY_PID=$LAST_PID
M=$(free_port)
start dnsmasq "$SERVER_CPU" dnsmasq --keep-in-foreground --no-resolv --no-hosts --conf-file=/dev/null \
  --pid-file= --user=root --bind-interfaces --listen-address=127.0.0.1 --port="$M" \
  --addn-hosts="$WORK/hosts" --local-ttl=30
DNSMASQ_PID=$LAST_PID
U=$(free_port)
unbound_conf "$U" bench.test "$WORK/unbound-local.conf" >"$WORK/unbound.conf"
start unbound "$SERVER_CPU" unbound -d -c "$WORK/unbound.conf"
UNBOUND_PID=$LAST_PID
wait_answer "$P" host1.bench.test
wait_answer "$M" host1.bench.test
wait_answer "$U" host1.bench.test
for ((r = 1; r <= ROUNDS; r++)); do
  measure "proxy (table)" "$P" "$WORK/q-table.txt" "$PROXY_PID"
  measure "dnsmasq (hosts)" "$M" "$WORK/q-table.txt" "$DNSMASQ_PID"
  measure "unbound (local-data)" "$U" "$WORK/q-table.txt" "$UNBOUND_PID"
done
report "proxy (table)" "dnsmasq (hosts)" "unbound (local-data)"
kill "$PROXY_PID" "$DNSMASQ_PID" "$UNBOUND_PID"

echo
echo "== forwarding, cache off: upstream unbound on cpu $CLIENT_CPU"
UP=$(free_port)
unbound_conf "$UP" fwd.test "$WORK/upstream-local.conf" >"$WORK/upstream.conf"
start upstream "$CLIENT_CPU" unbound -d -c "$WORK/upstream.conf"
UP_PID=$LAST_PID
wait_answer "$UP" fwd1.fwd.test

P=$(free_port)
start proxy-fwd "$SERVER_CPU" env DNS_PROXY_ADDR="127.0.0.1:$P" DNS_PROXY_CACHE=false \
  SERVE_UPSTREAMS="127.0.0.1:$UP" SERVE_RUNTIME=current RUST_LOG=warn \
  "$SERVE" "$WORK/hosts" "$WORK/resolv.conf"
PROXY_FWD_PID=$LAST_PID
D=$(free_port)
start dnsmasq-fwd "$SERVER_CPU" dnsmasq --keep-in-foreground --no-resolv --no-hosts --conf-file=/dev/null \
  --pid-file= --user=root --bind-interfaces --listen-address=127.0.0.1 --port="$D" \
  --server="127.0.0.1#$UP" --cache-size=0 --dns-forward-max=1000
DNSMASQ_FWD_PID=$LAST_PID
wait_answer "$P" fwd1.fwd.test
wait_answer "$D" fwd1.fwd.test
for ((r = 1; r <= ROUNDS; r++)); do
  measure "upstream direct" "$UP" "$WORK/q-fwd.txt" "$UP_PID"
  measure "proxy (forward)" "$P" "$WORK/q-fwd.txt" "$PROXY_FWD_PID"
  measure "dnsmasq (forward)" "$D" "$WORK/q-fwd.txt" "$DNSMASQ_FWD_PID"
done
report "upstream direct" "proxy (forward)" "dnsmasq (forward)"

echo
echo "== light load (1000 q/s, 1 outstanding): latency added by forwarding; upstream moved to cpu $SERVER_CPU"
taskset -pc "$SERVER_CPU" "$UP_PID" >/dev/null
OUTSTANDING=1 CLIENTS=1
for ((r = 1; r <= ROUNDS; r++)); do
  measure "light: upstream direct" "$UP" "$WORK/q-fwd.txt" "$UP_PID" -Q 1000
  measure "light: proxy (forward)" "$P" "$WORK/q-fwd.txt" "$PROXY_FWD_PID" -Q 1000
  measure "light: dnsmasq (forward)" "$D" "$WORK/q-fwd.txt" "$DNSMASQ_FWD_PID" -Q 1000
done
report "light: upstream direct" "light: proxy (forward)" "light: dnsmasq (forward)"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
# median over rounds of a/b, each round's pair measured back to back
paired() {
  local i
  for ((i = 1; i <= ROUNDS; i++)); do ratio "${ROUNDQ[$1#$i]}" "${ROUNDQ[$2#$i]}"; echo; done |
    sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}
echo
echo "== ratios (goal in brackets)"
echo "table QPS   proxy/unbound  = $(ratio "${QPS[proxy (table)]}" "${QPS[unbound (local-data)]}")  [>= 1.00]  (median of paired rounds $(paired "proxy (table)" "unbound (local-data)"))"
echo "table QPS   proxy/dnsmasq  = $(ratio "${QPS[proxy (table)]}" "${QPS[dnsmasq (hosts)]}")"
echo "table CPU   proxy/unbound  = $(ratio "${CPU[proxy (table)]}" "${CPU[unbound (local-data)]}")  [< 1.00]"
echo "table CPU   proxy/dnsmasq  = $(ratio "${CPU[proxy (table)]}" "${CPU[dnsmasq (hosts)]}")"
echo "forward QPS proxy/dnsmasq  = $(ratio "${QPS[proxy (forward)]}" "${QPS[dnsmasq (forward)]}")  [>= 2.00]  (median of paired rounds $(paired "proxy (forward)" "dnsmasq (forward)"))"
echo "forward CPU proxy/dnsmasq  = $(ratio "${CPU[proxy (forward)]}" "${CPU[dnsmasq (forward)]}")"
echo "forward QPS proxy/direct   = $(ratio "${QPS[proxy (forward)]}" "${QPS[upstream direct]}")"
added=$(awk -v a="${AVG[light: proxy (forward)]}" -v b="${AVG[light: upstream direct]}" 'BEGIN {printf "%.3f", a - b}')
added_d=$(awk -v a="${AVG[light: dnsmasq (forward)]}" -v b="${AVG[light: upstream direct]}" 'BEGIN {printf "%.3f", a - b}')
echo "light load added latency: proxy ${added} ms [<= 0.050], dnsmasq ${added_d} ms"
