//! The one integration-test binary: every test starts the real `mcp-sandbox-repl`.
//! Tests run as root and exercise the real kernel mechanisms.

mod common;
mod suite;
