//! Snapshots of a session's state, server side: the control socket a live worker hands
//! each snapshot's socket over on, and asking a snapshot to fork a new live worker with
//! fresh protocol pipes (descriptors passed by SCM_RIGHTS on SOCK_SEQPACKET sockets).
//! The worker side is `_Snapshots` in python/sandbox_repl_worker.py; the messages are in
//! docs/worker-protocol.md ("Snapshots").

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, setsockopt, socketpair, sockopt,
};
use nix::sys::time::TimeVal;

/// Errors of the snapshot channel.
#[derive(Debug, thiserror::Error)]
pub(super) enum SnapshotError {
    #[error("could not {what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the snapshot did not fork a worker: {0}")]
    Refused(String),
}

fn io(what: &'static str) -> impl FnOnce(nix::Error) -> SnapshotError {
    move |e| SnapshotError::Io {
        what,
        source: std::io::Error::from(e),
    }
}

/// A connected pair of SOCK_SEQPACKET unix sockets (close-on-exec in this process).
pub(crate) fn control_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(std::io::Error::from)
}

/// One held snapshot: a frozen fork of a worker right after cell `cell`, waiting on its
/// control socket. Dropping this closes the socket, and the snapshot exits.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub cell: u64,
    pub pid: u32,
    /// What a fork of it shares with the other forks instead of copying (open files'
    /// offsets, pipes, child processes), in the worker's words; `None` if nothing.
    pub shared: Option<String>,
    sock: OwnedFd,
}

#[cfg(test)]
impl Snapshot {
    pub(crate) fn for_test(cell: u64, sock: OwnedFd) -> Snapshot {
        Snapshot {
            cell,
            pid: 0,
            shared: None,
            sock,
        }
    }
}

/// The server's ends of a live worker a snapshot forked.
pub(crate) struct Forked {
    pub pid: u32,
    pub requests: OwnedFd,
    pub events: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub control: OwnedFd,
}

