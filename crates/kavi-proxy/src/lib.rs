//! The network of kavi's confined processes and of kavi itself: [`proxy`], the filtering proxy
//! a confined process with the network reaches out through (hyper's server, the host matching,
//! the log of what it allowed and refused), and [`network`], `policies/network.toml`, the hosts
//! that proxy and kavi's own requests are held to.
//!
//! Nothing here starts a process: the bridge that carries a confined process's connections to
//! the proxy's socket, and the launch that serves it, are kavi-process's (`confinement`), which
//! re-exports both modules where they were.

pub mod network;
pub mod proxy;
