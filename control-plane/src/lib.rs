//! istiod-lite: a minimal Istio CA and ADS server for running the mesh without Kubernetes.