impl Snapshot {
    /// Ask the snapshot to fork a live worker on fresh pipes; blocks until it answers
    /// (at most `timeout`). The snapshot stays, and can be forked again.
    pub(crate) fn fork_live(&self, timeout: Duration) -> Result<Forked, SnapshotError> {
        let pipe = |what| std::io::pipe().map_err(|source| SnapshotError::Io { what, source });
        let (req_r, req_w) = pipe("create a request pipe")?;
        let (ev_r, ev_w) = pipe("create an event pipe")?;
        let (out_r, out_w) = pipe("create a stdout pipe")?;
        let (err_r, err_w) = pipe("create a stderr pipe")?;
        let (ctl_mine, ctl_theirs) = control_pair().map_err(|source| SnapshotError::Io {
            what: "create a control socket",
            source,
        })?;
        let theirs: [RawFd; 5] = [
            req_r.as_raw_fd(),
            ev_w.as_raw_fd(),
            out_w.as_raw_fd(),
            err_w.as_raw_fd(),
            ctl_theirs.as_raw_fd(),
        ];
        let secs = timeout.as_secs() as i64;
        let usecs = timeout.subsec_micros() as i64;
        setsockopt(
            &self.sock,
            sockopt::ReceiveTimeout,
            &TimeVal::new(secs, usecs as _),
        )
        .map_err(io("set a timeout on the snapshot socket"))?;
        sendmsg::<()>(
            self.sock.as_raw_fd(),
            &[IoSlice::new(br#"{"op":"fork"}"#)],
            &[ControlMessage::ScmRights(&theirs)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(io("send `fork` to the snapshot"))?;
        // The worker's ends are its now; ours close here.
        drop((req_r, ev_w, out_w, err_w, ctl_theirs));
        let (reply, fds) = recv(&self.sock, false).map_err(io("read the snapshot's answer"))?;
        drop(fds);
        let reply = reply.ok_or_else(|| SnapshotError::Refused("the snapshot is gone".into()))?;
        match reply.get("pid").and_then(serde_json::Value::as_u64) {
            Some(pid) => Ok(Forked {
                pid: pid as u32,
                requests: req_w.into(),
                events: ev_r.into(),
                stdout: out_r.into(),
                stderr: err_r.into(),
                control: ctl_mine,
            }),
            None => Err(SnapshotError::Refused(
                reply
                    .get("error")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("no pid in its answer")
                    .to_string(),
            )),
        }
    }
}

/// The snapshot socket a live worker sent on its control socket, without waiting (the
/// worker sends it before the `snapshot` event that announces it).
pub(crate) fn take_snapshot(control: &OwnedFd, cell: u64) -> Result<Snapshot, SnapshotError> {
    let (msg, mut fds) = recv(control, true).map_err(io("receive a snapshot socket"))?;
    let msg = msg.ok_or_else(|| SnapshotError::Refused("the control socket closed".into()))?;
    let sock = fds
        .pop()
        .ok_or_else(|| SnapshotError::Refused("no socket came with the snapshot".into()))?;
    let got = msg.get("cell").and_then(serde_json::Value::as_u64);
    let pid = msg.get("pid").and_then(serde_json::Value::as_u64);
    match (got, pid) {
        (Some(c), Some(pid)) if c == cell => Ok(Snapshot {
            cell,
            pid: pid as u32,
            shared: msg
                .get("shared")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
            sock,
        }),
        _ => Err(SnapshotError::Refused(format!(
            "the snapshot socket is for {msg}, not cell {cell}"
        ))),
    }
}

/// One message and its descriptors; `None` at end of file.
fn recv(
    sock: &OwnedFd,
    nonblocking: bool,
) -> nix::Result<(Option<serde_json::Value>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 1 << 16];
    let mut cmsg = nix::cmsg_space!([RawFd; 8]);
    let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
    if nonblocking {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let (bytes, raw) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), flags) {
            Ok(msg) => {
                let mut raw: Vec<RawFd> = Vec::new();
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        raw.extend(fds);
                    }
                }
                break (msg.bytes, raw);
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e),
        }
    };
    let fds = raw
        .into_iter()
        // SAFETY: the kernel just installed these descriptors in this process for this
        // message (SCM_RIGHTS); nothing else owns them.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if bytes == 0 {
        return Ok((None, fds));
    }
    let value = serde_json::from_slice(&buf[..bytes]).unwrap_or(serde_json::Value::Null);
    Ok((Some(value), fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor and a message travel together; the cell must match.
    #[test]
    fn snapshot_socket_is_taken_from_the_control_socket() {
        let (ours, worker) = control_pair().unwrap();
        let (snap_end, _kept) = control_pair().unwrap();
        let fds = [snap_end.as_raw_fd()];
        sendmsg::<()>(
            worker.as_raw_fd(),
            &[IoSlice::new(br#"{"cell":4,"pid":77}"#)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let s = take_snapshot(&ours, 4).unwrap();
        assert_eq!((s.cell, s.pid), (4, 77));
        // Nothing queued: no wait, an error.
        assert!(take_snapshot(&ours, 5).is_err());
        // A message for another cell is refused.
        sendmsg::<()>(
            worker.as_raw_fd(),
            &[IoSlice::new(br#"{"cell":9,"pid":1}"#)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        assert!(take_snapshot(&ours, 4).is_err());
    }

    /// A snapshot that refuses, or is gone, is an error, not a hang.
    #[test]
    fn fork_live_reports_a_refusal_and_a_closed_snapshot() {
        let (server, snap) = control_pair().unwrap();
        let s = Snapshot {
            cell: 1,
            pid: 1,
            shared: None,
            sock: server,
        };
        let t = std::thread::spawn(move || {
            let (msg, fds) = recv(&snap, false).unwrap();
            assert_eq!(fds.len(), 5);
            assert_eq!(msg.unwrap()["op"], "fork");
            sendmsg::<()>(
                snap.as_raw_fd(),
                &[IoSlice::new(br#"{"error":"fork failed: EAGAIN"}"#)],
                &[],
                MsgFlags::empty(),
                None,
            )
            .unwrap();
            drop(snap);
        });
        let e = s.fork_live(Duration::from_secs(5)).err().unwrap();
        assert!(e.to_string().contains("EAGAIN"), "{e}");
        t.join().unwrap();
        let e = s.fork_live(Duration::from_secs(5)).err().unwrap();
        assert!(
            e.to_string().contains("gone") || e.to_string().contains("send"),
            "{e}"
        );
    }
}
