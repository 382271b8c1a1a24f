//! Entry point. The hidden launcher and zygote modes are dispatched before anything else runs:
//! no tokio runtime, no threads, no logging — the launcher must stay single-threaded
//! so that Landlock and seccomp apply to the whole process it then execs.

use std::process::ExitCode;

fn main() -> ExitCode {
    if mcp_sandbox_repl::sandbox::is_launcher_invocation() {
        // Never returns on success: it execs the target.
        mcp_sandbox_repl::sandbox::launcher_main();
    }
    if mcp_sandbox_repl::sandbox::is_zygote_invocation() {
        mcp_sandbox_repl::sandbox::zygote_main();
    }
    mcp_sandbox_repl::cli::main()
}
