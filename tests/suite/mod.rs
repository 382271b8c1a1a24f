//! Integration suites, one module per area.

mod jobs;
