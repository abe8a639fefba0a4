//! Approvals signed by their givers' own keys, where the adopted roles pin them.
//!
//! Every account that writes a ledger holds the journal key, so the ledger alone cannot tell
//! an approval its giver made from one another account wrote under their name. Once
//! `policies/roles.toml` pins accounts' keys (`[keys]`), each approval is signed by its giver's
//! own key, over the ledger's identity, what it approves and who approves it, and only those
//! signed by the key pinned for their giver count: a rule change's, an escalation's, a lifecycle
//! move's alike.

use crate::ledger::{Ledger, RecordedApproval, checkpoint, keys};
use crate::policy::roles::{DEFAULT_POLICY as ROLES, Roles};
use crate::{GovernanceError, Result};

/// What an approval is of: its kind, the row's id, and what the row says is approved (so that
/// the signature counts for nothing else).
pub(crate) struct Subject {
    pub kind: &'static str,
    pub id: i64,
    pub what: String,
}

impl Subject {
    fn message(&self, ledger_id: &str, actor: &str) -> String {
        format!(
            "kavi-approval-v1\n{ledger_id}\n{}\n{}\n{}\n{actor}",
            self.kind, self.id, self.what
        )
    }
}

/// The current account's own key, ready to sign its approvals; `None` where the roles pin no
/// keys (nothing is signed).
pub(crate) struct Signer {
    key: checkpoint::SigningKey,
    ledger_id: String,
    actor: String,
}

impl Signer {
    /// Refuses an account whose own key is not the one the roles pin for it: what it signed
    /// would not count.
    pub(crate) fn for_actor(
        roles: Option<&Roles>,
        ledger: &Ledger,
        actor: &str,
    ) -> Result<Option<Self>> {
        let Some(roles) = roles.filter(|roles| roles.pins_keys()) else {
            return Ok(None);
        };
        let key =
            checkpoint::load_or_generate(&keys::person_key()).map_err(GovernanceError::Usage)?;
        let public = checkpoint::public_hex(&key.verifying_key());
        if roles.pinned_key(actor) != Some(public.as_str()) {
            return Err(GovernanceError::Usage(format!(
                "{actor}'s own key ({}) is not the one the adopted {ROLES} pins for this account: \
                 an approval it signs would not count (`kavi policy key` prints the key to pin)",
                checkpoint::short(&public)
            )));
        }
        Ok(Some(Self {
            key,
            ledger_id: ledger_id(ledger)?,
            actor: actor.to_owned(),
        }))
    }

    pub(crate) fn sign(&self, subject: &Subject) -> String {
        format!(
            "ed25519:{}",
            checkpoint::sign(&self.key, &subject.message(&self.ledger_id, &self.actor))
        )
    }
}

/// The approvals of `subject` that count under `roles`: every one where no account's key is
/// pinned; else only those its giver's pinned key signed.
pub(crate) fn vouched(
    roles: Option<&Roles>,
    ledger: &Ledger,
    subject: &Subject,
    approvals: &[RecordedApproval],
) -> Result<Vec<RecordedApproval>> {
    let Some(roles) = roles.filter(|roles| roles.pins_keys()) else {
        return Ok(approvals.to_vec());
    };
    let ledger_id = ledger_id(ledger)?;
    Ok(approvals
        .iter()
        .filter(|approval| {
            let signature = approval
                .signature
                .as_deref()
                .and_then(|s| s.strip_prefix("ed25519:"));
            match (roles.pinned_key(&approval.actor), signature) {
                (Some(key), Some(signature)) => checkpoint::holds(
                    key,
                    signature,
                    &subject.message(&ledger_id, &approval.actor),
                ),
                _ => false,
            }
        })
        .cloned()
        .collect())
}

fn ledger_id(ledger: &Ledger) -> Result<String> {
    ledger.identity()?.ok_or_else(|| {
        GovernanceError::Usage("the ledger has no identity yet: run any kavi command on it".into())
    })
}
