//! The store rows of ``processor/store``: keys as ``keys.py`` builds them, timers as
//! ``model/due.py`` derives them, runs-index rows as ``model/listing.py`` does.

use crate::state::RunState;
use std::ops::Range;

pub type Error = String;

pub fn string_key(value: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

/// ``keys.history_key``: (run id, seq of the chunk's first fact).
pub fn history_key(run_id: &str, first_seq: i64, out: &mut Vec<u8>) -> Result<(), Error> {
    string_key(run_id, out);
    out.extend_from_slice(&u64_bytes(first_seq)?);
    Ok(())
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
pub fn history_chunk<'a>(facts: impl Iterator<Item = Stripped<'a>>, out: &mut Vec<u8>) {
    for fact in facts {
        let size = fact.header.len() + fact.body.len();
        out.extend_from_slice(&(size as u32).to_be_bytes());
        out.extend_from_slice(fact.header);
        out.extend_from_slice(fact.body);
    }
}

pub fn u64_bytes(value: i64) -> Result<[u8; 8], Error> {
    u64::try_from(value)
        .map(u64::to_be_bytes)
        .map_err(|_| format!("{value} does not fit an unsigned 64-bit key"))
}

/// A due-work row of a run: (due ms, kind code, scope, ordinal); its key holds the run
/// id after the due time.
pub type Due = (i64, u8, i64, i64);

const ATTEMPT_TIMEOUT: u8 = 1;
const RETRY: u8 = 2;
const INTERACTION_TIMEOUT: u8 = 3;
const PUBLICATION: u8 = 4;
const RUN_DEADLINE: u8 = 5;
const COMPENSATION_TIMEOUT: u8 = 6;
const COMPENSATION_RETRY: u8 = 7;
const HEARTBEAT_TIMEOUT: u8 = 9;
const SCHEDULE_TO_START_TIMEOUT: u8 = 10;
const SLEEP: u8 = 11;

/// ``due.due_entries``: every timer the run waits on (none once terminal), in key
/// order (within a run), each once.
pub fn due_entries(state: Option<&RunState>, entries: &mut Vec<Due>) {
    entries.clear();
    let Some(s) = state else { return };
    if s.terminal() {
        return;
    }
    if let (Some(deadline), None) = (s.deadline_ms, &s.stop_reason) {
        entries.push((deadline, RUN_DEADLINE, 0, 0));
    }
    let step = s.compensating_step.unwrap_or(0);
    let generation = s.compensation_generation;
    let timer = match s.phase.as_str() {
        "compensating" => {
            // As a forward attempt's: schedule-to-start until a worker reports the start.
            let kind = if s.compensation_worker.is_some() {
                COMPENSATION_TIMEOUT
            } else {
                SCHEDULE_TO_START_TIMEOUT
            };
            if let Some(due) = s.compensation_heartbeat_due_ms {
                entries.push((due, HEARTBEAT_TIMEOUT, step, generation));
            }
            s.compensation_expires_ms
                .map(|expiry| (expiry, kind, step, generation))
        }
        "compensation_retry_wait" => s
            .compensation_retry_due_ms
            .map(|due| (due, COMPENSATION_RETRY, step, generation)),
        "dispatched" => {
            // Schedule-to-start until a worker reports the start, then start-to-close.
            let kind = if s.attempt_started_step.is_some() {
                ATTEMPT_TIMEOUT
            } else {
                SCHEDULE_TO_START_TIMEOUT
            };
            if let Some(due) = s.heartbeat_due_ms {
                entries.push((due, HEARTBEAT_TIMEOUT, s.segment, s.generation));
            }
            s.attempt_expires_ms
                .map(|expiry| (expiry, kind, s.segment, s.generation))
        }
        "retry_wait" => s
            .retry_due_ms
            .map(|due| (due, RETRY, s.segment, s.generation)),
        "publishing" => s.publication_due_ms.map(|due| (due, PUBLICATION, 0, 0)),
        "sleeping" => s
            .sleep_wake_ms
            .map(|wake| (wake, SLEEP, s.segment, s.sleep_step.unwrap_or(0))),
        "suspended" => {
            interaction_timeouts(s, entries);
            None
        }
        // A failed child step's other children, which its stop waits for (waits.IDLE).
        "idle" if s.stop_held_by_children() => {
            interaction_timeouts(s, entries);
            None
        }
        _ => None,
    };
    entries.extend(timer);
    entries.sort_unstable();
    entries.dedup();
}

/// The deadline of each open interaction of the run's boundary (0: none).
fn interaction_timeouts(s: &RunState, entries: &mut Vec<Due>) {
    for i in s.interactions.values() {
        if i.boundary == s.boundary && i.status == "open" && i.deadline_ms > 0 {
            entries.push((i.deadline_ms, INTERACTION_TIMEOUT, i.boundary, i.item_index));
        }
    }
}

/// The entries of ``of`` not in ``but`` (both sorted, as ``due_entries`` leaves them).
pub fn due_difference<'e>(of: &'e [Due], but: &'e [Due]) -> impl Iterator<Item = &'e Due> {
    of.iter().filter(|entry| but.binary_search(entry).is_err())
}

/// ``keys.due_key`` of a run's timer.
pub fn due_key(run_id: &str, entry: &Due, out: &mut Vec<u8>) -> Result<(), Error> {
    let (due_ms, kind, scope, ordinal) = *entry;
    out.extend_from_slice(&u64_bytes(due_ms)?);
    string_key(run_id, out);
    out.push(kind);
    for part in [scope, ordinal] {
        let part = u32::try_from(part).map_err(|_| format!("{part} does not fit 32 bits"))?;
        out.extend_from_slice(&part.to_be_bytes());
    }
    Ok(())
}

/// The runs-index rows of a run, as their keys: one buffer, a range per key, sorted.
#[derive(Default)]
pub struct IndexKeys {
    bytes: Vec<u8>,
    keys: Vec<Range<usize>>,
}

impl IndexKeys {
    pub fn key(&self, index: usize) -> &[u8] {
        &self.bytes[self.keys[index].clone()]
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.keys
            .binary_search_by(|range| self.bytes[range.clone()].cmp(key))
            .is_ok()
    }

    /// The keys of ``self`` not in ``other``.
    pub fn difference<'k>(&'k self, other: &'k IndexKeys) -> impl Iterator<Item = &'k [u8]> {
        (0..self.len())
            .map(|index| self.key(index))
            .filter(|key| !other.contains(key))
    }
}

// ``keys._INDEX_KINDS``.
const STATUS: u8 = 1;
const PIPELINE_STATUS: u8 = 2;
const WAITING: u8 = 3;
const WAITING_PIPELINE: u8 = 4;
const BLOCKED: u8 = 5;
const EVENT_KEY: u8 = 7;

/// ``listing.index_entries``, each as ``keys.index_key`` builds it, sorted.
pub fn index_keys(state: Option<&RunState>, out: &mut IndexKeys) {
    out.bytes.clear();
    out.keys.clear();
    let Some(s) = state else { return };
    let (pipeline, status) = (s.pipeline.as_str(), s.status.as_str());
    let mut tail = Vec::with_capacity(8 + s.run_id.len());
    let inverted = u64::MAX - u64::try_from(s.submitted_ms.max(0)).unwrap_or(0);
    tail.extend_from_slice(&inverted.to_be_bytes());
    tail.extend_from_slice(s.run_id.as_bytes());
    let mut push = |kind: u8, parts: &[&str]| {
        let start = out.bytes.len();
        out.bytes.push(kind);
        for part in parts {
            string_key(part, &mut out.bytes);
        }
        out.bytes.extend_from_slice(&tail);
        out.keys.push(start..out.bytes.len());
    };
    push(STATUS, &[status]);
    push(PIPELINE_STATUS, &[pipeline, status]);
    let open = open_targets(s);
    let registrations: Vec<Option<Registration>> =
        open.iter().map(|target| registration(target)).collect();
    let mut listed: Vec<String> = open
        .iter()
        .zip(&registrations)
        .map(|(target, found)| match found {
            Some(r) => format!("event:{}", r.event),
            None => (*target).to_string(),
        })
        .collect();
    listed.sort_unstable();
    listed.dedup();
    for target in &listed {
        push(WAITING, &[target]);
        push(WAITING_PIPELINE, &[target, pipeline]);
    }
    let mut keyed: Vec<(String, String)> = registrations
        .into_iter()
        .flatten()
        .filter_map(|r| r.key.map(|key| (r.event, key)))
        .collect();
    keyed.sort_unstable();
    keyed.dedup();
    for (event, key) in &keyed {
        push(EVENT_KEY, &[event, key]);
    }
    if s.phase == "definition_blocked" && !s.terminal() {
        // ``listing.blocked_parts``: the pipeline and its version, as a string
        push(BLOCKED, &[pipeline, &s.pipeline_version.to_string()]);
    }
    let bytes = &out.bytes;
    out.keys
        .sort_unstable_by(|a, b| bytes[a.clone()].cmp(&bytes[b.clone()]));
}

/// An event wait's registration (``event_waits.parse_registration``): its event name
/// and the value of its key field in its correlation, if it has one.
struct Registration {
    event: String,
    key: Option<String>,
}

fn registration(target: &str) -> Option<Registration> {
    if !target.starts_with('{') {
        return None;
    }
    let body: serde_json::Value = serde_json::from_str(target).ok()?;
    let event = body.get("event")?.as_str()?.to_string();
    let correlation = body.get("correlation")?.as_object()?;
    let key = body
        .get("key")
        .and_then(|field| field.as_str())
        .and_then(|field| correlation.get(field))
        .and_then(|value| value.as_str())
        .map(str::to_string);
    Some(Registration { event, key })
}

/// ``listing.open_targets``: the targets of the open interactions of the current
/// boundary, sorted, each once (none unless suspended and not terminal).
fn open_targets(s: &RunState) -> Vec<&str> {
    if s.terminal() || s.phase != "suspended" {
        return Vec::new();
    }
    let mut targets: Vec<&str> = s
        .interactions
        .values()
        .filter(|i| i.boundary == s.boundary && i.status == "open")
        .map(|i| i.target.as_str())
        .collect();
    targets.sort_unstable();
    targets.dedup();
    targets
}
