//! This server's instance id: the owner named in everything it makes that outlives a
//! call outside its own process — job cgroups (machine-wide) and the temp paths of jobs,
//! scripts and installs in the state dir. A pid cannot serve: another PID namespace sees
//! a different number (or none) for the same process, and pids are reused. Who is alive
//! is told by a lock the owner holds (`app::owners`), never by `/proc`.

/// A new id, `<pid>x<8 hex digits>`: the pid for people reading `ps` and cgroup trees,
/// the random part so that no other server, in any namespace, ever has the same id.
/// Made once per [`Runtime`](super::runtime::Runtime), which holds it.
pub(super) fn new_id() -> String {
    let mut bytes = [0u8; 4];
    // Without randomness (never seen) the time still tells two servers apart.
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        bytes = nanos.to_ne_bytes();
    }
    format!("{}x{:08x}", std::process::id(), u32::from_ne_bytes(bytes))
}

/// Whether `s` has the shape of an instance id (so a name that merely starts like one,
/// or an older server's pid-only name, is never taken for one).
pub(crate) fn is_id(s: &str) -> bool {
    s.split_once('x').is_some_and(|(pid, rand)| {
        !pid.is_empty()
            && pid.bytes().all(|b| b.is_ascii_digit())
            && rand.len() == 8
            && rand.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_unique_in_shape_and_starts_with_the_pid() {
        let id = new_id();
        assert_ne!(id, new_id());
        assert!(is_id(&id), "{id}");
        assert!(id.starts_with(&format!("{}x", std::process::id())));
        for bad in [
            "123",
            "123x",
            "x0000abcd",
            "12x0000abc",
            "12x0000abcg",
            "1-2x00000000",
        ] {
            assert!(!is_id(bad), "{bad}");
        }
    }
}
