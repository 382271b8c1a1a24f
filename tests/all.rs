//! The one integration-test binary: every suite module lives under tests/suite/.

mod suite;
