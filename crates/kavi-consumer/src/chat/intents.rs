//! `policies/chat.toml`: what the chat understands, as data.
//!
//! Each intent has regular expressions for the deterministic parser (named groups become
//! template variables), the skill or chain it runs, and templates for that skill's input or
//! that chain's parameters. The file also says which side-effect classes the chat may run at
//! all; READ_ONLY runs at once, the others only once confirmed.

use std::sync::Arc;
use std::time::Duration;

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
    /// How long a plan waits for a yes before it is put aside (`5m`, `90s`); 5 minutes unless
    /// set.
    #[schemars(with = "Option<String>")]
    confirm_within: Option<Spanned<String>>,
    /// What joins two requests in one message, as a regular expression (case-insensitive): a
    /// message two or more of whose parts each match an intent is asked back about, never run
    /// in part. `;`, `and`, `then`, `also` and commas unless set.
    #[schemars(with = "Option<String>")]
    joiners: Option<Spanned<String>>,
    /// Words that stand for an earlier result instead of for themselves ("summarize that").
    /// `that`, `it`, `this`, `them`, `the result`, `the same` and `again` unless set.
    reference_words: Option<Vec<String>>,
    /// By named group: where an earlier result holds a value that group can take by reference,
    /// as JSONPaths into that result's output (`path = ["$.path", "$.results[*].path"]`). A
    /// reference word in a group resolves to the newest result holding such a value, or is
    /// asked back about: when no result holds one, when one holds several, or when the group
    /// has no entry here.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, Vec<String>>")]
    references: IndexMap<String, Vec<Spanned<String>>>,
}

const DEFAULT_JOINERS: &str = r"\s*(?:;|,|\band\s+then\b|\bthen\b|\band\b|\balso\b)\s*";
const DEFAULT_REFERENCE_WORDS: [&str; 7] = [
    "that",
    "it",
    "this",
    "them",
    "the result",
    "the same",
    "again",
];

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
    /// How long a plan waits for a yes.
    pub confirm_within: Duration,
    joiners: Regex,
    /// Lowercase.
    reference_words: Vec<String>,
    /// Group -> JSONPaths into earlier outputs.
    pub references: IndexMap<String, Vec<String>>,
}

