//! `doctor`: what this kernel supports (probed for real, not guessed from the version)
//! and, for each shipped policy, what is enforced here and what is not.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use crate::cli::DoctorArgs;
use crate::sandbox::Placeholders;
use crate::sandbox::parent::probe::enforcement::{Item, enforcement};
use crate::sandbox::parent::probe::{KernelSupport, Probe};
use crate::sandbox::policy::{Policy, SHIPPED};

#[derive(Debug, Serialize)]
struct PolicyReport {
    name: String,
    description: String,
    /// Whether the launcher refuses to start this policy here (something required is missing).
    refuses_to_start: bool,
    items: Vec<Item>,
    /// What each path (session, shell, script, install) may reach over the network.
    reach: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The open-file limit as this process has it, and what `serve` would make of it.
#[derive(Debug, Serialize)]
struct OpenFiles {
    soft: u64,
    hard: u64,
    /// The server's soft limit after it raises it at start (the hard limit).
    server_soft: u64,
    /// The network broker's budgets that follow from it.
    broker_per_job: usize,
    broker_total: usize,
}

impl OpenFiles {
    fn probe() -> OpenFiles {
        let (soft, hard) = crate::sandbox::launcher::rlimits::open_files_limit();
        let server_soft = hard.max(soft);
        let budget = crate::broker::Limits::for_open_files(server_soft);
        OpenFiles {
            soft,
            hard,
            server_soft,
            broker_per_job: budget.per_job,
            broker_total: budget.total,
        }
    }
}

/// An interpreter sessions can run (`--interpreter`, `python_exec`'s `language`).
#[derive(Debug, Serialize)]
struct InterpreterReport {
    language: crate::repl::Language,
    /// The program workers start, when found.
    program: Option<PathBuf>,
    /// Its version and paths, or why sessions of this language cannot start.
    detail: String,
    ok: bool,
}

impl InterpreterReport {
    fn probe() -> Vec<InterpreterReport> {
        use crate::repl::Language;
        let python = match which::which("python3") {
            Ok(p) => InterpreterReport {
                language: Language::Python,
                program: Some(p),
                detail: "python3 on PATH (a workspace .venv or --python is used first)".into(),
                ok: true,
            },
            Err(e) => InterpreterReport {
                language: Language::Python,
                program: None,
                detail: format!("no python3 on PATH ({e}); pass --python PATH"),
                ok: false,
            },
        };
        let r = match crate::repl::discover_r_blocking() {
            Ok(info) => InterpreterReport {
                language: Language::R,
                detail: format!(
                    "{}, jsonlite found; R's paths in the policy's {{python}}: {}",
                    info.version,
                    info.prefixes
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                program: Some(info.executable),
                ok: true,
            },
            Err(e) => InterpreterReport {
                language: Language::R,
                program: None,
                detail: e.to_string(),
                ok: false,
            },
        };
        vec![python, r]
    }
}

#[derive(Debug, Serialize)]
struct Report {
    kernel: KernelSupport,
    open_files: OpenFiles,
    interpreters: Vec<InterpreterReport>,
    policies: Vec<PolicyReport>,
}

pub(crate) fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let workspace = match args.workspace {
        Some(w) => w,
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let kernel = KernelSupport::probe();
    let policies = SHIPPED
        .iter()
        .map(|(name, _)| policy_report(&kernel, name, &workspace))
        .collect();
    let report = Report {
        kernel,
        open_files: OpenFiles::probe(),
        interpreters: InterpreterReport::probe(),
        policies,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        render(&mut out, &report)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn policy_report(k: &KernelSupport, name: &str, workspace: &std::path::Path) -> PolicyReport {
    let resolved = Policy::load(name).and_then(|p| {
        let ph = Placeholders {
            workspace: workspace.to_path_buf(),
            tmp: std::env::temp_dir(),
            python: Vec::<PathBuf>::new(),
            venv: None,
            uv_cache: None,
        };
        Ok((p.description.clone(), p.resolve(&ph)?))
    });
    match resolved {
        Ok((description, policy)) => {
            let items = enforcement(k, &policy);
            let best_effort =
                policy.kernel_support == crate::sandbox::KernelSupportMode::BestEffort;
            let refuses_to_start = !best_effort && items.iter().any(|i| !i.enforced && i.required);
            PolicyReport {
                name: name.to_string(),
                description,
                refuses_to_start,
                items,
                reach: crate::envs::policy::network_reach(&policy, k.namespaces.network.ok)
                    .into_iter()
                    .map(|(p, w)| (p.to_string(), w))
                    .collect(),
                error: None,
            }
        }
        Err(e) => PolicyReport {
            name: name.to_string(),
            description: String::new(),
            refuses_to_start: true,
            items: Vec::new(),
            reach: Vec::new(),
            error: Some(e.to_string()),
        },
    }
}

fn probe_word(p: &Probe) -> String {
    match (&p.ok, &p.error) {
        (true, _) => "yes".into(),
        (false, Some(e)) => format!("NO ({e})"),
        (false, None) => "NO".into(),
    }
}

fn render(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    let k = &r.kernel;
    let who = if k.is_root {
        "root".to_string()
    } else {
        format!("uid {} (not root)", k.euid)
    };
    writeln!(
        out,
        "mcp-sandbox-repl doctor: Linux {}, running as {who}\n",
        k.kernel
    )?;
    writeln!(out, "Interpreters")?;
    for i in &r.interpreters {
        let program = i
            .program
            .as_ref()
            .map(|p| format!("{} ", p.display()))
            .unwrap_or_default();
        let mark = if i.ok { "" } else { "NO: " };
        writeln!(out, "  {:<13} {mark}{program}{}", i.language, i.detail)?;
    }
    writeln!(out)?;
    writeln!(out, "Kernel")?;
    match k.landlock_abi {
        Some(abi) => writeln!(
            out,
            "  Landlock      ABI {abi}: {}",
            k.landlock_features.join("; ")
        )?,
        None => writeln!(
            out,
            "  Landlock      NO: {}",
            k.landlock_error.as_deref().unwrap_or("unavailable")
        )?,
    }
    writeln!(
        out,
        "  seccomp       filter mode: {}",
        probe_word(&k.seccomp_filter)
    )?;
    let ns = &k.namespaces;
    writeln!(out, "  namespaces    user: {}", probe_word(&ns.user))?;
    writeln!(out, "                pid: {}", probe_word(&ns.pid))?;
    writeln!(out, "                network: {}", probe_word(&ns.network))?;
    writeln!(out, "                mount: {}", probe_word(&ns.mount))?;
    writeln!(
        out,
        "                procfs hidepid=ptraceable: {}",
        probe_word(&ns.procfs_hidepid)
    )?;
    if ns.in_user_namespace {
        writeln!(
            out,
            "                (pid, network, mount, procfs, the broker's network: made in a user \
             namespace of the launcher's own (the broker's: of a helper's), mapping only uid {} \
             to itself: {}, no CAP_SYS_ADMIN)",
            k.euid,
            if k.is_root { "root" } else { "not root" }
        )?;
    }
    let cg = &k.cgroup;
    let version = match cg.version {
        crate::sandbox::parent::cgroup::CgroupVersion::V1 if cg.hybrid => {
            "v1 (hybrid: the cgroup2 mount has no pids/memory controller)"
        }
        crate::sandbox::parent::cgroup::CgroupVersion::V1 => "v1",
        crate::sandbox::parent::cgroup::CgroupVersion::V2 => "v2 (unified)",
        crate::sandbox::parent::cgroup::CgroupVersion::None => "none mounted",
    };
    writeln!(out, "  cgroups       {version}")?;
    let at = |d: &Option<String>| {
        d.as_deref()
            .map(|d| format!(" under {d}"))
            .unwrap_or_default()
    };
    writeln!(
        out,
        "                pids: {}{}",
        probe_word(&cg.pids),
        at(&cg.pids_dir)
    )?;
    writeln!(
        out,
        "                memory: {}{}",
        probe_word(&cg.memory),
        at(&cg.memory_dir)
    )?;
    if !cg.v2_controllers.is_empty() {
        writeln!(
            out,
            "                v2 controllers offered: {}",
            cg.v2_controllers.join(" ")
        )?;
    }
    writeln!(out, "                {}", cg.per_job)?;
    let f = &r.open_files;
    writeln!(out, "\nServer")?;
    if f.server_soft > f.soft {
        writeln!(
            out,
            "  open files    soft {}, hard {}: `serve` raises its soft limit to {} at start; \
             jobs whose policy sets no limits.open_files keep {}",
            f.soft, f.hard, f.server_soft, f.soft
        )?;
    } else {
        writeln!(
            out,
            "  open files    soft {}, hard {}: already at the hard limit",
            f.soft, f.hard
        )?;
    }
    writeln!(
        out,
        "  broker        at most {} connections per job, {} for all jobs together",
        f.broker_per_job, f.broker_total
    )?;
    writeln!(out, "\nPolicies (what is enforced on this machine)")?;
    for p in &r.policies {
        writeln!(out, "  {}: {}", p.name, p.description)?;
        if let Some(e) = &p.error {
            writeln!(out, "    cannot load: {e}")?;
            continue;
        }
        for i in &p.items {
            let mark = match (i.enforced, i.required) {
                (true, _) => "enforced    ",
                (false, true) => "NOT ENFORCED",
                (false, false) => "not enforced (runs without it)",
            };
            let why = i
                .why_not
                .as_deref()
                .map(|w| format!(" — {w}"))
                .unwrap_or_default();
            writeln!(out, "    {mark} {} [{}]{why}", i.what, i.how)?;
        }
        if p.items.is_empty() {
            writeln!(out, "    nothing restricted (no sandbox)")?;
        }
        for (path, what) in &p.reach {
            writeln!(out, "    network of {path}: {what}")?;
        }
        if p.refuses_to_start {
            writeln!(
                out,
                "    => refuses to start here (fails closed); set kernel_support = \"best_effort\" to run anyway"
            )?;
        }
    }
    Ok(())
}
