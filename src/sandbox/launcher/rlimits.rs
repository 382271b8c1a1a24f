//! Resource limits set in the launcher before it drops privileges: [`rlimit_plan`] is
//! the pure list (unit-tested), [`apply_rlimits`] sets them. Also the server's own
//! open-file limit: [`raise_open_files_limit`] at start, and what jobs get instead.

use rlimit::Resource;

use super::error::SetupError;
use crate::sandbox::policy::resolve::Limits;

/// One limit to set: (resource, soft, hard, name for messages).
pub(crate) type RlimitEntry = (Resource, u64, u64, &'static str);

/// The rlimits for `limits`. `memory_cgroup`: memory is capped by a cgroup, so the
/// address-space limit (which breaks programs that reserve large virtual ranges) is not
/// used. `root`: RLIMIT_NPROC does not bind uid 0 and would count every process of a
/// non-root user, so it is only set for non-root servers (the pids cgroup binds root).
///
/// `inherited_open_files`: the soft open-file limit the server was started with, when it
/// raised its own ([`open_files_at_start`]); a policy without `open_files` gives its
/// jobs that one (the hard limit stays), not the server's raised one.
pub(crate) fn rlimit_plan(
    limits: &Limits,
    memory_cgroup: bool,
    root: bool,
    inherited_open_files: Option<u64>,
) -> Vec<RlimitEntry> {
    let mut plan: Vec<RlimitEntry> = vec![(Resource::CORE, 0, 0, "core")];
    if let (Some(mem), false) = (limits.memory_bytes, memory_cgroup) {
        plan.push((Resource::AS, mem, mem, "memory (address space)"));
        plan.push((Resource::DATA, mem, mem, "memory (data)"));
    }
    if let Some(cpu) = limits.cpu_seconds {
        // SIGXCPU at the soft limit, SIGKILL one second later.
        plan.push((Resource::CPU, cpu, cpu + 1, "cpu_seconds"));
    }
    if let Some(size) = limits.file_size_bytes {
        plan.push((Resource::FSIZE, size, size, "file_size"));
    }
    if let (Some(n), false) = (limits.processes, root) {
        plan.push((Resource::NPROC, n, n, "processes"));
    }
    match (limits.open_files, inherited_open_files) {
        (Some(n), _) => plan.push((Resource::NOFILE, n, n, "open_files")),
        (None, Some(soft)) => plan.push((Resource::NOFILE, soft, rlimit::INFINITY, "open_files")),
        (None, None) => {}
    }
    plan
}

/// The current (soft, hard) open-file limit; (0, 0) if it cannot be read.
pub(crate) fn open_files_limit() -> (u64, u64) {
    Resource::NOFILE.get().unwrap_or((0, 0))
}

/// The server, at start: raise the soft open-file limit to the hard one (an MCP client
/// often starts servers with 1024, which a few hundred connections and pipes exhaust).
/// Returns (soft before, soft now); jobs keep the soft limit from before unless their
/// policy sets `limits.open_files` (see [`rlimit_plan`]).
pub(crate) fn raise_open_files_limit() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = Resource::NOFILE.get()?;
    if soft >= hard {
        return Ok((soft, soft));
    }
    Resource::NOFILE.set(hard, hard)?;
    Ok((soft, hard))
}

/// Set every limit of `plan` on the calling process. Only lowers limits, so no
/// privilege is needed; a hard limit already lower than asked is kept.
pub(crate) fn apply_rlimits(plan: &[RlimitEntry]) -> Result<(), SetupError> {
    for &(resource, soft, hard, name) in plan {
        let (_, cur_hard) = resource.get().map_err(|source| SetupError::RlimitRead {
            limit: name,
            source,
        })?;
        let hard = hard.min(cur_hard);
        let soft = soft.min(hard);
        resource
            .set(soft, hard)
            .map_err(|source| SetupError::RlimitSet {
                limit: name,
                soft,
                source,
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_respects_cgroup_and_root() {
        let limits = Limits {
            memory_bytes: Some(1 << 30),
            cpu_seconds: Some(5),
            processes: Some(64),
            ..Default::default()
        };
        let names = |p: Vec<RlimitEntry>| p.into_iter().map(|e| e.3).collect::<Vec<_>>();
        assert_eq!(
            names(rlimit_plan(&limits, false, false, None)),
            [
                "core",
                "memory (address space)",
                "memory (data)",
                "cpu_seconds",
                "processes"
            ]
        );
        assert_eq!(
            names(rlimit_plan(&limits, true, true, None)),
            ["core", "cpu_seconds"]
        );
        let cpu = rlimit_plan(&limits, true, true, None)[1];
        assert_eq!((cpu.1, cpu.2), (5, 6));
    }

    #[test]
    fn open_files_come_from_the_policy_else_from_before_the_servers_raise() {
        let nofile = |limits: &Limits, inherited| {
            rlimit_plan(limits, true, true, inherited)
                .into_iter()
                .find(|e| e.0 == Resource::NOFILE)
                .map(|e| (e.1, e.2))
        };
        let none = Limits::default();
        let set = Limits {
            open_files: Some(4096),
            ..Default::default()
        };
        // The policy's number wins, soft and hard.
        assert_eq!(nofile(&set, Some(1024)), Some((4096, 4096)));
        assert_eq!(nofile(&set, None), Some((4096, 4096)));
        // Without one: the soft limit the server had before it raised its own; the
        // hard limit is left as it is (apply_rlimits never raises it).
        assert_eq!(nofile(&none, Some(1024)), Some((1024, rlimit::INFINITY)));
        // Not raised (`run`, or a server already at its hard limit): nothing set.
        assert_eq!(nofile(&none, None), None);
    }
}
