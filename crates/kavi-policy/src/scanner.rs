//! The policy scanner: kavi's own check of a skill's files against rules in a policy file.
//!
//! Python files are checked by syntax: [`ANALYSER`], a small program run with the pinned
//! interpreter of the gate's toolchain, parses each one with Python's own `ast` and reports every
//! reference to a module or qualified callable that the skill's side-effect class forbids,
//! however it is spelled (aliases, star imports, `getattr` with a constant name, `__import__`,
//! `sys.modules[...]`). Which capabilities each class forbids is data (`[capability.*]`,
//! `[class.*]`, `[tests]`). Text rules (regular expressions, line by line) and secret rules
//! (known key formats, for a `secret_scan` gate) are applied by kavi itself. A finding names
//! file, line and rule, so a failed gate says exactly what to fix; a secret finding never holds
//! the secret.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};
use indexmap::IndexMap;
use regex::Regex;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::skills::{SideEffect, SideEffects};

/// The analyser the interpreter runs (`python -I -B -c ANALYSER`): JSON in on stdin, findings
/// out on stdout.
pub const ANALYSER: &str = include_str!("scan_python.py");

/// The launcher a `secret_scan` gate runs detect-secrets with (`python -I -B -c DETECT_SECRETS
/// FILE...`): its findings as JSON on stdout, `{"results": {file: [{"type", "line_number"}]}}`.
pub const DETECT_SECRETS: &str = include_str!("detect_secrets.py");

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawScanner {
    /// Line prefixes that make a line a comment, which text rules pass over.
    #[serde(default)]
    comment_prefixes: Vec<String>,
    /// File-name globs of the skill's test files, checked against `[tests]`.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    test_files: Vec<Spanned<String>>,
    /// The class a skill without a proposal is checked as.
    #[schemars(with = "Option<String>")]
    default_class: Option<Spanned<String>>,
    /// The failure kind of a policy scan whose only findings are files that do not parse (else
    /// the gate's own): named for its cause, as the lint gate names it.
    #[schemars(with = "Option<String>")]
    syntax_failure: Option<Spanned<String>>,
    /// What code can do, by name: the modules and qualified callables that give it.
    #[serde(default)]
    capability: IndexMap<String, RawCapability>,
    /// Per side-effect class, the capabilities its code may not use.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, RawClass>")]
    class: IndexMap<String, Spanned<RawClass>>,
    /// The capabilities the skill's test files may not use.
    tests: Option<RawClass>,
    #[serde(rename = "rule", default)]
    rules: Vec<RawRule>,
    /// Known secret formats, for a `secret_scan` gate.
    #[serde(rename = "secret", default)]
    secrets: Vec<RawRule>,
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawCapability {
    /// How a finding says what the code does.
    message: String,
    /// Modules (and everything in them) that give the capability.
    #[serde(default)]
    modules: Vec<String>,
    /// Qualified names (`os.system`, globs: `os.exec*`, `*.write_text` for any receiver).
    #[serde(default)]
    calls: Vec<String>,
    /// Calls that give the capability only with a mode that may write.
    #[serde(default)]
    write_modes: Vec<WriteMode>,
    /// A name computed at run time, which cannot be followed, is a finding of this capability.
    #[serde(default)]
    dynamic: bool,
    /// What changes what the test run reports without touching the framework itself is a
    /// finding of this capability: in any file, a module-level `pytest_*` name however bound
    /// (a hook, `pytest_plugins`) and a module-level `__getattr__`; in a test file, a method of
    /// `TestCase`'s own (its `run`, an assertion) taken over by `def`, assignment or `setattr`,
    /// a decorated class, a metaclass, `__init_subclass__` and a class made by `type(...)`.
    #[serde(default)]
    test_hooks: bool,
    /// Code in a branch the type checker never looks at (the `else` of `if TYPE_CHECKING:` or
    /// `if MYPY:`, the body of `if not TYPE_CHECKING:` or `if PY2:`), and a condition on
    /// `sys.version_info` or `sys.platform`, is a finding of this capability.
    #[serde(default)]
    unchecked_branches: bool,
    /// Reaching a private name of a standard module (`uuid._get_command_stdout`), whose effects
    /// no list names, is a finding of this capability.
    #[serde(default)]
    private_helpers: bool,
    /// Reading the environment other than one variable by a literal name is a finding of this
    /// capability: `dict(os.environ)`, `os.environ.copy()`, `{**os.environ}`, `os.environb`,
    /// `os.getenv(name)`; `os.environ["HOME"]`, `os.environ.get("HOME")` and `os.getenv("HOME")`
    /// are not.
    #[serde(default)]
    environment: bool,
    /// Calls that give the capability only when passed a keyword argument (or arguments
    /// computed at run time, `**options`).
    #[serde(default)]
    keywords: Vec<KeywordArg>,
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct KeywordArg {
    /// The qualified callable (a glob, as `calls`).
    call: String,
    /// The keyword that gives the capability (`filename` of `logging.basicConfig`).
    keyword: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteMode {
    /// The qualified callable (a glob, as `calls`).
    call: String,
    /// The mode's position among the call's arguments; else it is the `mode=` keyword.
    position: usize,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawClass {
    /// Capability names.
    #[schemars(with = "Vec<String>")]
    forbid: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    message: String,
    #[schemars(with = "String")]
    regex: Spanned<String>,
    /// Matched in the skill's test files only (`test_files`).
    #[serde(default)]
    tests_only: bool,
}

#[derive(Debug, Clone)]
struct Rule {
    id: String,
    message: String,
    regex: Regex,
    tests_only: bool,
}

/// A compiled scanner policy.
#[derive(Debug, Clone)]
pub struct Scanner {
    comment_prefixes: Vec<String>,
    rules: Vec<Rule>,
    secrets: Vec<Rule>,
    test_files: GlobSet,
    default_class: Option<String>,
    syntax_failure: Option<Spanned<String>>,
    capabilities: IndexMap<String, RawCapability>,
    classes: IndexMap<String, Vec<String>>,
    tests: Vec<String>,
}

/// One rule matching one place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub file: String,
    pub line: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub col: Option<usize>,
    pub rule: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub excerpt: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.col {
            Some(col) => write!(
                f,
                "{}:{}:{}: [{}] {}",
                self.file, self.line, col, self.rule, self.message
            ),
            None => write!(
                f,
                "{}:{}: [{}] {}",
                self.file, self.line, self.rule, self.message
            ),
        }
    }
}

/// One file a skill ships, read.
#[derive(Debug, Clone)]
pub struct SkillFile {
    /// Its path relative to the workspace, as findings name it.
    pub name: String,
    pub text: String,
}

/// The rule of a finding for a file that does not parse (the analyser's).
pub const SYNTAX_RULE: &str = "syntax";

/// The rule of a finding for a file Python reads otherwise than the gates' tools do (a coding
/// declaration other than UTF-8, a name that is not ASCII): the analyser's.
pub const SOURCE_RULE: &str = "source";

/// The rule of a secret scan's finding for a Python file whose built strings the analyser could
/// not follow (too deeply nested, too large).
pub const UNSCANNED_RULE: &str = "unscanned";

/// Extensions of files Python would load as code that the analyser cannot read.
const COMPILED: &[&str] = &["pyc", "pyo", "so", "pyd", "dylib", "dll", "pth"];

fn compile_rules(source: &Arc<SourceFile>, raw: Vec<RawRule>) -> Result<Vec<Rule>, Diagnostic> {
    raw.into_iter()
        .map(|rule| {
            let regex = Regex::new(rule.regex.get_ref()).map_err(|e| {
                Diagnostic::new(format!(
                    "invalid regular expression in rule `{}`: {e}",
                    rule.id
                ))
                .at(source, rule.regex.span())
            })?;
            Ok(Rule {
                id: rule.id,
                message: rule.message,
                regex,
                tests_only: rule.tests_only,
            })
        })
        .collect()
}

impl Scanner {
    /// Parses a scanner policy; a regular expression that does not compile, an unknown class or
    /// capability, or a bad glob is pointed at.
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawScanner =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let capabilities = raw.capability;
        let known = |forbid: &[Spanned<String>]| -> Result<Vec<String>, Diagnostic> {
            forbid
                .iter()
                .map(|name| {
                    if capabilities.contains_key(name.get_ref()) {
                        Ok(name.get_ref().clone())
                    } else {
                        Err(
                            Diagnostic::new(format!("unknown capability `{}`", name.get_ref()))
                                .at(source, name.span())
                                .with_help(format!(
                                    "declared capabilities: {}",
                                    capabilities.keys().cloned().collect::<Vec<_>>().join(", ")
                                )),
                        )
                    }
                })
                .collect()
        };
        let mut classes = IndexMap::new();
        for (name, class) in &raw.class {
            if SideEffect::named(name).is_none() {
                return Err(
                    Diagnostic::new(format!("unknown side-effect class `{name}`"))
                        .at(source, class.span()),
                );
            }
            classes.insert(name.clone(), known(&class.get_ref().forbid)?);
        }
        let tests = match &raw.tests {
            Some(tests) => known(&tests.forbid)?,
            None => Vec::new(),
        };
        if let Some(default) = &raw.default_class
            && !classes.contains_key(default.get_ref())
        {
            return Err(Diagnostic::new(format!(
                "default_class `{}` is not a class declared here",
                default.get_ref()
            ))
            .at(source, default.span()));
        }
        let mut globs = GlobSetBuilder::new();
        for pattern in &raw.test_files {
            let glob = Glob::new(pattern.get_ref()).map_err(|e| {
                Diagnostic::new(format!("invalid glob in test_files: {e}"))
                    .at(source, pattern.span())
            })?;
            globs.add(glob);
        }
        let test_files = globs
            .build()
            .map_err(|e| Diagnostic::new(format!("invalid test_files: {e}")).at(source, 0..0))?;
        Ok(Self {
            comment_prefixes: raw.comment_prefixes,
            rules: compile_rules(source, raw.rules)?,
            secrets: compile_rules(source, raw.secrets)?,
            test_files,
            default_class: raw.default_class.map(Spanned::into_inner),
            syntax_failure: raw.syntax_failure,
            capabilities,
            classes,
            tests,
        })
    }

    /// Applies the text rules to one file's text; `name` is how findings name the file.
    pub fn scan_text(&self, name: &str, text: &str) -> Vec<Finding> {
        let mut findings = Vec::new();
        for (index, line) in super::python_lines(text).enumerate() {
            let trimmed = line.trim_start();
            if self
                .comment_prefixes
                .iter()
                .any(|p| trimmed.starts_with(p.as_str()))
            {
                continue;
            }
            for rule in &self.rules {
                if rule.tests_only && !self.is_test(name) {
                    continue;
                }
                if rule.regex.is_match(line) {
                    findings.push(Finding {
                        file: name.to_owned(),
                        line: index + 1,
                        col: None,
                        rule: rule.id.clone(),
                        message: rule.message.clone(),
                        excerpt: trimmed.chars().take(200).collect(),
                    });
                }
            }
        }
        findings
    }

    /// The secret rules over one file's text (whole, so that a rule may span lines, as a PEM
    /// key does): each finding names the line, the column and the rule, never the value; the
    /// values found are returned beside, to redact whatever else would print them.
    pub fn scan_secrets(&self, name: &str, text: &str) -> (Vec<Finding>, Vec<String>) {
        let mut findings = Vec::new();
        let mut values = Vec::new();
        for rule in &self.secrets {
            for found in rule.regex.find_iter(text) {
                let before = &text[..found.start()];
                let line_start = before.rfind('\n').map_or(0, |at| at + 1);
                findings.push(Finding {
                    file: name.to_owned(),
                    line: before.matches('\n').count() + 1,
                    col: Some(before[line_start..].chars().count() + 1),
                    rule: rule.id.clone(),
                    message: format!(
                        "{} ({} characters, redacted)",
                        rule.message,
                        found.as_str().chars().count()
                    ),
                    excerpt: String::new(),
                });
                values.push(found.as_str().to_owned());
            }
        }
        findings.sort_by_key(|f| (f.line, f.col));
        (findings, values)
    }

    /// The failure kind of a scan whose only findings are files that do not parse, as written.
    pub fn syntax_failure(&self) -> Option<&Spanned<String>> {
        self.syntax_failure.as_ref()
    }

    /// Whether `findings` are all of files that do not parse (and there is one at least).
    pub fn only_syntax(findings: &[Finding]) -> bool {
        !findings.is_empty() && findings.iter().all(|f| f.rule == SYNTAX_RULE)
    }

    /// The files Python would read otherwise than every gate's tool did: what any gate saw of
    /// them is not what runs.
    pub fn read_otherwise(findings: &[Finding]) -> Vec<&str> {
        let mut files: Vec<&str> = findings
            .iter()
            .filter(|f| f.rule == SOURCE_RULE)
            .map(|f| f.file.as_str())
            .collect();
        files.dedup();
        files
    }

    /// Whether the policy declares secret rules.
    pub fn has_secret_rules(&self) -> bool {
        !self.secrets.is_empty()
    }

    /// The capabilities code of `class` (a proposal's side effect, `+`-joined for several) may
    /// not use: what every one of its classes forbids. No class: `default_class`'s.
    pub fn forbidden_for(&self, class: Option<&str>) -> Result<Vec<String>, String> {
        let class = match class {
            Some(class) => class.to_owned(),
            None => self.default_class.clone().ok_or(
                "the skill has no proposal, so no side-effect class, and the scanner policy \
                 names no default_class",
            )?,
        };
        let set = SideEffects::parse(&class)?;
        let mut forbidden: Option<BTreeSet<&String>> = None;
        for one in set.iter() {
            let forbids: BTreeSet<&String> = self
                .classes
                .get(one.as_str())
                .ok_or_else(|| {
                    format!(
                        "the scanner policy declares no rules for class {}",
                        one.as_str()
                    )
                })?
                .iter()
                .collect();
            forbidden = Some(match forbidden {
                None => forbids,
                Some(before) => before.intersection(&forbids).copied().collect(),
            });
        }
        // Kept in the declared order of the capabilities.
        let forbidden = forbidden.unwrap_or_default();
        Ok(self
            .capabilities
            .keys()
            .filter(|name| forbidden.contains(name))
            .cloned()
            .collect())
    }

    /// Whether `name` (a path) is one of the skill's tests.
    pub fn is_test(&self, name: &str) -> bool {
        let file = Path::new(name).file_name().unwrap_or_default();
        self.test_files.is_match(file)
    }

    /// What the analyser reads on stdin for these files, and what kavi finds without it: files
    /// that are not Python text (compiled code, a file that is not UTF-8) and the text rules.
    pub fn analyser_request(
        &self,
        class: Option<&str>,
        files: &[SkillFile],
    ) -> Result<(serde_json::Value, Vec<Finding>), String> {
        let forbidden = self.forbidden_for(class)?;
        let mut findings = Vec::new();
        let mut python = Vec::new();
        for file in files {
            findings.extend(self.scan_text(&file.name, &file.text));
            if file.name.ends_with(".py") {
                let stem = Path::new(&file.name)
                    .file_stem()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                python.push(serde_json::json!({
                    "name": file.name,
                    "module": stem,
                    "test": self.is_test(&file.name),
                    "text": file.text,
                }));
            }
        }
        let request = serde_json::json!({
            "capabilities": self.capabilities,
            "forbid": { "code": forbidden, "tests": self.tests },
            "files": python,
        });
        Ok((request, findings))
    }

    /// What the analyser reads on stdin to list the strings the Python files among `files`
    /// build from pieces (`"AKIA" + "..."`, `"".join([...])`, f-strings, hex or base64 of a
    /// literal), for [`Scanner::scan_built`].
    pub fn strings_request(files: &[SkillFile]) -> serde_json::Value {
        let python: Vec<serde_json::Value> = files
            .iter()
            .filter(|file| file.name.ends_with(".py"))
            .map(|file| serde_json::json!({ "name": file.name, "text": file.text }))
            .collect();
        serde_json::json!({ "strings": true, "files": python })
    }

    /// The secret rules over the strings the analyser answered [`Scanner::strings_request`]
    /// with: each finding is placed where the string is built, and, as [`Scanner::scan_secrets`]
    /// does, names the rule, never the value; each built string a rule matched is returned
    /// beside, whole, for what else prints it (a test's output) to be redacted.
    pub fn scan_built(&self, stdout: &[u8]) -> Result<(Vec<Finding>, Vec<String>), String> {
        #[derive(Deserialize)]
        struct Built {
            file: String,
            line: usize,
            col: usize,
            text: String,
            value: String,
        }
        #[derive(Deserialize)]
        struct Unscanned {
            file: String,
            reason: String,
        }
        #[derive(Deserialize)]
        struct Answer {
            strings: Vec<Built>,
            unscanned: Vec<Unscanned>,
        }
        let answer = serde_json::from_slice::<Answer>(stdout)
            .map_err(|e| format!("the analyser's answer is not what kavi expects: {e}"))?;
        // A file whose strings could not be followed may hide one: it fails the scan.
        let mut findings: Vec<Finding> = answer
            .unscanned
            .into_iter()
            .map(|unscanned| Finding {
                file: unscanned.file,
                line: 1,
                col: None,
                rule: UNSCANNED_RULE.to_owned(),
                message: format!(
                    "the strings it builds cannot be followed ({}), so it cannot be checked \
                     for secrets",
                    unscanned.reason
                ),
                excerpt: String::new(),
            })
            .collect();
        let mut values = Vec::new();
        for built in answer.strings {
            let (found, _) = self.scan_secrets(&built.file, &built.text);
            if !found.is_empty() {
                values.push(built.value);
            }
            findings.extend(found.into_iter().map(|finding| Finding {
                line: built.line,
                col: Some(built.col),
                message: format!("{}, built from pieces", finding.message),
                ..finding
            }));
        }
        Ok((findings, values))
    }

    /// The analyser's answer, as findings; anything else is an error, never a clean result.
    pub fn analyser_findings(stdout: &[u8]) -> Result<Vec<Finding>, String> {
        #[derive(Deserialize)]
        struct Answer {
            findings: Vec<Finding>,
        }
        serde_json::from_slice::<Answer>(stdout)
            .map(|answer| answer.findings)
            .map_err(|e| format!("the analyser's answer is not what kavi expects: {e}"))
    }
}

/// Reads what `entries` name under `root`: a file, or every file in a folder (recursively, in
/// path order). Files no scanner can read are findings: compiled code Python would load, a
/// symbolic link, a Python file that is not UTF-8. A file that cannot be read is an error.
pub fn read_skill_files(
    root: &Path,
    entries: &[String],
) -> Result<(Vec<SkillFile>, Vec<Finding>), String> {
    let mut files = Vec::new();
    let mut findings = Vec::new();
    let finding = |name: &str, rule: &str, message: &str| Finding {
        file: name.to_owned(),
        line: 1,
        col: None,
        rule: rule.to_owned(),
        message: message.to_owned(),
        excerpt: String::new(),
    };
    for entry in entries {
        let path = root.join(entry);
        let meta =
            std::fs::symlink_metadata(&path).map_err(|e| format!("cannot read {entry}: {e}"))?;
        let names: Vec<String> = if meta.is_dir() {
            let mut names = Vec::new();
            for item in walkdir::WalkDir::new(&path).sort_by_file_name() {
                let item = item.map_err(|e| format!("cannot read {entry}: {e}"))?;
                if item.file_type().is_dir() {
                    continue;
                }
                let relative = item.path().strip_prefix(root).unwrap_or(item.path());
                let name = relative.to_string_lossy().into_owned();
                if !item.file_type().is_file() {
                    findings.push(finding(
                        &name,
                        "not-a-file",
                        "is not a regular file (a link, a socket, ...), which no scanner follows",
                    ));
                    continue;
                }
                names.push(name);
            }
            names
        } else {
            vec![entry.clone()]
        };
        for name in names {
            let extension = Path::new(&name)
                .extension()
                .unwrap_or_default()
                .to_string_lossy()
                .to_lowercase();
            if COMPILED.contains(&extension.as_str()) {
                findings.push(finding(
                    &name,
                    "compiled-code",
                    "is compiled code or an import hook, which the scanner cannot read",
                ));
                continue;
            }
            let bytes = super::invariants::read_bytes(root, &name)?;
            match String::from_utf8(bytes) {
                // UTF-16 without its mark is valid UTF-8, a NUL between every letter: no rule
                // matches it, and the skill decodes it whole.
                Ok(text) if text.contains('\0') => {
                    findings.push(finding(
                        &name,
                        "encoding",
                        "holds NUL characters, so it cannot be checked as text",
                    ));
                    files.push(SkillFile { name, text });
                }
                Ok(text) => files.push(SkillFile { name, text }),
                Err(e) => {
                    // Read whole by the skill in any encoding it likes (UTF-16 hides a key
                    // from every rule here), so no file is passed over for its encoding.
                    findings.push(finding(
                        &name,
                        "encoding",
                        "is not UTF-8 text, so it cannot be checked",
                    ));
                    files.push(SkillFile {
                        name,
                        text: String::from_utf8_lossy(e.as_bytes()).into_owned(),
                    });
                }
            }
        }
    }
    Ok((files, findings))
}

#[cfg(test)]
mod tests;
