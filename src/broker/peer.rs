//! Which process of a job holds a connection to its broker.
//!
//! The broker's listener lives in the job's network namespace, so a connection's peer
//! is a socket of some process of that job. Its kernel identity is the socket inode in
//! the namespace's TCP table (`/proc/<pid>/net/tcp` of any process in it), keyed by the
//! connection's two ends; a process holds it if one of its descriptors
//! (`/proc/<pid>/fd/*`) names `socket:[inode]`. The pid is checked to still live in the
//! job's namespace, so a recycled pid of another process never qualifies.
//!
//! A process's descriptors cannot be taken over by another process of the job:
//! `pidfd_getfd`, `ptrace` and `process_vm_writev` are refused by the job's seccomp
//! filter, a socket cannot be reopened through `/proc/<pid>/fd`, and the descriptors a
//! program like uv opens are close-on-exec, so its children never inherit them.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

/// Whether `pid`, living in the network namespace `netns` (device, inode), holds the
/// client end of the TCP connection from `peer` to `127.0.0.1:server_port`.
pub(crate) fn holds_connection(
    pid: u32,
    netns: (u64, u64),
    peer: SocketAddrV4,
    server_port: u16,
) -> io::Result<bool> {
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/net"))?;
    if (ns.dev(), ns.ino()) != netns {
        return Ok(false);
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))?;
    let server = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, server_port);
    let Some(inode) = socket_inode(&table, peer, server) else {
        return Ok(false);
    };
    let link = format!("socket:[{inode}]");
    let entries = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return holds_socket_by_pidfd(pid, inode);
        }
        Err(e) => return Err(e),
    };
    for entry in entries {
        let Ok(entry) = entry else { continue };
        if std::fs::read_link(entry.path()).is_ok_and(|l| l.as_os_str() == link.as_str()) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `pid` holds the socket `inode`, for a server that may not list its
/// `/proc/<pid>/fd`: a server without root whose trusted process (the sealed uv, which
/// the kernel makes non-dumpable) lives in a user namespace that maps no root, so its
/// `/proc` files belong to the host's root (`task_dump_owner`). The server may still
/// `pidfd_getfd` its descriptors (it owns that user namespace, so it has
/// `CAP_SYS_PTRACE` there, and the process is its descendant): each descriptor below the
/// table size (`FDSize` in `/proc/<pid>/status`) is duplicated, compared by inode and
/// closed at once.
fn holds_socket_by_pidfd(pid: u32, inode: u64) -> io::Result<bool> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let table = status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|n| n.trim().parse::<i32>().ok())
        .unwrap_or(0);
    // SAFETY: pidfd_open(2) with a pid and no flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just opened this descriptor for us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    for fd in 0..table {
        // SAFETY: pidfd_getfd(2) on our pidfd; the result, if any, is ours to close.
        let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        if got < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EBADF) => continue,
                _ => return Err(e),
            }
        }
        // SAFETY: as above.
        let got = unsafe { OwnedFd::from_raw_fd(got as i32) };
        let st = nix::sys::stat::fstat(&got).map_err(io::Error::from)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFSOCK && st.st_ino == inode {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `/proc/net/tcp`'s form of an address: the IPv4 address as the kernel's in-memory
/// (network order) word printed in hex, and the port in hex.
fn proc_form(addr: SocketAddrV4) -> String {
    format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(addr.ip().octets()),
        addr.port()
    )
}

/// The inode of the socket whose local end is `local` and remote end `remote`, from a
/// `/proc/<pid>/net/tcp` table; `None` if there is none (or it has no inode: closed).
fn socket_inode(table: &str, local: SocketAddrV4, remote: SocketAddrV4) -> Option<u64> {
    let (local, remote) = (proc_form(local), proc_form(remote));
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() > 9 && fields[1] == local && fields[2] == remote {
            fields[9].parse::<u64>().ok().filter(|&i| i != 0)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_read_by_both_ends() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:A2E4 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 31337 1 0000000000000000 20 4 30 10 -1\n\
            1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n";
        let a = |port| SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
        assert_eq!(socket_inode(table, a(0xA2E4), a(0x1F90)), Some(31337));
        // The other direction, another port: not that socket.
        assert_eq!(socket_inode(table, a(0x1F90), a(0xA2E4)), None);
        assert_eq!(socket_inode(table, a(0xA2E5), a(0x1F90)), None);
    }

    #[test]
    fn a_connection_of_this_process_is_found_and_one_of_another_is_not() {
        use std::os::unix::fs::MetadataExt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server_end, peer) = listener.accept().unwrap();
        let std::net::SocketAddr::V4(peer) = peer else {
            panic!("not IPv4: {peer}")
        };
        let me = std::process::id();
        let ns = std::fs::metadata("/proc/self/ns/net").unwrap();
        let netns = (ns.dev(), ns.ino());
        assert!(holds_connection(me, netns, peer, port).unwrap());
        // Another namespace identity: never, whatever the process holds.
        assert!(!holds_connection(me, (netns.0, netns.1 + 1), peer, port).unwrap());
        // A child process (which shares our namespace) does not hold our socket.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(!holds_connection(child.id(), netns, peer, port).unwrap());
        // The same answers through pidfd_getfd, as for a process whose fd list is closed.
        let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
        let server = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
        let inode = socket_inode(&table, peer, server).unwrap();
        assert!(holds_socket_by_pidfd(me, inode).unwrap());
        assert!(!holds_socket_by_pidfd(me, u64::MAX).unwrap());
        assert!(!holds_socket_by_pidfd(child.id(), inode).unwrap());
        let _ = child.kill();
        let _ = child.wait();
        drop(client);
    }
}
