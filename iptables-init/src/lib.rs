//! istio-iptables: programs a pod's traffic redirection with Istio's flags and rule sets.
