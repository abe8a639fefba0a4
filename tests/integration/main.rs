//! kavi's integration tests, one module per area, in one test binary: fifteen binaries each
//! linked the whole of kavi again (the build's longest step after compiling it), where one is
//! linked once. Run one area with its module path: `cargo test --test integration engine::`.
//! Most drive the real `kavi` binary in a workspace folder (see `common`).

mod common;

mod adoption;
mod advisory;
mod allowlist;
mod chains;
mod cli;
mod distributed;
mod drill;
mod engine;
mod executor;
mod forge;
mod gates;
mod layers;
mod lifecycle;
mod objects;
mod planning;
mod provenance;
mod proxy;
mod roots;
mod run_rules;
mod sandbox;
mod scanner;
mod serve;
mod team;
mod trust;
