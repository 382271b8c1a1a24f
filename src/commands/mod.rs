//! The thin bodies of each subcommand: they translate CLI arguments into calls on the
//! library subsystems and render the outcome for a terminal or a CI log.

pub(crate) mod doctor;
pub(crate) mod install;
pub(crate) mod policy;
pub(crate) mod run;
pub mod serve;
