//! The thin bodies of each subcommand: they translate CLI arguments into calls on the
//! library subsystems and render the outcome for a terminal or a CI log.

pub mod doctor;
pub mod install;
pub mod policy;
pub mod run;
pub mod serve;
