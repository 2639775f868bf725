use super::*;
use crate::envoy::config::cluster::v3::Cluster;
use crate::envoy::config::endpoint::v3::ClusterLoadAssignment;
use crate::envoy::config::listener::v3::Listener;
use crate::envoy::config::route::v3::RouteConfiguration;
use crate::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use crate::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use crate::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, Secret, UpstreamTlsContext,
};
use crate::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use crate::google::protobuf::{Struct, Value, value::Kind};
use crate::istio::ca::{IstioCertificateRequest, IstioCertificateResponse, Roots};
use crate::istio::nds::{NameTable, name_table::NameInfo};
use prost::Message;

fn roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>(m: M) {
    let bytes = m.encode_to_vec();
    let back = M::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(m, back);
}

#[test]
fn envoy_messages_roundtrip() {
    roundtrip(Listener {
        name: "virtualOutbound".into(),
        ..Default::default()
    });
    roundtrip(Cluster {
        name: "outbound|80||httpbin.demo.svc.cluster.local".into(),
        ..Default::default()
    });
    roundtrip(RouteConfiguration {
        name: "80".into(),
        ..Default::default()
    });
    roundtrip(ClusterLoadAssignment {
        cluster_name: "c".into(),
        ..Default::default()
    });
    roundtrip(Secret {
        name: "default".into(),
        ..Default::default()
    });
    roundtrip(DownstreamTlsContext::default());
    roundtrip(UpstreamTlsContext {
        sni: "outbound_.80_._.httpbin".into(),
        ..Default::default()
    });
    roundtrip(HttpConnectionManager {
        stat_prefix: "inbound_0.0.0.0_8080".into(),
        ..Default::default()
    });
    roundtrip(TcpProxy {
        stat_prefix: "PassthroughCluster".into(),
        ..Default::default()
    });
    roundtrip(DiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        version_info: "1".into(),
        response_nonce: "n".into(),
        resource_names: vec!["a".into()],
        ..Default::default()
    });
    roundtrip(DiscoveryResponse {
        type_url: type_url::SECRET.into(),
        nonce: "n".into(),
        resources: vec![pack(&Secret {
            name: "ROOTCA".into(),
            ..Default::default()
        })],
        ..Default::default()
    });
    roundtrip(DeltaDiscoveryRequest {
        type_url: type_url::ENDPOINT.into(),
        resource_names_subscribe: vec!["x".into()],
        ..Default::default()
    });
    roundtrip(DeltaDiscoveryResponse {
        type_url: type_url::LISTENER.into(),
        removed_resources: vec!["gone".into()],
        ..Default::default()
    });
}

#[test]
fn istio_ca_messages_roundtrip() {
    let mut fields = std::collections::HashMap::new();
    fields.insert(
        "CertSigner".to_string(),
        Value {
            kind: Some(Kind::StringValue("signer".into())),
        },
    );
    roundtrip(IstioCertificateRequest {
        csr: "-----BEGIN CERTIFICATE REQUEST-----".into(),
        validity_duration: 86400,
        metadata: Some(Struct { fields }),
    });
    roundtrip(IstioCertificateResponse {
        cert_chain: vec!["leaf".into(), "root".into()],
        root_cert: Some(Roots {
            ca_cert: vec!["root".into()],
        }),
    });
}

#[test]
fn istio_ca_field_numbers() {
    // csr=1 (len), validity_duration=3 (varint), metadata=4 (len).
    let req = IstioCertificateRequest {
        csr: "x".into(),
        validity_duration: 5,
        metadata: Some(Struct::default()),
    };
    assert_eq!(req.encode_to_vec(), vec![0x0a, 1, b'x', 0x18, 5, 0x22, 0]);
    let resp = IstioCertificateResponse {
        cert_chain: vec!["a".into()],
        root_cert: Some(Roots {
            ca_cert: vec!["r".into()],
        }),
    };
    assert_eq!(
        resp.encode_to_vec(),
        vec![0x0a, 1, b'a', 0x12, 3, 0x0a, 1, b'r']
    );
}

#[test]
fn name_table_field_numbers() {
    let mut table = std::collections::HashMap::new();
    table.insert(
        "h".to_string(),
        NameInfo {
            ips: vec!["1".into()],
            registry: "r".into(),
            shortname: "s".into(),
            namespace: "n".into(),
            #[allow(deprecated)]
            alt_hosts: vec!["a".into()],
        },
    );
    let nt = NameTable { table };
    let bytes = nt.encode_to_vec();
    // table = 1 (map entry: key=1 "h", value=2 NameInfo{ips=1, registry=2, shortname=3,
    // namespace=4, alt_hosts=5}).
    let info = [
        0x0a, 1, b'1', 0x12, 1, b'r', 0x1a, 1, b's', 0x22, 1, b'n', 0x2a, 1, b'a',
    ];
    let mut entry = vec![0x0a, 1, b'h', 0x12, info.len() as u8];
    entry.extend_from_slice(&info);
    let mut expected = vec![0x0a, entry.len() as u8];
    expected.extend_from_slice(&entry);
    assert_eq!(bytes, expected);
    roundtrip(nt);
}

#[test]
fn pack_and_unpack_check_the_type() {
    let nt = NameTable::default();
    let any = pack(&nt);
    assert_eq!(any.type_url, type_url::NAME_TABLE);
    let back: NameTable = unpack(&any).unwrap();
    assert_eq!(back, nt);
    let err = unpack::<Secret>(&any).unwrap_err();
    assert!(err.to_string().contains("NameTable"), "{err}");
    let c = pack(&Cluster::default());
    assert_eq!(c.type_url, type_url::CLUSTER);
    assert_eq!(pack(&Listener::default()).type_url, type_url::LISTENER);
    assert_eq!(
        pack(&RouteConfiguration::default()).type_url,
        type_url::ROUTE
    );
    assert_eq!(
        pack(&ClusterLoadAssignment::default()).type_url,
        type_url::ENDPOINT
    );
    assert_eq!(pack(&Secret::default()).type_url, type_url::SECRET);
}

/// A real gRPC round trip through the generated CA client and server stubs.
#[tokio::test]
async fn ca_stubs_round_trip_over_grpc() {
    use crate::istio::ca::istio_certificate_service_client::IstioCertificateServiceClient;
    use crate::istio::ca::istio_certificate_service_server::{
        IstioCertificateService, IstioCertificateServiceServer,
    };

    struct Echo;
    #[tonic::async_trait]
    impl IstioCertificateService for Echo {
        async fn create_certificate(
            &self,
            req: tonic::Request<IstioCertificateRequest>,
        ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status> {
            let r = req.into_inner();
            Ok(tonic::Response::new(IstioCertificateResponse {
                cert_chain: vec![r.csr, r.validity_duration.to_string()],
                root_cert: None,
            }))
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IstioCertificateServiceServer::new(Echo))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = IstioCertificateServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let resp = client
        .create_certificate(IstioCertificateRequest {
            csr: "pem".into(),
            validity_duration: 60,
            metadata: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.cert_chain, vec!["pem".to_string(), "60".to_string()]);
    server.abort();
}
