//! `policy show|check|list`: print a resolved policy, validate a policy file, list the
//! shipped policies.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::PolicyCommand;
use crate::sandbox::policy::SHIPPED;
use crate::sandbox::{Placeholders, Policy};

pub(crate) fn policy(cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::List => {
            for (name, _) in SHIPPED {
                let p = Policy::load(name)?;
                println!("{name:<20} {}", p.description);
            }
        }
        PolicyCommand::Check { file } => {
            let path = file.to_string_lossy();
            // A bare name would load a shipped policy; insist on the file.
            let spec = if path.contains('/') {
                path.into_owned()
            } else {
                format!("./{path}")
            };
            let p = Policy::load(&spec)?;
            println!("{}: ok (policy {:?})", file.display(), p.name);
        }
        PolicyCommand::Show { name, workspace } => {
            let p = Policy::load(&name)?;
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            let workspace = workspace.map(|w| cwd.join(w)).unwrap_or(cwd);
            let ph = Placeholders {
                workspace,
                tmp: PathBuf::from("/tmp/<private per job>"),
                python: vec![PathBuf::from("<python prefix>")],
                venv: Some(PathBuf::from("<session venv>")),
                uv_cache: Some(PathBuf::from("<uv cache>")),
            };
            let resolved = p.resolve(&ph)?;
            let text = toml::to_string_pretty(&resolved)
                .context("cannot render the resolved policy as TOML")?;
            if !p.description.is_empty() {
                println!("# {}", p.description);
            }
            println!("# network, per path:");
            for (path, what) in crate::envs::policy::network_reach(
                &resolved,
                crate::sandbox::parent::netns::namespaces_usable(),
            ) {
                println!("#   {path}: {what}");
            }
            print!("{text}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
