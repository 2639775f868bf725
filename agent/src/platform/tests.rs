//! The platform against stand-in metadata servers on loopback ([`super::standin`]), through
//! the agent's configuration (the variables that move the servers): what each cloud gives,
//! discovery, `none`, an unknown value, timeouts, a hanging server. What reaches the
//! bootstrap's node is tested beside the bootstrap (`bootstrap::tests::platform`).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use super::standin::{AZURE_VERSION, Serve, StandIn, config};
use super::*;
use crate::config::{Config, Inputs, NodeType, ProxyFlags};

/// AWS named: an IMDSv2 token first, every metadata read with it, three reads at once.
#[tokio::test]
async fn aws_reads_with_an_imdsv2_token() {
    let dir = tempfile::tempdir().unwrap();
    let aws = StandIn::start(Serve::Aws { tokens: true });
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "AWS"),
            ("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host()),
        ],
    );
    assert_eq!(c.platform.cloud, CloudPlatform::Aws);
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.cloud, Some(Cloud::Aws));
    assert_eq!(p.metadata["aws_instance_id"], "i-0123456789abcdef0");
    let seen = aws.requests();
    assert_eq!(seen[0], "PUT /latest/api/token", "{seen:?}");
    assert_eq!(seen.len(), 4, "one token, three reads: {seen:?}");
}

/// An IMDS that gives no token: IMDSv1 reads, as Istio falls back to; found by discovery.
#[tokio::test]
async fn aws_without_a_token_uses_imdsv1() {
    let dir = tempfile::tempdir().unwrap();
    let aws = StandIn::start(Serve::Aws { tokens: false });
    let c = config(
        dir.path(),
        &[("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host())],
    );
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.cloud, Some(Cloud::Aws), "discovered by its IAM info");
    assert_eq!(p.metadata["aws_region"], "us-west-2");
    assert_eq!(p.locality.zone, "us-west-2b");
}

/// A GCE VM outside Kubernetes: the location is the zone (no cluster-location), the instance
/// template is there, no cluster URL; the labels come from the Compute API with the service
/// account's token; resolv.conf's zone comes before the metadata server's. In a pod
/// (`KUBERNETES_SERVICE_HOST`) the labels are not asked for.
#[tokio::test]
async fn gce_vm_labels_and_resolv_conf_zone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("resolv.conf"),
        "search default.svc.cluster.local us-east1-b.c.test-proj.internal google.internal\n",
    )
    .unwrap();
    let gcp = StandIn::start(Serve::Gcp { vm: true });
    let host = gcp.host();
    let vm = [
        ("CLOUD_PLATFORM", "gcp"),
        ("GCE_METADATA_HOST", host.as_str()),
    ];
    let mut c = config(dir.path(), &vm);
    c.platform.endpoints.gcp_compute = format!("http://{host}");
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.metadata["gcp_location"], "us-central1-c");
    assert_eq!(p.metadata["gcp_gce_instance_template"], "tmpl-1");
    assert!(!p.metadata.contains_key("gcp_gke_cluster_url"));
    assert!(!p.metadata.contains_key("gcp_gce_instance_created_by"));
    assert_eq!(p.labels["env"], "prod");
    assert_eq!(p.locality.zone, "us-east1-b");
    assert!(gcp.requests().iter().any(|r| r.contains("scopes=")));

    let mut pod = vm.to_vec();
    pod.push(("KUBERNETES_SERVICE_HOST", "10.96.0.1"));
    let mut c = config(dir.path(), &pod);
    c.platform.endpoints.gcp_compute = format!("http://{host}");
    let before = gcp.requests().len();
    let p = discover(&c.platform, BOUND).await;
    assert!(p.labels.is_empty());
    assert!(
        !gcp.requests()[before..]
            .iter()
            .any(|r| r.contains("compute/v1"))
    );
}

