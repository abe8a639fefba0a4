//! `policies/roles.toml`: which OS accounts and groups hold which named roles, and the
//! requirements other policies embed (`{ role = "reviewer", approvals = 2 }`) that count the
//! distinct holders who approved something.
//!
//! An approval records the roles its giver held when giving it, so a later edit of this file
//! neither makes nor unmakes a decision already taken.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};

pub const DEFAULT_POLICY: &str = "policies/roles.toml";

/// `policies/roles.toml`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRoles {
    /// Each role by name (`maintainer`, `reviewer`, ...).
    #[serde(rename = "role")]
    #[schemars(with = "BTreeMap<String, RawRole>")]
    roles: BTreeMap<String, Spanned<RawRole>>,
    /// Each account's own public key (`kavi policy key` prints it), by the account's name or
    /// `uid N`: `alice = "ed25519:<64 hex digits>"`. Once any is pinned, an approval counts only
    /// when its giver's pinned key signed it, so an account that can write the ledger cannot
    /// record another's approval.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    keys: BTreeMap<String, Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRole {
    /// Who holds the role: an account's name (`alice`), a numeric uid (`uid 1000`, for an id with
    /// no account), a group (`group:wheel`), or `*` for any account.
    #[schemars(with = "Vec<String>")]
    members: Vec<Spanned<String>>,
}

/// One member entry of a role.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    Anyone,
    Uid(u32),
    Name(String),
    Group(String),
}

impl Member {
    fn parse(entry: &str) -> Result<Self, String> {
        let entry = entry.trim();
        if entry == "*" {
            return Ok(Self::Anyone);
        }
        if let Some(group) = entry.strip_prefix("group:") {
            return if group.is_empty() || group.contains(char::is_whitespace) {
                Err(format!("`{entry}` names no group: write `group:NAME`"))
            } else {
                Ok(Self::Group(group.to_owned()))
            };
        }
        if let Some(uid) = entry.strip_prefix("uid ") {
            return uid
                .trim()
                .parse()
                .map(Self::Uid)
                .map_err(|_| format!("`{entry}` is not a numeric uid: write `uid N`"));
        }
        if entry.is_empty() || entry.contains(char::is_whitespace) || entry.contains(':') {
            return Err(format!(
                "`{entry}` is not a member: write an account's name, `uid N`, `group:NAME` or `*`"
            ));
        }
        Ok(Self::Name(entry.to_owned()))
    }

    fn includes(&self, who: &Identity) -> bool {
        match self {
            Self::Anyone => true,
            Self::Uid(uid) => *uid == who.uid,
            Self::Name(name) => who.name.as_deref() == Some(name.as_str()),
            Self::Group(group) => who.groups.iter().any(|g| g == group),
        }
    }
}

/// An account as the operating system knows it: its uid, its name if it has one, the names of
/// its groups.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub uid: u32,
    pub name: Option<String>,
    pub groups: Vec<String>,
}

impl Identity {
    /// The current process's real uid, its account's name, and the names of its real gid and
    /// supplementary groups (a gid with no name has none to match).
    pub fn current() -> Self {
        use nix::unistd::{Group, User, getgid, getgroups, getuid};
        let uid = getuid();
        let name = User::from_uid(uid).ok().flatten().map(|u| u.name);
        let mut gids = getgroups().unwrap_or_default();
        gids.push(getgid());
        gids.sort_unstable_by_key(|g| g.as_raw());
        gids.dedup();
        let groups = gids
            .into_iter()
            .filter_map(|gid| Group::from_gid(gid).ok().flatten().map(|g| g.name))
            .collect();
        Self {
            uid: uid.as_raw(),
            name,
            groups,
        }
    }
}

/// The loaded roles: each role's members, in name order.
#[derive(Debug, Clone)]
pub struct Roles {
    roles: BTreeMap<String, Vec<Member>>,
    /// Each pinned key (hex) with the account it is pinned for (a name or a uid).
    keys: Vec<(Member, String)>,
    pub source: Arc<SourceFile>,
}

impl Roles {
    /// Reads and checks `policies/roles.toml` of the workspace at `root`.
    pub fn load(root: &Path) -> Result<Self, Diagnostic> {
        let source = super::read(root, DEFAULT_POLICY).map_err(Diagnostic::new)?;
        Self::parse(&source)
    }

