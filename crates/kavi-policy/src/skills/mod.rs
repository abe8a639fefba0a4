//! Skills: small code units built by an external agent, and the lifecycle they move through.
//!
//! A skill starts as a proposal (name, description, schemas, side-effect class, secrets, the
//! command that runs it). Its name is the one source of naming truth: every path the forge uses
//! derives from it, so it may hold no path characters.

pub mod conventions;
mod lifecycle;
pub mod promotion;
mod proposal;
pub mod propose;
pub mod registry;
mod scope;
pub mod snapshot;
mod tree;
pub mod trust;

pub use kavi_foundation::side_effect::{SideEffect, SideEffects};
pub use lifecycle::RawLifecycle;
pub use lifecycle::{Approval, Lifecycle, build_refusal};
pub use proposal::{Example, Proposal};
pub use scope::{is_python, untrusted_program, write_scope_refusal};

/// The skill lifecycle every skill command and node follows unless told otherwise.
pub const LIFECYCLE_POLICY: &str = "policies/lifecycle.toml";

/// The state a promotion reaches, and the one `kavi skill verify` checks.
pub const TRUSTED: &str = "TRUSTED";

/// Renders a node's `skill` field and checks the name: it becomes part of paths.
pub fn render_name(ctx: &crate::node::NodeContext<'_>, source: &str) -> Result<String, String> {
    let skill = ctx.render("skill", source)?;
    match invalid_name_reason(&skill) {
        Some(reason) => Err(reason),
        None => Ok(skill),
    }
}

/// Why a skill name is unusable, if it is: names become paths, so only `[a-z][a-z0-9_]*` (at
/// most 64 characters) is accepted.
pub fn invalid_name_reason(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let valid = name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    (!valid).then(|| {
        format!(
            "invalid skill name `{name}`: use a lowercase letter, then lowercase letters, digits \
             or `_` (at most 64 characters)"
        )
    })
}

#[cfg(test)]
mod tests;
