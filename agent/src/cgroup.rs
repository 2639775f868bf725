//! The container's memory limit, read from its cgroup (v2 `memory.max`, v1
//! `memory.limit_in_bytes`), for the opt-in Envoy heap bound (`ENVOY_MEMORY_OVERLOAD`): an
//! input of the configuration, read by the composition root.

use std::path::{Path, PathBuf};

/// Limits at or above this are "no limit" (cgroup v1 writes 2^63 rounded to a page).
const UNLIMITED: u64 = 1 << 62;

/// The memory limit of this process's cgroup, `None` when there is none (or no cgroup to read).
pub fn memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    memory_limit_in(Path::new("/sys/fs/cgroup"), &own)
}

/// [`memory_limit`] with the cgroup mount and `/proc/self/cgroup` given (tests).
pub fn memory_limit_in(root: &Path, proc_self_cgroup: &str) -> Option<u64> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2 (unified).
            candidates.push(root.join(path).join("memory.max"));
        } else if controllers.split(',').any(|c| c == "memory") {
            candidates.push(root.join("memory").join(path).join("memory.limit_in_bytes"));
        }
    }
    // Inside a cgroup namespace the container's own cgroup is the mount's root.
    candidates.push(root.join("memory.max"));
    candidates.push(root.join("memory/memory.limit_in_bytes"));
    candidates
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| parse_limit(&text))
}

/// `max` or a huge number: no limit.
fn parse_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|b| *b > 0 && *b < UNLIMITED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_v2_and_v1_limits_and_treats_max_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("kubepods/pod1/c1")).unwrap();
        std::fs::write(root.join("kubepods/pod1/c1/memory.max"), "268435456\n").unwrap();
        assert_eq!(
            memory_limit_in(root, "0::/kubepods/pod1/c1\n"),
            Some(256 << 20)
        );
        std::fs::write(root.join("kubepods/pod1/c1/memory.max"), "max\n").unwrap();
        assert_eq!(memory_limit_in(root, "0::/kubepods/pod1/c1\n"), None);

        std::fs::create_dir_all(root.join("memory/docker/abc")).unwrap();
        std::fs::write(
            root.join("memory/docker/abc/memory.limit_in_bytes"),
            "134217728\n",
        )
        .unwrap();
        let v1 = "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n";
        assert_eq!(memory_limit_in(root, v1), Some(128 << 20));
        std::fs::write(
            root.join("memory/docker/abc/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(memory_limit_in(root, v1), None);
        // A cgroup namespace: the container's cgroup is the mount's root.
        let ns = tempfile::tempdir().unwrap();
        std::fs::write(ns.path().join("memory.max"), "536870912").unwrap();
        assert_eq!(memory_limit_in(ns.path(), "0::/\n"), Some(512 << 20));
        assert_eq!(memory_limit_in(&root.join("none"), ""), None);
    }
}
