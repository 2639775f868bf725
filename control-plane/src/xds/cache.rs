//! The cache of generated xDS: resources of one type for one proxy view are generated once per
//! snapshot and shared by every proxy with that view. The cache belongs to the xDS side and lives
//! as long as the snapshot it was generated from is the one being served. With fixed resources
//! (`istiod-lite replay`) nothing is generated: the fixed source answers every (view, type).
//!
//! Bounded: a proxy chooses its own view (namespace, labels), so made-up views could grow the
//! cache without end. Past [`MAX_CACHED`] generations or [`MAX_CACHED_BYTES`], a new view's
//! resources are generated for its stream and not kept (served as before, at the cost of a
//! generation per request).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::encoded::Encoded;
use super::{FixedResources, XdsType, generate};
use crate::model::{ProxyView, Snapshot};

/// Most (view, type) generations kept per snapshot: 1,024 views of every type.
pub const MAX_CACHED: usize = 1024 * XdsType::ALL.len();
/// Most bytes of generations kept per snapshot ([`Encoded::size`]): 256 MiB.
pub const MAX_CACHED_BYTES: usize = 256 << 20;

#[derive(Default)]
struct Generated {
    map: HashMap<(ProxyView, XdsType), Arc<Encoded>>,
    bytes: usize,
}

/// A snapshot and what was generated from it so far.
pub struct CachedSnapshot {
    snapshot: Arc<Snapshot>,
    generated: Mutex<Generated>,
    /// The bounds on `generated`: (generations, bytes).
    limits: (usize, usize),
    /// Resources served as they are instead of generated (`istiod-lite replay`).
    fixed: Option<Arc<dyn FixedResources>>,
}

impl std::fmt::Debug for CachedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedSnapshot")
            .field("version", &self.snapshot.version)
            .finish_non_exhaustive()
    }
}

impl CachedSnapshot {
    /// An empty cache for `snapshot`.
    pub fn new(snapshot: Arc<Snapshot>) -> CachedSnapshot {
        CachedSnapshot {
            snapshot,
            generated: Mutex::default(),
            limits: (MAX_CACHED, MAX_CACHED_BYTES),
            fixed: None,
        }
    }

    /// `snapshot` (versions, push timing) whose resources come from `fixed`, not generation.
    pub fn with_fixed(snapshot: Arc<Snapshot>, fixed: Arc<dyn FixedResources>) -> CachedSnapshot {
        CachedSnapshot {
            fixed: Some(fixed),
            ..CachedSnapshot::new(snapshot)
        }
    }

    /// The snapshot the resources are generated from.
    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// Resources of one type for a proxy view, generated once per (view, type).
    #[cfg(test)]
    pub(crate) fn resources(&self, view: &ProxyView, ty: XdsType) -> Arc<super::Resources> {
        if let Some(fixed) = &self.fixed {
            return fixed.resources(view, ty);
        }
        self.encoded(view, ty).resources.clone()
    }

    /// Resources of one type for a proxy view with their response entries, generated and
    /// encoded once per (view, type) and shared by every stream that sends them. Fixed
    /// resources are encoded on each call (`replay` serves a handful of proxies).
    pub(crate) fn encoded(&self, view: &ProxyView, ty: XdsType) -> Arc<Encoded> {
        if let Some(fixed) = &self.fixed {
            return Arc::new(Encoded::new(fixed.resources(view, ty)));
        }
        // Proxies that differ only in what the snapshot cannot tell apart share one generation.
        let key = (self.snapshot.distinguishing_view(view), ty);
        if let Ok(cache) = self.generated.lock()
            && let Some(r) = cache.map.get(&key)
        {
            return r.clone();
        }
        let generated = Arc::new(Encoded::new(Arc::new(generate(&self.snapshot, view, ty))));
        let Ok(mut cache) = self.generated.lock() else {
            return generated;
        };
        // Another stream may have generated the same meanwhile: keep (and share) the first.
        if let Some(r) = cache.map.get(&key) {
            return r.clone();
        }
        let (max, max_bytes) = self.limits;
        let size = generated.size();
        if cache.map.len() >= max || cache.bytes + size > max_bytes {
            tracing::debug!(namespace = %view.namespace, "xDS cache full: generation not kept");
            return generated;
        }
        cache.bytes += size;
        cache.map.insert(key, generated.clone());
        generated
    }
}

/// The cache of the newest snapshot served, shared by every stream of the ADS server.
pub(crate) struct CacheSlot {
    current: Mutex<Option<Arc<CachedSnapshot>>>,
    /// When present, every cache answers from it (`istiod-lite replay`).
    fixed: Option<Arc<dyn FixedResources>>,
}

impl CacheSlot {
    pub(crate) fn new(fixed: Option<Arc<dyn FixedResources>>) -> CacheSlot {
        CacheSlot {
            current: Mutex::new(None),
            fixed,
        }
    }

    fn cache(&self, snap: &Arc<Snapshot>) -> Arc<CachedSnapshot> {
        Arc::new(match &self.fixed {
            Some(f) => CachedSnapshot::with_fixed(snap.clone(), f.clone()),
            None => CachedSnapshot::new(snap.clone()),
        })
    }

