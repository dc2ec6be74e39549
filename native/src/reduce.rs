//! The fold of ``processor/model/reduce.py``, fact type by fact type. The Python
//! reducers are the reference: tests fold the same facts both ways and compare
//! every row.

use indexmap::IndexMap;
use rustc_hash::FxHashMap;

use crate::avro::{self, RecordSchema, Value};
use crate::state::{Interaction, RecordedResolution, RunState, UnknownAttempt, B64};

pub type Error = String;

/// The fact types folded here: every other type is left to Python.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    RunSubmitted,
    SegmentAttemptStarted,
    StepCompleted,
    SegmentCompleted,
    SegmentFailed,
    RetryScheduled,
    SegmentSuspended,
    BoundaryInteractionDispatched,
    BoundaryDispatchCompleted,
    BoundaryCompletionAdmitted,
    InteractionTimedOut,
    ContinuationSegmentCreated,
    TerminalPublicationPrepared,
    TerminalPublicationCompleted,
    RunSucceeded,
    RunFailed,
    RunStopRequested,
    AttemptOutcomeUnknown,
    AttemptResolved,
    CompensationStarted,
    CompensationAttemptStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    CompensationAttemptFailed,
    RunStopped,
    AttemptStepStarted,
    AttemptHeartbeatRecorded,
    AttemptLost,
    SleepStarted,
    SleepCompleted,
    RunDefinitionBlocked,
}

impl Kind {
    /// The kind of a fact record named ``name`` (without namespace), if folded here.
    pub fn of(name: &str) -> Option<Kind> {
        Some(match name {
            "RunSubmitted" => Kind::RunSubmitted,
            "SegmentAttemptStarted" => Kind::SegmentAttemptStarted,
            "StepCompleted" => Kind::StepCompleted,
            "SegmentCompleted" => Kind::SegmentCompleted,
            "SegmentFailed" => Kind::SegmentFailed,
            "RetryScheduled" => Kind::RetryScheduled,
            "SegmentSuspended" => Kind::SegmentSuspended,
            "BoundaryInteractionDispatched" => Kind::BoundaryInteractionDispatched,
            "BoundaryDispatchCompleted" => Kind::BoundaryDispatchCompleted,
            "BoundaryCompletionAdmitted" => Kind::BoundaryCompletionAdmitted,
            "InteractionTimedOut" => Kind::InteractionTimedOut,
            "ContinuationSegmentCreated" => Kind::ContinuationSegmentCreated,
            "TerminalPublicationPrepared" => Kind::TerminalPublicationPrepared,
            "TerminalPublicationCompleted" => Kind::TerminalPublicationCompleted,
            "RunSucceeded" => Kind::RunSucceeded,
            "RunFailed" => Kind::RunFailed,
            "RunStopRequested" => Kind::RunStopRequested,
            "AttemptOutcomeUnknown" => Kind::AttemptOutcomeUnknown,
            "AttemptResolved" => Kind::AttemptResolved,
            "CompensationStarted" => Kind::CompensationStarted,
            "CompensationAttemptStarted" => Kind::CompensationAttemptStarted,
            "CompensationStepCompleted" => Kind::CompensationStepCompleted,
            "CompensationStepSkipped" => Kind::CompensationStepSkipped,
            "CompensationAttemptFailed" => Kind::CompensationAttemptFailed,
            "RunStopped" => Kind::RunStopped,
            "AttemptStepStarted" => Kind::AttemptStepStarted,
            "AttemptHeartbeatRecorded" => Kind::AttemptHeartbeatRecorded,
            "AttemptLost" => Kind::AttemptLost,
            "SleepStarted" => Kind::SleepStarted,
            "SleepCompleted" => Kind::SleepCompleted,
            "RunDefinitionBlocked" => Kind::RunDefinitionBlocked,
            _ => return None,
        })
    }
}

/// A fact schema folded here: its record and its kind.
pub struct FactSchema {
    pub record: RecordSchema,
    pub kind: Kind,
}

/// Schemas by fingerprint, for the fact types folded here.
pub type Schemas = FxHashMap<[u8; 8], FactSchema>;

