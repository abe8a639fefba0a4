//! Building the tables as toml's parser reports each event, from tokens lexed a chunk at a
//! time ([`Chunks`]).

use std::borrow::Cow;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeArray, DeTable, DeValue};
use toml::map::Entry;
use toml_parser::decoder::{Encoding, ScalarKind};
use toml_parser::lexer::{Token, TokenKind};
use toml_parser::parser::EventReceiver;
use toml_parser::{ErrorSink, Raw, Source, Span};

use super::{DEPTH_LIMIT, Key, Taker};

/// About how many tokens are parsed at a time. Lexing the whole 10,000-node pipeline of
/// `benches/bench.sh` first held some 300,000 tokens, 7 MB that were written once and dropped;
/// a chunk this size is reused and stays in the cache. Tests use tiny chunks, so that every
/// document they compare is cut in many places.
const CHUNK_TOKENS: usize = if cfg!(test) { 8 } else { 4096 };

/// The document's tokens, lexed a chunk at a time. A chunk ends only before a `[` that opens
/// a line outside any bracket, so between two expressions: a table header. Its tokens are the
/// ones lexing the whole text gives (one lexer reads it all, spans count from its start), and
/// toml's parser gives the same events for them chunk by chunk as in one go, because it keeps
/// nothing from one expression to the next.
pub(super) struct Chunks<'i> {
    lexer: toml_parser::lexer::Lexer<'i>,
    pub(super) tokens: Vec<Token>,
    /// The header bracket that ended the last chunk: the next one starts with it.
    carried: Option<Token>,
    /// Brackets and braces open (headers' too); negative in a malformed document.
    depth: i64,
    after_newline: bool,
    done: bool,
}

impl<'i> Chunks<'i> {
    pub(super) fn new(source: Source<'i>) -> Self {
        Chunks {
            lexer: source.lex(),
            tokens: Vec::with_capacity(CHUNK_TOKENS),
            carried: None,
            depth: 0,
            after_newline: true,
            done: false,
        }
    }

    pub(super) fn next_chunk(&mut self) -> Option<&[Token]> {
        if self.done {
            return None;
        }
        self.tokens.clear();
        self.tokens.extend(self.carried.take());
        for token in self.lexer.by_ref() {
            let kind = token.kind();
            if kind == TokenKind::LeftSquareBracket
                && self.depth == 0
                && self.after_newline
                && self.tokens.len() >= CHUNK_TOKENS
            {
                self.carried = Some(token);
                self.depth = 1;
                self.after_newline = false;
                return Some(&self.tokens);
            }
            match kind {
                TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => self.depth += 1,
                TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => self.depth -= 1,
                _ => {}
            }
            self.after_newline = kind == TokenKind::Newline;
            self.tokens.push(token);
        }
        self.done = true;
        Some(&self.tokens)
    }
}

/// The tables built so far, and where in the document the parser is.
pub(super) struct Builder<'s, 'i> {
    /// The whole document: spans index it.
    pub(super) text: &'i str,
    /// Where the part this builder reads starts in `text`: the parser's spans count from there.
    base: usize,
    pub(super) root: DeTable<'i>,
    /// The table that the key/value lines since the last header fill (before the first header,
    /// the root's own lines). As in toml, it joins the tree when the next header starts.
    section: DeTable<'i>,
    /// The header that opened `section`: its own key and its span.
    pub(super) header: Option<(Key<'i>, Range<usize>)>,
    /// The keys leading to that header's table.
    header_path: Vec<Key<'i>>,
    /// Where the header being read starts.
    header_start: usize,
    /// The keys read since the last `=` or header. Like `header_path` and `pending`, it is
    /// swapped and cleared rather than replaced, so a line allocates no vector.
    pub(super) keys: Vec<Key<'i>>,
    /// The document-level key whose value is being read, when `awaiting` one.
    pending: Vec<Key<'i>>,
    awaiting: bool,
    /// The arrays and inline tables open, innermost last.
    pub(super) open: Vec<Open<'i>>,
    /// The items of the open arrays, outermost first: each array is made at its `]`, at its
    /// size. Pushed one by one, toml's arrays started at room for four items, and most of a
    /// pipeline's hold one (`run = ["make"]`).
    pub(super) items: Vec<Spanned<DeValue<'i>>>,
    /// Something this reader leaves to toml was met.
    pub(super) unsupported: bool,
    /// Tables handed over as they end, when the caller takes them ([`parse_taking`]).
    pub(super) taking: Option<Taking<'s, 'i>>,
}

/// Handing `[PREFIX.NAME]` tables over as they end (see [`parse_taking`]).
pub(super) struct Taking<'s, 'i> {
    pub(super) prefix: &'s str,
    /// The document-level keys the taker reads: a header under one of them after a table was
    /// handed over means the taker read too early.
    pub(super) reads: &'s [&'s str],
    pub(super) taker: &'s mut dyn Taker<'i>,
    /// The last `[PREFIX.NAME]` table read, held until the next header shows that no header
    /// adds to it. A table with nothing in it stands for it in the tree, so that the name is
    /// known there.
    pub(super) held: Option<(Key<'i>, Range<usize>, DeTable<'i>)>,
    pub(super) handed: usize,
    pub(super) state: TakingState,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TakingState {
    Taking,
    /// The tables from here on stay in the tree: a header added to the held one, the taker
    /// gave one back, or the prefix's table held others before the first.
    Stopped,
    /// A header reached into a table already handed over, or into what the taker read: the
    /// document must be read again, with nothing handed over.
    Spoiled,
}

pub(super) enum Open<'i> {
    Array {
        start: usize,
        /// Where its items start in [`Builder::items`].
        first: usize,
    },
    Table {
        start: usize,
        table: DeTable<'i>,
        /// The key whose value is being read.
        key: Option<Key<'i>>,
    },
}

