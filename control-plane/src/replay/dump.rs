//! Reading a recorded config dump: Envoy's `/config_dump` (or `istioctl proxy-config all -o
//! json|yaml`, which prints the same document) and picking out its dynamic resources.

use std::path::Path;

use serde_json::Value;

use super::Error;
use crate::xds::XdsType;

const ADMIN_PREFIX: &str = "type.googleapis.com/envoy.admin.v3.";

/// One dynamic resource of the dump, still as JSON (`@type` removed).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Item {
    pub ty: XdsType,
    pub name: String,
    /// Where it sits in the dump, e.g. `configs[2].dynamic_listeners[0].active_state.listener`.
    pub path: String,
    pub json: Value,
}

/// What the dump holds: its dynamic resources and the sections replay does not serve.
#[derive(Debug, Default)]
pub(super) struct Dump {
    pub items: Vec<Item>,
    /// Section types (after `envoy.admin.v3.`) in dump order.
    pub sections: Vec<String>,
}

/// Reads the file as JSON, or as YAML when it is not JSON.
pub(super) fn read(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    match serde_json::from_str::<Value>(&text) {
        Ok(v) => Ok(v),
        Err(json) => serde_yaml::from_str::<Value>(&text).map_err(|yaml| Error::Parse {
            path: path.to_path_buf(),
            reason: format!("not JSON ({json}) nor YAML ({yaml})"),
        }),
    }
}

/// Where a section keeps its dynamic resources: list field, path inside an entry, type.
fn layout(section: &str) -> &'static [(&'static str, &'static [&'static str], XdsType)] {
    match section {
        "ListenersConfigDump" => &[
            (
                "dynamic_listeners",
                &["active_state", "listener"],
                XdsType::Lds,
            ),
            (
                "dynamic_listeners",
                &["warming_state", "listener"],
                XdsType::Lds,
            ),
        ],
        "ClustersConfigDump" => &[
            ("dynamic_active_clusters", &["cluster"], XdsType::Cds),
            ("dynamic_warming_clusters", &["cluster"], XdsType::Cds),
        ],
        "RoutesConfigDump" => &[("dynamic_route_configs", &["route_config"], XdsType::Rds)],
        "EndpointsConfigDump" => &[(
            "dynamic_endpoint_configs",
            &["endpoint_config"],
            XdsType::Eds,
        )],
        _ => &[],
    }
}

/// The name field of each resource type.
fn name_field(ty: XdsType) -> &'static str {
    match ty {
        XdsType::Eds => "cluster_name",
        _ => "name",
    }
}

/// Picks the dynamic resources out of a parsed dump. `file` names the dump in errors.
pub(super) fn parse(file: &Path, doc: &Value) -> Result<Dump, Error> {
    let shape = |field: String, reason: String| Error::Shape {
        path: file.to_path_buf(),
        field,
        reason,
    };
    let Some(configs) = doc.get("configs") else {
        return Err(shape(
            "configs".into(),
            "missing: an Envoy config dump is an object with a `configs` list".into(),
        ));
    };
    let Some(configs) = configs.as_array() else {
        return Err(shape(
            "configs".into(),
            "expected a list of sections".into(),
        ));
    };
    let mut dump = Dump::default();
    for (i, section) in configs.iter().enumerate() {
        let at = format!("configs[{i}]");
        let ty = section
            .get("@type")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                shape(
                    format!("{at}.@type"),
                    "missing: each section names its type".into(),
                )
            })?;
        let Some(kind) = ty.strip_prefix(ADMIN_PREFIX) else {
            return Err(shape(
                format!("{at}.@type"),
                format!("{ty:?} is not a config dump section ({ADMIN_PREFIX}*)"),
            ));
        };
        dump.sections.push(kind.to_string());
        // Other sections (bootstrap, secrets, ECDS, scoped routes) come from the agent's
        // bootstrap and SDS, or are not served: they are listed, not replayed.
        for (list, inner, xds) in layout(kind) {
            let Some(entries) = section.get(*list) else {
                continue;
            };
            let entries = entries
                .as_array()
                .ok_or_else(|| shape(format!("{at}.{list}"), "expected a list".into()))?;
            for (j, entry) in entries.iter().enumerate() {
                let mut v = entry;
                let mut path = format!("{at}.{list}[{j}]");
                let mut found = true;
                for p in *inner {
                    match v.get(*p) {
                        Some(next) => {
                            v = next;
                            path.push('.');
                            path.push_str(p);
                        }
                        None => {
                            found = false;
                            break;
                        }
                    }
                }
                if !found {
                    continue;
                }
                dump.items.push(item(file, *xds, path, v)?);
            }
        }
    }
    Ok(dump)
}

fn item(file: &Path, ty: XdsType, path: String, v: &Value) -> Result<Item, Error> {
    let shape = |field: String, reason: String| Error::Shape {
        path: file.to_path_buf(),
        field,
        reason,
    };
    let Some(obj) = v.as_object() else {
        return Err(shape(path, "expected an object (a packed resource)".into()));
    };
    if let Some(t) = obj.get("@type").and_then(Value::as_str)
        && t != ty.type_url()
    {
        return Err(shape(
            format!("{path}.@type"),
            format!("{t:?}, expected {:?}", ty.type_url()),
        ));
    }
    let field = name_field(ty);
    let name = obj
        .get(field)
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            shape(
                format!("{path}.{field}"),
                "missing or empty: every resource needs its name".into(),
            )
        })?
        .to_string();
    let mut json = v.clone();
    if let Some(o) = json.as_object_mut() {
        o.remove("@type");
    }
    Ok(Item {
        ty,
        name,
        path,
        json,
    })
}