    /// Parses a roles file; a member entry that names no one is an error at the entry.
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawRoles =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let mut roles = BTreeMap::new();
        for (name, role) in raw.roles {
            if role.get_ref().members.is_empty() {
                return Err(Diagnostic::new(format!(
                    "role `{name}` has no members: no approval it is asked for could be given"
                ))
                .at(source, role.span()));
            }
            let members = role
                .get_ref()
                .members
                .iter()
                .map(|entry| {
                    Member::parse(entry.get_ref()).map_err(|reason| {
                        Diagnostic::new(format!("invalid member of role `{name}`: {reason}"))
                            .at(source, entry.span())
                    })
                })
                .collect::<Result<_, _>>()?;
            roles.insert(name, members);
        }
        let mut keys = Vec::new();
        for (account, key) in raw.keys {
            let member = match Member::parse(&account) {
                Ok(member @ (Member::Name(_) | Member::Uid(_))) => member,
                _ => {
                    return Err(Diagnostic::new(format!(
                        "`{account}` in [keys] is not an account: write its name or `uid N`"
                    ))
                    .at(source, key.span()));
                }
            };
            let hex = key
                .get_ref()
                .strip_prefix("ed25519:")
                .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
            let Some(hex) = hex else {
                return Err(Diagnostic::new(format!(
                    "the key of `{account}` is not `ed25519:` and 64 hex digits (`kavi policy key` \
                     prints one)"
                ))
                .at(source, key.span()));
            };
            keys.push((member, hex.to_ascii_lowercase()));
        }
        Ok(Self {
            roles,
            keys,
            source: source.clone(),
        })
    }

    /// Whether any account's key is pinned: then only signed approvals count.
    pub fn pins_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The key (hex) pinned for the account `actor` names (as an approval records it).
    pub fn pinned_key(&self, actor: &str) -> Option<&str> {
        let uid = crate::identity::uid_of(actor);
        let name = actor.split_once(" (uid ").map(|(name, _)| name);
        self.keys
            .iter()
            .find(|(member, _)| match member {
                Member::Uid(pinned) => uid == Some(*pinned),
                Member::Name(pinned) => name == Some(pinned.as_str()),
                _ => false,
            })
            .map(|(_, key)| key.as_str())
    }

    /// The roles `who` holds, in name order.
    pub fn held_by(&self, who: &Identity) -> Vec<String> {
        self.roles
            .iter()
            .filter(|(_, members)| members.iter().any(|m| m.includes(who)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// How many accounts can hold `role`, when its members are all named accounts or uids;
    /// `None` when a group or `*` makes that open (or the role is not declared).
    pub fn named_members(&self, role: &str) -> Option<usize> {
        let members = self.roles.get(role)?;
        members
            .iter()
            .all(|m| matches!(m, Member::Uid(_) | Member::Name(_)))
            .then(|| {
                let mut distinct = members.clone();
                distinct.dedup();
                distinct.len()
            })
    }

    /// The roles the current process's account holds, to record with an approval it gives.
    pub fn held_by_current_process(&self) -> Vec<String> {
        self.held_by(&Identity::current())
    }

    /// A requirement another policy embeds names a declared role and at least one approval;
    /// `file` and `span` locate it in that policy.
    pub fn check(
        &self,
        requirement: &Requirement,
        file: &Arc<SourceFile>,
        span: Range<usize>,
    ) -> Result<(), Diagnostic> {
        if !self.roles.contains_key(&requirement.role) {
            let names: Vec<&str> = self.roles.keys().map(String::as_str).collect();
            return Err(Diagnostic::new(format!(
                "role `{}` is not declared in {DEFAULT_POLICY}: {}",
                requirement.role,
                crate::diagnostic::suggest(&requirement.role, &names)
            ))
            .at(file, span));
        }
        if requirement.approvals == 0 {
            return Err(Diagnostic::new(
                "`approvals` counts distinct approvers and must be at least 1",
            )
            .at(file, span));
        }
        Ok(())
    }
}

/// What a decision needs: this many approvals by distinct accounts holding `role`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// A role declared in `policies/roles.toml`.
    pub role: String,
    /// How many distinct accounts holding the role must approve (at least 1).
    pub approvals: u32,
}

/// The account whose approval never counts, and what it is to the decision ("the account that
/// started the run", "the proposer").
#[derive(Debug, Clone, Copy)]
pub struct Excluded<'a> {
    pub actor: &'a str,
    pub described: &'a str,
}

