//! User and group names looked up in `/etc/passwd` and `/etc/group` directly, as Istio's
//! `istio-iptables` does: it is a Go binary built without cgo, whose `os/user` reads those two
//! files and never asks NSS (so an LDAP or sssd user is unknown to it, and to us). Reading the
//! files ourselves also keeps glibc's NSS out of the binary, which can then be linked statically
//! (its start is then as cheap as `/bin/true`'s; see `benches/apply-vs-restore.sh`).
//!
//! The rules are Go's: lines are trimmed, blank lines and `#` comments skipped, the first line
//! whose name field equals the name wins, names starting with `+` or `-` (NIS) never match, and
//! a line whose numeric fields do not parse is passed over.

use std::path::Path;

/// The uid of `name` in a passwd file (`name:x:uid:gid:gecos:home:shell`).
pub fn uid(passwd: &Path, name: &str) -> Option<u32> {
    find(&std::fs::read_to_string(passwd).ok()?, name, 6, &[2, 3])
}

/// The gid of `name` in a group file (`name:x:gid:members`).
pub fn gid(group: &Path, name: &str) -> Option<u32> {
    find(&std::fs::read_to_string(group).ok()?, name, 3, &[2])
}

/// The first record of `text` named `name` with at least `colons` separators, whose `numeric`
/// fields all parse; its first numeric field.
fn find(text: &str, name: &str, colons: usize, numeric: &[usize]) -> Option<u32> {
    if name.is_empty() {
        return None;
    }
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.matches(':').count() < colons {
            continue;
        }
        let parts: Vec<&str> = line.splitn(colons + 1, ':').collect();
        if parts[0] != name || parts[0].starts_with(['+', '-']) {
            continue;
        }
        // Go's Atoi: an optional sign, then digits. Ids outside u32 are not ids here.
        let ids: Option<Vec<u32>> = numeric
            .iter()
            .map(|&i| parts[i].strip_prefix('+').unwrap_or(parts[i]).parse().ok())
            .collect();
        match ids {
            Some(ids) => return ids.first().copied(),
            None => continue,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::find;

    const PASSWD: &str = "\
# comment:x:1:1:::
root:x:0:0:root:/root:/bin/bash

  istio-proxy:x:1337:1337::/home/istio-proxy:/bin/sh  
+nis:x:5:5:::
broken:x:notanumber:1:::
broken:x:7:7:::
short:x:9:9
app:x:+1000:1000:App,,,:/app:/bin/sh
";

    fn uid(name: &str) -> Option<u32> {
        find(PASSWD, name, 6, &[2, 3])
    }

    #[test]
    fn passwd_lookups_follow_gos_rules() {
        assert_eq!(uid("root"), Some(0));
        assert_eq!(uid("istio-proxy"), Some(1337), "trimmed line");
        assert_eq!(uid("+nis"), None, "NIS names never match");
        assert_eq!(uid("nis"), None);
        assert_eq!(
            uid("broken"),
            Some(7),
            "a line that does not parse is passed over"
        );
        assert_eq!(uid("short"), None, "fewer than six colons");
        assert_eq!(uid("app"), Some(1000), "Atoi's leading +");
        assert_eq!(uid("comment"), None);
        assert_eq!(uid(""), None);
        assert_eq!(uid("nobody"), None);
    }

    #[test]
    fn group_lookups() {
        let group = "wheel:x:10:root\nistio-proxy:x:1337:\n-bad:x:3:\nodd:x:x:\n";
        assert_eq!(find(group, "wheel", 3, &[2]), Some(10));
        assert_eq!(find(group, "istio-proxy", 3, &[2]), Some(1337));
        assert_eq!(find(group, "-bad", 3, &[2]), None);
        assert_eq!(find(group, "odd", 3, &[2]), None);
    }
}
