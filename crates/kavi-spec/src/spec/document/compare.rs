//! For tests: [`parse`](super::parse) checked against toml itself, keys, values, order and
//! spans.

use super::parts::{parse_parts, take_parts};
use super::{Key, Read, Tables, Taker, parse, parse_taking};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Checks [`parse`] against toml on `text`: `Ok(true)` when it read the text and built exactly
/// toml's tables (keys, values, order and spans), `Ok(false)` when it left the text to toml,
/// and the first difference otherwise. Reading the text in parts, cut before any one line
/// that opens with `[` or before all of them, must leave it to toml or build the same tables.
pub fn agrees_with_toml(text: &str) -> Result<bool, String> {
    let theirs = DeTable::parse(text);
    let agrees = |ours: Option<DeTable<'_>>| -> Result<bool, String> {
        let Some(ours) = ours else {
            return Ok(false);
        };
        let theirs = theirs
            .as_ref()
            .map_err(|e| format!("read a text toml refuses ({})", e.message()))?;
        if theirs.span() != (0..0) {
            return Err(format!("root spans 0..0 and {:?}", theirs.span()));
        }
        same_table(&ours, theirs.get_ref(), "")?;
        Ok(true)
    };
    let whole = agrees(parse(text).map(Spanned::into_inner))?;
    let line_starts: Vec<usize> = text.match_indices("\n[").map(|(at, _)| at + 1).collect();
    for &cut in &line_starts {
        agrees(parse_parts(text, &[cut])).map_err(|e| format!("cut at {cut}: {e}"))?;
    }
    if !line_starts.is_empty() {
        agrees(parse_parts(text, &line_starts)).map_err(|e| format!("cut at every line: {e}"))?;
    }
    // Tables handed over as they are read, put back where their names stand, make the same
    // tree; a reading that hands some over and then is left to toml is one the whole is too.
    // So do those handed over by the first part, with the text cut before any one line that
    // opens with `[` or before all of them.
    let mut cut_sets: Vec<Vec<usize>> = line_starts.iter().map(|&cut| vec![cut]).collect();
    cut_sets.push(line_starts.clone());
    for (prefix, reads) in [("a", &["b"][..]), ("b", &[][..])] {
        for cuts in &cut_sets {
            let mut taken = Collect::default();
            if let Some((mut root, handed)) = take_parts(text, cuts, prefix, reads, &mut taken) {
                put_back(&mut root, prefix, &mut taken, handed)?;
                agrees(Some(root)).map_err(|e| format!("taking {prefix}, cuts {cuts:?}: {e}"))?;
            }
        }
        let mut taken = Collect::default();
        match parse_taking(text, prefix, reads, &mut taken) {
            Read::LeftToToml if whole => return Err(format!("taking {prefix}: left to toml")),
            Read::LeftToToml => {}
            Read::Tables { root, handed } => {
                let mut root = root.into_inner();
                put_back(&mut root, prefix, &mut taken, handed)?;
                let read = agrees(Some(root)).map_err(|e| format!("taking {prefix}: {e}"))?;
                if read != whole {
                    return Err(format!("taking {prefix}: read {read}, whole {whole}"));
                }
            }
        }
    }
    Ok(whole)
}

/// Puts the tables `taken` was handed back where their stand-ins are in `root`.
pub(super) fn put_back<'i>(
    root: &mut DeTable<'i>,
    prefix: &str,
    taken: &mut Collect<'i>,
    handed: usize,
) -> Result<(), String> {
    if handed == 0 {
        return Ok(());
    }
    if handed != taken.0.len() {
        return Err(format!("{handed} handed over, {} taken", taken.0.len()));
    }
    let Some(DeValue::Table(named)) = root.get_mut(prefix).map(Spanned::get_mut) else {
        return Err(format!("no table `{prefix}` for what was handed over"));
    };
    for (name, table) in taken.0.drain(..) {
        let Some(slot) = named.get_mut(name.get_ref().as_ref()) else {
            return Err(format!("no stand-in for `{}`", name.get_ref()));
        };
        *slot = table;
    }
    Ok(())
}

/// Keeps what it is handed.
#[derive(Default)]
pub(super) struct Collect<'i>(Tables<'i>);

impl<'i> Taker<'i> for Collect<'i> {
    fn take(
        &mut self,
        _root: &DeTable<'i>,
        name: Key<'i>,
        table: Spanned<DeValue<'i>>,
    ) -> Option<Spanned<DeValue<'i>>> {
        self.0.push((name, table));
        None
    }
}

fn same_table(ours: &DeTable<'_>, theirs: &DeTable<'_>, at: &str) -> Result<(), String> {
    let keys = |table: &DeTable<'_>| table.keys().map(|k| k.get_ref().to_string()).collect();
    let (our_keys, their_keys): (Vec<String>, Vec<String>) = (keys(ours), keys(theirs));
    if our_keys != their_keys {
        return Err(format!("{at}: keys {our_keys:?} and {their_keys:?}"));
    }
    for ((our_key, our_value), (their_key, their_value)) in ours.iter().zip(theirs.iter()) {
        let at = format!("{at}.{}", our_key.get_ref());
        if our_key.span() != their_key.span() {
            return Err(format!(
                "{at}: key spans {:?} and {:?}",
                our_key.span(),
                their_key.span()
            ));
        }
        same_value(our_value, their_value, &at)?;
    }
    Ok(())
}

fn same_value(
    ours: &Spanned<DeValue<'_>>,
    theirs: &Spanned<DeValue<'_>>,
    at: &str,
) -> Result<(), String> {
    if ours.span() != theirs.span() {
        return Err(format!(
            "{at}: spans {:?} and {:?}",
            ours.span(),
            theirs.span()
        ));
    }
    let same = match (ours.get_ref(), theirs.get_ref()) {
        (DeValue::String(a), DeValue::String(b)) => a == b,
        (DeValue::Integer(a), DeValue::Integer(b)) => {
            a.as_str() == b.as_str() && a.radix() == b.radix()
        }
        (DeValue::Float(a), DeValue::Float(b)) => a.as_str() == b.as_str(),
        (DeValue::Boolean(a), DeValue::Boolean(b)) => a == b,
        (DeValue::Datetime(a), DeValue::Datetime(b)) => a == b,
        (DeValue::Array(a), DeValue::Array(b)) => {
            if a.len() != b.len() {
                return Err(format!("{at}: {} and {} items", a.len(), b.len()));
            }
            for (i, (a, b)) in a.iter().zip(b.iter()).enumerate() {
                same_value(a, b, &format!("{at}[{i}]"))?;
            }
            true
        }
        (DeValue::Table(a), DeValue::Table(b)) => return same_table(a, b, at),
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(format!(
            "{at}: {:?} and {:?}",
            ours.get_ref(),
            theirs.get_ref()
        ))
    }
}
