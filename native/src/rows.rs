//! The store rows of ``processor/store``: keys as ``keys.py`` builds them, timers as
//! ``model/due.py`` derives them, claims as ``StoreBatch.put_claim`` writes them.

use std::collections::BTreeSet;

use crate::state::RunState;

pub type Error = String;

pub fn string_key(value: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

pub fn history_key(run_id: &str, seq: i64) -> Result<Vec<u8>, Error> {
    let mut key = Vec::with_capacity(run_id.len() + 12);
    string_key(run_id, &mut key);
    key.extend_from_slice(&u64_bytes(seq)?);
    Ok(key)
}

pub fn fact_key_key(run_id: &str, fact_key: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(run_id.len() + fact_key.len() + 8);
    string_key(run_id, &mut key);
    string_key(fact_key, &mut key);
    key
}

pub fn run_key(run_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(run_id.len() + 4);
    string_key(run_id, &mut key);
    key
}

pub fn claim_key(idempotency_key: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(idempotency_key.len() + 4);
    string_key(idempotency_key, &mut key);
    key
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
    match s.phase.as_str() {
        "compensating" if s.compensation_expires_ms.is_some() => {
            let expiry = s.compensation_expires_ms.unwrap_or_default();
            let generation = s.compensation_generation;
            entries.insert((expiry, run_id(), COMPENSATION_TIMEOUT, step, generation));
        }
        "compensation_retry_wait" if s.compensation_retry_due_ms.is_some() => {
            let due = s.compensation_retry_due_ms.unwrap_or_default();
            let generation = s.compensation_generation;
            entries.insert((due, run_id(), COMPENSATION_RETRY, step, generation));
        }
        "dispatched" if s.attempt_expires_ms.is_some() => {
            let expiry = s.attempt_expires_ms.unwrap_or_default();
            entries.insert((expiry, run_id(), ATTEMPT_TIMEOUT, s.segment, s.generation));
        }
        "retry_wait" if s.retry_due_ms.is_some() => {
            let due = s.retry_due_ms.unwrap_or_default();
            entries.insert((due, run_id(), RETRY, s.segment, s.generation));
        }
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
        }
        "publishing" if s.publication_due_ms.is_some() => {
            let due = s.publication_due_ms.unwrap_or_default();
            entries.insert((due, run_id(), PUBLICATION, 0, 0));
        }
        _ => {}
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
