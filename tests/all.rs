//! The one integration-test binary: every test starts the real `mcp-sandbox-repl`
//! (or drives a subsystem API directly). Tests run as root against the real kernel.

mod common;
mod suite;
