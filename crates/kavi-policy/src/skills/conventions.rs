//! `policies/conventions.toml`: the paths of a skill's files, derived from its name, declared
//! once. Other policies refer to them as `{{ paths.<name> }}`.

use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::template::{TemplateEngine, describe_error};

pub const DEFAULT_POLICY: &str = "policies/conventions.toml";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConventions {
    #[schemars(with = "IndexMap<String, String>")]
    paths: IndexMap<String, Spanned<String>>,
}

#[derive(Debug, Clone)]
pub struct Conventions {
    paths: IndexMap<String, String>,
    pub source: Arc<SourceFile>,
}

impl Conventions {
    /// Parses the conventions; each path template may read only `skill`.
    pub fn parse(source: &Arc<SourceFile>, templates: &TemplateEngine) -> Result<Self, Diagnostic> {
        let raw: RawConventions =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        for template in raw.paths.values() {
            let reads = templates.check_str(template.get_ref()).map_err(|e| {
                Diagnostic::new(format!("invalid template: {}", describe_error(&e)))
                    .at(source, template.span())
            })?;
            if let Some(other) = reads.iter().find(|r| r.as_str() != "skill") {
                return Err(Diagnostic::new(format!(
                    "a convention may read only `skill`, not `{other}`"
                ))
                .at(source, template.span()));
            }
        }
        Ok(Self {
            paths: raw
                .paths
                .into_iter()
                .map(|(k, v)| (k, v.into_inner()))
                .collect(),
            source: Arc::clone(source),
        })
    }

    pub fn has(&self, name: &str) -> bool {
        self.paths.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.paths.keys().map(String::as_str)
    }

    /// Every path for one skill.
    pub fn render(
        &self,
        templates: &TemplateEngine,
        skill: &str,
    ) -> Result<IndexMap<String, String>, String> {
        let context = minijinja::Value::from_serialize(serde_json::json!({ "skill": skill }));
        self.paths
            .iter()
            .map(|(name, template)| {
                templates
                    .render_str(template, &context)
                    .map(|path| (name.clone(), path))
                    .map_err(|e| {
                        format!(
                            "failed to render convention `{name}`: {}",
                            describe_error(&e)
                        )
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> TemplateEngine {
        TemplateEngine::new(std::path::Path::new("templates"))
    }

    #[test]
    fn the_shipped_conventions_render_every_path_from_the_name() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policies/conventions.toml"
        ))
        .unwrap();
        let conventions = Conventions::parse(&SourceFile::new("c.toml", text), &engine()).unwrap();
        let paths = conventions.render(&engine(), "word_count").unwrap();
        assert_eq!(paths["folder"], "skills/word_count");
        assert_eq!(paths["source"], "skills/word_count/skill.py");
        assert!(conventions.has("tests") && !conventions.has("nope"));
    }

    #[test]
    fn a_convention_reading_anything_but_the_skill_name_points_at_it() {
        let source = SourceFile::new(
            "c.toml",
            "[paths]\nfolder = \"{{ params.root }}/{{ skill }}\"\n",
        );
        let err = Conventions::parse(&source, &engine()).unwrap_err();
        assert_eq!(
            err.message,
            "a convention may read only `skill`, not `params.root`"
        );
        assert_eq!(err.position().as_deref(), Some("c.toml:2:10"));
    }
}