/// Discovery with a token that comes late (50 ms): IMDSv1 is asked meanwhile (refused: IMDSv2
/// required), then the IAM info with the token; AWS all the same. An IMDS that never answers is
/// asked for the token and, meanwhile, IMDSv1: two requests, no platform.
#[tokio::test]
async fn discovery_asks_imdsv1_while_the_token_is_late() {
    let dir = tempfile::tempdir().unwrap();
    let aws = StandIn::start(Serve::AwsLateToken);
    let c = config(
        dir.path(),
        &[("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host())],
    );
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.cloud, Some(Cloud::Aws));
    assert_eq!(p.metadata["aws_region"], "us-west-2");
    let seen = aws.requests();
    let info = "GET /latest/meta-data/iam/info";
    assert_eq!(
        seen.iter().filter(|r| *r == info).count(),
        2,
        "IMDSv1, then with the token: {seen:?}"
    );
    assert_eq!(
        seen.iter().filter(|r| r.starts_with("PUT")).count(),
        1,
        "{seen:?}"
    );

    let hang = StandIn::start(Serve::Hang);
    let c = config(
        dir.path(),
        &[("CLOUD_PLATFORM_AWS_METADATA_HOST", &hang.host())],
    );
    assert_eq!(discover(&c.platform, BOUND).await, Platform::none());
    assert_eq!(hang.requests().len(), 2, "{:?}", hang.requests());
}

/// `GCP_METADATA` (with `GCP_QUOTA_PROJECT`, `GCP_ZONE`) is the GCP metadata and makes the
/// platform GCP without a metadata server.
#[tokio::test]
async fn gcp_static_metadata_needs_no_server() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(
        dir.path(),
        &[
            ("GCP_METADATA", "pid|77|cl|europe-west1"),
            ("GCP_QUOTA_PROJECT", "quota"),
            ("GCP_ZONE", "europe-west1-d"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ],
    );
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.cloud, Some(Cloud::Gcp));
    assert_eq!(
        p.metadata,
        [
            ("gcp_project", "pid"),
            ("gcp_project_number", "77"),
            ("gcp_gke_cluster_name", "cl"),
            ("gcp_location", "europe-west1"),
            (
                "gcp_gke_cluster_url",
                "https://container.googleapis.com/v1/projects/pid/locations/europe-west1/clusters/cl"
            ),
            ("gcp_quota_project", "quota"),
            ("gcp_zone", "europe-west1-d"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    );
    assert_eq!(
        p.locality,
        Locality {
            region: "europe-west1".into(),
            zone: "europe-west1-d".into()
        }
    );
}

/// Azure named (any case): the newest API version the service names, then the instance
/// document of that version, both with `Metadata: true`.
#[tokio::test]
async fn azure_asks_for_the_newest_api_version() {
    let dir = tempfile::tempdir().unwrap();
    let azure = StandIn::start(Serve::Azure);
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "Azure"),
            ("CLOUD_PLATFORM_AZURE_METADATA_HOST", &azure.host()),
        ],
    );
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.cloud, Some(Cloud::Azure));
    assert_eq!(p.metadata["azure_name"], "negasonic");
    assert_eq!(
        azure.requests(),
        vec![
            "GET /metadata/instance?".to_string(),
            format!("GET /metadata/instance?api-version={AZURE_VERSION}"),
        ]
    );
}

/// Istio's other spelling of Azure's tags: `tags`, `name:value` pairs split at `;` (a name
/// alone has an empty value); `tagsList` wins when both are there.
#[test]
fn azure_tags_from_the_tags_string() {
    let doc =
        |compute: serde_json::Value| json!({ "compute": compute }).as_object().unwrap().clone();
    let p = azure::from_document(&doc(
        json!({"name": "n", "tags": "Department:IT;Env:Prod;Lone"}),
    ));
    assert_eq!(p.metadata["azure_Department"], "IT");
    assert_eq!(p.metadata["azure_Env"], "Prod");
    assert_eq!(p.metadata["azure_Lone"], "");
    let p = azure::from_document(&doc(json!({"tags": "A:1", "tagsList": []})));
    assert!(!p.metadata.contains_key("azure_A"));
    let p = azure::from_document(&doc(json!({})));
    assert!(p.metadata.is_empty());
    assert_eq!(p.locality, Locality::default());
}

