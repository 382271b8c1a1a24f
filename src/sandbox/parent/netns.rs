//! Network namespaces the parent makes: the broker's ([`namespace_with_listener`]: a
//! namespace with `lo` up and the broker's listener bound in it; the launcher joins it)
//! and whether this process can make them at all. The runtime's pool makes namespaces
//! ahead with `launcher::netns::make_namespace` in its own thread.
//!
//! With CAP_SYS_ADMIN a short-lived thread of the server makes the broker's namespace.
//! Without it (not root, or root in a container without it) a thread cannot: the
//! kernel refuses `CLONE_NEWUSER` to a multi-threaded process. A forked child then does
//! it ([`helper`]): it enters a user namespace of its own (mapping only the server's uid
//! and gid to themselves, as the launcher's does), makes the network namespace there,
//! brings `lo` up, binds the listener, sends the listener and the namespace back over a
//! socket pair (`SCM_RIGHTS`) and exits. The launcher enters that user namespace
//! (`launcher::userns::join_owner_of`, which the server's uid may: it owns it) before it
//! joins the network namespace and makes the job's other namespaces.

use std::io;
use std::net::TcpListener;
use std::os::fd::OwnedFd;

use crate::sandbox::launcher::netns::{NetnsError, make_namespace};

/// A fresh network namespace with only `lo` up, and a TCP listener on 127.0.0.1 in it.
pub(crate) struct NamespaceListener {
    /// Keeps the namespace alive; the launcher `setns`es into it.
    pub netns: OwnedFd,
    /// Bound in the namespace, accepted from anywhere (a socket keeps its namespace).
    pub listener: TcpListener,
}

/// Make a [`NamespaceListener`]: in a short-lived thread with CAP_SYS_ADMIN (the
/// server's own threads stay in the host namespace), else in a helper child's user
/// namespace ([`helper`]).
pub(crate) fn namespace_with_listener() -> Result<NamespaceListener, NetnsError> {
    if crate::sandbox::launcher::userns::wanted() {
        let (netns, listener) = helper::make()?;
        return Ok(NamespaceListener { netns, listener });
    }
    let worker = std::thread::Builder::new()
        .name("netns-listener".into())
        .spawn(|| -> Result<NamespaceListener, NetnsError> {
            // The thread ends right after: its namespace lives on in the descriptor.
            let netns = make_namespace(true)?;
            let listener =
                TcpListener::bind(("127.0.0.1", 0)).map_err(|source| NetnsError::Listener {
                    step: "bind 127.0.0.1",
                    source,
                })?;
            Ok(NamespaceListener { netns, listener })
        })
        .map_err(|source| NetnsError::Listener {
            step: "spawn a thread",
            source,
        })?;
    worker.join().unwrap_or_else(|_| {
        Err(NetnsError::Listener {
            step: "thread",
            source: io::Error::other("the namespace thread panicked"),
        })
    })
}

pub(crate) mod helper;

/// Whether this process can make the broker's network namespaces: with CAP_SYS_ADMIN
/// tried in a short-lived thread, without it by making one through the helper (a
/// runtime remembers the answer: `Runtime::namespaces_usable`).
pub(crate) fn namespaces_usable() -> bool {
    if crate::sandbox::launcher::userns::wanted() {
        return helper::make().is_ok();
    }
    std::thread::spawn(|| {
        // SAFETY: unshare(2) with a constant flag, in a thread that ends right after.
        unsafe { libc::unshare(libc::CLONE_NEWNET) == 0 }
    })
    .join()
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    use super::*;
    use crate::sandbox::launcher::netns::{isolate_network, join_namespace};

    /// Run `script` with python in a child that first isolated its network.
    fn python_in_netns(loopback: bool, script: &str) -> std::process::Output {
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(script);
        // SAFETY: isolate_network makes raw syscalls only; fine between fork and exec in a test.
        unsafe { cmd.pre_exec(move || isolate_network(loopback, false).map_err(io::Error::other)) };
        cmd.output().expect("spawn python3")
    }

    /// A host listener on 127.0.0.1 is unreachable from the new namespace; with loopback
    /// up the job can still serve and connect to itself, without it even that fails.
    /// The listener lives in a namespace of its own: a host client cannot reach its
    /// port on the host's 127.0.0.1, yet the server accepts on it; a process that joins
    /// the namespace reaches it and nothing of the host.
    #[test]
    fn namespaces_are_usable_as_root() {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(
            namespaces_usable(),
            root || namespace_with_listener().is_ok()
        );
    }

    #[test]
    fn namespace_listener_is_reachable_only_from_inside() {
        let ns = namespace_with_listener().unwrap();
        let port = ns.listener.local_addr().unwrap().port();
        let host = TcpListener::bind("127.0.0.1:0").unwrap();
        let host_port = host.local_addr().unwrap().port();
        let fd = ns.netns.try_clone().unwrap();
        let script = format!(
            "import socket\n\
             def tryc(p):\n  try:\n    socket.create_connection(('127.0.0.1', p), timeout=2).close(); return 'ok'\n  except OSError as e: return type(e).__name__\n\
             print(tryc({port}), tryc({host_port}))"
        );
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(&script);
        // SAFETY: setns is a raw syscall; fine between fork and exec in a test.
        unsafe { cmd.pre_exec(move || join_namespace(&fd).map_err(io::Error::other)) };
        let out = cmd.output().expect("spawn python3");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.trim(), "ok ConnectionRefusedError", "{out:?}");
        ns.listener.set_nonblocking(true).unwrap();
        assert!(
            ns.listener.accept().is_ok(),
            "the server accepts the job's connection"
        );
    }

    #[test]
    fn host_loopback_is_unreachable_and_own_loopback_works_when_asked() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_ok(),
            "control: reachable from the host"
        );
        let script = format!(
            "import socket\n\
             def tryc(p):\n  try:\n    socket.create_connection(('127.0.0.1', p), timeout=1); return 'ok'\n  except OSError as e: return type(e).__name__\n\
             s=socket.socket()\n\
             try:\n  s.bind(('127.0.0.1',0)); s.listen(); own=tryc(s.getsockname()[1])\n\
             except OSError as e: own=type(e).__name__\n\
             print(tryc({port}), own)"
        );
        let out = python_in_netns(true, &script);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.trim(),
            "ConnectionRefusedError ok",
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = python_in_netns(false, &script);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut words = text.split_whitespace();
        assert_ne!(
            words.next(),
            Some("ok"),
            "host listener reachable without lo: {text}"
        );
        assert_ne!(
            words.next(),
            Some("ok"),
            "own loopback works though lo is down: {text}"
        );
    }
}