impl Requirement {
    /// Ok when enough distinct accounts other than `excluded` held the role when they approved;
    /// otherwise says what is missing and who has approved so far.
    pub fn met_by(
        &self,
        approvals: &[crate::ledger::RecordedApproval],
        excluded: Excluded<'_>,
    ) -> Result<(), String> {
        // Accounts are told apart by uid: one uid under two names is one approver.
        let mut counted: Vec<&str> = Vec::new();
        for approval in approvals.iter().filter(|a| {
            !crate::identity::same_account(&a.actor, excluded.actor) && a.roles.contains(&self.role)
        }) {
            if !counted
                .iter()
                .any(|c| crate::identity::same_account(c, &approval.actor))
            {
                counted.push(&approval.actor);
            }
        }
        counted.sort_unstable();
        if counted.len() >= self.approvals as usize {
            return Ok(());
        }
        let needed = match self.approvals {
            1 => format!("1 {}", self.role),
            n => format!("{n} distinct {}s", self.role),
        };
        let has = match counted.len() {
            0 => "has none".to_owned(),
            n => format!("has {n}: {}", counted.join(", ")),
        };
        Err(format!(
            "needs {needed} other than {}; {has}",
            excluded.described
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(text: &str) -> Result<Roles, Diagnostic> {
        Roles::parse(&SourceFile::new(DEFAULT_POLICY, text))
    }

    fn approval(actor: &str, roles: &[&str]) -> crate::ledger::RecordedApproval {
        crate::ledger::RecordedApproval {
            signature: None,
            actor: actor.to_owned(),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        }
    }

    const STARTER: Excluded<'static> = Excluded {
        actor: "root (uid 0)",
        described: "the account that started the run",
    };

    #[test]
    fn members_match_by_name_uid_group_and_anyone() {
        let roles = roles(
            "[role.maintainer]\nmembers = [\"alice\", \"uid 4242\"]\n\
             [role.reviewer]\nmembers = [\"group:review\"]\n\
             [role.user]\nmembers = [\"*\"]\n",
        )
        .unwrap();
        let alice = Identity {
            uid: 1000,
            name: Some("alice".into()),
            groups: vec!["alice".into()],
        };
        let nameless = Identity {
            uid: 4242,
            ..Identity::default()
        };
        let bob = Identity {
            uid: 1001,
            name: Some("bob".into()),
            groups: vec!["review".into()],
        };
        assert_eq!(roles.held_by(&alice), ["maintainer", "user"]);
        assert_eq!(roles.held_by(&nameless), ["maintainer", "user"]);
        assert_eq!(roles.held_by(&bob), ["reviewer", "user"]);
    }

    #[test]
    fn a_bad_member_is_an_error_at_its_line_and_column() {
        let error = roles("[role.reviewer]\nmembers = [\"bob\", \"uid x\"]\n").unwrap_err();
        assert!(error.to_string().contains("not a numeric uid"), "{error}");
        assert_eq!(
            error.position().as_deref(),
            Some("policies/roles.toml:2:19")
        );
        let error = roles("[role.reviewer]\nmembers = [\"group:\"]\n").unwrap_err();
        assert!(error.to_string().contains("names no group"), "{error}");
        let error = roles("[role.reviewer]\nmembers = []\n").unwrap_err();
        assert!(error.to_string().contains("has no members"), "{error}");
        let error = roles("[role.reviewer]\nmember = [\"bob\"]\n").unwrap_err();
        assert_eq!(error.position().as_deref(), Some("policies/roles.toml:2:1"));
    }

    #[test]
    fn a_requirement_names_a_declared_role_and_at_least_one_approval() {
        let roles = roles("[role.reviewer]\nmembers = [\"*\"]\n").unwrap();
        let file = SourceFile::new("policies/escalation.toml", "x = 1\n");
        let reviewer = |approvals| Requirement {
            role: "reviewer".into(),
            approvals,
        };
        roles.check(&reviewer(2), &file, 0..1).unwrap();
        let error = roles.check(&reviewer(0), &file, 0..1).unwrap_err();
        assert!(error.to_string().contains("at least 1"), "{error}");
        let typo = Requirement {
            role: "reviewr".into(),
            approvals: 1,
        };
        let error = roles.check(&typo, &file, 0..1).unwrap_err();
        assert!(error.to_string().contains("`reviewer`"), "{error}");
    }

    #[test]
    fn distinct_holders_other_than_the_starter_count() {
        let two = Requirement {
            role: "reviewer".into(),
            approvals: 2,
        };
        let alice = approval("alice (uid 1000)", &["reviewer"]);
        // The starter, a repeat, and someone without the role do not count.
        let approvals = [
            approval("root (uid 0)", &["reviewer"]),
            alice.clone(),
            alice.clone(),
            approval("uid 7", &["maintainer"]),
        ];
        assert_eq!(
            two.met_by(&approvals, STARTER).unwrap_err(),
            "needs 2 distinct reviewers other than the account that started the run; \
             has 1: alice (uid 1000)"
        );
        // One uid under two names is one approver, and the starter under another name is still
        // the starter.
        let renamed = [
            alice.clone(),
            approval("someone-else (uid 1000)", &["reviewer"]),
            approval("admin (uid 0)", &["reviewer"]),
        ];
        assert_eq!(
            two.met_by(&renamed, STARTER).unwrap_err(),
            "needs 2 distinct reviewers other than the account that started the run; \
             has 1: alice (uid 1000)"
        );
        let approvals = [alice, approval("uid 7", &["reviewer"])];
        two.met_by(&approvals, STARTER).unwrap();
        let one = Requirement {
            role: "maintainer".into(),
            approvals: 1,
        };
        assert_eq!(
            one.met_by(&[], STARTER).unwrap_err(),
            "needs 1 maintainer other than the account that started the run; has none"
        );
    }

    #[test]
    fn the_shipped_roles_give_the_only_account_of_a_fresh_clone_both_roles() {
        let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let roles = Roles::load(repo).unwrap();
        assert_eq!(roles.held_by_current_process(), ["maintainer", "reviewer"]);
    }

    #[test]
    fn a_requirement_reads_as_an_inline_table() {
        #[derive(Deserialize)]
        struct Embedding {
            weakening: Requirement,
        }
        let parsed: Embedding =
            toml::from_str("weakening = { role = \"maintainer\", approvals = 1 }").unwrap();
        assert_eq!(parsed.weakening.role, "maintainer");
        assert_eq!(parsed.weakening.approvals, 1);
    }
}
