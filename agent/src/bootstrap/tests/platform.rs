//! The cloud platform in the bootstrap's node, from stand-in metadata servers on loopback
//! (`crate::platform::standin`) through discovery: `PLATFORM_METADATA`, the locality when no
//! pod label gives one, a GCE VM's instance labels, the GCP project for the template and the
//! Stackdriver tracer, the gRPC bootstrap's node.

use serde_json::{Value, json};

use super::*;
use crate::platform::standin::{Serve, StandIn, config};
use crate::platform::{BOUND, Platform, discover};

/// The bootstrap's node on `platform`.
fn node(c: &Config, platform: &Platform) -> Value {
    render(c, status_only(15020), platform).unwrap()["node"].clone()
}

/// AWS: Istio's keys, the locality from the region and availability zone, in Envoy's
/// bootstrap and the gRPC one.
#[tokio::test]
async fn aws_metadata_and_locality_in_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let aws = StandIn::start(Serve::Aws { tokens: true });
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "aws"),
            ("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host()),
        ],
    );
    let p = discover(&c.platform, BOUND).await;
    let n = node(&c, &p);
    assert_eq!(
        n["metadata"]["PLATFORM_METADATA"],
        json!({
            "aws_availability_zone": "us-west-2b",
            "aws_instance_id": "i-0123456789abcdef0",
            "aws_region": "us-west-2",
        })
    );
    assert_eq!(
        n["locality"],
        json!({"region": "us-west-2", "zone": "us-west-2b"})
    );
    let path = write_grpc_bootstrap(&c, Sockets::default(), &p).unwrap();
    let grpc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(grpc["node"]["locality"], n["locality"]);
    assert_eq!(
        grpc["node"]["metadata"]["PLATFORM_METADATA"],
        n["metadata"]["PLATFORM_METADATA"]
    );
}

/// GCP on a GKE node (`GCE_METADATA_HOST` moves the server): every key Istio asks for (the
/// numeric id trimmed), the cluster URL, the zone from the metadata server and its region; a
/// cluster name means Kubernetes, so no instance labels. The template gets the project
/// number.
#[tokio::test]
async fn gcp_metadata_and_locality_in_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let gcp = StandIn::start(Serve::Gcp { vm: false });
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "gcp"),
            ("GCE_METADATA_HOST", &gcp.host()),
        ],
    );
    let p = discover(&c.platform, BOUND).await;
    let n = node(&c, &p);
    assert_eq!(
        n["metadata"]["PLATFORM_METADATA"],
        json!({
            "gcp_project": "test-proj",
            "gcp_project_number": "123456789",
            "gcp_location": "us-central1",
            "gcp_gke_cluster_name": "test-cluster",
            "gcp_gke_cluster_url": "https://container.googleapis.com/v1/projects/test-proj/locations/us-central1/clusters/test-cluster",
            "gcp_gce_instance": "vm-1",
            "gcp_gce_instance_id": "4242",
        })
    );
    assert_eq!(
        n["locality"],
        json!({"region": "us-central1", "zone": "us-central1-c"})
    );
    assert!(n["metadata"].get("STATIC_LABELS").is_none());
    assert!(!gcp.requests().iter().any(|r| r.contains("token")));
    let d = template_data(&c, status_only(15020), &p).unwrap();
    assert_eq!(d["gcp_project_number"], "123456789");
}

/// A GCE VM outside Kubernetes: its instance labels are static labels; with no labels file and
/// no `ISTIO_METAJSON_LABELS`, Istio's LABELS stays unset. With `ISTIO_METAJSON_LABELS` the two
/// are one map, instance labels included.
#[tokio::test]
async fn gce_instance_labels_are_static_labels() {
    let dir = tempfile::tempdir().unwrap();
    let gcp = StandIn::start(Serve::Gcp { vm: true });
    let host = gcp.host();
    let mut c = config(
        dir.path(),
        &[("CLOUD_PLATFORM", "gcp"), ("GCE_METADATA_HOST", &host)],
    );
    c.platform.endpoints.gcp_compute = format!("http://{host}");
    let p = discover(&c.platform, BOUND).await;
    let n = node(&c, &p);
    let labels = json!({"env": "prod", "team": "mesh"});
    assert_eq!(n["metadata"]["STATIC_LABELS"], labels);
    assert!(n["metadata"].get("LABELS").is_none());
    assert_eq!(
        n["locality"],
        json!({"region": "us-central1", "zone": "us-central1-c"})
    );

    let mut c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "gcp"),
            ("GCE_METADATA_HOST", &host),
            ("ISTIO_METAJSON_LABELS", r#"{"app":"vm-app"}"#),
        ],
    );
    c.platform.endpoints.gcp_compute = format!("http://{host}");
    let n = node(&c, &discover(&c.platform, BOUND).await);
    let both = json!({"app": "vm-app", "env": "prod", "team": "mesh"});
    assert_eq!(n["metadata"]["STATIC_LABELS"], both);
    assert_eq!(n["metadata"]["LABELS"], both);
}

