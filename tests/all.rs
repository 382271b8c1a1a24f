//! The one integration-test binary: every suite module drives the real code through
//! its public surface.

mod suite;
