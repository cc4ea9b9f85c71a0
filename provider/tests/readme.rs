//! The README's Rust example is the loopback example the tests build and run, word for word.

#[test]
fn readme_shows_the_loopback_example() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../examples/loopback.rs");
    let body = example
        .split("\n#[test]")
        .next()
        .unwrap_or(example)
        .trim_end();
    assert!(
        readme.contains(body),
        "README.md's Rust example must be provider/examples/loopback.rs (without its test)"
    );
}

#[test]
fn readme_shows_the_cm_example() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../examples/cm.rs");
    let body = example
        .split("\n#[test]")
        .next()
        .unwrap_or(example)
        .trim_end();
    assert!(
        readme.contains(body),
        "README.md's connection manager example must be provider/examples/cm.rs (without its test)"
    );
}
