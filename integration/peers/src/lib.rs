//! Empty: this crate exists for its dependencies (see Cargo.toml).