    /// The cache for `snap`: the shared one when `snap` is the current snapshot; a new shared
    /// one when `snap` is newer (the previous cache is dropped with its last user); a private,
    /// unshared one for an older snapshot a slow stream still works from.
    pub(crate) fn for_snapshot(&self, snap: &Arc<Snapshot>) -> Arc<CachedSnapshot> {
        let Ok(mut current) = self.current.lock() else {
            return self.cache(snap);
        };
        match current.as_ref() {
            Some(c) if Arc::ptr_eq(c.snapshot(), snap) => c.clone(),
            Some(c) if c.snapshot().created > snap.created => self.cache(snap),
            _ => {
                let c = self.cache(snap);
                *current = Some(c.clone());
                c
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Revision};
    use crate::model::MeshSettings;

    fn snap(n: u64) -> Arc<Snapshot> {
        let rev = Revision::new(Arc::new(Config::default()), n);
        Arc::new(Snapshot::from_revision(
            &rev,
            Arc::new(MeshSettings::default()),
        ))
    }

    fn view(namespace: &str) -> ProxyView {
        ProxyView {
            namespace: namespace.into(),
            labels: Default::default(),
            ips: vec!["127.0.0.1".into()],
            dns_capture: false,
            dns_auto_allocate: false,
            capture: true,
            grpc: false,
        }
    }

    #[test]
    fn made_up_views_do_not_grow_the_cache_past_its_bound() {
        let mut cache = CachedSnapshot::new(snap(1));
        cache.limits = (8, MAX_CACHED_BYTES);
        for i in 0..100 {
            let served = cache.encoded(&view(&format!("made-up-{i}")), XdsType::Cds);
            assert!(served.resources.iter().all(|r| !r.name.is_empty()));
        }
        assert_eq!(cache.generated.lock().unwrap().map.len(), 8);
        // A view already kept is still shared.
        let a = cache.encoded(&view("made-up-0"), XdsType::Cds);
        assert!(Arc::ptr_eq(
            &a,
            &cache.encoded(&view("made-up-0"), XdsType::Cds)
        ));
        // And the byte bound holds the same way.
        let mut cache = CachedSnapshot::new(snap(1));
        let one = cache.encoded(&view("a"), XdsType::Cds).size();
        cache = CachedSnapshot::new(snap(1));
        cache.limits = (MAX_CACHED, 3 * one);
        for i in 0..10 {
            cache.encoded(&view(&format!("v{i}")), XdsType::Cds);
        }
        let kept = cache.generated.lock().unwrap();
        assert!(
            kept.bytes <= 3 * one && kept.map.len() <= 3,
            "{}",
            kept.map.len()
        );
    }

    #[test]
    fn streams_share_the_cache_of_the_newest_snapshot() {
        let slot = CacheSlot::new(None);
        let (old, new) = (snap(1), snap(2));
        let a = slot.for_snapshot(&old);
        assert!(Arc::ptr_eq(&a, &slot.for_snapshot(&old)));
        let b = slot.for_snapshot(&new);
        assert!(Arc::ptr_eq(b.snapshot(), &new));
        assert!(Arc::ptr_eq(&b, &slot.for_snapshot(&new)));
        // An older snapshot gets its own cache and does not evict the newest one.
        let stale = slot.for_snapshot(&old);
        assert!(Arc::ptr_eq(stale.snapshot(), &old));
        assert!(!Arc::ptr_eq(&stale, &a));
        assert!(Arc::ptr_eq(&b, &slot.for_snapshot(&new)));
    }

    /// Answers every (view, type) with one named resource and counts the calls.
    struct Fixed(std::sync::atomic::AtomicUsize);

    impl FixedResources for Fixed {
        fn resources(&self, _view: &ProxyView, ty: XdsType) -> Arc<super::super::Resources> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Arc::new(vec![super::super::Resource {
                name: format!("fixed-{}", ty.short()),
                any: Default::default(),
                hash: 1,
            }])
        }
    }

    #[test]
    fn fixed_resources_answer_instead_of_generation() {
        let fixed = Arc::new(Fixed(Default::default()));
        let slot = CacheSlot::new(Some(fixed.clone()));
        let s = snap(1);
        let cache = slot.for_snapshot(&s);
        assert!(Arc::ptr_eq(cache.snapshot(), &s));
        let view = ProxyView {
            namespace: "demo".into(),
            labels: Default::default(),
            ips: vec!["127.0.0.1".into()],
            dns_capture: false,
            dns_auto_allocate: false,
            capture: true,
            grpc: false,
        };
        for ty in XdsType::ALL {
            let r = cache.resources(&view, ty);
            let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(names, [format!("fixed-{}", ty.short())]);
        }
        assert_eq!(
            fixed.0.load(std::sync::atomic::Ordering::SeqCst),
            XdsType::ALL.len()
        );
        // A newer snapshot keeps the fixed source.
        let newer = slot.for_snapshot(&snap(2));
        assert_eq!(newer.resources(&view, XdsType::Cds)[0].name, "fixed-CDS");
        // Without one, an empty config generates no listener named like the fixed ones.
        let plain = CacheSlot::new(None).for_snapshot(&s);
        assert!(
            plain
                .resources(&view, XdsType::Lds)
                .iter()
                .all(|r| !r.name.starts_with("fixed-"))
        );
    }
}
