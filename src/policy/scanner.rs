//! The policy scanner: kavi's own check of source files against rules in a policy file.
//!
//! Rules are regular expressions applied line by line, plus a list of forbidden imports that
//! becomes one rule per module. A finding names file, line and rule, so a failed gate says
//! exactly what to fix.

use std::path::Path;
use std::sync::Arc;

use regex::Regex;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScanner {
    #[serde(default)]
    comment_prefixes: Vec<String>,
    #[serde(default)]
    forbidden_imports: Vec<String>,
    #[serde(rename = "rule", default)]
    rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    message: String,
    #[schemars(with = "String")]
    regex: Spanned<String>,
}

#[derive(Debug, Clone)]
struct Rule {
    id: String,
    message: String,
    regex: Regex,
}

/// A compiled scanner policy.
#[derive(Debug, Clone)]
pub struct Scanner {
    comment_prefixes: Vec<String>,
    rules: Vec<Rule>,
}

/// One rule matching one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub file: String,
    pub line: usize,
    pub rule: String,
    pub message: String,
    pub excerpt: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: [{}] {}",
            self.file, self.line, self.rule, self.message
        )
    }
}

impl Scanner {
    /// Parses a scanner policy; a regular expression that does not compile is pointed at.
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawScanner =
            toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))?;
        let mut rules = Vec::new();
        for module in &raw.forbidden_imports {
            let module = regex::escape(module);
            rules.push(Rule {
                id: "forbidden-import".into(),
                message: format!("imports forbidden module `{}`", module.replace('\\', "")),
                regex: Regex::new(&format!(
                    r"^\s*(import\s+([\w.]+\s*,\s*)*{module}\b|from\s+{module}(\.[\w.]+)?\s+import\b)"
                ))
                .expect("escaped module names make valid expressions"),
            });
        }
        for rule in raw.rules {
            let regex = Regex::new(rule.regex.get_ref()).map_err(|e| {
                Diagnostic::new(format!(
                    "invalid regular expression in rule `{}`: {e}",
                    rule.id
                ))
                .at(source, rule.regex.span())
            })?;
            rules.push(Rule {
                id: rule.id,
                message: rule.message,
                regex,
            });
        }
        Ok(Self {
            comment_prefixes: raw.comment_prefixes,
            rules,
        })
    }

    /// Scans one file's text; `name` is how findings name the file.
    pub fn scan_text(&self, name: &str, text: &str) -> Vec<Finding> {
        let mut findings = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if self
                .comment_prefixes
                .iter()
                .any(|p| trimmed.starts_with(p.as_str()))
            {
                continue;
            }
            for rule in &self.rules {
                if rule.regex.is_match(line) {
                    findings.push(Finding {
                        file: name.to_owned(),
                        line: index + 1,
                        rule: rule.id.clone(),
                        message: rule.message.clone(),
                        excerpt: trimmed.chars().take(200).collect(),
                    });
                }
            }
        }
        findings
    }

    /// Scans files under `root`, named relative to it. A file that cannot be read is an error,
    /// never a clean result.
    pub fn scan_files(&self, root: &Path, files: &[String]) -> Result<Vec<Finding>, String> {
        let mut findings = Vec::new();
        for file in files {
            let text = super::invariants::read(root, file)?;
            findings.extend(self.scan_text(file, &text));
        }
        Ok(findings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Scanner {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/policies/scanner.toml"
        ))
        .unwrap();
        Scanner::parse(&SourceFile::new("policies/scanner.toml", text)).unwrap()
    }

    fn rules(findings: &[Finding]) -> Vec<(usize, &str)> {
        findings.iter().map(|f| (f.line, f.rule.as_str())).collect()
    }

    #[test]
    fn forbidden_imports_in_every_form_are_found_with_their_line() {
        let text = "import json\nimport subprocess\nfrom subprocess import run\nimport os, socket\nfrom importlib.util import find_spec\n# import subprocess\nimport subprocessing\n";
        let findings = shipped().scan_text("skill.py", text);
        assert_eq!(
            rules(&findings),
            [
                (2, "forbidden-import"),
                (3, "forbidden-import"),
                (4, "forbidden-import"),
                (5, "forbidden-import")
            ]
        );
        assert_eq!(
            findings[0].to_string(),
            "skill.py:2: [forbidden-import] imports forbidden module `subprocess`"
        );
    }

    #[test]
    fn eval_process_and_secret_leak_rules_fire_and_clean_code_passes() {
        let text = "x = eval(data)\nos.system('ls')\nprint(os.environ['TOKEN'])\nlogging.info('k=%s', os.getenv('KEY'))\ntoken = os.environ['TOKEN']\nprint('done')\n";
        assert_eq!(
            rules(&shipped().scan_text("s.py", text)),
            [
                (1, "eval-exec"),
                (2, "os-process"),
                (3, "secret-leak"),
                (4, "secret-leak")
            ]
        );
        assert!(
            shipped()
                .scan_text("s.py", "def run(x):\n    return {'ok': x}\n")
                .is_empty()
        );
    }

    #[test]
    fn a_bad_expression_points_at_its_rule() {
        let source = SourceFile::new(
            "s.toml",
            "[[rule]]\nid = \"x\"\nmessage = \"m\"\nregex = '(unclosed'\n",
        );
        let err = Scanner::parse(&source).unwrap_err();
        assert!(
            err.message
                .starts_with("invalid regular expression in rule `x`"),
            "{}",
            err.message
        );
        assert_eq!(err.position().as_deref(), Some("s.toml:4:9"));
    }

    #[test]
    fn a_fifo_in_place_of_a_scanned_file_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&dir.path().join("skill.py"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Opened to read as a file is, a FIFO waits for a writer: this call would not return.
        let error = shipped()
            .scan_files(dir.path(), &["skill.py".into()])
            .unwrap_err();
        assert!(
            error.starts_with("cannot read skill.py:")
                && error.ends_with("no longer a regular file"),
            "{error}"
        );
    }
}
