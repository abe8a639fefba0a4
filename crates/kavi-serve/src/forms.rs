//! The approve and reject forms, and a rule change's approve, reject and adopt. A decision is
//! taken only from this server's own page (its token, and an `Origin` that is this server), only
//! on the run as the page showed it, and then through `kavi_governance::review::decide`, the
//! function `kavi approve` and `kavi reject` call (or `kavi_governance::adoption`'s, as `kavi
//! policy` does): whatever the CLI refuses, the page refuses, recorded as the account running
//! the server.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use kavi_foundation::state::RunStatus;
use kavi_governance::adoption;
use kavi_governance::review::{self, Outcome, Verdict};
use kavi_ledger::Ledger;

use crate::pages::{page, refusal};
use crate::{Shared, evidence};

#[derive(Deserialize)]
pub struct Decision {
    token: String,
    /// The run's state as the page showed it ([`evidence::fingerprint`]).
    seen: String,
    /// `approve` or `reject`.
    verdict: String,
    #[serde(default)]
    comment: String,
}

/// Whether the request comes from a page of this server: browsers send `Origin` with every
/// form post, and a page elsewhere cannot make it this server's.
fn same_origin(headers: &HeaderMap) -> bool {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    match (header(header::ORIGIN), header(header::HOST)) {
        (Some(origin), Some(host)) => origin == format!("http://{host}"),
        _ => false,
    }
}

/// The refusal of a form not sent from this server's own page; `None` for one that was.
fn not_from_our_page(app: &Shared, headers: &HeaderMap, form: &Decision) -> Option<Response> {
    if !same_origin(headers) {
        return Some(refusal(
            app,
            StatusCode::FORBIDDEN,
            "refused: the form was not sent from this server's page (its Origin is another \
             site's, or missing); nothing was recorded",
        ));
    }
    if form.token != app.token {
        return Some(refusal(
            app,
            StatusCode::FORBIDDEN,
            "refused: the form's token is not this server's (reload the page: a token lasts \
             as long as the server); nothing was recorded",
        ));
    }
    None
}

/// A decision the form does not offer.
fn not_a_decision(app: &Shared, verdict: &str, offered: &str) -> Response {
    refusal(
        app,
        StatusCode::BAD_REQUEST,
        &format!("refused: `{verdict}` is not a decision ({offered})"),
    )
}

/// Runs a decision off the async threads.
async fn blocking(
    app: Shared,
    decide: impl FnOnce(&Shared) -> Response + Send + 'static,
) -> Response {
    let task = tokio::task::spawn_blocking(move || decide(&app));
    task.await.unwrap_or_else(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the decision did not finish: {e}"),
        )
            .into_response()
    })
}

pub async fn decide(
    State(app): State<Shared>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    form: axum::Form<Decision>,
) -> Response {
    if let Some(refused) = not_from_our_page(&app, &headers, &form) {
        return refused;
    }
    let verdict = match form.verdict.as_str() {
        "approve" => Verdict::Approve,
        "reject" => Verdict::Reject,
        other => return not_a_decision(&app, other, "approve or reject"),
    };
    blocking(app, move |app| decide_blocking(app, id, verdict, &form)).await
}

/// What the page may do to a pending rule change, each as its `kavi policy` command does.
#[derive(Clone, Copy)]
enum RuleVerdict {
    Approve,
    Reject,
    Adopt,
}

/// `kavi policy approve ID`, `kavi policy reject ID` and `kavi policy adopt ID` from the page:
/// through `kavi_governance::adoption`, as the CLI, on the rule change as the page showed it.
pub async fn decide_rules(
    State(app): State<Shared>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    form: axum::Form<Decision>,
) -> Response {
    if let Some(refused) = not_from_our_page(&app, &headers, &form) {
        return refused;
    }
    let verdict = match form.verdict.as_str() {
        "approve" => RuleVerdict::Approve,
        "reject" => RuleVerdict::Reject,
        "adopt" => RuleVerdict::Adopt,
        other => return not_a_decision(&app, other, "approve, reject or adopt"),
    };
    blocking(app, move |app| {
        let workspace = &app.workspace;
        let now = Ledger::open_existing(&workspace.config.ledger)
            .map_err(|e| e.to_string())
            .and_then(|ledger| evidence::rules_fingerprint(&ledger, id));
        match now {
            Ok(now) if now == form.seen => {}
            Ok(_) => {
                return refusal(
                    app,
                    StatusCode::CONFLICT,
                    &format!(
                        "refused: rule change {id} changed since the page was shown; nothing \
                         was recorded. Read the page again before deciding."
                    ),
                );
            }
            Err(e) => return refusal(app, StatusCode::NOT_FOUND, &e),
        }
        let lines = match verdict {
            RuleVerdict::Approve => adoption::approve(workspace, id).map(|approved| {
                let roles = match approved.roles.is_empty() {
                    true => "none".to_owned(),
                    false => approved.roles.join(", "),
                };
                vec![
                    format!(
                        "approved rule change {id} by {} (roles: {roles})",
                        approved.actor
                    ),
                    match approved.missing {
                        None => format!(
                            "its approvals are complete: adopt it with `kavi policy adopt {id}`"
                        ),
                        Some(missing) => format!("not yet adoptable: {missing}"),
                    },
                ]
            }),
            RuleVerdict::Reject => adoption::reject(workspace, id)
                .map(|actor| vec![format!("rejected rule change {id} by {actor}")]),
            RuleVerdict::Adopt => {
                adoption::adopt(workspace, id).map(|adopted| adoption::adopted_lines(&adopted))
            }
        };
        match lines {
            Ok(lines) => page(
                app,
                "decided.html",
                minijinja::context! { title => format!("rule change {id}"), lines },
            ),
            Err(e) => refusal(
                app,
                StatusCode::FORBIDDEN,
                &format!("refused: {e}; nothing was decided"),
            ),
        }
    })
    .await
}

