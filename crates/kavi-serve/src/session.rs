//! Who may use the page: whoever holds this server's key. A page on loopback is reachable by
//! every account of the machine, and the page decides as the account running the server, so
//! reading a page (and the forms' token in it) needs the key `kavi serve` printed, as a
//! notebook server's token does: `?key=` on any address sets it as a cookie only this server's
//! pages send, and redirects to the address without it.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Shared;
use crate::pages::refusal;

/// The cookie's name: cookies are kept per host, not per port, so each server's is its own.
fn cookie_name(port: u16) -> String {
    format!("kavi_key_{port}")
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
    let name = cookie_name(app.port);
    if let Some(given) = request.uri().query().and_then(query_key)
        && same_key(given, &app.key)
    {
        let cookie = format!("{name}={}; HttpOnly; SameSite=Strict; Path=/", app.key);
        let to = request.uri().path().to_owned();
        return (
            StatusCode::SEE_OTHER,
            [(header::SET_COOKIE, cookie), (header::LOCATION, to)],
        )
            .into_response();
    }
    if cookie(request.headers(), &name).is_some_and(|given| same_key(given, &app.key)) {
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
            "kavi_key_8000=other; kavi_key_8321=abc".parse().unwrap(),
        );
        assert_eq!(cookie(&headers, &cookie_name(8321)), Some("abc"));
        assert_eq!(cookie(&headers, &cookie_name(9)), None);
        assert!(same_key("abc", "abc"));
        assert!(!same_key("abd", "abc"));
        assert!(!same_key("ab", "abc"));
    }
}
