//! The persistent Python worker: spawn through the launcher, the typed worker
//! protocol, execution, input bridging, interrupt/restart, crash detection.
