//! Integration test suites, one module per subsystem.

mod envs;
