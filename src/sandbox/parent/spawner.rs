//! The spawner thread: every launcher and zygote the server starts is forked from one
//! thread that lives as long as its runtime.

use std::sync::{Mutex, OnceLock};

type SpawnRequest = (
    std::process::Command,
    std::sync::mpsc::SyncSender<std::io::Result<std::process::Child>>,
);

/// Forks commands from one thread that lives as long as its runtime. The launcher asks
/// for `SIGKILL` when the *thread* that forked it dies (`PR_SET_PDEATHSIG`): forked from
/// a pool thread that retires when idle, a job would be killed with the server still up.
#[derive(Default)]
pub(super) struct Spawner {
    sender: OnceLock<Result<Mutex<std::sync::mpsc::Sender<SpawnRequest>>, String>>,
}

impl Spawner {
    /// Fork `cmd` from the spawner thread (started on first use).
    pub(super) fn spawn(&self, cmd: std::process::Command) -> std::io::Result<std::process::Child> {
        let spawner = self.sender.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("sandbox-spawner".into())
                .spawn(move || {
                    // Lives until every sender is gone: with the runtime.
                    for (mut cmd, reply) in rx {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .map(|_| Mutex::new(tx))
                .map_err(|e| e.to_string())
        });
        let gone = |what: &str| {
            std::io::Error::other(format!(
                "the sandbox spawner thread {what}; restart the server"
            ))
        };
        let sender = match spawner {
            Ok(sender) => sender
                .lock()
                .map_err(|_| gone("is unusable (a panic while spawning)"))?
                .clone(),
            Err(e) => return Err(gone(&format!("could not be started ({e})"))),
        };
        let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
        sender
            .send((cmd, reply_tx))
            .map_err(|_| gone("has stopped"))?;
        reply_rx.recv().map_err(|_| gone("has stopped"))?
    }
}
