//! Integration suites, one module per area.

mod repl;
