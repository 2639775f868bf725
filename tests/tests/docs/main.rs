//! The documents hold what they claim: every difference from Istio the README and the docs link
//! has its entry in `docs/differences.md`, every path ARCHITECTURE.md names exists, and the
//! documents describe the product rather than the history of its making. No root, no network,
//! nothing but the files.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn root() -> PathBuf {
    harness::repo_root()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `README.md`, `ARCHITECTURE.md` and every Markdown file under `docs/`, as repo-relative paths.
fn documents() -> Vec<String> {
    let mut docs = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string()];
    let mut stack = vec![root().join("docs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("docs entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(root()).expect("under the repo");
                docs.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    docs.sort();
    docs
}

/// The anchors of `docs/differences.md`: every `<a id="...">` and every heading's GitHub slug.
fn difference_anchors() -> BTreeSet<String> {
    let text = read("docs/differences.md");
    let mut anchors = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("<a id=\"") {
        rest = &rest[at + "<a id=\"".len()..];
        let id = &rest[..rest.find('"').expect("closing quote of an anchor id")];
        assert!(
            anchors.insert(id.to_string()),
            "docs/differences.md: anchor {id:?} twice"
        );
    }
    for line in text.lines() {
        if let Some(title) = line.strip_prefix('#') {
            let slug: String = title
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect();
            anchors.insert(slug);
        }
    }
    anchors
}

/// Every `differences.md#anchor` link in `text`.
fn difference_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("differences.md#") {
        rest = &rest[at + "differences.md#".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(rest.len());
        // `differences.md#<entry>` is a placeholder, not a link.
        if end > 0 {
            links.push(rest[..end].to_string());
        }
    }
    links
}

/// A difference the documents link has an entry in docs/differences.md.
#[test]
fn every_linked_difference_has_an_entry() {
    let anchors = difference_anchors();
    let mut missing = Vec::new();
    let mut count = 0;
    for doc in documents() {
        for link in difference_links(&read(&doc)) {
            count += 1;
            if !anchors.contains(&link) {
                missing.push(format!("{doc}: differences.md#{link}"));
            }
        }
    }
    assert!(count > 0, "no document links docs/differences.md#<entry>");
    assert!(
        missing.is_empty(),
        "links to differences without an entry in docs/differences.md:\n{}",
        missing.join("\n")
    );
}

/// Each item of the README's "Differences from Istio" list links its entry.
#[test]
fn every_readme_difference_links_its_entry() {
    let readme = read("README.md");
    let start = readme
        .find("### Differences from Istio")
        .expect("README has a \"Differences from Istio\" section");
    let section = &readme[start + 1..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    let items: Vec<&str> = section.split("\n- ").skip(1).collect();
    assert!(!items.is_empty(), "the README's differences list is empty");
    let unlinked: Vec<&str> = items
        .iter()
        .filter(|item| difference_links(item).is_empty())
        .map(|item| item.lines().next().unwrap_or_default())
        .collect();
    assert!(
        unlinked.is_empty(),
        "README differences without a docs/differences.md#<entry> link:\n{}",
        unlinked.join("\n")
    );
}

/// Every file and folder below the repository root, relative, folders with a trailing `/`.
fn repo_paths() -> Vec<String> {
    let root = root();
    let mut paths = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                if matches!(name.as_ref(), ".git" | ".tools" | "target") {
                    continue;
                }
                let rel = path.strip_prefix(&root).expect("under root");
                paths.push(format!("{}/", rel.display()));
                stack.push(path);
            } else {
                let rel = path.strip_prefix(&root).expect("under root");
                paths.push(rel.display().to_string());
            }
        }
    }
    paths
}