/// One decoded fact: its header, its kind and every field (borrowed from the batch).
pub struct Fact<'a> {
    pub run_id: &'a str,
    pub seq: i64,
    pub time_ms: i64,
    pub cause_id: &'a str,
    pub kind: Kind,
    record: &'a RecordSchema,
    values: &'a [Value<'a>],
}

/// Every fact schema begins with these fields, in this order (``FactHeader``).
pub const HEADER: [&str; 5] = ["run_id", "seq", "fact_key", "time_ms", "cause_id"];

impl<'a> Fact<'a> {
    /// The fact of a record decoded with ``schema``, which begins with ``HEADER``;
    /// ``values`` holds the header's values too (``get`` skips them).
    pub fn new(schema: &'a FactSchema, values: &'a [Value<'a>]) -> Result<Fact<'a>, Error> {
        let [Value::Str(run_id), Value::Long(seq), Value::Str(_fact_key), Value::Long(time_ms), Value::Str(cause_id), ..] =
            *values
        else {
            return Err("a fact header is run_id, seq, fact_key, time_ms, cause_id".into());
        };
        Ok(Fact {
            run_id,
            seq,
            time_ms,
            cause_id,
            kind: schema.kind,
            record: &schema.record,
            values,
        })
    }

    fn get(&self, name: &str) -> Result<&Value<'a>, Error> {
        self.record.fields[HEADER.len()..]
            .iter()
            .position(|(field, _)| field == name)
            .map(|index| &self.values[HEADER.len() + index])
            .ok_or_else(|| format!("{} has no field {name}", self.record.name))
    }

    fn string(&self, name: &str) -> Result<String, Error> {
        match self.get(name)? {
            Value::Str(text) => Ok((*text).to_string()),
            _ => Err(format!("{name} is not a string")),
        }
    }

    fn opt_string(&self, name: &str) -> Result<Option<String>, Error> {
        match self.get(name)? {
            Value::Null => Ok(None),
            Value::Str(text) => Ok(Some((*text).to_string())),
            _ => Err(format!("{name} is not an optional string")),
        }
    }

    fn long(&self, name: &str) -> Result<i64, Error> {
        match self.get(name)? {
            Value::Long(number) => Ok(*number),
            _ => Err(format!("{name} is not a number")),
        }
    }

    fn opt_long(&self, name: &str) -> Result<Option<i64>, Error> {
        match self.get(name)? {
            Value::Null => Ok(None),
            Value::Long(number) => Ok(Some(*number)),
            _ => Err(format!("{name} is not an optional number")),
        }
    }

    fn bytes(&self, name: &str) -> Result<B64, Error> {
        match self.get(name)? {
            Value::Bytes(bytes) => Ok(B64(bytes.to_vec())),
            _ => Err(format!("{name} is not bytes")),
        }
    }

    fn boolean(&self, name: &str) -> Result<bool, Error> {
        match self.get(name)? {
            Value::Bool(flag) => Ok(*flag),
            _ => Err(format!("{name} is not a boolean")),
        }
    }

    /// Whether the fact is about a compensator attempt (``kind`` compensate), not a
    /// forward one.
    fn compensates(&self) -> Result<bool, Error> {
        match self.get("kind")? {
            Value::Str(kind) => Ok(*kind == "compensate"),
            _ => Err("kind is not a string".into()),
        }
    }

    fn longs(&self, name: &str) -> Result<Vec<i64>, Error> {
        match self.get(name)? {
            Value::Longs(encoded) => avro::longs(encoded),
            _ => Err(format!("{name} is not a list of numbers")),
        }
    }
}

/// ``reduce.journal_facts``: which of the run's ``facts`` are new to its journal after
/// ``state`` (all but duplicates at or below its version; before the run starts, every
/// fact), as indexes into ``facts``, in ``new``.
pub fn journal_facts(facts: &[Fact], state: Option<&RunState>, new: &mut Vec<usize>) {
    new.clear();
    let mut version = state.map(|run| run.version);
    for (index, fact) in facts.iter().enumerate() {
        if version.is_some_and(|v| fact.seq <= v) {
            continue;
        }
        new.push(index);
        if version.is_some() || fact.kind == Kind::RunSubmitted {
            version = Some(fact.seq);
        }
    }
}

/// ``reduce.fold``: the run after ``facts`` (in order), in place; whether it changed.
pub fn fold<'f, 'a: 'f>(
    facts: impl Iterator<Item = &'f Fact<'a>>,
    state: &mut Option<Box<RunState>>,
) -> Result<bool, Error> {
    let mut changed = false;
    for fact in facts {
        match state.as_mut() {
            None => {
                *state = start(fact)?.map(Box::new);
                changed = state.is_some();
            }
            Some(run) => {
                if fact.seq <= run.version {
                    continue; // already folded: duplicates change nothing
                }
                apply(fact, run)?;
                run.version = fact.seq;
                run.updated_ms = fact.time_ms;
                changed = true;
            }
        }
    }
    Ok(changed)
}