impl<'s, 'i> Builder<'s, 'i> {
    pub(super) fn new(text: &'i str, base: usize) -> Self {
        Self {
            text,
            base,
            root: DeTable::new(),
            section: DeTable::new(),
            header: None,
            header_path: Vec::new(),
            header_start: 0,
            keys: Vec::new(),
            pending: Vec::new(),
            awaiting: false,
            open: Vec::new(),
            items: Vec::new(),
            unsupported: false,
            taking: None,
        }
    }

    /// The tables, once the part has ended where an expression may end.
    pub(super) fn finish(mut self) -> Option<DeTable<'i>> {
        self.end().then_some(self.root)
    }

    /// Ends the part: its last section joins the tree and the held table is handed over.
    /// `false` when the part ended inside an expression or met what is left to toml.
    pub(super) fn end(&mut self) -> bool {
        if self.unsupported || !self.open.is_empty() || self.awaiting {
            return false;
        }
        self.finish_section();
        self.hand_over_held();
        !self.unsupported
    }

    /// Where `span` starts and ends in the whole document.
    pub(super) fn at(&self, span: Span) -> Range<usize> {
        self.base + span.start()..self.base + span.end()
    }

    /// Puts the finished section into the tree, under its header.
    fn finish_section(&mut self) {
        let table = std::mem::take(&mut self.section);
        match self.header.take() {
            None => self.root = table,
            Some((key, span)) => {
                let text = self.text;
                let taking = self.taking.as_mut().filter(|taking| {
                    taking.state == TakingState::Taking
                        && matches!(&self.header_path[..], [prefix] if prefix.get_ref() == taking.prefix)
                });
                match descend(&mut self.root, &self.header_path, text) {
                    Some(parent) => match taking {
                        Some(taking) if taking.handed > 0 || parent.is_empty() => {
                            let placeholder = DeValue::Table(DeTable::new());
                            parent.insert(key.clone(), Spanned::new(span.clone(), placeholder));
                            taking.held = Some((key, span, table));
                        }
                        _ => {
                            if let Some(taking) = taking {
                                taking.state = TakingState::Stopped;
                            }
                            parent.insert(key, Spanned::new(span, DeValue::Table(table)));
                        }
                    },
                    None => self.unsupported = true,
                }
            }
        }
    }

    /// Hands the held table over, or, when the taker gives it back, puts it in the tree and
    /// stops taking.
    fn hand_over_held(&mut self) {
        let Some(taking) = self.taking.as_mut() else {
            return;
        };
        let Some((key, span, table)) = taking.held.take() else {
            return;
        };
        let table = Spanned::new(span, DeValue::Table(table));
        match taking.taker.take(&self.root, key.clone(), table) {
            None => taking.handed += 1,
            Some(given_back) => {
                taking.state = TakingState::Stopped;
                self.put_back(&key, given_back);
            }
        }
    }

    /// Puts a held table in the tree, where the table that stood for it is.
    pub(super) fn put_back(&mut self, key: &Key<'i>, table: Spanned<DeValue<'i>>) {
        let Some(taking) = &self.taking else {
            return;
        };
        let slot = self
            .root
            .get_mut(taking.prefix)
            .and_then(|prefix| match prefix.get_mut() {
                DeValue::Table(named) => named.get_mut(key.get_ref().as_ref()),
                _ => None,
            });
        match slot {
            Some(slot) => *slot = table,
            None => self.unsupported = true,
        }
    }

    /// Before a header's path is followed: the held table is handed over, unless this header
    /// adds to it; a header into a table handed over, or into what the taker read, spoils the
    /// reading.
    fn settle_held(&mut self, key: &Key<'i>) {
        let Some(taking) = &self.taking else {
            return;
        };
        if taking.state != TakingState::Taking {
            return;
        }
        let mut path = self
            .header_path
            .iter()
            .chain(std::iter::once(key))
            .map(|key| key.get_ref().as_ref());
        let (first, second, deeper) = (path.next(), path.next(), path.next().is_some());
        let into_taken = deeper && first == Some(taking.prefix);
        let adds_to_held = into_taken
            && taking
                .held
                .as_ref()
                .is_some_and(|(name, _, _)| second == Some(name.get_ref().as_ref()));
        let into_read = first.is_some_and(|first| taking.reads.contains(&first));
        if adds_to_held {
            if let Some(taking) = self.taking.as_mut()
                && let Some((name, span, table)) = taking.held.take()
            {
                taking.state = TakingState::Stopped;
                self.put_back(&name, Spanned::new(span, DeValue::Table(table)));
            }
            return;
        }
        if into_taken {
            self.spoil();
            return;
        }
        self.hand_over_held();
        if into_read && self.taking.as_ref().is_some_and(|taking| taking.handed > 0) {
            self.spoil();
        }
    }

    fn spoil(&mut self) {
        if let Some(taking) = self.taking.as_mut() {
            taking.state = TakingState::Spoiled;
        }
    }

    /// A header was read: its path must lead through tables toml would extend, and its key
    /// must be new there (toml reopens a table a header path made; that is left to toml).
    fn start_section(&mut self, span: Range<usize>) {
        let Some(key) = self.keys.pop() else {
            self.unsupported = true;
            return;
        };
        std::mem::swap(&mut self.keys, &mut self.header_path);
        self.keys.clear();
        if self.header_path.len() >= DEPTH_LIMIT as usize {
            self.unsupported = true;
            return;
        }
        self.settle_held(&key);
        if self
            .taking
            .as_ref()
            .is_some_and(|taking| taking.state == TakingState::Spoiled)
        {
            self.unsupported = true;
            return;
        }
        let text = self.text;
        match descend(&mut self.root, &self.header_path, text) {
            Some(parent) if !parent.contains_key(key.get_ref().as_ref()) => {
                self.header = Some((key, span));
            }
            _ => self.unsupported = true,
        }
    }

    /// Places a value that was just read: in the array or inline table open around it, or
    /// under the document-level key it follows.
    fn deliver(&mut self, value: Spanned<DeValue<'i>>) {
        match self.open.last_mut() {
            Some(Open::Array { .. }) => self.items.push(value),
            Some(Open::Table { table, key, .. }) => match key.take() {
                Some(key) => insert_new(table, key, value, &mut self.unsupported),
                None => self.unsupported = true,
            },
            None => {
                let key = self.pending.pop();
                let Some(key) = key.filter(|_| self.awaiting) else {
                    self.unsupported = true;
                    return;
                };
                self.awaiting = false;
                if self.pending.len() >= DEPTH_LIMIT as usize {
                    self.unsupported = true;
                    return;
                }
                // A dotted key extends the tables earlier dotted keys of this section made,
                // and nothing else: the section starts empty, so a table in it that is not
                // inline was made by a dotted key.
                let text = self.text;
                match descend(&mut self.section, &self.pending, text) {
                    Some(table) => insert_new(table, key, value, &mut self.unsupported),
                    None => self.unsupported = true,
                }
                self.pending.clear();
            }
        }
    }

    pub(super) fn scalar(
        &mut self,
        span: Span,
        encoding: Option<Encoding>,
        errors: &mut dyn ErrorSink,
    ) {
        let at = self.at(span);
        let Some(raw_text) = self.text.get(at.clone()) else {
            self.unsupported = true;
            return;
        };
        let raw = Raw::new_unchecked(raw_text, encoding, span);
        let mut decoded = Cow::Borrowed("");
        let value = match raw.decode_scalar(&mut decoded, errors) {
            ScalarKind::String => DeValue::String(decoded),
            ScalarKind::Boolean(value) => DeValue::Boolean(value),
            // toml keeps numbers and dates in types only it can make: it reads this one
            // alone, which is as rare in a pipeline as numbers are.
            ScalarKind::Integer(_) | ScalarKind::Float | ScalarKind::DateTime => {
                match DeValue::parse(raw_text) {
                    Ok(value) => value.into_inner(),
                    Err(_) => {
                        self.unsupported = true;
                        return;
                    }
                }
            }
        };
        self.deliver(Spanned::new(at, value));
    }
}

