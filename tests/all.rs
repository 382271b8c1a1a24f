//! The one integration-test binary: every test starts the real `mcp-sandbox-repl`
//! (or drives a subsystem API directly). Tests run as root against the real kernel.

// Every item here is test code, also the helpers that are not `#[test]` functions
// (which `allow-unwrap-in-tests` in clippy.toml does not cover): a failed unwrap is a
// failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod suite;