fn start(fact: &Fact) -> Result<Option<RunState>, Error> {
    if fact.kind != Kind::RunSubmitted {
        return Ok(None); // a run begins with its submission; anything else is orphaned
    }
    let input = fact.bytes("input")?;
    Ok(Some(RunState {
        run_id: fact.run_id.to_string(),
        pipeline: fact.string("pipeline")?,
        pipeline_version: fact.long("pipeline_version")?,
        status: "running".into(),
        version: fact.seq,
        input: input.clone(),
        submitted_ms: fact.long("submitted_ms")?,
        created_ms: fact.time_ms,
        updated_ms: fact.time_ms,
        idempotency_key: fact.opt_string("idempotency_key")?,
        fingerprint: fact.opt_string("fingerprint")?,
        submit_command_id: fact.cause_id.to_string(),
        segment: 0,
        attempt: 0,
        generation: 0,
        next_step: 0,
        step_attempts: 0,
        last_output: input,
        phase: "idle".into(),
        attempt_expires_ms: None,
        retry_due_ms: None,
        retry_reason: None,
        completed_steps: Vec::new(),
        boundary: 0,
        boundary_step: None,
        boundary_kind: "await".into(),
        boundary_itemized: false,
        boundary_items: 0,
        boundary_on_timeout: "fail".into(),
        boundary_dispatched: false,
        boundary_total: 0,
        boundary_settled: 0,
        boundary_failed: 0,
        sleep_step: None,
        sleep_wake_ms: None,
        interactions: IndexMap::new(),
        publications: IndexMap::new(),
        publication_key: None,
        publication_due_ms: None,
        result: None,
        error: None,
        error_type: None,
        failed_step: None,
        failed_attempts: 0,
        deadline_ms: fact.opt_long("deadline_ms")?,
        stop_reason: None,
        stop_detail: None,
        unknown: None,
        step_outputs: IndexMap::new(),
        resolutions: IndexMap::new(),
        unwind: Vec::new(),
        compensation_started: false,
        compensating_step: None,
        compensation_attempt: 0,
        compensation_generation: 0,
        compensation_expires_ms: None,
        compensation_retry_due_ms: None,
        compensation_retry_reason: None,
        compensated: 0,
        skipped: 0,
        compensation_failed: false,
        execution: None,
        recovery: None,
        traceparent: fact.opt_string("traceparent")?,
        attempt_started_step: None,
        attempt_worker: None,
        heartbeat_due_ms: None,
        infrastructure_losses: 0,
        compensation_worker: None,
        compensation_heartbeat_due_ms: None,
    }))
}

