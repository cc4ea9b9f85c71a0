//! docs/architecture.md's map names every module of the workspace, and nothing that is not
//! one: a module added, moved or removed without the map fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The source directories whose every `.rs` file is a module the map must name.
const SOURCES: &[&str] = &[
    "wire/src",
    "transport/src",
    "provider/src",
    "ibverbs/src",
    "librdmacm/src",
    "cli/src",
    "tests/src",
    "fuzz/fuzz_targets",
];

fn rust_files(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p: PathBuf = e.path();
        if p.is_dir() {
            rust_files(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.insert(rel.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_map_names_every_module_and_only_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the map");
    let mut tree = BTreeSet::new();
    for dir in SOURCES {
        rust_files(&root, &root.join(dir), &mut tree);
    }
    assert!(tree.len() > 100, "the walk found {} modules", tree.len());
    // The map's rows: `| `path` | job |`.
    let named: BTreeSet<String> = map
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|p| p.ends_with(".rs"))
        .map(str::to_owned)
        .collect();
    let missing: Vec<_> = tree.difference(&named).collect();
    let stale: Vec<_> = named.difference(&tree).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/architecture.md's map: modules not in it {missing:?}; rows for no module {stale:?}"
    );
}
