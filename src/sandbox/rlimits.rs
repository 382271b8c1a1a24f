//! Resource limits set in the launcher before it drops privileges: [`rlimit_plan`] is
//! the pure list (unit-tested), [`apply_rlimits`] sets them.

use rlimit::Resource;

use super::error::SetupError;
use super::resolve::Limits;

/// One limit to set: (resource, soft, hard, name for messages).
pub type RlimitEntry = (Resource, u64, u64, &'static str);

/// The rlimits for `limits`. `memory_cgroup`: memory is capped by a cgroup, so the
/// address-space limit (which breaks programs that reserve large virtual ranges) is not
/// used. `root`: RLIMIT_NPROC does not bind uid 0 and would count every process of a
/// non-root user, so it is only set for non-root servers (the pids cgroup binds root).
pub fn rlimit_plan(limits: &Limits, memory_cgroup: bool, root: bool) -> Vec<RlimitEntry> {
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
    if let Some(n) = limits.open_files {
        plan.push((Resource::NOFILE, n, n, "open_files"));
    }
    plan
}

/// Set every limit of `plan` on the calling process. Only lowers limits, so no
/// privilege is needed; a hard limit already lower than asked is kept.
pub fn apply_rlimits(plan: &[RlimitEntry]) -> Result<(), SetupError> {
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
            names(rlimit_plan(&limits, false, false)),
            [
                "core",
                "memory (address space)",
                "memory (data)",
                "cpu_seconds",
                "processes"
            ]
        );
        assert_eq!(
            names(rlimit_plan(&limits, true, true)),
            ["core", "cpu_seconds"]
        );
        let cpu = rlimit_plan(&limits, true, true)[1];
        assert_eq!((cpu.1, cpu.2), (5, 6));
    }
}
