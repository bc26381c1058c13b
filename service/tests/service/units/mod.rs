//! The unit tests of the library, in the suite's binary (one test binary to
//! build and link for make test-service).

mod config;
mod hash_tag;
mod json;
mod keys;
mod logger;
mod settings;
