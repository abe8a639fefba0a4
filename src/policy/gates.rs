//! `policies/gates.toml`: the gate set, as written.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateSet {
    #[serde(rename = "gate")]
    pub gates: Vec<GateSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    Command,
    PolicyScan,
    Invariant,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateSpec {
    pub id: Spanned<String>,
    pub kind: GateKind,
    /// `command`: the argv, each element a template over the node's `vars`.
    #[serde(default)]
    pub run: Vec<Spanned<String>>,
    /// `policy_scan`: the scanner policy; `invariant`: the invariants policy.
    pub rules: Option<Spanned<String>>,
    /// `policy_scan`: the files to scan, templates over `vars`.
    #[serde(default)]
    pub files: Vec<Spanned<String>>,
    /// The failure kind a failure of this gate is classified as.
    pub failure: Spanned<String>,
    #[serde(default = "yes")]
    pub required: bool,
    pub description: Option<String>,
}

fn yes() -> bool {
    true
}
