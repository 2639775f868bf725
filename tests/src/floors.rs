// The floors check every crate's `floors` test runs: a crate's top-level modules listed lowest
// first, and no module naming (`crate::x`, in code or in a doc link) a module on a floor above
// its own, so no two modules reach each other. The harness has it as its module `floors`; the
// other crates (which the harness depends on, so they cannot depend on it) through
// `include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/src/floors.rs"))`; hence plain
// comments here, no inner doc.

use std::path::{Path, PathBuf};

/// Panics unless the top-level modules under `src` (all but `lib`, `main` and `floors`) are
/// exactly `floors`, and each names only modules listed before it. `allowed` lists the
/// `(module, named)` pairs that may point up anyway, each with its reason at the caller.
pub fn check(src: &Path, floors: &[&str], allowed: &[(&str, &str)]) {
    let mut top: Vec<String> = std::fs::read_dir(src)
        .expect("src")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".rs").map(str::to_string)
        })
        .filter(|m| !["lib", "main", "floors"].contains(&m.as_str()))
        .collect();
    top.sort();
    let mut listed: Vec<String> = floors.iter().map(|m| m.to_string()).collect();
    listed.sort();
    assert_eq!(top, listed, "every top-level module has a floor");

    let mut upward = Vec::new();
    for (floor, module) in floors.iter().enumerate() {
        let mut files = vec![src.join(format!("{module}.rs"))];
        sources(&src.join(module), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source");
            for name in named(&text) {
                if let Some(other) = floors.iter().position(|m| *m == name)
                    && other > floor
                    && !allowed.contains(&(*module, name.as_str()))
                {
                    upward.push(format!("{} names crate::{name}", file.display()));
                }
            }
        }
    }
    assert!(upward.is_empty(), "modules reaching up: {upward:#?}");
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules `text` names through `crate::`, including each name of a `crate::{a, b}` group.
fn named(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.push(item);
        } else {
            out.push(rest.to_string());
        }
    }
    out.iter()
        .map(|s| {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}
