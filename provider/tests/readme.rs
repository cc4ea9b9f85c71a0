//! The README is the front door: short, its two set-up commands the ones the tests run, its
//! Rust example the loopback example word for word, its links and named files present; the
//! connection manager example in docs/rust.md is `examples/cm.rs` word for word.

use std::path::Path;

const README: &str = include_str!("../../README.md");

/// The source of an example without its `#[test]` wrapper.
fn example_body(example: &str) -> &str {
    example
        .split("\n#[test]")
        .next()
        .unwrap_or(example)
        .trim_end()
}

#[test]
fn readme_shows_the_loopback_example() {
    let body = example_body(include_str!("../examples/loopback.rs"));
    assert!(
        README.contains(body),
        "README.md's Rust example must be provider/examples/loopback.rs (without its test)"
    );
}

#[test]
fn rust_doc_shows_the_cm_example() {
    let doc = include_str!("../../docs/rust.md");
    let body = example_body(include_str!("../examples/cm.rs"));
    assert!(
        doc.contains(body),
        "docs/rust.md's connection manager example must be provider/examples/cm.rs (without its test)"
    );
}

#[test]
fn readme_is_at_most_200_lines() {
    let lines = README.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: depth goes to docs/"
    );
}

#[test]
fn readme_set_up_is_the_demo_and_the_tests() {
    let setup = README
        .split("## Set-up: two commands")
        .nth(1)
        .and_then(|s| s.split("```sh").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("README.md has a set-up section with a sh block");
    let commands: Vec<&str> = setup
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // cli/tests/multiprocess.rs runs the demo and checks its last line; CI runs the tests.
    assert_eq!(
        commands,
        [
            "cargo run --release --bin ferroce -- demo",
            "cargo test --workspace"
        ]
    );
    assert!(README.contains("`demo OK: every byte verified`"));
}

#[test]
fn readme_links_and_named_files_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut missing = Vec::new();
    // Markdown links to files of the repository: `](path)`.
    for part in README.split("](").skip(1) {
        let target = part.split(')').next().unwrap_or_default();
        if !target.contains("://") && !root.join(target).exists() {
            missing.push(target.to_string());
        }
    }
    // Paths in backticks that name a file of the repository (`dir/…/file.ext`).
    for (i, part) in README.split('`').enumerate() {
        let looks_like_path = i % 2 == 1
            && part.contains('/')
            && !part.contains(' ')
            && !part.starts_with('/')
            && !part.starts_with('$')
            && part.rsplit('/').next().is_some_and(|f| f.contains('.'));
        if looks_like_path && !root.join(part).exists() {
            missing.push(part.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "README.md names missing files: {missing:?}"
    );
}