/// What a message asks for.
pub enum Understood<'p> {
    One(Chosen<'p>),
    /// More than one request: each part that asks for something, with the intent it matches.
    Several(Vec<(String, &'p Intent)>),
    Nothing,
}

/// A value without the quotes around it: `"one two"` is `one two`.
pub fn unquote(value: &str) -> &str {
    let value = value.trim();
    for (open, close) in [('"', '"'), ('\'', '\''), ('“', '”'), ('‘', '’'), ('`', '`')] {
        if let Some(inner) = value
            .strip_prefix(open)
            .and_then(|rest| rest.strip_suffix(close))
        {
            return inner.trim();
        }
    }
    value
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
                // Anchored: a pattern matches the whole message, so a lazy group can end it.
                patterns.push(regex(
                    source,
                    &format!("^(?:{})$", pattern.get_ref()),
                    pattern.span(),
                )?);
            }
            intents.push(Intent {
                name: intent.name,
                help: intent.help,
                patterns,
                target,
                fields,
            });
        }
        let confirm_within = match &raw.confirm_within {
            None => Duration::from_secs(5 * 60),
            Some(within) => humantime::parse_duration(within.get_ref()).map_err(|e| {
                Diagnostic::new(format!("invalid `confirm_within`: {e}")).at(source, within.span())
            })?,
        };
        let joiners = match &raw.joiners {
            None => regex(source, DEFAULT_JOINERS, 0..0)?,
            Some(joiners) => regex(source, joiners.get_ref(), joiners.span())?,
        };
        let reference_words = raw.reference_words.map_or_else(
            || DEFAULT_REFERENCE_WORDS.map(str::to_owned).to_vec(),
            |words| words.iter().map(|w| w.trim().to_lowercase()).collect(),
        );
        let mut references = IndexMap::new();
        for (group, paths) in raw.references {
            let mut checked = Vec::with_capacity(paths.len());
            for path in paths {
                crate::jsonpath::check(path.get_ref())
                    .map_err(|e| Diagnostic::new(e).at(source, path.span()))?;
                checked.push(path.into_inner());
            }
            references.insert(group, checked);
        }
        Ok(Self {
            allow: raw.allow,
            intents,
            confirm_within,
            joiners,
            reference_words,
            references,
        })
    }

    /// Whether a group's value stands for an earlier result rather than for itself.
    pub fn is_reference(&self, value: &str) -> bool {
        let value = value.trim().to_lowercase();
        self.reference_words.contains(&value)
    }

    /// What `message` asks for: one intent, more than one (each part that matches one, when
    /// two or more do), or nothing the policy declares.
    pub fn understand(&self, message: &str) -> Understood<'_> {
        let message = message.trim();
        let asking: Vec<(String, &Intent)> = self
            .joiners
            .split(message)
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .filter_map(|part| {
                self.parse_message(part)
                    .map(|(intent, _)| (part.to_owned(), intent))
            })
            .collect();
        if asking.len() > 1 {
            return Understood::Several(asking);
        }
        self.parse_message(message)
            .map_or(Understood::Nothing, Understood::One)
    }

    /// The first intent one of whose patterns matches all of `message`, with its named groups.
    pub fn parse_message(&self, message: &str) -> Option<Chosen<'_>> {
        let message = message.trim();
        self.intents.iter().find_map(|intent| {
            intent.patterns.iter().find_map(|pattern| {
                let captures = pattern.captures(message)?;
                let groups = pattern
                    .capture_names()
                    .flatten()
                    .filter_map(|name| {
                        captures
                            .name(name)
                            .map(|m| (name.to_owned(), unquote(m.as_str()).to_owned()))
                    })
                    .collect();
                Some((intent, groups))
            })
        })
    }
}

/// A case-insensitive regular expression of the policy, refused where it is written.
fn regex(
    source: &Arc<SourceFile>,
    pattern: &str,
    span: std::ops::Range<usize>,
) -> Result<Regex, Diagnostic> {
    RegexBuilder::new(pattern)
        .case_insensitive(true)
        .build()
        .map_err(|e| Diagnostic::new(format!("invalid pattern: {e}")).at(source, span))
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
        let bad = policy("allow = []\nconfirm_within = \"soon\"\n").unwrap_err();
        assert!(bad.message.contains("confirm_within"), "{}", bad.message);
        assert!(policy("allow = []\n[references]\npath = [\"$.[\"]\n").is_err());
    }

    #[test]
    fn a_message_asking_for_two_things_is_several_and_values_lose_their_quotes() {
        let chat = policy(
            r#"
allow = ["READ_ONLY"]

[[intent]]
name = "search"
help = "find <words>"
patterns = ['find (?P<query>.+)']
skill = "find_notes"

[[intent]]
name = "count"
help = "count words in <text>"
patterns = ['count words in (?P<text>.+)']
skill = "word_count"
"#,
        )
        .unwrap();
        let several = |message: &str| match chat.understand(message) {
            Understood::Several(parts) => parts.into_iter().map(|(part, _)| part).collect(),
            _ => Vec::new(),
        };
        assert_eq!(
            several("find governed; count words in a b c"),
            ["find governed", "count words in a b c"]
        );
        assert_eq!(
            several("count words in a b and find governed"),
            ["count words in a b", "find governed"]
        );
        // A joiner inside one request is part of it.
        let Understood::One((intent, groups)) = chat.understand("count words in salt and pepper")
        else {
            panic!("not one request");
        };
        assert_eq!(intent.name, "count");
        assert_eq!(groups["text"], "salt and pepper");
        let Understood::One((_, groups)) = chat.understand("count words in \"one two three\"")
        else {
            panic!("not one request");
        };
        assert_eq!(groups["text"], "one two three");
        assert!(chat.is_reference(" That "));
        assert!(!chat.is_reference("governed"));
    }
}
