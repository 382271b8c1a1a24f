//! Scripts `python_run_script` ran, saved with their parameters (one JSON file per run in
//! `<state>/scripts/<job id>.json`) so an agent can list them, read one back and run it
//! again with the same arguments. At most [`KEEP`] are kept (oldest removed first).
//! Saved: the inline code (or the script path), dependencies, Python version, args, cwd,
//! timeout, benchmark — and env *names* only: values may be secrets and are not written
//! to disk (a rerun must pass them again).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::envs::ScriptArgs;
use super::error::AppError;

/// How many saved scripts are kept.
pub(crate) const KEEP: usize = 200;

/// One saved run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedScript {
    /// The job that ran it (also the script's name in resources).
    pub job_id: String,
    pub label: String,
    pub created_unix_ms: u64,
    /// The `python_run_script` arguments, as the tool takes them.
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// Names of the env variables the run had (their values are not saved).
    #[serde(default)]
    pub env_names: Vec<String>,
}

/// The tool arguments a rerun needs (env values left out).
pub(crate) fn arguments_of(args: &ScriptArgs) -> Record {
    use serde_json::{Value, json};
    let mut m = serde_json::Map::new();
    if let Some(code) = &args.code {
        m.insert("code".into(), json!(code));
    }
    if let Some(path) = &args.path {
        m.insert("path".into(), json!(path));
    }
    if !args.dependencies.is_empty() {
        m.insert("dependencies".into(), json!(args.dependencies));
    }
    if let Some(v) = &args.python_version {
        m.insert("python_version".into(), json!(v));
    }
    if !args.args.is_empty() {
        m.insert("args".into(), json!(args.args));
    }
    if let Some(cwd) = &args.cwd {
        m.insert("cwd".into(), json!(cwd));
    }
    if let Some(t) = args.timeout {
        m.insert("timeout_seconds".into(), json!(t.as_secs_f64()));
    }
    if args.benchmark {
        m.insert("benchmark".into(), Value::Bool(true));
    }
    if !args.session.is_empty() {
        m.insert("session".into(), json!(args.session));
    }
    (m, args.env.keys().cloned().collect())
}

impl super::App {
    /// Every saved script, newest first.
    pub fn saved_scripts(&self) -> Vec<SavedScript> {
        list(&self.state_dir)
    }

    /// The script job `job_id` ran, if it was saved.
    pub fn saved_script(&self, job_id: &str) -> Option<SavedScript> {
        get(&self.state_dir, job_id)
    }
}

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("scripts")
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The arguments of a run, taken before the run consumes them.
pub(crate) type Record = (serde_json::Map<String, serde_json::Value>, Vec<String>);

/// Save one run (best effort is the caller's choice: an error says what failed).
pub(crate) fn save(
    state_dir: &Path,
    job_id: &str,
    label: &str,
    record: Record,
) -> Result<(), AppError> {
    if !valid_id(job_id) {
        return Err(AppError::BadRequest("a job id names a saved script"));
    }
    let dir = dir(state_dir);
    std::fs::create_dir_all(&dir).map_err(|error| AppError::CreateDir {
        path: dir.clone(),
        error,
    })?;
    let (arguments, env_names) = record;
    let saved = SavedScript {
        job_id: job_id.to_string(),
        label: label.to_string(),
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default(),
        arguments,
        env_names,
    };
    let path = dir.join(format!("{job_id}.json"));
    let tmp = dir.join(format!(".{job_id}.json.tmp"));
    let text = serde_json::to_vec_pretty(&saved).unwrap_or_default();
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|error| AppError::CreateDir { path, error })?;
    prune(&dir);
    Ok(())
}

/// Every saved script, newest first.
pub(crate) fn list(state_dir: &Path) -> Vec<SavedScript> {
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return Vec::new();
    };
    let mut all: Vec<SavedScript> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect();
    all.sort_by_key(|s: &SavedScript| std::cmp::Reverse(s.created_unix_ms));
    all
}

/// One saved script by its job id.
pub(crate) fn get(state_dir: &Path, job_id: &str) -> Option<SavedScript> {
    if !valid_id(job_id) {
        return None;
    }
    let bytes = std::fs::read(dir(state_dir).join(format!("{job_id}.json"))).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() <= KEEP {
        return;
    }
    files.sort();
    let excess = files.len() - KEEP;
    for (_, p) in files.into_iter().take(excess) {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn args() -> ScriptArgs {
        ScriptArgs {
            session: "default".into(),
            code: Some("print(1)".into()),
            path: None,
            dependencies: vec!["rich".into()],
            python_version: None,
            args: vec!["a".into()],
            env: BTreeMap::from([("TOKEN".to_string(), "secret-value".to_string())]),
            cwd: None,
            timeout: Some(std::time::Duration::from_secs(5)),
            benchmark: false,
        }
    }

    #[test]
    fn saved_scripts_round_trip_without_env_values() {
        let (_scratch, d) = crate::test_support::scratch_path("app-scripts", "state");
        save(&d, "j7", "script: print(1)", arguments_of(&args())).unwrap();
        let s = get(&d, "j7").unwrap();
        assert_eq!(s.arguments["code"], "print(1)");
        assert_eq!(s.arguments["dependencies"], serde_json::json!(["rich"]));
        assert_eq!(s.arguments["timeout_seconds"], 5.0);
        assert_eq!(s.env_names, vec!["TOKEN"]);
        let raw = std::fs::read_to_string(d.join("scripts/j7.json")).unwrap();
        assert!(!raw.contains("secret-value"), "{raw}");
        assert_eq!(list(&d).len(), 1);
        // Hostile ids never reach the file system.
        for bad in ["../x", "", "a/b", "..", &"x".repeat(40)] {
            assert!(get(&d, bad).is_none());
            assert!(save(&d, bad, "", arguments_of(&args())).is_err());
        }
    }
}
