//! uv-managed environments: per-session venvs, package installs, one-off scripts.
