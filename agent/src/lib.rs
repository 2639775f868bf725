//! pilot-agent: the istio-proxy container's process (xDS proxy, SDS, DNS, Envoy lifecycle, status port).
