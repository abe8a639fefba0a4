//! The foundation every other kavi crate stands on, and that depends on none of them: how a
//! problem in a file is reported ([`diagnostic`]), what kavi exits with ([`exit`]), the states a run goes through ([`state`]), who
//! acts ([`identity`]), how secrets stay out of what kavi keeps ([`redact`]), how content is named
//! ([`hash`]), how files are opened and copied without trusting what is in their place
//! ([`files`], [`sandbox`]), side-effect classes ([`side_effect`]), templates ([`template`]),
//! JSON Schema checks of values ([`json_schema`]) and JSONPath ([`jsonpath`]).

pub mod content;
pub mod diagnostic;
pub mod exit;
pub mod files;
pub mod hash;
pub mod identity;
pub mod json_schema;
pub mod jsonpath;
pub mod redact;
pub mod removal;
pub mod sandbox;
pub mod side_effect;
pub mod state;
pub mod template;
pub mod vcs;
