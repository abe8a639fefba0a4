//! `policies/chat.toml`: what the chat understands, as data.
//!
//! Each intent has regular expressions for the deterministic parser (named groups become
//! template variables), the skill or chain it runs, and templates for that skill's input or
//! that chain's parameters. The file also says which side-effect classes the chat may run at
//! all; READ_ONLY runs at once, the others only once confirmed.

use std::sync::Arc;

use indexmap::IndexMap;
use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::skills::SideEffect;

pub const DEFAULT_POLICY: &str = "policies/chat.toml";

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawChatPolicy {
    /// Side-effect classes the chat may run; anything else is refused. READ_ONLY runs at once,
    /// the others after a yes (`--confirmed`, or `yes` in the REPL).
    allow: Vec<SideEffect>,
    /// What the chat understands, tried in order: the first whose pattern matches wins.
    #[serde(default, rename = "intent")]
    intents: Vec<RawIntent>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawIntent {
    /// Its name, as answers report it.
    name: String,
    /// One line for the help and for "unsupported" answers, such as `summarize <note.md>`.
    help: String,
    /// Regular expressions matched against the whole message (case-insensitive); named groups
    /// (`(?P<path>...)`) are template variables.
    #[schemars(with = "Vec<String>")]
    patterns: Vec<Spanned<String>>,
    /// The trusted skill it runs.
    skill: Option<String>,
    /// The chain it runs (`chains/<name>.toml`).
    chain: Option<String>,
    /// The skill's input: each value a template over the named groups, `last` (the output of the
    /// last execution of this session) and `last_<skill>`.
    #[serde(default)]
    input: IndexMap<String, String>,
    /// The chain's parameters, as templates like `input`.
    #[serde(default)]
    params: IndexMap<String, String>,
}

/// An intent a message was understood as, with the text of its named groups.
pub type Chosen<'p> = (&'p Intent, IndexMap<String, String>);

/// What an intent runs; in an answer's plan, `"kind": "skill" | "chain", "name": ...`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "lowercase")]
pub enum Target {
    Skill(String),
    Chain(String),
}

impl Target {
    /// The skill's or the chain's name.
    pub fn name(&self) -> &str {
        match self {
            Target::Skill(name) | Target::Chain(name) => name,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Skill(name) => write!(f, "skill `{name}`"),
            Target::Chain(name) => write!(f, "chain `{name}`"),
        }
    }
}

#[derive(Debug)]
pub struct Intent {
    pub name: String,
    pub help: String,
    patterns: Vec<Regex>,
    pub target: Target,
    /// Field (input field or chain parameter) -> template.
    pub fields: IndexMap<String, String>,
}

#[derive(Debug)]
pub struct ChatPolicy {
    pub allow: Vec<SideEffect>,
    pub intents: Vec<Intent>,
}

impl Intent {
    /// The named groups of its patterns, each once.
    pub fn groups(&self) -> Vec<&str> {
        let mut groups: Vec<&str> = Vec::new();
        for name in self
            .patterns
            .iter()
            .flat_map(|p| p.capture_names().flatten())
        {
            if !groups.contains(&name) {
                groups.push(name);
            }
        }
        groups
    }
}

impl ChatPolicy {
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawChatPolicy =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let mut intents = Vec::with_capacity(raw.intents.len());
        for intent in raw.intents {
            let target = match (intent.skill, intent.chain) {
                (Some(skill), None) => Target::Skill(skill),
                (None, Some(chain)) => Target::Chain(chain),
                _ => {
                    return Err(Diagnostic::new(format!(
                        "intent `{}` must name exactly one of `skill` and `chain`",
                        intent.name
                    ))
                    .at(source, intent.patterns.first().map_or(0..0, Spanned::span)));
                }
            };
            let fields = match target {
                Target::Skill(_) => intent.input,
                Target::Chain(_) => intent.params,
            };
            let mut patterns = Vec::with_capacity(intent.patterns.len());
            for pattern in &intent.patterns {
                patterns.push(
                    RegexBuilder::new(pattern.get_ref())
                        .case_insensitive(true)
                        .build()
                        .map_err(|e| {
                            Diagnostic::new(format!("invalid pattern: {e}"))
                                .at(source, pattern.span())
                        })?,
                );
            }
            intents.push(Intent {
                name: intent.name,
                help: intent.help,
                patterns,
                target,
                fields,
            });
        }
        Ok(Self {
            allow: raw.allow,
            intents,
        })
    }

    /// The first intent one of whose patterns matches all of `message`, with its named groups.
    pub fn parse_message(&self, message: &str) -> Option<Chosen<'_>> {
        let message = message.trim();
        self.intents.iter().find_map(|intent| {
            intent.patterns.iter().find_map(|pattern| {
                let captures = pattern.captures(message)?;
                let whole = captures.get(0)?;
                (whole.start() == 0 && whole.end() == message.len()).then(|| {
                    let groups = pattern
                        .capture_names()
                        .flatten()
                        .filter_map(|name| {
                            captures
                                .name(name)
                                .map(|m| (name.to_owned(), m.as_str().to_owned()))
                        })
                        .collect();
                    (intent, groups)
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Result<ChatPolicy, Diagnostic> {
        ChatPolicy::parse(&SourceFile::new(DEFAULT_POLICY, text.to_owned()))
    }

    #[test]
    fn the_first_intent_matching_the_whole_message_wins_with_its_groups() {
        let chat = policy(
            r#"
allow = ["READ_ONLY"]

[[intent]]
name = "summarize"
help = "summarize <note.md>"
patterns = ['summari[sz]e (?P<path>\S+\.md)']
skill = "summarize_note"
input = { path = "{{ path }}" }

[[intent]]
name = "search"
help = "find <words>"
patterns = ['(?:find|search) (?P<query>.+)']
chain = "search_and_summarize"
params = { query = "{{ query }}" }
"#,
        )
        .unwrap();
        let (intent, groups) = chat.parse_message("  Summarise notes/a.md ").unwrap();
        assert_eq!(intent.name, "summarize");
        assert_eq!(groups["path"], "notes/a.md");
        assert_eq!(intent.target, Target::Skill("summarize_note".into()));
        let (intent, groups) = chat.parse_message("find kavi runs").unwrap();
        assert_eq!(intent.target, Target::Chain("search_and_summarize".into()));
        assert_eq!(groups["query"], "kavi runs");
        // A pattern must match the whole message, not a part of it.
        assert!(
            chat.parse_message("please summarize notes/a.md now")
                .is_none()
        );
    }

    #[test]
    fn a_bad_intent_is_refused_where_it_is_written() {
        let both = policy(
            "allow = []\n[[intent]]\nname = \"x\"\nhelp = \"x\"\npatterns = ['x']\nskill = \"a\"\nchain = \"b\"\n",
        )
        .unwrap_err();
        assert!(both.message.contains("exactly one of `skill` and `chain`"));
        let bad = policy(
            "allow = []\n[[intent]]\nname = \"x\"\nhelp = \"x\"\npatterns = ['(']\nskill = \"a\"\n",
        )
        .unwrap_err();
        assert!(
            bad.message.starts_with("invalid pattern"),
            "{}",
            bad.message
        );
        assert!(policy("allow = [\"WRITE\"]\n").is_err());
    }
}
