//! Integration suites, one module per area.

mod jobs;
mod jobs_bench;
