# A proxyv2-style image: Istio's injection template works with only the image swapped.
# Build: docker build -t mesh-agent/proxyv2 .
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/setup.sh --envoy-only
RUN cargo build --profile dist --locked -p agent -p iptables-init --bins
RUN scripts/image-rootfs.sh target/dist .tools/bin/envoy /rootfs

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd -m --uid 1337 --user-group istio-proxy
COPY --from=build /rootfs/ /
RUN chown -R istio-proxy:istio-proxy /etc/istio /var/lib/istio /etc/certs
WORKDIR /
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/pilot-agent"]
