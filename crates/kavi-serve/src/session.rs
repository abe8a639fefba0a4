//! Who may use the page: whoever started the server. A page on loopback is reachable by every
//! account of the machine, and the page decides as the account running the server, so reading a
//! page (and the forms' token in it) needs the key `kavi serve` printed, as a notebook server's
//! token does: `?key=` on any address sets it as a cookie, and redirects to the address without
//! it.
//!
//! A browser sends a cookie to every port of the host that set it, so a cookie of `127.0.0.1`
//! would reach any other account's server on `127.0.0.1`. On loopback the server is therefore
//! served under a name made at random for each start, `kavi-<hex>.localhost` (browsers resolve
//! `*.localhost` to loopback themselves), the cookie is that name's alone, and a request that
//! names any other host is refused: another server only receives the cookie if the browser is
//! sent to that name, which only the starter was told (and a rebound name of another site never
//! reaches the pages).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Shared;
use crate::pages::refusal;

/// The cookie's name; the host it is bound to is this server's own.
const COOKIE: &str = "kavi_key";

/// Whether `given`, a request's `Host`, is `host` (a name's case does not matter).
fn named(given: Option<&str>, host: &str) -> bool {
    given.is_some_and(|given| given.eq_ignore_ascii_case(host))
}

/// Answers only requests sent to the name this server printed, unless it serves beyond
/// loopback. The refusal does not say the name: whoever sent it there was not told it.
pub async fn named_host(State(app): State<Shared>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    match &app.host {
        Some(host) if !named(given, host) => refusal(
            &app,
            StatusCode::MISDIRECTED_REQUEST,
            "refused: this server answers only to the address `kavi serve` printed when it \
             started; this request names another host (another name of loopback, or a site \
             whose name leads here); nothing was read or recorded",
        ),
        _ => next.run(request).await,
    }
}

/// Equal without saying where they differ first, so that timing tells nothing of the key.
fn same_key(given: &str, key: &str) -> bool {
    given.len() == key.len()
        && given
            .bytes()
            .zip(key.bytes())
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

/// The `key` a query gives, if it gives one.
fn query_key(query: &str) -> Option<&str> {
    query.split('&').find_map(|pair| pair.strip_prefix("key="))
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (cookie, value) = pair.trim().split_once('=')?;
            (cookie == name).then_some(value)
        })
}

/// Answers a request that carries the key (as the cookie, or once as `?key=`); refuses any
/// other, reading and recording nothing.
pub async fn with_key(State(app): State<Shared>, request: Request, next: Next) -> Response {
    if let Some(given) = request.uri().query().and_then(query_key)
        && same_key(given, &app.key)
    {
        // No `Domain`: the cookie is this host's (this start's name) alone.
        let cookie = format!("{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/", app.key);
        let to = request.uri().path().to_owned();
        return (
            StatusCode::SEE_OTHER,
            [(header::SET_COOKIE, cookie), (header::LOCATION, to)],
        )
            .into_response();
    }
    if cookie(request.headers(), COOKIE).is_some_and(|given| same_key(given, &app.key)) {
        return next.run(request).await;
    }
    refusal(
        &app,
        StatusCode::UNAUTHORIZED,
        "refused: open the address `kavi serve` printed when it started (it ends with \
         `?key=...`): this server answers only whoever holds its key; nothing was read or \
         recorded",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_read_from_the_query_and_this_servers_cookie_only() {
        assert_eq!(query_key("a=1&key=abc"), Some("abc"));
        assert_eq!(query_key("monkey=abc"), None);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "kavi_key_8000=other; kavi_key=abc".parse().unwrap(),
        );
        assert_eq!(cookie(&headers, COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "kavi_key_9"), None);
        assert!(same_key("abc", "abc"));
        assert!(!same_key("abd", "abc"));
        assert!(!same_key("ab", "abc"));
    }

    #[test]
    fn only_the_printed_name_is_answered() {
        let host = "kavi-3f2a.localhost:8321";
        assert!(named(Some(host), host));
        assert!(named(Some("KAVI-3F2A.localhost:8321"), host));
        for other in [
            "127.0.0.1:8321",
            "localhost:8321",
            "[::1]:8321",
            "kavi-3f2a.localhost:8322",
            "kavi-3f2a.localhost",
            "x.kavi-3f2a.localhost:8321",
            "rebound.example:8321",
        ] {
            assert!(!named(Some(other), host), "{other}");
        }
        assert!(!named(None, host), "no Host at all");
    }
}