/// Unset: each cloud is asked at once and the one that says yes is the platform. AWS by its
/// IAM info (detection's token reused); Azure by its DMI vendor; GCP by its metadata server's
/// answer, waited for on a machine whose DMI product is Google's even when the DNS probe says
/// no first.
#[tokio::test]
async fn unset_discovers_the_cloud_that_answers() {
    let dir = tempfile::tempdir().unwrap();
    let aws = StandIn::start(Serve::Aws { tokens: true });
    let c = config(
        dir.path(),
        &[("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host())],
    );
    assert_eq!(c.platform.cloud, CloudPlatform::Discover);
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.cloud, Some(Cloud::Aws));
    assert_eq!(p.locality.region, "us-west-2");
    let seen = aws.requests();
    assert_eq!(
        seen.iter().filter(|r| r.starts_with("PUT")).count(),
        1,
        "{seen:?}"
    );

    let azure = StandIn::start(Serve::Azure);
    std::fs::create_dir_all(dir.path().join("dmi")).unwrap();
    std::fs::write(dir.path().join("dmi/sys_vendor"), "Microsoft Corporation\n").unwrap();
    let c = config(
        dir.path(),
        &[("CLOUD_PLATFORM_AZURE_METADATA_HOST", &azure.host())],
    );
    assert_eq!(discover(&c.platform, BOUND).await.cloud, Some(Cloud::Azure));
    std::fs::remove_file(dir.path().join("dmi/sys_vendor")).unwrap();

    std::fs::write(
        dir.path().join("dmi/product_name"),
        "Google Compute Engine\n",
    )
    .unwrap();
    let gcp = StandIn::start(Serve::Gcp { vm: false });
    let mut c = config(dir.path(), &[("KUBERNETES_SERVICE_HOST", "10.96.0.1")]);
    c.platform.endpoints.gcp = gcp.host();
    let p = discover(&c.platform, BOUND).await;
    assert_eq!(p.cloud, Some(Cloud::Gcp));
    assert_eq!(p.metadata["gcp_project"], "test-proj");
}

/// `CLOUD_PLATFORM=none`: not one request, no platform.
#[tokio::test]
async fn none_asks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let aws = StandIn::start(Serve::Aws { tokens: true });
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "none"),
            ("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host()),
        ],
    );
    assert_eq!(discover(&c.platform, BOUND).await, Platform::none());
    assert!(aws.requests().is_empty());
}

/// A value Istio does not know: Istio's agent ignores it and discovers; here it is also
/// warned about and counted like any value that does not parse (strict mode refuses it).
#[tokio::test]
async fn an_unknown_value_discovers_as_istio_does() {
    let dir = tempfile::tempdir().unwrap();
    let aws = StandIn::start(Serve::Aws { tokens: true });
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "openstack"),
            ("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host()),
        ],
    );
    assert_eq!(c.platform.cloud, CloudPlatform::Discover);
    assert!(c.env_fallbacks.contains(&"CLOUD_PLATFORM".to_string()));
    assert_eq!(discover(&c.platform, BOUND).await.cloud, Some(Cloud::Aws));
    let e = load(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "openstack"),
            (crate::config::STRICT_ENV, "true"),
        ],
    )
    .expect_err("refused in strict mode");
    assert!(e.to_string().contains("CLOUD_PLATFORM"), "{e}");
}

/// The configuration alone (nothing is asked: no endpoint check needed).
fn load(dir: &std::path::Path, pairs: &[(&str, &str)]) -> Result<Config, crate::config::Error> {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags: ProxyFlags::default(),
        env: &env,
        base_dir: dir.to_path_buf(),
        interface_ips: vec![],
        is_root: false,
        cgroup_memory_limit: None,
    })
}

/// The real servers' addresses by default (AWS's IPv6 one for a proxy with an IPv6 address,
/// as Istio); an override that is not `host[:port]` is warned about and not used.
#[test]
fn default_endpoints_and_a_bad_override() {
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), &[]).unwrap();
    let e = &c.platform.endpoints;
    assert_eq!(
        (
            e.aws.as_str(),
            e.azure.as_str(),
            e.gcp.as_str(),
            e.gcp_host_set
        ),
        (
            "169.254.169.254",
            "169.254.169.254",
            "169.254.169.254",
            false
        )
    );
    let c = load(dir.path(), &[("INSTANCE_IP", "fd00::5")]).unwrap();
    assert_eq!(c.platform.endpoints.aws, "[fd00:ec2::254]");
    let c = load(
        dir.path(),
        &[("CLOUD_PLATFORM_AWS_METADATA_HOST", "http://x/latest")],
    )
    .unwrap();
    assert_eq!(c.platform.endpoints.aws, "169.254.169.254");
    assert_eq!(c.env_fallbacks, vec!["CLOUD_PLATFORM_AWS_METADATA_HOST"]);
    let c = load(dir.path(), &[("GCE_METADATA_HOST", "[::1]:8080")]).unwrap();
    assert_eq!(c.platform.endpoints.gcp, "[::1]:8080");
    assert!(c.platform.endpoints.gcp_host_set);
}

