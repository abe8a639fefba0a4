//! One value as either database holds it: what crosses the connection ([`super::db`]), and what
//! the server's client ([`super::postgres`]) binds and reads, which therefore needs nothing of the
//! connection above it.

/// One value, as the database holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}
