//! The store rows of ``processor/store``: keys as ``keys.py`` builds them, timers as
//! ``model/due.py`` derives them, claims as ``StoreBatch.put_claim`` writes them.

use std::collections::BTreeSet;

use crate::reduce::Fact;
use crate::state::RunState;

pub type Error = String;

pub fn string_key(value: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

/// ``keys.string_key``: a run's key, a claim's key.
pub fn string_key_of(value: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(value.len() + 4);
    string_key(value, &mut key);
    key
}

/// ``keys.history_key``: (run id, seq of the chunk's first fact).
pub fn history_key(run_id: &str, seq: &[u8; 8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(run_id.len() + 12);
    string_key(run_id, &mut key);
    key.extend_from_slice(seq);
    key
}

/// An encoded fact without its run id (the key of its history row holds it): its
/// single-object header, and its Avro body after the run id.
#[derive(Clone, Copy)]
pub struct Stripped<'a> {
    pub header: &'a [u8],
    pub body: &'a [u8],
}

/// ``history.encode_chunk``: each fact without its run id, length-prefixed, in journal
/// order.
pub fn history_chunk(facts: &[(&Fact, Stripped)]) -> Vec<u8> {
    let size = |fact: &Stripped| fact.header.len() + fact.body.len();
    let mut chunk = Vec::with_capacity(facts.iter().map(|(_, fact)| 4 + size(fact)).sum());
    for (_, fact) in facts {
        chunk.extend_from_slice(&(size(fact) as u32).to_be_bytes());
        chunk.extend_from_slice(fact.header);
        chunk.extend_from_slice(fact.body);
    }
    chunk
}

pub fn u64_bytes(value: i64) -> Result<[u8; 8], Error> {
    u64::try_from(value)
        .map(u64::to_be_bytes)
        .map_err(|_| format!("{value} does not fit an unsigned 64-bit key"))
}

/// A due-work row: (due ms, run id, kind code, scope, ordinal), ordered as the key.
pub type Due = (i64, String, u8, i64, i64);

const ATTEMPT_TIMEOUT: u8 = 1;
const RETRY: u8 = 2;
const INTERACTION_TIMEOUT: u8 = 3;
const PUBLICATION: u8 = 4;
const RUN_DEADLINE: u8 = 5;
const COMPENSATION_TIMEOUT: u8 = 6;
const COMPENSATION_RETRY: u8 = 7;

/// ``due.due_entries``: every timer the run waits on (none once terminal).
pub fn due_entries(state: Option<&RunState>) -> BTreeSet<Due> {
    let mut entries = BTreeSet::new();
    let Some(s) = state else { return entries };
    if s.terminal() {
        return entries;
    }
    let run_id = || s.run_id.clone();
    if let (Some(deadline), None) = (s.deadline_ms, &s.stop_reason) {
        entries.insert((deadline, run_id(), RUN_DEADLINE, 0, 0));
    }
    let step = s.compensating_step.unwrap_or(0);
    let generation = s.compensation_generation;
    let timer = match s.phase.as_str() {
        "compensating" => s
            .compensation_expires_ms
            .map(|expiry| (expiry, COMPENSATION_TIMEOUT, step, generation)),
        "compensation_retry_wait" => s
            .compensation_retry_due_ms
            .map(|due| (due, COMPENSATION_RETRY, step, generation)),
        "dispatched" => s
            .attempt_expires_ms
            .map(|expiry| (expiry, ATTEMPT_TIMEOUT, s.segment, s.generation)),
        "retry_wait" => s
            .retry_due_ms
            .map(|due| (due, RETRY, s.segment, s.generation)),
        "publishing" => s.publication_due_ms.map(|due| (due, PUBLICATION, 0, 0)),
        "suspended" => {
            for i in s.interactions.values() {
                if i.boundary == s.boundary && i.status == "open" && i.deadline_ms > 0 {
                    let entry = (
                        i.deadline_ms,
                        run_id(),
                        INTERACTION_TIMEOUT,
                        i.boundary,
                        i.item_index,
                    );
                    entries.insert(entry);
                }
            }
            None
        }
        _ => None,
    };
    if let Some((due_ms, kind, scope, ordinal)) = timer {
        entries.insert((due_ms, run_id(), kind, scope, ordinal));
    }
    entries
}

pub fn due_key(entry: &Due) -> Result<Vec<u8>, Error> {
    let (due_ms, run_id, kind, scope, ordinal) = entry;
    let mut key = Vec::with_capacity(run_id.len() + 25);
    key.extend_from_slice(&u64_bytes(*due_ms)?);
    string_key(run_id, &mut key);
    key.push(*kind);
    for part in [scope, ordinal] {
        let part = u32::try_from(*part).map_err(|_| format!("{part} does not fit 32 bits"))?;
        key.extend_from_slice(&part.to_be_bytes());
    }
    Ok(key)
}

/// The claims row's value: Python's ``json.dumps({"run_id": ..., "fingerprint": ...})``.
pub fn claim_value(run_id: &str, fingerprint: Option<&str>) -> Vec<u8> {
    let mut out = String::from("{\"run_id\": ");
    python_json_string(run_id, &mut out);
    out.push_str(", \"fingerprint\": ");
    match fingerprint {
        Some(text) => python_json_string(text, &mut out),
        None => out.push_str("null"),
    }
    out.push('}');
    out.into_bytes()
}

/// A JSON string as ``json.dumps`` writes it by default (``ensure_ascii=True``).
fn python_json_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}