fn decide_blocking(app: &Shared, id: i64, verdict: Verdict, form: &Decision) -> Response {
    let workspace = &app.workspace;
    let root = match Ledger::open_existing(&workspace.config.ledger)
        .map_err(|e| e.to_string())
        .and_then(|ledger| {
            let root = ledger.root_run(id).map_err(|e| e.to_string())?;
            let now = evidence::fingerprint(&ledger, root.id)?;
            Ok((root, now))
        }) {
        Ok((root, now)) if now == form.seen => root,
        Ok((root, _)) => {
            return refusal(
                app,
                StatusCode::CONFLICT,
                &format!(
                    "refused: run {} changed since the page was shown (it is {} now); nothing \
                     was recorded. Read the page again before deciding.",
                    root.id, root.status
                ),
            );
        }
        Err(e) => return refusal(app, StatusCode::NOT_FOUND, &e),
    };
    let comment = Some(form.comment.trim()).filter(|c| !c.is_empty());
    let mut steps = Vec::new();
    let decided = review::decide(
        workspace,
        &root.id.to_string(),
        verdict,
        comment,
        &mut |line| steps.push(line),
    );
    let review = match decided {
        Ok(review) => review,
        Err(e) => {
            return refusal(
                app,
                StatusCode::FORBIDDEN,
                &format!("refused: {e}; nothing was decided"),
            );
        }
    };
    let verb = match verdict {
        Verdict::Approve => "approved",
        Verdict::Reject => "rejected",
    };
    let (title, mut lines) = match review.outcome {
        Outcome::NeedsApprovals(missing) => (
            format!("approval of run {} recorded", review.root.id),
            vec![format!(
                "recorded the approval by {}; it stays awaiting review: {missing}",
                review.actor
            )],
        ),
        Outcome::Waiting => (
            format!("run {} still awaits review", review.root.id),
            Vec::new(),
        ),
        Outcome::Decided(decided) => {
            let mut lines: Vec<String> = decided
                .escalations
                .iter()
                .map(|e| format!("{verb} `{}` by {}", e.skill, review.actor))
                .collect();
            lines.extend(decided.undone);
            // As `kavi approve` does: a run that stopped for more than lifecycle moves goes on.
            if verdict == Verdict::Approve
                && !decided.only_moves
                && review.root.status == RunStatus::AwaitingReview
            {
                lines.push(format!(
                    "resuming run {} ({}): the resumed run is listed under Runs",
                    review.root.id, review.root.spec_path
                ));
                app.cli.resume(workspace, review.root.clone());
            }
            (format!("run {} {verb}", review.root.id), lines)
        }
    };
    steps.append(&mut lines);
    page(
        app,
        "decided.html",
        minijinja::context! { title, run => review.root.id, lines => steps },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_post_is_same_origin_only_with_this_servers_origin() {
        let ours = [
            (header::HOST, "127.0.0.1:8321"),
            (header::ORIGIN, "http://127.0.0.1:8321"),
        ];
        assert!(same_origin(&headers(&ours)));
        for origin in [
            "http://attacker.example",
            "https://127.0.0.1:8321",
            "http://127.0.0.1:8322",
            "null",
        ] {
            let theirs = [(header::HOST, "127.0.0.1:8321"), (header::ORIGIN, origin)];
            assert!(!same_origin(&headers(&theirs)), "{origin}");
        }
        assert!(
            !same_origin(&headers(&[(header::HOST, "127.0.0.1:8321")])),
            "a post without Origin"
        );
    }
}