/// `a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (one level of braces, possibly several groups).
fn expand_braces(path: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (path.find('{'), path.find('}')) else {
        return vec![path.to_string()];
    };
    path[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{}{alt}{}", &path[..open], &path[close + 1..])))
        .collect()
}

/// Whether `pattern` (segments; `<name>` matches any one segment) equals `path`.
fn matches(pattern: &[&str], path: &[&str]) -> bool {
    pattern.len() == path.len()
        && pattern
            .iter()
            .zip(path)
            .all(|(p, s)| (p.starts_with('<') && p.ends_with('>')) || p == s)
}

const EXTENSIONS: &[&str] = &[
    "rs", "md", "toml", "sh", "py", "ld", "json", "jsonl", "yaml", "go", "txt",
];

/// A backticked span that names a repository path: no spaces, no `::` or `:port`, not a URL
/// path or a pod path (`/…`, `./…`, `../…`, `<configPath>/…`), not a domain's
/// (`istio.io/istio`, `proxy.istio.io/config`), and either a folder path (`a/b`, `a/`) or a
/// file name with a known extension.
fn names_a_path(span: &str) -> bool {
    if span.is_empty()
        || span.contains([' ', ':', '=', '*', '$', '|', '#'])
        || span.starts_with(['/', '.', '<', '-'])
    {
        return span.starts_with(".config/") || span.starts_with(".cargo/");
    }
    if span
        .split('/')
        .next()
        .is_some_and(|first| first.contains('.'))
        && span.contains('/')
    {
        return false;
    }
    let ext = span.rsplit_once('.').map(|(_, e)| e);
    span.contains('/') || ext.is_some_and(|e| EXTENSIONS.contains(&e))
}

/// A path named in ARCHITECTURE.md exists: from the root when its first segment is a top-level
/// entry, else as the tail of some path (the document names parts relative to the file
/// mentioned before them: `forward/pool.rs` in `dns-proxy/src/`).
#[test]
fn architecture_names_only_paths_that_exist() {
    let text = read("ARCHITECTURE.md");
    let paths = repo_paths();
    let split = |p: &str| -> Vec<String> {
        p.trim_end_matches('/')
            .split('/')
            .map(str::to_string)
            .collect()
    };
    let all: Vec<(Vec<String>, bool)> =
        paths.iter().map(|p| (split(p), p.ends_with('/'))).collect();
    let top: BTreeSet<String> = all.iter().map(|(segs, _)| segs[0].clone()).collect();
    let mut named = 0;
    let mut missing = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 || !names_a_path(span) {
            continue;
        }
        for candidate in expand_braces(span) {
            named += 1;
            let want_dir = candidate.ends_with('/');
            let pattern = split(&candidate);
            let pattern: Vec<&str> = pattern.iter().map(String::as_str).collect();
            let from_root = top.contains(pattern[0]);
            let found = all.iter().any(|(segs, is_dir)| {
                if want_dir && !is_dir {
                    return false;
                }
                let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
                if from_root {
                    matches(&pattern, &segs)
                } else {
                    segs.len() >= pattern.len()
                        && matches(&pattern, &segs[segs.len() - pattern.len()..])
                }
            });
            if !found {
                missing.push(candidate);
            }
        }
    }
    assert!(named > 50, "only {named} paths found in ARCHITECTURE.md");
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// `session <number>`, `re-measured in session`, `stale since session`, in any case.
fn history_narrative(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    let mut found = Vec::new();
    for (n, line) in lower.lines().enumerate() {
        let mut narrative =
            line.contains("re-measured in session") || line.contains("stale since session");
        let mut rest = line;
        while let Some(at) = rest.find("session ") {
            let word_start = at == 0
                || !rest[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_');
            let after = &rest[at + "session ".len()..];
            if word_start && after.starts_with(|c: char| c.is_ascii_digit()) {
                narrative = true;
            }
            rest = after;
        }
        if narrative {
            found.push(format!("{}: {}", n + 1, line.trim()));
        }
    }
    found
}

/// The documents describe the product: no numbered rounds of work ("session 7"), no
/// "re-measured in session" or "stale since session".
#[test]
fn documents_tell_no_history_of_their_making() {
    let mut found = Vec::new();
    for doc in documents() {
        for hit in history_narrative(&read(&doc)) {
            found.push(format!("{doc}:{hit}"));
        }
    }
    assert!(
        found.is_empty(),
        "history narrative in the documents (describe the product; date the figures):\n{}",
        found.join("\n")
    );
}

/// The checks themselves catch what they are for.
#[test]
fn the_checks_catch_what_they_are_for() {
    assert_eq!(history_narrative("Measured in Session 10.").len(), 1);
    assert_eq!(history_narrative("stale since session seven").len(), 1);
    assert!(history_narrative("one SDS session per stream; sessions 3").is_empty());
    assert_eq!(
        difference_links("see [x](docs/differences.md#dns-cache)."),
        ["dns-cache"]
    );
    assert_eq!(
        expand_braces("a/{b,c}/{d,e}.rs"),
        ["a/b/d.rs", "a/b/e.rs", "a/c/d.rs", "a/c/e.rs"]
    );
    assert!(names_a_path("forward/pending.rs"));
    assert!(names_a_path("x509.rs"));
    assert!(!names_a_path("proto::listen"));
    assert!(!names_a_path(
        "./var/run/secrets/workload-spiffe-uds/socket"
    ));
    assert!(!names_a_path("<configPath>/admin.sock"));
    assert!(!names_a_path("proxy.istio.io/config"));
    assert!(names_a_path(".config/nextest.toml"));
    assert!(difference_links("`docs/differences.md#<entry>`").is_empty());
    assert!(matches(
        &["tests", "<area>", "main.rs"],
        &["tests", "mesh", "main.rs"]
    ));
}
