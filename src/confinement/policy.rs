//! `policies/confinement.toml`: one profile per role, its paths templates over the values kavi
//! provides for that role (the sandbox, a private temp folder, ...).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::Profile;
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::template::{TemplateEngine, describe_error};

pub const DEFAULT_POLICY: &str = "policies/confinement.toml";

/// The values the builder's path templates may read.
const BUILDER_VALUES: &[&str] = &["sandbox", "tmp"];

/// The values a gate's path templates may read.
const GATE_VALUES: &[&str] = &["workspace", "tmp"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    builder: RawProfile,
    gate: RawProfile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default = "yes")]
    require: bool,
    read: Vec<Spanned<String>>,
    write: Vec<Spanned<String>>,
    #[serde(default)]
    network: bool,
}

fn yes() -> bool {
    true
}

/// One role's profile as the policy writes it: path templates, not yet resolved.
#[derive(Debug, Clone)]
pub struct RoleProfile {
    role: &'static str,
    require: bool,
    read: Vec<String>,
    write: Vec<String>,
    network: bool,
}

impl RoleProfile {
    /// Resolves the path templates with the role's values; every path must come out absolute.
    pub fn resolve(
        &self,
        templates: &TemplateEngine,
        values: &minijinja::Value,
    ) -> Result<Profile, String> {
        let render = |paths: &[String]| -> Result<Vec<PathBuf>, String> {
            paths
                .iter()
                .map(|template| {
                    let path = templates.render_str(template, values).map_err(|e| {
                        format!(
                            "failed to render the {} profile's path `{template}`: {}",
                            self.role,
                            describe_error(&e)
                        )
                    })?;
                    let path = PathBuf::from(path);
                    if path.is_absolute() {
                        Ok(path)
                    } else {
                        Err(format!(
                            "the {} profile's path `{template}` is not absolute: {}",
                            self.role,
                            path.display()
                        ))
                    }
                })
                .collect()
        };
        Ok(Profile {
            role: self.role.to_owned(),
            read: render(&self.read)?,
            write: render(&self.write)?,
            network: self.network,
            require: self.require,
        })
    }
}

/// The confinement policy: a checked profile for every role.
#[derive(Debug, Clone)]
pub struct ConfinementPolicy {
    pub builder: RoleProfile,
    pub gate: RoleProfile,
}

impl ConfinementPolicy {
    /// Parses the policy; a path template that reads a value its role does not provide is an
    /// error at the template.
    pub fn parse(source: &Arc<SourceFile>, templates: &TemplateEngine) -> Result<Self, Diagnostic> {
        let raw: RawPolicy =
            toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))?;
        Ok(Self {
            builder: check(source, templates, "builder", BUILDER_VALUES, raw.builder)?,
            gate: check(source, templates, "gate", GATE_VALUES, raw.gate)?,
        })
    }
}

fn check(
    source: &Arc<SourceFile>,
    templates: &TemplateEngine,
    role: &'static str,
    provided: &[&str],
    raw: RawProfile,
) -> Result<RoleProfile, Diagnostic> {
    for path in raw.read.iter().chain(&raw.write) {
        let reads = templates.check_str(path.get_ref()).map_err(|e| {
            Diagnostic::new(format!("invalid template: {}", describe_error(&e)))
                .at(source, path.span())
        })?;
        if let Some(unknown) = reads
            .iter()
            .find(|read| !provided.contains(&read.split('.').next().unwrap_or_default()))
        {
            return Err(Diagnostic::new(format!(
                "the {role} profile may read only {}; `{unknown}` is not one of them",
                provided
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .at(source, path.span()));
        }
    }
    let plain = |paths: Vec<Spanned<String>>| paths.into_iter().map(Spanned::into_inner).collect();
    Ok(RoleProfile {
        role,
        require: raw.require,
        read: plain(raw.read),
        write: plain(raw.write),
        network: raw.network,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfinementPolicy, Diagnostic> {
        let dir = tempfile::tempdir().unwrap();
        let templates = TemplateEngine::new(dir.path());
        ConfinementPolicy::parse(
            &SourceFile::new("policies/confinement.toml", text.to_owned()),
            &templates,
        )
    }

    #[test]
    fn the_shipped_policy_parses_and_resolves_to_absolute_paths() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_POLICY),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let templates = TemplateEngine::new(dir.path());
        let policy = parse(&text).unwrap();
        let profile = policy
            .builder
            .resolve(
                &templates,
                &minijinja::context! { sandbox => "/s/box", tmp => "/s/tmp" },
            )
            .unwrap();
        assert!(profile.write.contains(&PathBuf::from("/s/box")));
        assert!(profile.write.contains(&PathBuf::from("/s/tmp")));
        assert!(profile.require && !profile.network);
    }

    #[test]
    fn a_template_reading_a_value_the_role_lacks_is_refused_at_its_line() {
        let gate = "[gate]\nread = []\nwrite = []\n";
        let err = parse(&format!(
            "[builder]\nread = [\"/\"]\nwrite = [\"{{{{ workspace }}}}\"]\n{gate}"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("may read only `sandbox`, `tmp`"), "{err}");
        assert!(err.contains("confinement.toml:3:"), "{err}");
    }

    #[test]
    fn relative_paths_are_refused_when_resolved() {
        let policy =
            parse("[builder]\nread = [\"usr\"]\nwrite = []\n[gate]\nread = []\nwrite = []\n")
                .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let err = policy
            .builder
            .resolve(&TemplateEngine::new(dir.path()), &minijinja::context! {})
            .unwrap_err();
        assert!(err.contains("not absolute"), "{err}");
    }
}
