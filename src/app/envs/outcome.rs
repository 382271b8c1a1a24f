//! How an install or a script run becomes a job outcome: status, the message the agent
//! reads (uv's explanation, what was installed and whether the session sees it, the
//! benchmark in words) and the structured result.

use serde_json::{Value, json};

use crate::envs::Venv;
use crate::envs::install::InstallReport;
use crate::envs::script::{ScriptFailure, ScriptReport};
use crate::jobs::{JobOutcome, JobStatus};

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

pub(super) fn install_outcome(
    session: &str,
    venv: &Venv,
    report: InstallReport,
    activation: Option<Result<(), String>>,
) -> JobOutcome {
    let sp = venv.site_packages().display().to_string();
    let manual = format!("import site; site.addsitedir({sp:?})");
    let status = if report.cancelled {
        JobStatus::Cancelled
    } else if report.ok {
        JobStatus::Completed
    } else {
        JobStatus::Failed
    };
    let message = if !report.ok {
        report.message.clone()
    } else {
        let what = if report.installed.is_empty() {
            "nothing to install: the requirements were already satisfied".to_string()
        } else {
            format!("installed {}", report.installed.join(", "))
        };
        let how = match &activation {
            Some(Ok(())) => {
                format!("importable now in session {session:?} (its variables are kept)")
            }
            Some(Err(e)) => format!(
                "could not activate the venv in session {session:?} ({e}); run `{manual}` there"
            ),
            None => {
                format!("session {session:?} is not running; in a new worker run `{manual}` first")
            }
        };
        Some(format!("{what} into {}; {how}", venv.root().display()))
    };
    let mut result = serde_json::to_value(&report).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut result {
        map.insert("venv".into(), json!(venv.root()));
        map.insert(
            "activated".into(),
            json!(matches!(activation, Some(Ok(())))),
        );
    }
    JobOutcome {
        status,
        exit_code: report.exit_code,
        signal: None,
        message,
        result: Some(result),
    }
}

pub(super) fn script_outcome(report: ScriptReport, benchmark: bool) -> JobOutcome {
    let status = match report.failure {
        Some(ScriptFailure::Cancelled) => JobStatus::Cancelled,
        _ if report.ok => JobStatus::Completed,
        _ => JobStatus::Failed,
    };
    let mut lines: Vec<String> = report.message.iter().cloned().collect();
    if let Some(v) = &report.python {
        lines.push(match report.resolved.as_slice() {
            [] => format!("ran on Python {v}"),
            deps => format!("ran on Python {v} with {}", deps.join(", ")),
        });
        if report.reused_environment {
            lines.push(
                "reused the environment an earlier run with the same dependencies and Python built (no install step ran)".into(),
            );
        }
    }
    if benchmark {
        let b = &report.benchmark;
        lines.push(format!(
            "benchmark (uv + script, whole process tree): wall {} ms · CPU {} ms (user {} + sys {}) · peak RSS {}",
            b.wall_ms,
            b.cpu_ms,
            b.user_cpu_ms,
            b.system_cpu_ms,
            mb(b.peak_rss_bytes)
        ));
    }
    let mut result = serde_json::to_value(&report).unwrap_or(Value::Null);
    if !benchmark && let Value::Object(map) = &mut result {
        map.remove("benchmark");
    }
    JobOutcome {
        status,
        exit_code: report.exit_code,
        signal: report.signal.clone(),
        message: (!lines.is_empty()).then(|| lines.join("\n")),
        result: Some(result),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::script::Benchmark;

    #[test]
    fn environment_failures_fail_the_job_without_benchmark() {
        let outcome = script_outcome(
            ScriptReport {
                ok: false,
                exit_code: Some(2),
                failure: Some(ScriptFailure::Environment),
                message: Some("x".into()),
                ..Default::default()
            },
            false,
        );
        assert_eq!(outcome.status, JobStatus::Failed);
        assert_eq!(outcome.message.as_deref(), Some("x"));
        assert!(outcome.result.unwrap().get("benchmark").is_none());
    }

    #[test]
    fn benchmark_is_in_words_and_numbers() {
        let report = ScriptReport {
            ok: true,
            exit_code: Some(0),
            benchmark: Benchmark {
                wall_ms: 10,
                cpu_ms: 7,
                user_cpu_ms: 5,
                system_cpu_ms: 2,
                peak_rss_bytes: 2_000_000,
            },
            ..Default::default()
        };
        let o = script_outcome(report, true);
        assert_eq!(o.status, JobStatus::Completed);
        assert!(
            o.message
                .unwrap()
                .contains("wall 10 ms · CPU 7 ms (user 5 + sys 2) · peak RSS 2.0 MB")
        );
        assert_eq!(o.result.unwrap()["benchmark"]["peak_rss_bytes"], 2_000_000);
    }
}