/// One fact's changes, applied to the run in place (each reducer reads the run as
/// the earlier facts left it, as the Python draft does).
fn apply(fact: &Fact, s: &mut RunState) -> Result<(), Error> {
    match fact.kind {
        Kind::SegmentAttemptStarted => {
            s.segment = fact.long("segment")?;
            s.attempt = fact.long("attempt")?;
            s.generation = fact.long("generation")?;
            s.next_step = fact.long("first_step")?;
            s.step_attempts += 1;
            set(&mut s.phase, "dispatched");
            s.attempt_expires_ms = fact.opt_long("expires_ms")?;
            s.retry_due_ms = None;
            s.attempt_started_step = None;
            s.attempt_worker = None;
            s.heartbeat_due_ms = None;
        }
        Kind::AttemptStepStarted => {
            let worker = Some(fact.string("worker_id")?);
            let expires = Some(fact.long("expires_ms")?);
            let heartbeat = fact.opt_long("heartbeat_due_ms")?;
            if fact.compensates()? {
                s.compensation_worker = worker;
                s.compensation_expires_ms = expires;
                s.compensation_heartbeat_due_ms = heartbeat;
            } else {
                s.attempt_started_step = Some(fact.long("step")?);
                s.attempt_worker = worker;
                s.attempt_expires_ms = expires;
                s.heartbeat_due_ms = heartbeat;
            }
            if fact.boolean("redelivered")? {
                s.infrastructure_losses += 1;
            }
        }
        Kind::AttemptHeartbeatRecorded => {
            let due = Some(fact.long("heartbeat_due_ms")?);
            if fact.compensates()? {
                s.compensation_heartbeat_due_ms = due;
            } else {
                s.heartbeat_due_ms = due;
            }
        }
        Kind::AttemptLost => {
            if fact.compensates()? {
                // Dispatched again in the same commit, under the same attempt number.
                s.compensation_expires_ms = None;
                s.compensation_heartbeat_due_ms = None;
            } else {
                set(&mut s.phase, "idle");
                s.attempt_expires_ms = None;
                s.heartbeat_due_ms = None;
                s.step_attempts = (s.step_attempts - 1).max(0);
            }
            s.infrastructure_losses = fact.long("losses")?;
        }
        Kind::RunDefinitionBlocked => {
            // The attempt named waits, not started: no expiry, the budget without it.
            s.segment = fact.long("segment")?;
            s.attempt = fact.long("attempt")?;
            s.generation = fact.long("generation")?;
            s.next_step = fact.long("first_step")?;
            s.step_attempts = fact.long("step_attempts")?;
            s.attempt_expires_ms = None;
            s.retry_due_ms = None;
            set(&mut s.phase, "definition_blocked");
            s.unknown = None;
        }
        Kind::StepCompleted => {
            let step = fact.long("step")?;
            let output = fact.bytes("output")?;
            s.next_step = step + 1;
            s.step_attempts = 1;
            s.last_output = output.clone();
            s.completed_steps.push(step);
            s.step_outputs.insert(step, output);
        }
        Kind::SegmentCompleted => {
            set(&mut s.phase, "idle");
            s.attempt_expires_ms = None;
            s.heartbeat_due_ms = None;
            s.unknown = None;
        }
        Kind::SegmentFailed => {
            set(&mut s.phase, "idle");
            s.unknown = None;
            s.attempt_expires_ms = None;
            s.heartbeat_due_ms = None;
            s.error = Some(fact.string("error")?);
            s.error_type = Some(fact.string("error_type")?);
            s.failed_step = Some(fact.long("step")?);
            with_reason(&mut s.retry_reason, fact.opt_string("reason")?);
        }
        Kind::RetryScheduled => {
            set(&mut s.phase, "retry_wait");
            s.retry_due_ms = Some(fact.long("due_ms")?);
            with_reason(&mut s.retry_reason, fact.opt_string("reason")?);
        }
        Kind::SegmentSuspended => {
            let step = fact.long("step")?;
            set(&mut s.phase, "suspended");
            s.unknown = None;
            s.attempt_expires_ms = None;
            s.heartbeat_due_ms = None;
            s.next_step = step;
            s.boundary = fact.long("boundary")?;
            s.boundary_step = Some(step);
            s.boundary_kind = fact.string("kind")?;
            s.boundary_itemized = fact.boolean("itemized")?;
            s.boundary_items = fact.long("items")?;
            s.boundary_on_timeout = fact.string("on_timeout")?;
            s.boundary_dispatched = false;
            s.count_boundary(); // none, unless the boundary is reached again
        }
        Kind::BoundaryInteractionDispatched => {
            let interaction = Interaction {
                boundary: fact.long("boundary")?,
                item_index: fact.long("item_index")?,
                kind: s.boundary_kind.clone(),
                target: fact.string("target")?,
                deadline_ms: fact.long("deadline_ms")?,
                token_digest: fact.bytes("token_digest")?,
                status: "open".into(),
                outcome: None,
                digest: None,
                output: None,
                error: None,
            };
            let before = s
                .interactions
                .insert(fact.string("interaction")?, interaction.clone());
            s.recount(before.as_ref(), &interaction);
        }
        Kind::BoundaryDispatchCompleted => s.boundary_dispatched = true,
        Kind::BoundaryCompletionAdmitted => {
            let key = fact.string("interaction")?;
            if let Some(before) = s.interactions.get(&key).cloned() {
                let outcome = fact.string("outcome")?;
                let mut after = before.clone();
                after.status = "admitted".into();
                after.output = if outcome == "success" {
                    Some(fact.bytes("payload")?)
                } else {
                    None
                };
                after.outcome = Some(outcome);
                after.digest = Some(fact.bytes("payload_digest")?);
                after.error = fact.opt_string("error")?;
                s.recount(Some(&before), &after);
                s.interactions.insert(key, after);
            }
        }
        Kind::InteractionTimedOut => {
            let key = fact.string("interaction")?;
            if let Some(before) = s.interactions.get(&key).cloned() {
                let mut after = before.clone();
                after.status = "timed_out".into();
                s.recount(Some(&before), &after);
                s.interactions.insert(key, after);
            }
        }
        Kind::ContinuationSegmentCreated => {
            let boundary = fact.long("boundary")?;
            for interaction in s.interactions.values_mut() {
                if interaction.boundary == boundary {
                    interaction.output = None;
                }
            }
            set(&mut s.phase, "idle");
            s.segment = fact.long("segment")?;
            s.attempt = 0;
            s.next_step = fact.long("first_step")?;
            s.step_attempts = 0;
            s.last_output = fact.bytes("input")?;
        }
        Kind::TerminalPublicationPrepared => {
            set(&mut s.phase, "publishing");
            s.publications
                .insert(fact.string("topic")?, "prepared".into());
            s.publication_key = Some(fact.string("idempotency_key")?);
            s.publication_due_ms = Some(fact.time_ms);
        }
        Kind::TerminalPublicationCompleted => {
            s.publications
                .insert(fact.string("topic")?, "completed".into());
        }
        Kind::RunSucceeded => {
            set(&mut s.status, "succeeded");
            s.execution = Some("Completed".into());
            s.recovery = Some("NotRequired".into());
            set(&mut s.phase, "idle");
            s.result = Some(fact.bytes("result")?);
            s.error = None;
            s.error_type = None;
            s.failed_step = None;
        }
        Kind::RunFailed => {
            set(&mut s.status, "failed");
            s.execution = Some("Failed".into());
            s.recovery = Some(fact.string("recovery")?);
            s.failed_attempts = fact.long("attempts")?;
            set(&mut s.phase, "idle");
            s.retry_due_ms = None;
            s.error = Some(fact.string("error")?);
            s.error_type = Some(fact.string("error_type")?);
            s.failed_step = Some(fact.long("step")?);
            with_reason(&mut s.retry_reason, fact.opt_string("reason")?);
        }
        Kind::RunStopRequested => {
            let reason = fact.string("reason")?;
            if s.phase == "retry_wait" {
                // A pending retry fenced by the stop (reduce._FENCED_RETRY_REASONS).
                let fenced = match reason.as_str() {
                    "timed_out" => Some("deadline_elapsed".to_string()),
                    "cancelled" => Some("cancelled".to_string()),
                    _ => None,
                };
                with_reason(&mut s.retry_reason, fenced);
            }
            if s.phase == "sleeping" {
                s.sleep_step = None;
                s.sleep_wake_ms = None;
            }
            // A child boundary with a child still open holds the stop (waits.children_open).
            let fenced = matches!(
                s.phase.as_str(),
                "retry_wait" | "suspended" | "sleeping" | "definition_blocked"
            ) && !(s.phase == "suspended" && s.children_open());
            s.stop_reason = Some(reason);
            s.stop_detail = Some(fact.string("detail")?);
            if fenced {
                set(&mut s.phase, "idle");
            }
            s.retry_due_ms = None;
        }
        Kind::SleepStarted => {
            let step = fact.long("step")?;
            set(&mut s.phase, "sleeping");
            s.unknown = None;
            s.attempt_expires_ms = None;
            s.next_step = step;
            s.sleep_step = Some(step);
            s.sleep_wake_ms = Some(fact.long("wake_ms")?);
        }
        Kind::SleepCompleted => {
            set(&mut s.phase, "idle");
            s.sleep_step = None;
            s.sleep_wake_ms = None;
        }
        Kind::AttemptOutcomeUnknown => {
            let kind = fact.string("kind")?;
            if kind == "forward" {
                // an effectful step's attempt: never retried blindly
                s.retry_reason = Some("outcome_unknown".into());
            }
            set(&mut s.phase, "unknown");
            s.unknown = Some(UnknownAttempt {
                kind,
                segment: fact.long("segment")?,
                attempt: fact.long("attempt")?,
                generation: fact.long("generation")?,
                step: fact.long("step")?,
            });
            s.attempt_expires_ms = None;
            s.heartbeat_due_ms = None;
            s.compensation_expires_ms = None;
            s.compensation_heartbeat_due_ms = None;
        }
        Kind::AttemptResolved => {
            set(&mut s.phase, "idle");
            s.unknown = None;
            let recorded = RecordedResolution {
                fingerprint: fact.string("fingerprint")?,
                response: fact.string("response")?,
            };
            s.resolutions
                .insert(fact.string("idempotency_key")?, recorded);
        }
        Kind::CompensationStarted => {
            set(&mut s.phase, "compensating");
            s.unwind = fact.longs("steps")?;
            s.compensation_started = true;
        }
        Kind::CompensationAttemptStarted => {
            set(&mut s.phase, "compensating");
            s.compensating_step = Some(fact.long("step")?);
            s.compensation_attempt = fact.long("attempt")?;
            s.compensation_generation = fact.long("generation")?;
            s.compensation_expires_ms = fact.opt_long("expires_ms")?;
            s.compensation_retry_due_ms = None;
            s.compensation_worker = None;
            s.compensation_heartbeat_due_ms = None;
        }
        Kind::CompensationStepCompleted => {
            unwound(s);
            s.compensated += 1;
        }
        Kind::CompensationStepSkipped => {
            unwound(s);
            s.skipped += 1;
        }
        Kind::CompensationAttemptFailed => {
            match fact.opt_long("retry_due_ms")? {
                Some(due) => {
                    set(&mut s.phase, "compensation_retry_wait");
                    s.compensation_retry_due_ms = Some(due);
                }
                None => {
                    s.compensation_failed = true;
                    s.unwind = Vec::new();
                    set(&mut s.phase, "idle");
                }
            }
            s.compensation_expires_ms = None;
            s.compensation_heartbeat_due_ms = None;
            with_reason(&mut s.compensation_retry_reason, fact.opt_string("reason")?);
        }
        Kind::RunStopped => {
            let execution = fact.string("execution")?;
            set(
                &mut s.status,
                if execution == "Cancelled" {
                    "cancelled"
                } else {
                    "timed_out"
                },
            );
            s.execution = Some(execution);
            s.recovery = Some(fact.string("recovery")?);
            set(&mut s.phase, "idle");
            s.attempt_expires_ms = None;
            s.heartbeat_due_ms = None;
            s.retry_due_ms = None;
        }
        Kind::RunSubmitted => {} // a second submission of a run only advances its version
    }
    Ok(())
}

/// The retry decision ``reason`` recorded, unless the fact has none (one written
/// before reasons: ``reduce._with_reason``).
fn with_reason(field: &mut Option<String>, reason: Option<String>) {
    if reason.is_some() {
        *field = reason;
    }
}

/// Overwrite a string field in place (its buffer is reused: no allocation per fact).
fn set(field: &mut String, value: &str) {
    field.clear();
    field.push_str(value);
}

fn unwound(s: &mut RunState) {
    if !s.unwind.is_empty() {
        s.unwind.remove(0);
    }
    s.compensating_step = None;
    s.compensation_attempt = 0;
    s.compensation_generation = 0;
    s.compensation_expires_ms = None;
    s.compensation_worker = None;
    s.compensation_heartbeat_due_ms = None;
    set(&mut s.phase, "compensating");
}
