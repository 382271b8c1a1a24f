//! The tool surface, split by area. Each area is one `#[tool_router]` impl block on
//! [`SandboxServer`]; [`all_tools`] adds them into the router the handler serves.
//!
//! Argument types are `deny_unknown_fields` with doc comments (they become the schema
//! text); descriptions live in `docs/tools/<tool>.md` and are compiled in.

pub(crate) mod env;
pub(crate) mod jobs;
pub(crate) mod python;
pub(crate) mod sessions;
pub(crate) mod shell;

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::model::{CallToolResult, JsonObject};

use super::handler::SandboxServer;
use super::report::failure;
use super::{schema, shapes};
use crate::app::AppError;

pub(crate) use crate::names::DEFAULT_SESSION;
use crate::names::is_valid_session_name;
pub(crate) const DEFAULT_WAIT_SECONDS: f64 = 3.0;
pub(crate) const MAX_WAIT_SECONDS: f64 = 60.0;
pub(crate) const DEFAULT_POLL_SECONDS: f64 = 30.0;
pub(crate) const MAX_POLL_SECONDS: f64 = 300.0;

/// Every tool the server offers, with schemas every client reads ([`schema`]): standard
/// JSON Schema, plain optional fields, and an output schema on each tool.
pub(crate) fn all_tools() -> ToolRouter<SandboxServer> {
    let mut router = SandboxServer::python_tools()
        + SandboxServer::session_tools()
        + SandboxServer::job_tools()
        + SandboxServer::shell_tools()
        + SandboxServer::env_tools();
    for (name, route) in router.map.iter_mut() {
        let tool = &mut route.attr;
        tool.input_schema = Arc::new(schema::input(&tool.input_schema));
        let out = tool
            .output_schema
            .clone()
            .or_else(|| output_of(name))
            .map(|o| Arc::new(schema::output(&o)));
        tool.output_schema = out;
    }
    router
}

/// The output schema of a tool that does not return a job report.
fn output_of(tool: &str) -> Option<Arc<JsonObject>> {
    Some(match tool {
        "python_interrupt" | "session_restart" | "session_close" => {
            schema_for_output::<shapes::SessionDone>()
        }
        "session_list" => schema_for_output::<shapes::Sessions>(),
        "python_vars" => schema_for_output::<shapes::Vars>(),
        "python_history" => schema_for_output::<shapes::History>(),
        "job_list" => schema_for_output::<shapes::Jobs>(),
        "job_prune" => schema_for_output::<shapes::Pruned>(),
        "job_output" => schema_for_output::<shapes::Output>(),
        "env_info" => schema_for_output::<shapes::EnvReport>(),
        _ => return None,
    })
}

/// Turn an app answer into the MCP result: `render` the value; an [`AppError`] (unknown
/// job, Python error, path outside the workspace...) is an `isError` result in words.
pub(crate) fn reply<T>(
    r: Result<T, AppError>,
    render: impl FnOnce(T) -> CallToolResult,
) -> Result<CallToolResult, ErrorData> {
    Ok(match r {
        Ok(v) => render(v),
        Err(e) => failure(e.to_string()),
    })
}

/// Validate a session name (the one rule, [`crate::names`]), or use `default`.
pub(crate) fn session_or_default(name: Option<String>) -> Result<String, ErrorData> {
    let name = name.unwrap_or_else(|| DEFAULT_SESSION.to_string());
    if is_valid_session_name(&name) {
        Ok(name)
    } else {
        Err(ErrorData::invalid_params(
            format!(
                "invalid `session` {name:?}: use 1-64 letters, digits, '_', '-' or '.' (not `.` or `..`)"
            ),
            None,
        ))
    }
}

/// A wait window in seconds: default when absent, an error when negative or too long.
pub(crate) fn seconds(
    value: Option<f64>,
    default: f64,
    max: f64,
    field: &str,
) -> Result<Duration, ErrorData> {
    let v = value.unwrap_or(default);
    if !v.is_finite() || v < 0.0 {
        return Err(ErrorData::invalid_params(
            format!("`{field}` must be a number of seconds >= 0, got {v}"),
            None,
        ));
    }
    if v > max {
        return Err(ErrorData::invalid_params(
            format!("`{field}` must be at most {max} seconds, got {v}"),
            None,
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Longest `timeout_seconds` of python_exec and shell_run (a day).
pub(crate) const MAX_TIME_LIMIT: f64 = 86_400.0;

/// A job's time limit (`timeout_seconds`): none when absent, else more than 0 s and at
/// most a day.
pub(crate) fn time_limit(value: Option<f64>) -> Result<Option<Duration>, ErrorData> {
    let Some(v) = value else { return Ok(None) };
    if v == 0.0 {
        return Err(ErrorData::invalid_params(
            "`timeout_seconds` must be more than 0 seconds (leave it out for no limit)",
            None,
        ));
    }
    seconds(Some(v), 0.0, MAX_TIME_LIMIT, "timeout_seconds").map(Some)
}

/// The wait window of execute-style tools (`wait_seconds`).
pub(crate) fn wait_window(value: Option<f64>, default: f64) -> Result<Duration, ErrorData> {
    seconds(value, default, MAX_WAIT_SECONDS, "wait_seconds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_are_checked() {
        assert_eq!(session_or_default(None).ok().as_deref(), Some("default"));
        assert!(session_or_default(Some("a-b_1.x".into())).is_ok());
        assert!(session_or_default(Some("".into())).is_err());
        for bad in ["../x", ".", "..", "a/b", "x\ny"] {
            assert!(session_or_default(Some(bad.into())).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wait_windows_are_checked() {
        assert_eq!(wait_window(None, 3.0).ok(), Some(Duration::from_secs(3)));
        assert!(wait_window(Some(-1.0), 3.0).is_err());
        assert!(wait_window(Some(61.0), 3.0).is_err());
        assert!(wait_window(Some(f64::NAN), 3.0).is_err());
    }
}
