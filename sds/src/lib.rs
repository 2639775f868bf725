//! Workload identity: keypair and CSR, Istio CA client, secret cache with rotation, SDS server on a Unix socket.
