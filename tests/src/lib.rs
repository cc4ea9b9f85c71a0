//! Cross-crate tests of ferroce live in `tests/`; this library only gives them a crate.