/// The Stackdriver tracer and the STS template keys take the GCP project from the platform's
/// metadata (`GCP_METADATA` here); without a GCP platform the tracer has none, an error.
#[tokio::test]
async fn the_gcp_project_comes_from_the_platform() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(
        dir.path(),
        &[
            ("GCP_METADATA", "pid|77|cl|europe-west1"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ],
    );
    c.flags.sts_port = 15463;
    let p = discover(&c.platform, BOUND).await;
    c.proxy.raw["tracing"] = json!({"stackdriver": {}});
    let d = template_data(&c, status_only(1), &p).unwrap();
    assert_eq!(d["stackdriverProjectID"], "pid");
    assert_eq!(d["gcp_project_id"], "pid");
    assert_eq!(d["gcp_project_number"], "77");
    let e = render(&c, status_only(1), &Platform::none()).unwrap_err();
    assert!(e.to_string().contains("gcp_project"), "{e}");
}

/// Azure: name, location, vmId and tags as Istio's `azure_` keys; locality from location and
/// zone.
#[tokio::test]
async fn azure_metadata_and_locality_in_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let azure = StandIn::start(Serve::Azure);
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "azure"),
            ("CLOUD_PLATFORM_AZURE_METADATA_HOST", &azure.host()),
        ],
    );
    let n = node(&c, &discover(&c.platform, BOUND).await);
    assert_eq!(
        n["metadata"]["PLATFORM_METADATA"],
        json!({
            "azure_name": "negasonic",
            "azure_location": "centralus",
            "azure_vmId": "13f56399-bd52-4150-9748-7190aae1ff21",
            "azure_Department": "IT",
            "azure_Role": "WorkerRole; OtherWorker",
        })
    );
    assert_eq!(n["locality"], json!({"region": "centralus", "zone": "1"}));
}

/// A pod label's locality wins over the platform's; `PLATFORM_METADATA` stays.
#[tokio::test]
async fn a_pod_locality_label_wins() {
    let dir = tempfile::tempdir().unwrap();
    write_pod_info(
        dir.path(),
        "labels",
        "app=\"a\"\ntopology.istio.io/locality=\"r1.z1.s1\"\n",
    );
    let aws = StandIn::start(Serve::Aws { tokens: true });
    let c = config(
        dir.path(),
        &[
            ("CLOUD_PLATFORM", "aws"),
            ("CLOUD_PLATFORM_AWS_METADATA_HOST", &aws.host()),
        ],
    );
    let n = node(&c, &discover(&c.platform, BOUND).await);
    assert_eq!(
        n["locality"],
        json!({"region": "r1", "zone": "z1", "sub_zone": "s1"})
    );
    assert_eq!(
        n["metadata"]["PLATFORM_METADATA"]["aws_region"],
        "us-west-2"
    );
}

/// `none`, or nothing found: no `PLATFORM_METADATA`, no locality.
#[tokio::test]
async fn no_platform_adds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for cloud in ["none", ""] {
        let c = config(dir.path(), &[("CLOUD_PLATFORM", cloud)]);
        let p = discover(&c.platform, BOUND).await;
        assert_eq!(p, Platform::none(), "{cloud:?}");
        let n = node(&c, &p);
        assert!(n["metadata"].get("PLATFORM_METADATA").is_none());
        assert!(n.get("locality").is_none_or(|l| l == &json!({})), "{n}");
    }
}
