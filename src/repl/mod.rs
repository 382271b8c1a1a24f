//! The persistent Python worker: spawn through the launcher, the typed worker
//! protocol, execution, input bridging, interrupt/restart, crash detection.
//!
//! Map (files import one another in one direction only; this file declares them and
//! re-exports the API, none of them imports it):
//! - `cell`, `info`, `config`, `error`: the types the API hands out and takes (a cell's
//!   sink and outcome, a session's info and history, the configuration, the errors).
//! - `protocol`: every message between server and worker (one tagged enum each way).
//! - `worker`: one worker process — spawn, calls, interrupt, kill.
//! - `pump`: the I/O task of a worker — its pipes, output attribution, death.
//! - `session`: a named session — cells, variables, history, restart after a crash.
//! - `graph`: a session's cells as a graph (parents, snapshots held, replay plans).
//! - `snapshot`: snapshots by fork — the control sockets, forking a live worker.
//! - `manager`: the named sessions — limits, idle TTL reaper, shutdown.
//! - `python`: which interpreter to use and its installation prefixes; `probe_cache`:
//!   its probe's answers remembered across servers.
//! - `interpreter`: a session's language (Python or R), the seam between the two.
//! - `r`: finding R and starting an R worker (`R/sandbox_repl_worker.R`).
//!
//! Nothing here knows MCP: the server passes a [`CellSink`] that receives a cell's
//! output as it is printed, and gets a [`CellOutcome`] when the cell ends.

mod cell;
mod config;
mod error;
mod graph;
mod info;
mod interpreter;
mod manager;
mod probe_cache;
mod protocol;
mod pump;
mod python;
mod r;
mod session;
mod snapshot;
mod worker;

pub use cell::{CellOutcome, CellSink, CellStatus, InstallAnswer, OutStream};
pub(crate) use cell::{cell_name, parse_cell};
pub use config::ReplConfig;
pub use error::ReplError;
pub use info::{History, HistoryEntry, SessionInfo, SessionState, SnapshotState, VariablePage};
pub use interpreter::Language;
pub use manager::SessionManager;
pub(crate) use probe_cache::known_python3;
pub use protocol::{DisplayItem, PyError, VariableDetail, VariableInfo};
pub use python::{PythonInfo, discover_python};
pub use r::{discover_r_blocking, session_library as r_session_library};
pub use session::{Parent, Session};