/// Inserts `key` into `table`, unless it is there already: toml refuses that, and says how.
fn insert_new<'i>(
    table: &mut DeTable<'i>,
    key: Key<'i>,
    value: Spanned<DeValue<'i>>,
    unsupported: &mut bool,
) {
    match table.entry(key) {
        Entry::Vacant(entry) => {
            entry.insert(value);
        }
        Entry::Occupied(_) => *unsupported = true,
    }
}

/// Follows `path` down from `table`, making each missing table as toml does (spanning the key
/// that made it), through tables that are not inline. `None` where toml would refuse.
///
/// A table's span tells its origin: an inline table's starts at its `{`, a header's at its
/// `[`, and a table made by a header's path or a dotted key spans that key.
fn descend<'t, 'i>(
    mut table: &'t mut DeTable<'i>,
    path: &[Key<'i>],
    text: &str,
) -> Option<&'t mut DeTable<'i>> {
    for key in path {
        let span = key.span();
        let value = match table.entry(key.clone()) {
            Entry::Vacant(entry) => {
                entry.insert(Spanned::new(span, DeValue::Table(DeTable::new())))
            }
            Entry::Occupied(entry) => entry.into_mut(),
        };
        if text.as_bytes().get(value.span().start) == Some(&b'{') {
            return None;
        }
        table = match value.get_mut() {
            DeValue::Table(inner) => inner,
            _ => return None,
        };
    }
    Some(table)
}

impl EventReceiver for Builder<'_, '_> {
    fn std_table_open(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        self.finish_section();
        self.header_start = self.at(span).start;
    }

    fn std_table_close(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        self.start_section(self.header_start..self.at(span).end);
    }

    fn array_table_open(&mut self, _span: Span, _errors: &mut dyn ErrorSink) {
        self.unsupported = true;
    }

    fn inline_table_open(&mut self, span: Span, _errors: &mut dyn ErrorSink) -> bool {
        self.open.push(Open::Table {
            start: self.at(span).start,
            table: DeTable::new(),
            key: None,
        });
        true
    }

    fn inline_table_close(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        match self.open.pop() {
            Some(Open::Table { start, table, .. }) if !self.unsupported => {
                self.deliver(Spanned::new(
                    start..self.at(span).end,
                    DeValue::Table(table),
                ));
            }
            _ => self.unsupported = true,
        }
    }

    fn array_open(&mut self, span: Span, _errors: &mut dyn ErrorSink) -> bool {
        self.open.push(Open::Array {
            start: self.at(span).start,
            first: self.items.len(),
        });
        true
    }

    fn array_close(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        match self.open.pop() {
            Some(Open::Array { start, first }) if !self.unsupported => {
                let items: DeArray<'_> = self.items.drain(first..).collect();
                self.deliver(Spanned::new(
                    start..self.at(span).end,
                    DeValue::Array(items),
                ));
            }
            _ => self.unsupported = true,
        }
    }

    fn simple_key(&mut self, span: Span, encoding: Option<Encoding>, errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        let at = self.at(span);
        let Some(raw_text) = self.text.get(at.clone()) else {
            self.unsupported = true;
            return;
        };
        let mut decoded = Cow::Borrowed("");
        Raw::new_unchecked(raw_text, encoding, span).decode_key(&mut decoded, errors);
        self.keys.push(Spanned::new(at, decoded));
    }

    fn key_val_sep(&mut self, _span: Span, _errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        match self.open.last_mut() {
            None => {
                std::mem::swap(&mut self.keys, &mut self.pending);
                self.awaiting = true;
            }
            Some(Open::Table { key, .. }) if self.keys.len() == 1 => *key = self.keys.pop(),
            // A dotted key in an inline table: left to toml.
            Some(_) => self.unsupported = true,
        }
        self.keys.clear();
    }

    fn scalar(&mut self, span: Span, encoding: Option<Encoding>, errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        Builder::scalar(self, span, encoding, errors);
    }

    fn error(&mut self, _span: Span, _errors: &mut dyn ErrorSink) {
        self.unsupported = true;
    }
}
