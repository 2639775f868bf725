//! Per proxy, per type sync state for `/debug/syncz` (like `istioctl proxy-status`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::XdsType;

/// One type's state on one connection.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TypeSync {
    /// `SYNCED`, `STALE` or `NOT SENT`.
    pub status: &'static str,
    /// The type's full URL (`type.googleapis.com/envoy.config.listener.v3.Listener`).
    pub type_url: &'static str,
    pub sent_nonce: String,
    pub sent_version: String,
    pub acked_nonce: String,
    pub acked_version: String,
    /// The error of the last NACK of the latest push, if any: Envoy's `error_detail` as
    /// `code <n>: <message>`; the message names the rejected resources.
    pub nack: Option<String>,
    /// The nonce of the push that NACK rejected.
    pub nack_nonce: Option<String>,
}

/// One connected proxy.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    pub proxy: String,
    pub connection_id: String,
    /// `sotw` or `delta`.
    pub stream: &'static str,
    pub types: BTreeMap<&'static str, TypeSync>,
}

/// One connection's row as the table keeps it: the types in [`XdsType::ALL`]'s order, in one
/// allocation (a map's node holds eleven; the table has a row per connected proxy).
struct Row {
    proxy: String,
    stream: &'static str,
    types: Box<[TypeSync; XdsType::ALL.len()]>,
}

impl Row {
    fn status(&self, conn_id: &str) -> SyncStatus {
        SyncStatus {
            proxy: self.proxy.clone(),
            connection_id: conn_id.to_string(),
            stream: self.stream,
            types: XdsType::ALL
                .iter()
                .zip(self.types.iter())
                .map(|(t, s)| (t.short(), s.clone()))
                .collect(),
        }
    }
}

/// Shared table of connections; each connection task updates its own row.
#[derive(Clone, Default)]
pub struct SyncTable {
    rows: Arc<Mutex<BTreeMap<String, Row>>>,
}

impl SyncTable {
    pub(crate) fn connect(&self, conn_id: &str, proxy: &str, stream: &'static str) {
        let types = Box::new(XdsType::ALL.map(|t| TypeSync {
            status: "NOT SENT",
            type_url: t.type_url(),
            ..Default::default()
        }));
        if let Ok(mut rows) = self.rows.lock() {
            rows.insert(
                conn_id.to_string(),
                Row {
                    proxy: proxy.to_string(),
                    stream,
                    types,
                },
            );
        }
    }

    pub(crate) fn disconnect(&self, conn_id: &str) {
        if let Ok(mut rows) = self.rows.lock() {
            rows.remove(conn_id);
        }
    }

    pub(crate) fn update(&self, conn_id: &str, ty: XdsType, f: impl FnOnce(&mut TypeSync)) {
        if let Ok(mut rows) = self.rows.lock()
            && let Some(row) = rows.get_mut(conn_id)
        {
            let t = &mut row.types[ty.index()];
            f(t);
            t.status = if t.sent_nonce.is_empty() {
                "NOT SENT"
            } else if t.acked_nonce == t.sent_nonce && t.nack.is_none() {
                "SYNCED"
            } else {
                "STALE"
            };
        }
    }

    /// Every connection's state, ordered by connection id.
    pub fn rows(&self) -> Vec<SyncStatus> {
        self.rows
            .lock()
            .map(|r| r.iter().map(|(id, row)| row.status(id)).collect())
            .unwrap_or_default()
    }

    /// Number of connected proxies.
    pub fn len(&self) -> usize {
        self.rows.lock().map(|r| r.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