/// An IMDS that accepts and never answers: each request ends at AWS's 100 ms, not at the
/// platform's bound; AWS named, it gives nothing.
#[tokio::test]
async fn aws_requests_time_out_at_100_ms() {
    let dir = tempfile::tempdir().unwrap();
    let hang = StandIn::start(Serve::Hang);
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "aws"),
            ("CLOUD_PLATFORM_AWS_METADATA_HOST", &hang.host()),
        ],
    );
    let started = Instant::now();
    let p = discover(&c.platform, BOUND).await;
    let took = started.elapsed();
    assert!(p.metadata.is_empty() && p.locality == Locality::default());
    // A token (100 ms), then three reads at once (100 ms): far below the 5 s bound.
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(hang.requests().len(), 4, "{:?}", hang.requests());
}

/// A metadata server that hangs is bounded: named (Google's, with its retries; Azure's two 5 s
/// requests) or discovered (every endpoint hanging), the platform is ready by the bound.
#[tokio::test]
async fn a_hanging_server_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let hang = StandIn::start(Serve::Hang);
    let host = hang.host();
    let bound = Duration::from_millis(600);
    let cases: [&[(&str, &str)]; 3] = [
        &[("CLOUD_PLATFORM", "gcp"), ("GCE_METADATA_HOST", &host)],
        &[
            ("CLOUD_PLATFORM", "azure"),
            ("CLOUD_PLATFORM_AZURE_METADATA_HOST", &host),
        ],
        &[
            ("CLOUD_PLATFORM_AWS_METADATA_HOST", &host),
            ("CLOUD_PLATFORM_AZURE_METADATA_HOST", &host),
        ],
    ];
    for pairs in cases {
        let mut c = config(dir.path(), pairs);
        if !c.platform.endpoints.gcp_host_set {
            c.platform.endpoints.gcp = host.clone();
        }
        let started = Instant::now();
        let p = discover(&c.platform, bound).await;
        let took = started.elapsed();
        assert!(p.metadata.is_empty(), "{pairs:?}: {p:?}");
        assert_eq!(p.locality, Locality::default(), "{pairs:?}");
        assert!(took < bound + Duration::from_secs(1), "{pairs:?}: {took:?}");
    }
}

/// What answered by the bound is kept: a GCE VM whose Compute API hangs still gets its
/// metadata and locality (without labels) when the bound ends the labels' request.
#[tokio::test]
async fn what_answered_by_the_bound_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let gcp = StandIn::start(Serve::Gcp { vm: true });
    let hang = StandIn::start(Serve::Hang);
    let mut c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "gcp"),
            ("GCE_METADATA_HOST", &gcp.host()),
        ],
    );
    c.platform.endpoints.gcp_compute = format!("http://{}", hang.host());
    let bound = Duration::from_millis(800);
    let started = Instant::now();
    let p = discover(&c.platform, bound).await;
    assert!(started.elapsed() < bound + Duration::from_secs(1));
    assert_eq!(p.metadata["gcp_project"], "test-proj");
    assert_eq!(p.locality.zone, "us-central1-c");
    assert!(p.labels.is_empty());
    assert_eq!(hang.requests().len(), 1, "the labels were asked for");
}

/// Without any server (every endpoint refuses), no platform; it is found once and shared by
/// whoever waits for it.
#[tokio::test]
async fn no_server_no_platform_found_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &[]);
    let pending = Pending::start(c.platform.clone());
    let (a, b) = tokio::join!(pending.get(), pending.get());
    assert_eq!(*a, Platform::none());
    assert!(Arc::ptr_eq(&a, &b));
}
